"""The census as JSON (``memforensics/census/1``) and the diff of two (``memforensics/
census-diff/1``); built without importing rich, so ``--json`` never loads it."""

from __future__ import annotations

from typing import Any

from memforensics.analysis.census_diff import CensusDiff
from memforensics.model.census import Census
from memforensics.render.jsondoc import record

CENSUS_SCHEMA = "memforensics/census/1"
CENSUS_DIFF_SCHEMA = "memforensics/census-diff/1"


def census_json(census: Census, *, source: str, top: int | None = None) -> dict[str, Any]:
    """The census document: every type (or the ``top`` biggest and one ``other`` line)."""
    types: list[dict[str, Any]] = [
        {"name": t.name, "kind": t.kind, "count": t.count, "bytes": t.total_bytes}
        for t in census.types
    ]
    if top is not None and len(types) > top:
        rest = types[top:]
        types = [
            *types[:top],
            {
                "name": "other",
                "kind": "other",
                "count": sum(t["count"] for t in rest),
                "bytes": sum(t["bytes"] for t in rest),
            },
        ]
    return {
        "schema": CENSUS_SCHEMA,
        "source": source,
        "time": census.time,
        "process": {"pid": census.pid, "name": census.process_name},
        "python_layout": census.read.python_layout,
        "totals": {
            "live_chunks": census.live_chunks,
            "live_bytes": census.live_bytes,
            "classified_bytes": census.classified_bytes,
            "unread_chunks": census.unread_chunks,
            "unread_bytes": census.unread_bytes,
        },
        "types": types,
        "read": record(census.read),
    }


def census_diff_json(diff: CensusDiff, *, old_name: str, new_name: str) -> dict[str, Any]:
    """The diff document: per type the change in count and bytes, biggest growth first."""
    return {
        "schema": CENSUS_DIFF_SCHEMA,
        "old": old_name,
        "new": new_name,
        "seconds": diff.seconds,
        "totals": {
            "live_chunks_delta": diff.live_chunks_delta,
            "live_bytes_delta": diff.live_bytes_delta,
        },
        "types": [record(row) for row in diff.types],
    }
