"""Read-only scans built by hand for the unit tests of what is made from them (reports, the
malloc_info image, the residency): every field a test does not name is empty (no bytes, no
chunks, no time spent), so a figure a test checks comes from the fields it set."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from memforensics.model.heapscan import ArenaScan, HeapScan

PAGE_BYTES = 4096


def arena_scan(address: int, **fields: Any) -> ArenaScan:
    """A walked thread arena at ``address`` of 1 MiB of system memory with no segment and no
    chunk, ``fields`` set over that."""
    base = ArenaScan(
        address=address,
        is_main=False,
        system_bytes=1 << 20,
        layout_ok=True,
        segments=(),
        walked=True,
    )
    return replace(base, **fields)


def heap_scan(arenas: Iterable[ArenaScan], **fields: Any) -> HeapScan:
    """A chained read of ``arenas`` (pid 1, 4 KiB pages) with no mapped, resident or mmapped
    bytes outside what ``fields`` set, done in no time within a budget of 1 s."""
    base = HeapScan(
        pid=1,
        page_bytes=PAGE_BYTES,
        chained=True,
        arenas=tuple(arenas),
        heap_mapped_bytes=0,
        heap_resident_bytes=0,
        mmap_chunks=0,
        mmap_chunk_bytes=0,
        mmap_chunk_resident_bytes=0,
        stack_resident_bytes=0,
        anon_resident_bytes=0,
        walk_seconds=0.0,
        walk_budget_seconds=1.0,
    )
    return replace(base, **fields)
