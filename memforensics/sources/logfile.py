"""Saved text logs (dmesg, dmesg -T/-x/iso, syslog, kern.log, journalctl short/iso/json,
raw /dev/kmsg records; plain, .gz or stdin) read fast: only lines near OOM messages are parsed.

Speed: a 1 GB log is mostly unrelated kernel noise. Instead of decoding every line we search
the raw bytes for a few literal anchors that every victim line contains (``bytes.find`` runs
at memchr-like speed) and, for each hit, search backwards for its incident's
``invoked oom-killer`` header and take the lines in between (task table, memcg block,
``oom-kill:`` summary). Only those lines are decoded and parsed.
"""

from __future__ import annotations

import gzip
import io
import json
import mmap
import multiprocessing
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from typing import Any, BinaryIO, Protocol

from memforensics.errors import InputDataError
from memforensics.sources import kmsg
from memforensics.sources.logrecord import KERNEL, LogRecord
from memforensics.sources.logtime import parse_ctime, parse_iso, parse_syslog_date

# Every victim line contains one of these: kernel "Killed process"/"Kill process" and
# systemd-oomd's older "Killed <cgroup> due to ..."; earlyoom's "sending SIGTERM to process";
# systemd-oomd's newest "Marked <cgroup> for killing due to ...".
ANCHORS = (b"Kill", b" to process ", b"for killing due to")
_HEADER = b" invoked oom-killer: "
_REAPER = b"oom_reaper: "
# How far back from a victim line we look for its incident's header (task tables of big
# hosts run to a few hundred KiB); a header further away only costs us trigger/top tasks.
LOOKBACK_BYTES = 1 << 20
# oom_reaper confirms a kill up to seconds later; look this far ahead for it.
_REAPER_LOOKAHEAD_BYTES = 1 << 16
# Without a header, this much before a victim line is parsed too (summary, group notice).
_NEAR_BYTES = 2048
# Files at least this big are searched by one process per core (up to _MAX_WORKERS).
PARALLEL_MIN_BYTES = 64 << 20
_MAX_WORKERS = 4
_CHUNK_BYTES = 8 << 20
_SNIFF_BYTES = 1 << 16
_JOURNAL_MAGIC = b"LPKSHHRH"
_GZIP_MAGIC = b"\x1f\x8b"


class _Buffer(Protocol):
    def find(self, sub: bytes, start: int = ..., end: int = ...) -> int: ...
    def rfind(self, sub: bytes, start: int = ..., end: int = ...) -> int: ...
    def __getitem__(self, index: slice) -> bytes: ...


def _find_anchor(buf: _Buffer, index: int, start: int, end: int) -> int:
    """Offset of the next ``ANCHORS[index]`` in ``buf[start:end]``, or -1.

    "Kill" is found through its capital K: a one-byte find is a plain memchr, several times
    faster than CPython's multi-byte search, and a capital K is rare in kernel logs.
    """
    anchor = ANCHORS[index]
    if index != 0:
        return buf.find(anchor, start, end)
    position = buf.find(b"K", start, end)
    while position >= 0 and buf[position : position + len(anchor)] != anchor:
        position = buf.find(b"K", position + 1, end)
    return position


def candidate_spans(
    buf: _Buffer, start: int, end: int, floor: int, emitted: int | None = None
) -> Iterator[tuple[int, int]]:
    """Yield ``(line_start, line_end)`` of the lines worth parsing in ``buf[start:end]``, in order.

    ``buf[start:end]`` holds whole lines; bytes from ``floor`` to ``start`` are look-behind
    from the previous buffer, searched for headers. Nothing before ``emitted`` (default
    ``start``: what the previous buffer already yielded) is yielded again.
    """
    nexts = [_find_anchor(buf, index, start, end) for index in range(len(ANCHORS))]
    emitted = start if emitted is None else emitted
    # A header before the previous victim line belongs to that victim's incident.
    last_victim_end = max(floor, min(emitted, start))
    while True:
        live = [p for p in nexts if p >= 0]
        if not live:
            return
        hit = min(live)
        line_start = buf.rfind(b"\n", floor, hit) + 1 or floor
        line_end = buf.find(b"\n", hit, end)
        if line_end < 0:
            line_end = end
        if line_start >= emitted:
            low = max(floor, last_victim_end, line_start - LOOKBACK_BYTES)
            header = buf.rfind(_HEADER, low, line_start)
            if header >= 0:
                pos = buf.rfind(b"\n", low, header) + 1 or low
            else:
                # No header (rate-limited, grep-filtered, or a group kill's next victim):
                # the lines just before may still be its oom-kill: summary or the
                # memory.oom.group notice.
                near = max(low, line_start - _NEAR_BYTES)
                pos = low if near == low else (buf.find(b"\n", near, line_start) + 1 or line_start)
            pos = max(pos, emitted)
            while pos < line_start:
                newline = buf.find(b"\n", pos, line_start)
                if newline < 0:
                    break
                yield pos, newline
                pos = newline + 1
            yield line_start, line_end
            emitted = last_victim_end = line_end + 1
            reaper = buf.find(_REAPER, line_end, min(end, line_end + _REAPER_LOOKAHEAD_BYTES))
            if reaper >= 0:
                reaper_end = buf.find(b"\n", reaper, end)
                yield (
                    (buf.rfind(b"\n", line_end, reaper) + 1 or line_end),
                    (end if reaper_end < 0 else reaper_end),
                )
        for index, position in enumerate(nexts):
            if 0 <= position <= line_end:
                nexts[index] = _find_anchor(buf, index, line_end + 1, end)


