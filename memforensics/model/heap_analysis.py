"""What a heap report shows, computed once from a HeapDump (analysis.heap computes it): the
per-arena and whole-process figures, the free-chunk histogram, the advice."""

from __future__ import annotations

from dataclasses import dataclass

from memforensics.model.advice import Advice
from memforensics.model.heap import HeapDump

# The histogram's page: where its size classes split (docs/json.md: "at least a page (4 KiB)").
# The trim estimate takes the page size of the machine the dump came from instead.
PAGE_BYTES = 4096


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
    """The figures a report shows for one arena, in the order its JSON lists them.

    Every field is a key of ``arenas[]`` in ``memforensics/heap/1`` (docs/json.md): a new
    field here is a new key there.
    """

    index: int
    system_bytes: int
    system_max_bytes: int
    free_bytes: int
    fast_bytes: int | None
    fast_chunks: int | None
    rest_bytes: int
    rest_chunks: int
    in_use_bytes: int
    free_ratio: float
    top_bytes: int | None
    subheaps: int | None
    aspace_total_bytes: int | None
    aspace_mprotect_bytes: int | None
    suspect: bool


@dataclass(frozen=True, slots=True)
class HeapTotals:
    """Whole-process figures of one dump, in the order ``totals`` lists them in JSON."""

    arenas: int
    system_bytes: int
    system_max_bytes: int
    free_bytes: int
    fast_bytes: int | None
    fast_chunks: int | None
    rest_bytes: int
    rest_chunks: int
    in_use_bytes: int
    mmap_bytes: int | None
    mmap_chunks: int | None
    free_ratio: float
    page_or_larger_free_bytes: int
    aspace_total_bytes: int | None
    aspace_mprotect_bytes: int | None
    all_zero: bool
    suspect: bool


@dataclass(frozen=True, slots=True)
class SeriesRow:
    """One dump of a file holding a series: where it is and its headline figures."""

    sequence: int
    line: int
    arenas: int
    system_bytes: int
    free_bytes: int
    in_use_bytes: int
    mmap_bytes: int | None
    free_ratio: float


@dataclass(frozen=True, slots=True)
class HeapAnalysis:
    """Everything a heap report shows, computed once from a HeapDump."""

    dump: HeapDump
    arenas: tuple[ArenaFigures, ...]
    histogram: tuple[HistogramRow, ...]
    advice: tuple[Advice, ...]
    notes: tuple[str, ...]
    page_or_larger_free_bytes: int  # free bytes in chunks of at least a page
    # What malloc_trim(0) would release by the XML alone, every free page taken as resident
    # (trim_release_bytes), and the page size that estimate assumed.
    trim_release_bytes: int = 0
    page_bytes: int = PAGE_BYTES

    @property
    def suspect(self) -> bool:
        """True when some arena's counters are implausible (old glibc garbage)."""
        return any(a.suspect for a in self.arenas)

    @property
    def totals(self) -> HeapTotals:
        """The whole-process figures."""
        dump = self.dump
        return HeapTotals(
            arenas=len(dump.arenas),
            system_bytes=dump.system_bytes,
            system_max_bytes=dump.system_max_bytes,
            free_bytes=dump.free_bytes,
            fast_bytes=dump.fast_bytes,
            fast_chunks=dump.fast_chunks,
            rest_bytes=dump.rest_bytes,
            rest_chunks=dump.rest_chunks,
            in_use_bytes=dump.in_use_bytes,
            mmap_bytes=dump.mmap_bytes,
            mmap_chunks=dump.mmap_chunks,
            free_ratio=dump.free_ratio,
            page_or_larger_free_bytes=self.page_or_larger_free_bytes,
            aspace_total_bytes=dump.aspace_total_bytes,
            aspace_mprotect_bytes=dump.aspace_mprotect_bytes,
            all_zero=dump.all_zero,
            suspect=self.suspect,
        )
