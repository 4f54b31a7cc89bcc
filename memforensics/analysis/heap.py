"""Pure analysis of one heap dump: per-arena figures, a free-chunk histogram, and advice."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from memforensics.model.advice import Advice
from memforensics.model.heap import Arena, HeapDump

PAGE_BYTES = 4096
MiB = 1 << 20

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

# Advice thresholds: small heaps are not worth a warning whatever their ratios.
_MANY_ARENAS = 8
_HIGH_FREE_RATIO = 0.5
_WORTH_MENTIONING_BYTES = 16 * MiB
_SMALL_CHUNK_SHARE = 0.7
_MMAP_SHARE = 0.5
_HEALTHY_FREE_RATIO = 0.2


@dataclass(frozen=True, slots=True)
class HistogramRow:
    """Free chunks of one size class, merged across arenas."""

    from_bytes: int
    to_bytes: int | None  # None: open-ended last class
    chunks: int
    bytes: int

    @property
    def page_or_larger(self) -> bool:
        """Chunks of this class can hold whole pages that malloc_trim may release."""
        return self.from_bytes >= PAGE_BYTES


@dataclass(frozen=True, slots=True)
class ArenaFigures:
    """The figures a report shows for one arena (bucket artefacts already removed)."""

    index: int
    system_bytes: int
    system_max_bytes: int
    free_bytes: int
    fast_bytes: int | None
    rest_bytes: int
    in_use_bytes: int
    free_ratio: float
    top_bytes: int | None
    subheaps: int | None
    suspect: bool


@dataclass(frozen=True, slots=True)
class HeapAnalysis:
    """Everything a heap report shows, computed once from a HeapDump."""

    dump: HeapDump
    arenas: tuple[ArenaFigures, ...]
    histogram: tuple[HistogramRow, ...]
    advice: tuple[Advice, ...]
    notes: tuple[str, ...]
    page_or_larger_free_bytes: int  # free bytes in chunks of at least a page

    @property
    def suspect(self) -> bool:
        """True when some arena's counters are implausible (old glibc garbage)."""
        return any(a.suspect for a in self.arenas)


def _class_index(chunk_bytes: int) -> int:
    for position, limit in enumerate(_CLASS_LIMITS_BYTES):
        if chunk_bytes <= limit:
            return position
    return len(_CLASS_LIMITS_BYTES)


def histogram(arenas: Iterable[Arena]) -> tuple[HistogramRow, ...]:
    """Free chunks by size class across all arenas (empty classes left out).

    A bucket line spanning a range (large bins, unsorted) is classed by its mean chunk
    size; suspect lines (uninitialised counters) are left out rather than skew the picture.
    """
    classes = len(_CLASS_LIMITS_BYTES) + 1
    chunks = [0] * classes
    sizes = [0] * classes
    for arena in arenas:
        for bucket in arena.sizes:
            if bucket.suspect or bucket.count == 0:
                continue
            chunk_bytes = bucket.chunk_bytes
            position = _class_index(chunk_bytes // bucket.count)
            chunks[position] += bucket.count
            sizes[position] += chunk_bytes
    rows = []
    for position in range(classes):
        if chunks[position] == 0:
            continue
        low = 1 if position == 0 else _CLASS_LIMITS_BYTES[position - 1] + 1
        high = _CLASS_LIMITS_BYTES[position] if position < len(_CLASS_LIMITS_BYTES) else None
        rows.append(HistogramRow(low, high, chunks[position], sizes[position]))
    return tuple(rows)


def arena_figures(arena: Arena) -> ArenaFigures:
    """The per-arena figures of DESIGN.md: free = fast + rest, in use = system − free."""
    return ArenaFigures(
        index=arena.index,
        system_bytes=arena.system_bytes,
        system_max_bytes=arena.system_max_bytes,
        free_bytes=arena.free_bytes,
        fast_bytes=arena.fast_bytes,
        rest_bytes=arena.rest_bytes,
        in_use_bytes=arena.in_use_bytes,
        free_ratio=arena.free_ratio,
        top_bytes=arena.top_bytes,
        subheaps=arena.subheaps,
        suspect=arena.suspect,
    )


def _mib(count: int) -> str:
    return f"{count / MiB:.1f} MiB"


def advise(
    dump: HeapDump, figures: tuple[ArenaFigures, ...], rows: tuple[HistogramRow, ...]
) -> tuple[Advice, ...]:
    """Plain-words advice drawn from what is known about glibc malloc; stable codes."""
    advice: list[Advice] = []
    if dump.all_zero:
        return (
            Advice(
                "glibc-malloc-unused",
                "glibc malloc holds no memory here: this process allocates with another "
                "allocator (jemalloc, tcmalloc, …); use that allocator's own statistics.",
                "warn",
            ),
        )
    suspect = [f.index for f in figures if f.suspect]
    if suspect:
        advice.append(
            Advice(
                "suspect-counters",
                f"arena(s) {', '.join(map(str, suspect))} print implausible <unsorted> counts "
                "(uninitialised in glibc <= 2.17): their free figures are not reliable.",
                "warn",
            )
        )
    free_bytes = sum(f.free_bytes for f in figures if not f.suspect)
    high = [f for f in figures if f.free_ratio >= _HIGH_FREE_RATIO and not f.suspect]
    if len(figures) >= _MANY_ARENAS and len(high) * 2 >= len(figures):
        held = sum(f.free_bytes for f in high)
        if held >= _WORTH_MENTIONING_BYTES:
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
    releasable = page_free + top_free
    if releasable >= _WORTH_MENTIONING_BYTES or (
        dump.system_bytes and releasable >= 0.1 * dump.system_bytes and releasable >= MiB
    ):
        advice.append(
            Advice(
                "trim-would-release",
                f"{_mib(releasable)} sit in free chunks of a page or more (and top): "
                "malloc_trim(0) returns their whole pages to the OS "
                "(`memforensics trim PID`), unless an earlier trim already did "
                "(`memforensics inspect` shows what is still resident).",
                "warn",
            )
        )
    small_free = free_bytes - page_free - top_free
    if free_bytes >= _WORTH_MENTIONING_BYTES and small_free >= _SMALL_CHUNK_SHARE * free_bytes:
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
    if mmap_bytes >= _WORTH_MENTIONING_BYTES and mmap_bytes >= _MMAP_SHARE * (
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
    if dump.system_bytes and dump.free_ratio < _HEALTHY_FREE_RATIO and not suspect:
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


def analyze(dump: HeapDump) -> HeapAnalysis:
    """Compute every figure, the histogram and the advice for ``dump``."""
    figures = tuple(arena_figures(a) for a in dump.arenas)
    rows = histogram(dump.arenas)
    return HeapAnalysis(
        dump=dump,
        arenas=figures,
        histogram=rows,
        advice=advise(dump, figures, rows),
        notes=_notes(dump),
        page_or_larger_free_bytes=sum(r.bytes for r in rows if r.page_or_larger),
    )
