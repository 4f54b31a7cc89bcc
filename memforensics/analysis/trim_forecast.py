"""Forecast of the bytes malloc_trim(0) will give back, from a dump and its heap residency.

What glibc does (malloc/malloc.c, mtrim() and systrim(), glibc >= 2.8): malloc_consolidate
first, then for every chunk in the unsorted and large bins madvise(MADV_DONTNEED) the whole
pages from align_up(chunk + sizeof(struct malloc_chunk)) to the chunk's end; then, for the
main arena only, sbrk() back the top chunk beyond MINSIZE, rounded down to pages. The RSS drop
is the part of those pages that is still resident: pages released by an earlier trim (or never
touched) give nothing, so a second trim forecasts about zero.
"""

from __future__ import annotations

from memforensics.analysis.residency import free_not_resident_bytes
from memforensics.model.heap import Arena, HeapDump
from memforensics.model.process import ArenaTrimForecast, HeapResidency, TrimForecast

_MALLOC_CHUNK_BYTES = 48  # sizeof(struct malloc_chunk) on 64-bit: the part mtrim never releases
_MINSIZE = 32

NOTES_ESTIMATED = (
    "estimated from the XML: chunk positions are not in it, so whole pages per chunk are "
    "averaged per size class and scaled by the share of the arena that is resident",
)
NOTES_ALWAYS = (
    "tcache chunks (up to 7 per size per thread) look in-use in malloc_info and are not trimmed",
    "fastbin chunks are merged first; they are at most 128 bytes and add at most a page each",
    "non-main arenas keep their top chunk: malloc_trim releases only the main arena's top",
    "the main arena keeps M_TOP_PAD (128 KiB by default) only on free(); malloc_trim(0) pads 0",
)


def _expected_whole_pages_bytes(chunk_bytes: float, page_bytes: int) -> float:
    """Expected bytes of whole pages inside one free chunk of ``chunk_bytes``.

    The releasable span starts 48 bytes in (the chunk header and list links) and ends at the
    chunk's end; for a span of L bytes at a random alignment the expected number of whole
    pages is max(L / page - 1, 0) (exact: floor/ceil average over all offsets).
    """
    span = chunk_bytes - _MALLOC_CHUNK_BYTES
    return max(span / page_bytes - 1.0, 0.0) * page_bytes


def estimate_arena_releasable(arena: Arena, resident_share: float, *, page_bytes: int) -> int:
    """Bytes malloc_trim should release from ``arena`` by the XML alone, scaled by residency."""
    whole_pages = 0.0
    for bucket in arena.sizes:
        if bucket.count <= 0 or bucket.kind == "fast":
            continue
        whole_pages += bucket.count * _expected_whole_pages_bytes(
            bucket.chunk_bytes / bucket.count, page_bytes
        )
    if arena.index == 0 and arena.top_bytes:
        whole_pages += max((arena.top_bytes - _MINSIZE - 1) // page_bytes * page_bytes, 0)
    return int(whole_pages * min(max(resident_share, 0.0), 1.0))


def forecast_trim(dump: HeapDump, residency: HeapResidency, *, page_bytes: int) -> TrimForecast:
    """Bytes malloc_trim(0) can release: whole resident pages inside free chunks + main top.

    Arenas whose free chunks were walked page by page use that measurement; the others are
    estimated from their size buckets, scaled by the share of their free memory (or else of
    their heap) that is resident.
    """
    rows: list[ArenaTrimForecast] = []
    for arena in dump.arenas:
        measured = residency.arena(arena.index)
        if measured is not None and measured.trimmable_bytes is not None:
            rows.append(ArenaTrimForecast(arena.index, measured.trimmable_bytes, measured=True))
            continue
        share = 1.0
        if measured is not None and measured.free_resident_bytes is not None and arena.free_bytes:
            share = measured.free_resident_bytes / arena.free_bytes
        elif measured is not None and measured.mapped_bytes:
            share = measured.resident_bytes / measured.mapped_bytes
        elif residency.heap_mapped_bytes:
            share = residency.heap_resident_bytes / residency.heap_mapped_bytes
        releasable = estimate_arena_releasable(arena, share, page_bytes=page_bytes)
        rows.append(ArenaTrimForecast(arena.index, releasable, measured=False))
    all_measured = bool(rows) and all(row.measured for row in rows)
    not_resident = (
        free_not_resident_bytes(dump, residency)
        if len(residency.arenas) == len(dump.arenas) and residency.free_resident_bytes is not None
        else None
    )
    notes = NOTES_ALWAYS if all_measured else NOTES_ESTIMATED + NOTES_ALWAYS
    return TrimForecast(
        releasable_bytes=sum(row.releasable_bytes for row in rows),
        arenas=tuple(rows),
        measured=all_measured,
        free_not_resident_bytes=not_resident,
        notes=notes,
    )
