"""Pure analysis of one heap dump: per-arena figures, a free-chunk histogram, and advice."""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from itertools import compress, repeat
from operator import and_, floordiv, gt, lshift, mul, sub

from memforensics.analysis.bucket_arrays import dump_sums
from memforensics.analysis.thresholds import (
    HEALTHY_FREE_RATIO,
    HEAP_ADVICE_MIN_BYTES,
    HIGH_FREE_RATIO,
    MANY_ARENAS,
    MMAP_SHARE,
    SMALL_CHUNK_SHARE,
)
from memforensics.model.advice import Advice
from memforensics.model.heap import (
    Arena,
    BucketColumns,
    HeapDump,
    bucket_columns,
    lines_over,
    top_chunk_bytes,
)
from memforensics.model.heap_analysis import (
    PAGE_BYTES,
    ArenaFigures,
    HeapAnalysis,
    HistogramRow,
    SeriesRow,
)
from memforensics.units import MiB

# Upper bounds (inclusive) of the histogram's size classes; the last class is open-ended.
# Page size splits "malloc_trim can give whole pages back" from "it cannot".
_CLASS_LIMITS_BYTES: tuple[int, ...] = (
    64,
    128,
    256,
    512,
    1024,
    PAGE_BYTES - 1,
    16 * 1024,
    64 * 1024,
    256 * 1024,
    MiB,
)


def series_row(dump: HeapDump) -> SeriesRow:
    """The headline figures of one dump of a series."""
    return SeriesRow(
        dump.sequence,
        dump.line,
        len(dump.arenas),
        dump.system_bytes,
        dump.free_bytes,
        dump.in_use_bytes,
        dump.mmap_bytes,
        dump.free_ratio,
    )


_CLASSES = len(_CLASS_LIMITS_BYTES) + 1
# Width of one class's field in the packed sums below: holds 2**72 lines of 2**56 bytes.
_FIELD_BITS = 128
_FIELD_MASK = (1 << _FIELD_BITS) - 1


def _class_sums(columns: BucketColumns) -> tuple[list[int], list[int]]:
    """(chunks, bytes) per size class over one arena's lines, without a per-line Python loop.

    A line spanning a range (large bins, unsorted) is classed by its mean chunk size. The
    weighted per-class sums are one C-level ``sum`` of values shifted into a field per class
    (a bincount in big-integer arithmetic). Suspect lines and empty lines are left out.
    """
    counts, totals = columns.counts, columns.totals
    # glibc prints regular bins with PREV_INUSE set (odd sizes, total over by count);
    # `(to & 1) > fast` is "odd and not a fastbin" (SizeBucket.chunk_bytes), line by line in C.
    prev_inuse = map(gt, map(and_, columns.tos, repeat(1)), columns.fast)
    chunk_bytes = list(map(sub, totals, map(mul, counts, prev_inuse)))
    keep: list[bool] | None = None
    if columns.any_suspect or 0 in counts:
        keep = [c > 0 and not s for c, s in zip(counts, columns.suspects(), strict=True)]
    if min(chunk_bytes, default=0) < 0:
        chunk_bytes = [max(b, 0) for b in chunk_bytes]
    if keep is not None:
        counts, chunk_bytes = list(compress(counts, keep)), list(compress(chunk_bytes, keep))
    means = map(floordiv, chunk_bytes, counts)
    shifts = list(
        map(mul, map(bisect_left, repeat(_CLASS_LIMITS_BYTES), means), repeat(_FIELD_BITS))
    )
    packed_chunks = sum(map(lshift, counts, shifts))
    packed_bytes = sum(map(lshift, chunk_bytes, shifts))
    return (
        [(packed_chunks >> (_FIELD_BITS * k)) & _FIELD_MASK for k in range(_CLASSES)],
        [(packed_bytes >> (_FIELD_BITS * k)) & _FIELD_MASK for k in range(_CLASSES)],
    )


def _rows(chunks: list[int], sizes: list[int]) -> tuple[HistogramRow, ...]:
    rows = []
    for position in range(_CLASSES):
        if chunks[position] == 0:
            continue
        low = 1 if position == 0 else _CLASS_LIMITS_BYTES[position - 1] + 1
        high = _CLASS_LIMITS_BYTES[position] if position < len(_CLASS_LIMITS_BYTES) else None
        rows.append(HistogramRow(low, high, chunks[position], sizes[position]))
    return tuple(rows)


def histogram(arenas: Iterable[Arena]) -> tuple[HistogramRow, ...]:
    """Free chunks by size class across all arenas (empty classes left out).

    A bucket line spanning a range (large bins, unsorted) is classed by its mean chunk
    size; suspect lines (uninitialised counters) are left out rather than skew the picture.
    """
    chunks = [0] * _CLASSES
    sizes = [0] * _CLASSES
    for arena in arenas:
        arena_chunks, arena_sizes = _class_sums(bucket_columns(arena.sizes))
        chunks = list(map(int.__add__, chunks, arena_chunks))
        sizes = list(map(int.__add__, sizes, arena_sizes))
    return _rows(chunks, sizes)


