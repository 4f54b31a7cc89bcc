"""Census documents (``memforensics/census/1``) read back from files, for ``diff``: every
value checked, hostile input refused as InputDataError (exit 7), never a traceback."""

from __future__ import annotations

import json
from typing import Any, BinaryIO

from memforensics.errors import InputDataError
from memforensics.model.census import KINDS, CensusSample, CensusType

CENSUS_SCHEMA = "memforensics/census/1"
MAX_DOCUMENT_BYTES = 256 << 20
MAX_TYPES = 1_000_000


def looks_like_census(head: bytes) -> bool:
    """Whether the first bytes of a file are a census document's (a JSON object naming the
    census schema early: the renderer writes ``schema`` first)."""
    return head.lstrip()[:1] == b"{" and CENSUS_SCHEMA.encode() in head


def _types(rows: Any, label: str) -> tuple[CensusType, ...]:
    if not isinstance(rows, list) or len(rows) > MAX_TYPES:
        raise InputDataError("census without a types list", source=label)
    types: list[CensusType] = []
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise InputDataError(f"types[{index}] is not an object", source=label)
        name, kind, count, size = (row.get(k) for k in ("name", "kind", "count", "bytes"))
        if (
            not isinstance(name, str)
            or kind not in (*KINDS, "other")
            or type(count) is not int
            or type(size) is not int
            or count < 0
            or size < 0
        ):
            raise InputDataError(
                f"types[{index}]: name, kind, count, bytes are not a census line", source=label
            )
        types.append(CensusType(name, str(kind), count, size))
    return tuple(types)


def census_line(sample: CensusSample) -> dict[str, Any]:
    """A recording's line for one census sample (``kind: census``)."""
    return {
        "schema": "memforensics/sample/1",
        "kind": "census",
        "time": sample.time,
        "pid": sample.pid,
        "process": sample.process,
        "rss_bytes": None,  # every sample/1 line has it; a census does not read RSS
        "live_chunks": sample.live_chunks,
        "live_bytes": sample.live_bytes,
        "pause_seconds": round(sample.pause_seconds, 6),
        "types": [
            {"name": t.name, "kind": t.kind, "count": t.count, "bytes": t.total_bytes}
            for t in sample.types
        ],
    }


def census_samples(path: str, lines_max: int = 10_000_000) -> list[CensusSample]:
    """The census samples (``kind: census`` lines) of a JSON Lines recording; other lines
    are not looked at, a broken census line is InputDataError."""
    samples: list[CensusSample] = []
    try:
        handle = open(path, "rb")  # noqa: SIM115
    except OSError as exc:
        raise InputDataError(f"cannot read: {exc.strerror}", source=path) from exc
    with handle:
        for number, raw in enumerate(handle, start=1):
            if number > lines_max:
                break
            if b'"census"' not in raw:
                continue
            try:
                obj = json.loads(raw)
            except ValueError:
                continue  # a torn last line, or not ours: the recording reader judges it
            if not isinstance(obj, dict) or obj.get("kind") != "census":
                continue
            label = f"{path}:{number}"
            pid, time, process = obj.get("pid"), obj.get("time"), obj.get("process")
            if type(pid) is not int or not isinstance(time, str) or not isinstance(process, str):
                raise InputDataError("census line without pid, time and process", source=label)
            types = _types(obj.get("types"), label)
            samples.append(
                CensusSample(
                    time=time,
                    pid=pid,
                    process=process,
                    types=types,
                    live_chunks=sum(t.count for t in types),
                    live_bytes=sum(t.total_bytes for t in types),
                    pause_seconds=float(obj.get("pause_seconds") or 0.0),
                )
            )
    return samples


def read_census(source: str | BinaryIO, label: str) -> tuple[tuple[CensusType, ...], str | None]:
    """(types, time) of the census document in ``source``."""
    try:
        if isinstance(source, str):
            with open(source, "rb") as handle:
                raw = handle.read(MAX_DOCUMENT_BYTES + 1)
        else:
            raw = source.read(MAX_DOCUMENT_BYTES + 1)
    except OSError as exc:
        raise InputDataError(f"cannot read: {exc.strerror}", source=label) from exc
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise InputDataError("census document larger than 256 MiB", source=label)
    try:
        document: Any = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InputDataError(f"not a JSON document: {exc}", source=label) from exc
    if not isinstance(document, dict) or document.get("schema") != CENSUS_SCHEMA:
        raise InputDataError(
            f"not a {CENSUS_SCHEMA} document",
            source=label,
            hint="diff compares two census documents (what `memforensics census --json` "
            "writes) or two dumps",
        )
    types = _types(document.get("types"), label)
    time = document.get("time")
    return types, time if isinstance(time, str) else None