# --- one line of text -> LogRecord --------------------------------------------------------

_UPTIME_RE = re.compile(r"^\[\s*(\d+\.\d+)\](?:\[\s*[TC]\d+\])? ?")
_CTIME_RE = re.compile(r"^\[([^\]]*?\d{1,2}:\d{2}:\d{2}[^\]]*)\](?:\[\s*[TC]\d+\])? ?")
_CALLER_RE = re.compile(r"^\[\s*[TC]\d+\] ?")
_DMESG_X_RE = re.compile(
    r"^(?:kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|local\d)\s*:"
    r"(?:emerg|alert|crit|err|warn|notice|info|debug)\s*: ?"
)
_SYSLOG_RE = re.compile(
    r"^(\S+)\s+(\d{1,2}) (\d{1,2}:\d{2}:\d{2}(?:\.\d+)?) (?:(\S+) )??"
    r"([^\s\[\]:]+)(?:\[\d+\])?: ?"
)
_ISO_SYSLOG_RE = re.compile(
    r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?) (?:(\S+) )??"
    r"([^\s\[\]:]+)(?:\[\d+\])?: ?"
)
_ISO_DMESG_RE = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2},\d+[+-]\d{2}:?\d{2}) ")
_KERNEL_IDENTS = frozenset({KERNEL, "vmunix", "genunix"})
# "ident[pid]: " (or "kernel: ") after a short-monotonic uptime stamp.
_USERSPACE_RE = re.compile(r"^(?:([A-Za-z][\w.@-]*)\[\d+\]|(kernel)): ")


def _strip_kernel_prefix(text: str) -> tuple[str, float | None]:
    """Remove a ``[  123.456789]`` uptime (and printk caller id) that syslog kept."""
    match = _UPTIME_RE.match(text)
    if match:
        return text[match.end() :], float(match.group(1))
    caller = _CALLER_RE.match(text)
    if caller:
        return text[caller.end() :], None
    return text, None


def _json_record(line: str, source: str) -> LogRecord | None:
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    if not isinstance(entry, dict):
        return None
    from memforensics.sources.journal import record_from_json  # same layer; avoids a cycle

    return record_from_json(entry, source)


def parse_line(line: str, source: str, reference: datetime) -> LogRecord | None:
    """Parse one saved log line in any supported format; None for lines that carry nothing."""
    if not line:
        return None
    first = line[0]
    if first == "{":
        return _json_record(line, source)
    if first.isdigit():
        record = kmsg.parse_record(line)
        if record is not None:
            ident, text = kmsg.split_userspace(record)
            return LogRecord(text, source, ident, None, record.uptime_seconds)
        iso = _ISO_DMESG_RE.match(line)
        if iso:
            text, uptime = _strip_kernel_prefix(line[iso.end() :])
            return LogRecord(text, source, KERNEL, parse_iso(iso.group(1)), uptime)
        iso_syslog = _ISO_SYSLOG_RE.match(line)
        if iso_syslog:
            return _syslog_record(
                line[iso_syslog.end() :],
                source,
                iso_syslog.group(3),
                parse_iso(iso_syslog.group(1)),
            )
    if first == "[":
        uptime_match = _UPTIME_RE.match(line)
        if uptime_match:
            text = line[uptime_match.end() :]
            uptime = float(uptime_match.group(1))
            # journalctl -o short-monotonic puts userspace lines behind an uptime too.
            userspace = _USERSPACE_RE.match(text)
            if userspace and userspace.group(1) is not None:
                return LogRecord(text[userspace.end() :], source, userspace.group(1), None, uptime)
            if userspace:
                text = text[userspace.end() :]
            return LogRecord(text, source, KERNEL, None, uptime)
        ctime = _CTIME_RE.match(line)
        if ctime:
            return LogRecord(line[ctime.end() :], source, KERNEL, parse_ctime(ctime.group(1)))
    dmesg_x = _DMESG_X_RE.match(line)
    if dmesg_x:
        rest = line[dmesg_x.end() :]
        inner = parse_line(rest, source, reference) if rest[:1] == "[" else None
        return inner or LogRecord(rest, source, KERNEL)
    syslog = _SYSLOG_RE.match(line)
    if syslog:
        return _syslog_record(
            line[syslog.end() :],
            source,
            syslog.group(5),
            parse_syslog_date(syslog.group(1), syslog.group(2), syslog.group(3), reference),
        )
    return LogRecord(line, source, None)