def arena_figures(arena: Arena, summed: tuple[int | None, bool] | None = None) -> ArenaFigures:
    """The per-arena figures (docs/heap-report.md): free = fast + rest, in use = system − free.

    ``summed``: (top bytes, suspect) where the bucket lines were already summed; else they
    are read from the arena's lines.
    """
    top_bytes, suspect = summed if summed is not None else (arena.top_bytes, arena.suspect)
    return ArenaFigures(
        index=arena.index,
        system_bytes=arena.system_bytes,
        system_max_bytes=arena.system_max_bytes,
        free_bytes=arena.free_bytes,
        fast_bytes=arena.fast_bytes,
        fast_chunks=arena.fast_chunks,
        rest_bytes=arena.rest_bytes,
        rest_chunks=arena.rest_chunks,
        in_use_bytes=arena.in_use_bytes,
        free_ratio=arena.free_ratio,
        top_bytes=top_bytes,
        subheaps=arena.subheaps,
        aspace_total_bytes=arena.aspace_total_bytes,
        aspace_mprotect_bytes=arena.aspace_mprotect_bytes,
        suspect=suspect,
    )


def _mib(count: int) -> str:
    return f"{count / MiB:.1f} MiB"


def machine_page_bytes() -> int:
    """The page size of the machine this runs on (a dump's own machine is not known)."""
    return os.sysconf("SC_PAGE_SIZE")


def trim_release_bytes(
    arenas: Sequence[Arena], main_top_bytes: int | None, *, page_bytes: int
) -> int:
    """What malloc_trim(0) would release by the XML alone, every free page taken as still
    resident: the trim forecast's own estimator (trim_forecast.estimate_buckets_releasable)
    over the arenas' size lines, with the main arena's top (``main_top_bytes``; None where the
    dump does not count it, glibc < 2.31). Other arenas' tops are not trimmed by glibc.

    Only lines whose mean chunk is over a page are handed to it (model.heap.lines_over): no
    other line holds a whole page (the estimator gives them 0), and a big dump's million
    lines need no objects.
    """
    # Imported here: the forecast brings the residency model, which `parse --help` and the
    # modules importing this one for its types need not load.
    from memforensics.analysis.trim_forecast import estimate_buckets_releasable

    lines = [line for arena in arenas for line in lines_over(arena.sizes, page_bytes)]
    return estimate_buckets_releasable(
        lines, 1.0, page_bytes=page_bytes, top_bytes=main_top_bytes or 0
    )


def _trim_advice(
    dump: HeapDump, releasable: int, page_bytes: int, machine_page: bool, top_known: bool
) -> Advice | None:
    if not (
        releasable >= HEAP_ADVICE_MIN_BYTES
        or (dump.system_bytes and releasable >= 0.1 * dump.system_bytes and releasable >= MiB)
    ):
        return None
    size = f"{page_bytes // 1024} KiB" if page_bytes % 1024 == 0 else f"{page_bytes} B"
    pages = f"{size} pages" + (", this machine's page size" if machine_page else "")
    where = (
        "in free chunks and the main arena's top"
        if top_known
        else "in free chunks (and more in the main arena's top, which this glibc's dump "
        "does not show)"
    )
    return Advice(
        "trim-would-release",
        f"{_mib(releasable)} of whole free pages ({pages}) sit {where}: malloc_trim(0) "
        "returns them to the OS (`memforensics trim PID`), unless an earlier trim already "
        "did (`memforensics inspect` shows what is still resident).",
        "warn",
    )


