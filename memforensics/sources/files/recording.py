"""Recordings (``memforensics/sample/1`` JSON Lines): append as taken, read while written.

The writer appends one line per sample and flushes it at once, so a crash loses at most the
line being written; it resumes an existing file by appending, after closing off a torn last
line with a newline. The reader tolerates such torn lines (the last line of a file still
being written, or one a crash cut short before a resume) and says how many it skipped; any
other malformed line is invalid input (exit 7).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from memforensics.errors import InputDataError, ToolingError
from memforensics.model.advice import Advice, Severity
from memforensics.model.process import Waterfall, WaterfallKind, WaterfallLine
from memforensics.model.series import ArenaPoint, Sample, SeriesEvent, SizeClassPoint

SAMPLE_SCHEMA = "memforensics/sample/1"
_EVENT_KINDS = ("gap", "exit", "oom-kill", "trim")
# The opening every line of a recording starts with (json.dumps keeps insertion order):
# a line that starts so but does not parse was cut short, not made up.
_LINE_PREFIX = '{"schema": "' + SAMPLE_SCHEMA + '"'


class RecordingWriter:
    """Appends recording lines to a file, flushing each one (a context manager)."""

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = Path(path)
        self._fsync = fsync
        try:
            torn = self._ends_torn()
            self._handle: IO[str] = self.path.open("a", encoding="utf-8")
        except OSError as exc:
            raise ToolingError(
                f"cannot write the recording {self.path}: {exc.strerror or exc}",
                hint="choose a writable path for the recording",
            ) from exc
        if torn:
            # A crash cut the last line short: end it so the next line stands on its own.
            self._handle.write("\n")
            self._handle.flush()

    def _ends_torn(self) -> bool:
        try:
            with self.path.open("rb") as existing:
                existing.seek(0, os.SEEK_END)
                if existing.tell() == 0:
                    return False
                existing.seek(-1, os.SEEK_END)
                return existing.read(1) != b"\n"
        except FileNotFoundError:
            return False

    def write(self, line: Mapping[str, Any]) -> None:
        """Append one line and flush it (and fsync it when asked) before returning."""
        self._handle.write(json.dumps(line, separators=(", ", ": ")) + "\n")
        self._handle.flush()
        if self._fsync:
            os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


@dataclass
class Recording:
    """What one recording file holds: samples and events in file order, and reader notes."""

    source: str
    samples: list[Sample] = field(default_factory=list)
    events: list[SeriesEvent] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    torn_lines: int = 0


def parse_time(value: Any, source: str, line: int) -> datetime | None:
    """An ISO-8601 time from a recording (``Z`` or an offset); None stays None."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InputDataError("time is not a string", source=source, line=line)
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InputDataError(f"time {value!r} is not ISO-8601", source=source, line=line) from None
    if moment.tzinfo is timezone.utc:
        return moment  # what memforensics writes: no conversion needed
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def _int(obj: Mapping[str, Any], key: str, source: str, line: int) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputDataError(f"{key} is not an integer", source=source, line=line)
    return value


def _float(obj: Mapping[str, Any], key: str, source: str, line: int) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputDataError(f"{key} is not a number", source=source, line=line)
    return float(value)


def _list(obj: Mapping[str, Any], key: str, source: str, line: int) -> list[Any]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InputDataError(f"{key} is not a list", source=source, line=line)
    return value


def arena_points(items: Iterable[Any], source: str, line: int) -> tuple[ArenaPoint, ...]:
    """Arena figures from heap/1 ``arenas[]`` or a recording's ``arenas``."""
    points = []
    for item in items:
        if not isinstance(item, dict):
            raise InputDataError("arenas[] holds a non-object", source=source, line=line)
        points.append(
            ArenaPoint(
                index=_int(item, "index", source, line) or 0,
                system_bytes=_int(item, "system_bytes", source, line) or 0,
                in_use_bytes=_int(item, "in_use_bytes", source, line) or 0,
                free_bytes=_int(item, "free_bytes", source, line) or 0,
                free_ratio=_float(item, "free_ratio", source, line) or 0.0,
                top_bytes=_int(item, "top_bytes", source, line),
            )
        )
    return tuple(points)


def size_classes(items: Iterable[Any], source: str, line: int) -> tuple[SizeClassPoint, ...]:
    """Histogram rows from heap/1 ``histogram[]`` or a recording's ``histogram``."""
    rows = []
    for item in items:
        if not isinstance(item, dict):
            raise InputDataError("histogram[] holds a non-object", source=source, line=line)
        rows.append(
            SizeClassPoint(
                from_bytes=_int(item, "from_bytes", source, line) or 0,
                to_bytes=_int(item, "to_bytes", source, line),
                chunks=_int(item, "chunks", source, line) or 0,
                bytes=_int(item, "bytes", source, line) or 0,
            )
        )
    return tuple(rows)