def _syslog_record(text: str, source: str, ident: str, stamp: datetime | None) -> LogRecord:
    if "#0" in text:
        # rsyslog escapes control characters: a multi-line printk arrives with #012.
        text = text.replace("#012", "\n").replace("#011", "\t")
    if ident in _KERNEL_IDENTS:
        stripped, uptime = _strip_kernel_prefix(text)
        return LogRecord(stripped, source, KERNEL, stamp, uptime)
    return LogRecord(text, source, ident, stamp)


# --- opening inputs ----------------------------------------------------------------------


def _check_text(head: bytes, source: str) -> None:
    if head.startswith(_JOURNAL_MAGIC):
        raise InputDataError(
            "this is a binary journal file, not a text log",
            source=source,
            hint="use --directory with its directory, or `journalctl --file FILE -k > out.txt`",
        )
    if b"\x00" in head:
        raise InputDataError(
            "binary data, not a text log",
            source=source,
            hint="pass dmesg, kern.log/syslog/messages or journalctl output (plain or .gz)",
        )


class _Scan:
    """Turns candidate spans of one buffer into records; remembers how far it yielded."""

    def __init__(self, source: str, reference: datetime) -> None:
        self.source = source
        self.reference = reference
        self.last_end = -1

    def records(
        self, buf: _Buffer, start: int, end: int, floor: int, emitted: int | None = None
    ) -> Iterator[LogRecord]:
        return self.parse_spans(buf, candidate_spans(buf, start, end, floor, emitted))

    def parse_spans(self, buf: _Buffer, spans: Iterable[tuple[int, int]]) -> Iterator[LogRecord]:
        """Decode and parse the given lines of ``buf``."""
        for line_start, line_end in spans:
            self.last_end = max(self.last_end, line_end)
            line = buf[line_start:line_end].decode("utf-8", errors="replace").rstrip("\r")
            record = parse_line(line, self.source, self.reference)
            if record is not None:
                yield record


