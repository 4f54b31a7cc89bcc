"""Forecast of the bytes malloc_trim(0) will give back, from a dump and its heap residency.

What glibc does (malloc/malloc.c, mtrim() and systrim(), glibc >= 2.8): malloc_consolidate
first, then for every chunk in the unsorted and large bins madvise(MADV_DONTNEED) the whole
pages from align_up(chunk + sizeof(struct malloc_chunk)) to the chunk's end; then, for the
main arena only, sbrk() back the top chunk beyond MINSIZE, rounded down to pages. The RSS drop
is the part of those pages that is still resident: pages released by an earlier trim (or never
touched) give nothing, so a second trim forecasts about zero. The arithmetic is
memforensics.model.glibc's, shared with the walk.
"""

from __future__ import annotations

from collections.abc import Iterable

from memforensics.model import glibc
from memforensics.model.heap import Arena, HeapDump, SizeBucket
from memforensics.model.process import ArenaTrimForecast, HeapResidency, TrimForecast
from memforensics.units import format_bytes

NOTES_ESTIMATED = (
    "estimated from the XML: chunk positions are not in it, so whole pages per chunk are "
    "averaged per size class and scaled by the share of the arena that is resident",
)
NOTES_ALWAYS = (
    "tcache chunks (up to 7 per size per thread) look in-use in malloc_info and are not trimmed",
    "fastbin chunks are merged first; they are at most 128 bytes and add at most a page each",
    "non-main arenas keep their top chunk: malloc_trim releases only the main arena's top",
    "the main arena keeps M_TOP_PAD (128 KiB by default) only on free(); malloc_trim pads only "
    "by its argument (--pad)",
)


def _expected_whole_pages_bytes(chunk_bytes: float, page_bytes: int) -> float:
    """Expected bytes of whole pages inside one free chunk of ``chunk_bytes``.

    The releasable span starts sizeof(struct malloc_chunk) bytes in and ends at the chunk's
    end; for a span of L bytes at a random alignment the expected number of whole pages is
    max(L / page - 1, 0) (exact: floor/ceil average over all offsets).
    """
    span = chunk_bytes - glibc.MALLOC_CHUNK_BYTES
    return max(span / page_bytes - 1.0, 0.0) * page_bytes


def estimate_buckets_releasable(
    buckets: Iterable[SizeBucket],
    resident_share: float,
    *,
    page_bytes: int,
    top_bytes: int = 0,
    pad_bytes: int = 0,
) -> int:
    """Bytes malloc_trim(``pad_bytes``) should release from these dump lines (and a
    main-arena top of ``top_bytes``) by the XML alone, scaled by the share that is resident."""
    whole_pages = 0.0
    for bucket in buckets:
        if bucket.count <= 0 or bucket.kind == "fast":
            continue
        whole_pages += bucket.count * _expected_whole_pages_bytes(
            bucket.chunk_bytes / bucket.count, page_bytes
        )
    whole_pages += glibc.systrim_release_bytes(top_bytes, page_bytes, pad_bytes) if top_bytes else 0
    return int(whole_pages * min(max(resident_share, 0.0), 1.0))


def estimate_arena_releasable(
    arena: Arena, resident_share: float, *, page_bytes: int, pad_bytes: int = 0
) -> int:
    """Bytes malloc_trim should release from ``arena`` by the XML alone, scaled by residency."""
    return estimate_buckets_releasable(
        arena.sizes,
        resident_share,
        page_bytes=page_bytes,
        top_bytes=(arena.top_bytes or 0) if arena.index == 0 else 0,
        pad_bytes=pad_bytes,
    )


def _xml_row(arena: Arena, residency: HeapResidency | None, page_bytes: int, pad_bytes: int) -> int:
    """An arena with no walk at all: the XML scaled by the resident share known for it."""
    measured = residency.arena(arena.index) if residency is not None else None
    share = 1.0
    if measured is not None and measured.free_resident_bytes is not None and arena.free_bytes:
        share = measured.free_resident_bytes / arena.free_bytes
    elif measured is not None and measured.mapped_bytes:
        share = measured.resident_bytes / measured.mapped_bytes
    elif residency is not None and residency.heap_mapped_bytes:
        share = residency.heap_resident_bytes / residency.heap_mapped_bytes
    return estimate_arena_releasable(arena, share, page_bytes=page_bytes, pad_bytes=pad_bytes)


def forecast_trim(
    dump: HeapDump, residency: HeapResidency | None, *, page_bytes: int, pad_bytes: int = 0
) -> TrimForecast:
    """Bytes malloc_trim(``pad_bytes``) can release: whole resident pages inside free chunks
    plus the main arena's top beyond the pad when it ends at the program break.

    ``residency`` must have been built for the same ``pad_bytes`` (its trimmable figures are).

    Per arena the same figures as the residency: what the walk measured plus, for the bins it
    could not read, the XML estimate; arenas never walked are estimated from their size
    lines, scaled by the share of their free memory (or else of their heap) that is resident.
    With no residency at all (pagemap unreadable) the XML alone is used and the notes say so.
    """
    rows: list[ArenaTrimForecast] = []
    for arena in dump.arenas:
        measured = residency.arena(arena.index) if residency is not None else None
        if measured is not None and measured.trimmable_bytes is not None:
            estimated = measured.estimated_trimmable_bytes
            rows.append(
                ArenaTrimForecast(
                    arena.index,
                    measured.trimmable_bytes,
                    measured=measured.estimated_free_bytes == 0 and measured.balanced,
                    estimated_bytes=estimated,
                )
            )
            continue
        releasable = _xml_row(arena, residency, page_bytes, pad_bytes)
        rows.append(ArenaTrimForecast(arena.index, releasable, False, estimated_bytes=releasable))
    all_measured = bool(rows) and all(row.measured for row in rows)
    not_resident = (
        residency.measured_not_resident_bytes
        if residency is not None and len(residency.arenas) == len(dump.arenas)
        else None
    )
    releasable_total = sum(row.releasable_bytes for row in rows)
    estimated_total = sum(row.estimated_bytes for row in rows)
    share = residency.measured_share if residency is not None else 0.0
    notes: list[str] = []
    if residency is None:
        notes.append(
            "which pages are resident is unknown: the forecast assumes every free page the "
            "XML counts is still in RAM (an upper bound)"
        )
    if estimated_total:
        notes.extend(NOTES_ESTIMATED)
    if not all_measured:
        notes.append(
            f"error bar: {format_bytes(releasable_total - estimated_total)} measured, "
            f"{format_bytes(estimated_total)} estimated; {share:.0%} of the free bytes measured"
        )
    notes.extend(NOTES_ALWAYS)
    return TrimForecast(
        releasable_bytes=releasable_total,
        arenas=tuple(rows),
        measured=all_measured,
        free_not_resident_bytes=not_resident,
        notes=tuple(notes),
        estimated_bytes=estimated_total,
        measured_share=share,
    )
