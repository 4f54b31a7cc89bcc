"""Recording lines (``memforensics/sample/1``): one JSON object per sample or event."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from memforensics.model.process import Waterfall
from memforensics.model.series import Sample, SeriesEvent

SAMPLE_SCHEMA = "memforensics/sample/1"


def iso_time(moment: datetime | None) -> str | None:
    """ISO-8601 UTC with milliseconds and a Z, as every memforensics document writes times."""
    if moment is None:
        return None
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _waterfall(wf: Waterfall) -> list[dict[str, Any]]:
    return [
        {
            "key": line.key,
            "label": line.label,
            "bytes": line.bytes,
            "depth": line.depth,
            "estimate": line.estimate,
            "in_rss": line.in_rss,
            "kind": line.kind,
        }
        for line in wf.lines
    ]


def sample_line(sample: Sample) -> dict[str, Any]:
    """The recording line of one sample (docs/json.md, ``memforensics/sample/1``)."""
    line: dict[str, Any] = {
        "schema": SAMPLE_SCHEMA,
        "kind": sample.kind,
        "time": iso_time(sample.time),
        "pid": sample.pid,
        "process": sample.process,
        "rss_bytes": sample.rss_bytes,
        "anon_bytes": sample.anon_bytes,
    }
    if sample.kind != "heap":
        return line
    line["totals"] = dict(sample.totals or {})
    line["pause_seconds"] = None if sample.pause_seconds is None else round(sample.pause_seconds, 6)
    if sample.free_resident_bytes is not None:
        line["free_resident_bytes"] = sample.free_resident_bytes
    if sample.runtime is not None:
        line["runtime"] = sample.runtime
    line["arenas"] = [
        {
            "index": a.index,
            "system_bytes": a.system_bytes,
            "in_use_bytes": a.in_use_bytes,
            "free_bytes": a.free_bytes,
            "free_ratio": round(a.free_ratio, 6),
            "top_bytes": a.top_bytes,
        }
        for a in sample.arenas
    ]
    line["histogram"] = [
        {"from_bytes": r.from_bytes, "to_bytes": r.to_bytes, "chunks": r.chunks, "bytes": r.bytes}
        for r in sample.histogram
    ]
    line["waterfall"] = None if sample.waterfall is None else _waterfall(sample.waterfall)
    line["advice"] = [
        {"code": a.code, "severity": a.severity, "message": a.message} for a in sample.advice
    ]
    return line


def event_line(event: SeriesEvent) -> dict[str, Any]:
    """The recording line of an event: a skipped heap sample, an exit, an OOM kill."""
    return {
        "schema": SAMPLE_SCHEMA,
        "kind": "event",
        "event": event.kind,
        "time": iso_time(event.time),
        "pid": event.pid,
        "process": event.process,
        "rss_bytes": event.rss_bytes,
        "message": event.message,
        "detail": dict(event.detail),
    }