class _Readable(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...


class _Prefixed(io.RawIOBase):
    """A stream that first returns ``head`` (already read to sniff the format), then the rest."""

    def __init__(self, head: bytes, rest: BinaryIO) -> None:
        super().__init__()
        self._head = head
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._head:
            count = min(len(view), len(self._head))
            view[:count] = self._head[:count]
            self._head = self._head[count:]
            return count
        data = self._rest.read(len(view))
        view[: len(data)] = data
        return len(data)


def _stream_records(stream: _Readable, source: str, reference: datetime) -> Iterator[LogRecord]:
    """Chunked scan for streams (stdin, gzip): keeps a look-behind tail between chunks."""
    tail = b""
    pending = b""
    scan = _Scan(source, reference)
    emitted = 0
    try:
        while True:
            chunk = stream.read(_CHUNK_BYTES)
            if not chunk:
                break
            data = pending + chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0 and len(data) < 4 * _CHUNK_BYTES:
                pending = data
                continue
            cut = cut or len(data)
            if b"\x00" in chunk[:_SNIFF_BYTES] and not tail:
                _check_text(chunk[:_SNIFF_BYTES], source)
            buf = tail + data[:cut]
            pending = data[cut:]
            scan.last_end = -1
            yield from scan.records(buf, len(tail), len(buf), 0, emitted)
            keep = buf[-LOOKBACK_BYTES:]
            tail = keep[keep.find(b"\n") + 1 :] if len(buf) > LOOKBACK_BYTES else buf
            # Offsets in the next buffer start where ``tail`` starts in this one.
            emitted = max(0, max(scan.last_end + 1, emitted) - (len(buf) - len(tail)))
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise InputDataError(
            f"cannot read compressed or streamed input: {exc}",
            source=source,
            hint="check that the file is complete (gzip -t FILE)",
        ) from exc
    if pending:
        buf = tail + pending + b"\n"
        yield from scan.records(buf, len(tail), len(buf), 0, emitted)


def read_text_log(
    path: str, *, stdin: BinaryIO | None = None, reference: datetime | None = None
) -> Iterator[LogRecord]:
    """Open ``path`` (``-`` = ``stdin``), check it is text, and return its records lazily.

    Errors opening or recognising the input are raised here, before iteration starts:
    InputDataError (exit 7) for unreadable, binary or corrupt input. ``reference`` dates
    year-less syslog stamps (default: the file's mtime, or now for stdin).
    """
    if path == "-":
        if stdin is None:
            raise InputDataError("no standard input to read", source="-")
        head = stdin.read(_SNIFF_BYTES)
        buffered = io.BufferedReader(_Prefixed(head, stdin))
        stream: _Readable = buffered
        if head.startswith(_GZIP_MAGIC):
            stream = gzip.GzipFile(fileobj=buffered, mode="rb")
        else:
            _check_text(head, "-")
        return _stream_records(stream, "-", reference or datetime.now(timezone.utc))
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed by the generator below
        stat = os.fstat(handle.fileno())
    except IsADirectoryError as exc:
        raise InputDataError(
            "is a directory", source=path, hint="for a journal directory use --directory"
        ) from exc
    except OSError as exc:
        raise InputDataError(
            f"cannot read: {exc.strerror}",
            source=path,
            hint="check the path and permissions (kern.log is often root:adm 0640; try sudo)",
        ) from exc
    when = reference or datetime.fromtimestamp(stat.st_mtime, tz=timezone.utc)
    head = handle.read(_SNIFF_BYTES)
    handle.seek(0)
    if head.startswith(_GZIP_MAGIC):
        return _closing(
            handle, _stream_records(gzip.GzipFile(fileobj=handle, mode="rb"), path, when)
        )
    _check_text(head, path)
    if stat.st_size == 0:
        handle.close()
        return iter(())
    return _closing(handle, _mapped_records(handle, path, when))


def _mapped_records(handle: BinaryIO, source: str, reference: datetime) -> Iterator[LogRecord]:
    try:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        # Not mappable (a pipe or /proc file given by path): stream it instead.
        yield from _stream_records(handle, source, reference)
        return
    with mapped:
        scan = _Scan(source, reference)
        workers = min(os.cpu_count() or 1, _MAX_WORKERS)
        if len(mapped) >= PARALLEL_MIN_BYTES and workers > 1:
            spans = _parallel_spans(source, mapped, workers)
            if spans is not None:
                yield from scan.parse_spans(mapped, spans)
                return
        yield from scan.records(mapped, 0, len(mapped), 0)


def _segment_spans(path: str, start: int, end: int) -> list[tuple[int, int]]:
    """Candidate spans of one segment of a file (run in a worker process)."""
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        floor = max(0, start - LOOKBACK_BYTES)
        if floor:
            floor = buf.find(b"\n", floor, start) + 1 or start
        # Lines before ``start`` may be yielded as header context; the parent dedupes.
        return list(candidate_spans(buf, start, end, floor, floor))


def _parallel_spans(path: str, buf: mmap.mmap, workers: int) -> list[tuple[int, int]] | None:
    """Find candidate spans of a big file with one process per core, in file order.

    The searches are memchr-bound and hold the GIL, so processes (forked: they share the
    page cache and the mapping costs nothing) rather than threads. None if we cannot fork.
    """
    size = len(buf)
    bounds = [0]
    for index in range(1, workers):
        cut = buf.find(b"\n", size * index // workers) + 1
        bounds.append(cut if cut > bounds[-1] else bounds[-1])
    bounds.append(size)
    jobs = [(path, bounds[i], bounds[i + 1]) for i in range(workers) if bounds[i] < bounds[i + 1]]
    try:
        context = multiprocessing.get_context("fork")
        with context.Pool(len(jobs)) as pool:
            results = pool.starmap(_segment_spans, jobs)
    except (OSError, ValueError):
        return None
    return sorted({span for spans in results for span in spans})


def _closing(handle: BinaryIO, records: Iterator[LogRecord]) -> Iterator[LogRecord]:
    try:
        yield from records
    finally:
        handle.close()