def waterfall_from(items: Any, source: str, line: int) -> Waterfall | None:
    """A Waterfall from a list of line objects (recording) or heap/1's ``{"lines": [...]}``."""
    if isinstance(items, dict):
        items = items.get("lines")
    if not isinstance(items, list):
        return None
    lines = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise InputDataError("waterfall line without a key", source=source, line=line)
        lines.append(
            WaterfallLine(
                key=item["key"],
                label=str(item.get("label", item["key"])),
                bytes=_int(item, "bytes", source, line),
                depth=_int(item, "depth", source, line) or 0,
                estimate=bool(item.get("estimate", False)),
                in_rss=bool(item.get("in_rss", True)),
                kind=_waterfall_kind(item.get("kind")),
            )
        )
    return Waterfall(lines=tuple(lines))


def _waterfall_kind(value: object) -> WaterfallKind:
    """A recorded line's kind; recordings from before kinds existed say "measured"."""
    if value == "estimated":
        return "estimated"
    if value == "difference":
        return "difference"
    return "measured"


def advice_from(items: Iterable[Any]) -> tuple[Advice, ...]:
    """Advice objects (``code``, ``severity``, ``message``); malformed ones are left out."""
    found = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("code"), str):
            severity: Severity = "warn" if item.get("severity") == "warn" else "info"
            found.append(Advice(item["code"], str(item.get("message", "")), severity))
    return tuple(found)


def _sample(obj: Mapping[str, Any], source: str, line: int) -> Sample:
    kind = obj.get("kind")
    process = obj.get("process")
    if kind != "heap":
        # The common line (one a second for days): only what an RSS reading holds.
        pid, rss, anon = obj.get("pid"), obj.get("rss_bytes"), obj.get("anon_bytes")
        if not all(value is None or type(value) is int for value in (pid, rss, anon)):
            raise InputDataError("pid or a byte count is not an integer", source=source, line=line)
        return Sample(
            kind="rss",
            time=parse_time(obj.get("time"), source, line),
            pid=pid,
            process=process if isinstance(process, str) else "?",
            rss_bytes=rss,
            anon_bytes=anon,
            sequence=line,
        )
    totals = obj.get("totals")
    if not isinstance(totals, dict):
        raise InputDataError("heap line without totals", source=source, line=line)
    return Sample(
        kind="heap",
        time=parse_time(obj.get("time"), source, line),
        pid=_int(obj, "pid", source, line),
        process=process if isinstance(process, str) else "?",
        rss_bytes=_int(obj, "rss_bytes", source, line),
        anon_bytes=_int(obj, "anon_bytes", source, line),
        totals=totals,
        pause_seconds=_float(obj, "pause_seconds", source, line),
        free_resident_bytes=_int(obj, "free_resident_bytes", source, line),
        arenas=arena_points(_list(obj, "arenas", source, line), source, line),
        histogram=size_classes(_list(obj, "histogram", source, line), source, line),
        waterfall=waterfall_from(obj.get("waterfall"), source, line),
        advice=advice_from(_list(obj, "advice", source, line)),
        sequence=line,
        runtime=runtime if isinstance(runtime := obj.get("runtime"), str) else None,
    )


def _event(obj: Mapping[str, Any], source: str, line: int) -> SeriesEvent | None:
    kind = obj.get("event")
    if kind not in _EVENT_KINDS:
        return None  # an event kind from a newer release: not ours to interpret
    detail = obj.get("detail")
    process = obj.get("process")
    return SeriesEvent(
        kind=kind,
        time=parse_time(obj.get("time"), source, line),
        pid=_int(obj, "pid", source, line),
        process=process if isinstance(process, str) else "?",
        message=str(obj.get("message", "")),
        rss_bytes=_int(obj, "rss_bytes", source, line),
        detail=detail if isinstance(detail, dict) else {},
    )


def read_recording(path: str | os.PathLike[str], *, name: str | None = None) -> Recording:
    """Read every line of a recording; torn lines are skipped and counted, not fatal."""
    source = name or str(path)
    recording = Recording(source=source)
    try:
        handle = Path(path).open("rb")  # noqa: SIM115  (closed by the with below)
    except OSError as exc:
        raise InputDataError(f"cannot read: {exc.strerror or exc}", source=source) from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            text = raw.decode("utf-8", errors="replace").strip()
            if not text:
                continue
            try:
                obj = json.loads(text)
            except ValueError:
                last = not raw.endswith(b"\n")
                if last or text.startswith(_LINE_PREFIX):
                    recording.torn_lines += 1  # being written now, or cut short by a crash
                    continue
                raise InputDataError(
                    "not a JSON line", source=source, line=number, hint=_HINT
                ) from None
            if not isinstance(obj, dict) or obj.get("schema") != SAMPLE_SCHEMA:
                raise InputDataError(
                    f"not a {SAMPLE_SCHEMA} line", source=source, line=number, hint=_HINT
                )
            kind = obj.get("kind")
            if kind in ("heap", "rss"):
                recording.samples.append(_sample(obj, source, number))
            elif kind == "event":
                event = _event(obj, source, number)
                if event is not None:
                    recording.events.append(event)
            # Other kinds come from newer releases: keys may be added, so skip, not fail.
    if recording.torn_lines:
        recording.notes.append(
            f"{source}: {recording.torn_lines} incomplete line(s) skipped "
            "(a sample being written, or one cut short by a crash)"
        )
    return recording


_HINT = "a recording is what `memforensics watch` records: one JSON object a line"
