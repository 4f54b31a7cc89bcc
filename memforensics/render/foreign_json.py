"""The ``allocator`` object of inspect's JSON (docs/json.md): which allocator serves malloc,
and for jemalloc, tcmalloc and mimalloc their figures in the one vocabulary and by their own
names. Built without rich."""

from __future__ import annotations

from typing import Any

from memforensics.model.allocator import ForeignHeap
from memforensics.model.process import AllocatorInfo


def allocator_json(info: AllocatorInfo, heap: ForeignHeap | None) -> dict[str, Any]:
    """``name``, ``version``, ``library`` always; the figures when ``heap`` was read."""
    foreign = info.foreign
    document: dict[str, Any] = {
        "name": info.kind,
        "version": heap.version if heap is not None else info.glibc_version,
        "library": foreign.path
        if foreign is not None and foreign.serves_malloc
        else info.libc_path,
        "prefix": foreign.prefix if foreign is not None and foreign.serves_malloc else None,
        "beside": None,
    }
    if foreign is not None and not foreign.serves_malloc:
        document["beside"] = {
            "name": foreign.kind,
            "library": foreign.path,
            "prefix": foreign.prefix,
        }
    if heap is None:
        return document
    document.update(
        {
            "in_use_bytes": heap.in_use_bytes,
            "free_bytes": heap.free_bytes,
            "releasable_bytes": heap.releasable_bytes,
            "fragmentation_bytes": heap.fragmentation_bytes,
            "metadata_bytes": heap.metadata_bytes,
            "resident_bytes": heap.resident_bytes,
            "mapped_bytes": heap.mapped_bytes,
            "retained_bytes": heap.retained_bytes,
            "stop_seconds": round(heap.stop_seconds, 6),
            "longest_stop_seconds": round(heap.longest_stop_seconds, 6),
            "holds": heap.holds,
            "figures": dict(heap.figures),
        }
    )
    return document