def advise(
    dump: HeapDump,
    figures: tuple[ArenaFigures, ...],
    rows: tuple[HistogramRow, ...],
    *,
    trim_release: int = 0,
    page_bytes: int = PAGE_BYTES,
    machine_page: bool = False,
) -> tuple[Advice, ...]:
    """Plain-words advice drawn from what is known about glibc malloc; stable codes.

    ``trim_release``: :func:`trim_release_bytes` of the dump for pages of ``page_bytes``
    (``machine_page``: that is this machine's page size, not one given for the dump).
    """
    advice: list[Advice] = []
    if dump.all_zero:
        return (
            Advice(
                "glibc-malloc-unused",
                "glibc malloc holds no memory here: it never took any from the system. "
                "If this process allocates, another allocator serves it (jemalloc, "
                "tcmalloc, …): use that allocator's own statistics.",
                "warn",
            ),
        )
    suspect = [f.index for f in figures if f.suspect]
    if suspect:
        advice.append(
            Advice(
                "suspect-counters",
                f"arena(s) {', '.join(map(str, suspect))} print implausible counters (an "
                "<unsorted> slot glibc <= 2.17 never filled in): kept out of their free "
                "figures, which therefore miss whatever sat in that bin.",
                "warn",
            )
        )
    free_bytes = sum(f.free_bytes for f in figures if not f.suspect)
    high = [f for f in figures if f.free_ratio >= HIGH_FREE_RATIO and not f.suspect]
    if len(figures) >= MANY_ARENAS and len(high) * 2 >= len(figures):
        held = sum(f.free_bytes for f in high)
        if held >= HEAP_ADVICE_MIN_BYTES:
            advice.append(
                Advice(
                    "many-arenas-high-free",
                    f"{len(high)} of {len(figures)} arenas are at least half free "
                    f"({_mib(held)} free in them): each thread's arena keeps its own free "
                    "chunks. Fewer arenas pool them: MALLOC_ARENA_MAX=2 or "
                    "GLIBC_TUNABLES=glibc.malloc.arena_max=2.",
                    "warn",
                )
            )
    page_free = sum(r.bytes for r in rows if r.page_or_larger)
    top_free = sum(f.top_bytes or 0 for f in figures)
    top_known = bool(figures) and figures[0].top_bytes is not None
    trim = _trim_advice(dump, trim_release, page_bytes, machine_page, top_known)
    if trim is not None:
        advice.append(trim)
    small_free = free_bytes - page_free - top_free
    if free_bytes >= HEAP_ADVICE_MIN_BYTES and small_free >= SMALL_CHUNK_SHARE * free_bytes:
        advice.append(
            Advice(
                "small-free-chunks",
                f"{_mib(small_free)} of the free memory is in chunks smaller than a page "
                "(fragmentation between live blocks): malloc_trim cannot release it. Fewer "
                "arenas, or allocating long- and short-lived objects apart, helps.",
                "warn",
            )
        )
    mmap_bytes = dump.mmap_bytes or 0
    if mmap_bytes >= HEAP_ADVICE_MIN_BYTES and mmap_bytes >= MMAP_SHARE * (
        mmap_bytes + dump.system_bytes
    ):
        advice.append(
            Advice(
                "mmap-heavy",
                f"{_mib(mmap_bytes)} in {dump.mmap_chunks} mmapped chunks (allocations above "
                "M_MMAP_THRESHOLD get their own mapping and go back to the OS on free). Many "
                "large short-lived blocks? Raising the threshold (mallopt M_MMAP_THRESHOLD or "
                "glibc.malloc.mmap_threshold) serves them from the heap instead.",
                "info",
            )
        )
    if dump.system_bytes and dump.free_ratio < HEALTHY_FREE_RATIO and not suspect:
        advice.append(
            Advice(
                "heap-mostly-used",
                f"only {dump.free_ratio:.0%} of arena memory is free: the heap is not "
                "bloated by free chunks; look for live data (a leak or a cache) instead.",
                "info",
            )
        )
    return tuple(advice)


def _notes(dump: HeapDump) -> tuple[str, ...]:
    return (
        "free = fast + rest: chunks sitting in malloc's bins, ready for reuse.",
        "in use = system − free: an upper bound (it still counts chunks cached in tcache, "
        "which malloc_info never shows, and per-arena bookkeeping).",
        "mmap: live allocations served by their own mappings, outside the arenas.",
        *dump.notes,
    )


def analyze(dump: HeapDump, *, page_bytes: int | None = None) -> HeapAnalysis:
    """Compute every figure, the histogram and the advice for ``dump``.

    ``page_bytes``: the page size of the machine the dump came from, for the trim estimate;
    None: this machine's (said in the advice).
    """
    machine_page = page_bytes is None
    page = machine_page_bytes() if page_bytes is None else page_bytes
    # Lines the parser judged implausible for their arena are not flagged by the vectorised
    # sums (they judge values alone): such dumps (old glibc, small) take the exact path.
    judged = any(a.implausible for a in dump.arenas)
    sums = None if judged else dump_sums(dump.arenas, _CLASS_LIMITS_BYTES)
    if sums is None:
        figures = tuple(arena_figures(a) for a in dump.arenas)
        rows = histogram(dump.arenas)
    else:  # a big dump: the same sums, vectorised over all its lines at once
        figures = tuple(
            arena_figures(a, (top_chunk_bytes(a, *bins), suspect))
            for a, bins, suspect in zip(dump.arenas, sums.bins, sums.suspect, strict=True)
        )
        rows = _rows(sums.class_chunks, sums.class_bytes)
    main_top = figures[0].top_bytes if figures and figures[0].index == 0 else None
    release = trim_release_bytes(dump.arenas, main_top, page_bytes=page)
    return HeapAnalysis(
        dump=dump,
        arenas=figures,
        histogram=rows,
        advice=advise(
            dump,
            figures,
            rows,
            trim_release=release,
            page_bytes=page,
            machine_page=machine_page,
        ),
        notes=_notes(dump),
        page_or_larger_free_bytes=sum(r.bytes for r in rows if r.page_or_larger),
        trim_release_bytes=release,
        page_bytes=page,
    )
