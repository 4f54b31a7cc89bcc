"""Frozen dataclasses for what a read of a live glibc heap found, before any dump is matched."""

from __future__ import annotations

from dataclasses import dataclass

from memforensics.model.corruption import HeapCorruption
from memforensics.model.process import HeapSegment


@dataclass(frozen=True, slots=True)
class BinFigures:
    """One arena's figures as glibc's malloc_info collects them under the arena's lock, read
    from memory instead: every bin was read consistently in one stop of the target (an arena
    read in parts, ArenaScan.parts: each bin in one stop, its bins in its parts' stops)."""

    fastbin_chunks: tuple[int, ...]  # chunks in each fastbin; fastbin i holds (i + 2) * 16 B
    # Each non-empty list bin, ascending (1 = unsorted): (bin, chunks, smallest, largest and
    # summed size word with its flag bits), glibc's chunksize_nomask, as malloc_info prints.
    bins: tuple[tuple[int, int, int, int, int], ...]
    top_bytes: int  # chunksize(top): malloc_info counts it in "rest" (glibc >= 2.31)
    system_bytes: int  # system_mem
    max_system_bytes: int  # max_system_mem
    aspace_bytes: int  # main: system_mem; others: the sum of heap_info.size over its heaps
    aspace_mprotect_bytes: int  # main: system_mem; others: the sum of mprotect_size
    subheaps: int  # heaps of a non-main arena (0 for the main arena)


@dataclass(frozen=True, slots=True)
class MallocParams:
    """The process-wide counters of glibc's ``mp_`` that malloc_info prints, read from memory."""

    address: int  # of ``mp_`` in libc's data
    layout: str  # which struct malloc_par: "2.26" (2.26 … 2.34) or "2.35" (2.35 and later)
    mmap_chunks: int  # n_mmaps: chunks served by their own mmap now
    mmapped_bytes: int  # mmapped_mem
    max_mmap_chunks: int  # max_n_mmaps
    max_mmapped_bytes: int  # max_mmapped_mem
    mmap_threshold_bytes: int
    trim_threshold_bytes: int
    sbrk_base: int  # where the main arena's first sbrk (or its mmap fallback) began; 0: none


@dataclass(frozen=True, slots=True)
class ArenaScan:
    """One arena of the process as read through /proc/PID/mem."""

    address: int | None  # its malloc_state; None for a main arena whose state was not found
    is_main: bool
    system_bytes: int | None  # malloc_state.system_mem at the read
    layout_ok: bool  # non-main: system_mem equals its heaps' sizes (re-read while it moved)
    # Its memory: sub-heaps; for the main arena [heap] first (when there is one), then any
    # segments it mmapped beyond [heap] when sbrk failed.
    segments: tuple[HeapSegment, ...]
    walked: bool  # its bins were walked (some may still be in unmeasured_bins)
    free_bytes: int = 0  # chunk bytes of the bins read consistently, fastbins and top
    free_resident_bytes: int = 0
    trimmable_bytes: int = 0  # resident whole pages malloc_trim releases from those
    chunks: int = 0
    unmeasured_bins: tuple[int, ...] = ()  # 0 = fastbins, 1 = unsorted, 2 … 126
    retries: int = 0
    budget_reached: bool = False  # its walk ran out of time (or of the pages it may copy)
    # Of budget_reached: its lists were too long to follow within a stop or to copy within
    # our memory, not merely left when the read's own time ran out.
    lists_too_long: bool = False
    top_bytes: int | None = None
    top_resident_bytes: int | None = None
    top_address: int | None = None
    # Per bin read consistently, sorted: (bin, chunks, bytes); 0 = the fastbins, 1 = unsorted.
    bins: tuple[tuple[int, int, int], ...] = ()
    # Main arena: the top's resident pages as [start, end) runs; None when not listed.
    top_resident_runs: tuple[tuple[int, int], ...] | None = None
    # Main arena: its top ends at the program break (the end of [heap]), the only top that
    # malloc_trim's systrim gives back; False for a top in a segment mmapped when sbrk
    # failed; None when not known (or not the main arena).
    top_at_brk: bool | None = None
    # malloc_info's figures for this arena, when the read asked for them and every bin was
    # read consistently in a stop (scan_heap's ``hold``; one stop, or one per part); else None.
    figures: BinFigures | None = None
    # Times the arena was found locked (its mutex held) and read again after the target ran.
    lock_retries: int = 0
    # Checks glibc's own that failed in a copy made while the target was held: the heap is
    # corrupt there (its bins are left unmeasured, never estimated).
    corruption: tuple[HeapCorruption, ...] = ()
    # Bytes of its heaps copied from the target inside stops (a held read); whether its
    # lists were scouted first (then only the pages they lie on were copied).
    stop_copy_bytes: int = 0
    scouted: bool = False
    # Of a scouted arena: its stop found the scout's copy unchanged at every word the walk
    # read (checked against the held target), and copied none of its pages again.
    scout_kept: bool = False
    # Of those: its walk was made before the stop over the scout's copy (the stop's check
    # then held for the very malloc_state that walk read), not in the stop.
    walked_before_stop: bool = False
    # Read in parts, one stop each (bins [first, last] per part, in order), where its lists lay
    # on more pages than one stop copies without a care: each bin was read consistently in
    # one stop, the arena's bins in as many stops as parts, milliseconds apart. () for an arena
    # read in one stop (or running). A single part's scan names its one part.
    parts: tuple[tuple[int, int], ...] = ()
    # Read in relays (bin_relay): lists too long for one stop, each followed in the held
    # target a stretch per stop, in this many stops (0: not relayed). Each chunk was read in
    # a stop; a list followed over several stops, milliseconds apart, is counted as it was at
    # each of them.
    relay_stops: int = 0
    # Of a relayed arena: lists whose chunks lay too far apart to follow were read by a sweep
    # of its heaps (list_sweep), their links checked in our memory.
    swept: bool = False
    # Of a swept arena: its lists moved between the sweep's stops (threads busy in it), and
    # it was swept again in one stop of every thread (its figures that one moment's; that
    # stop as long as the walk of its heaps).
    swept_in_one_stop: bool = False
    # Of an arena refused as lists too long: why its read in relays (or its sweep) gave up,
    # in a few words; None where it was not tried.
    relay_gave_up: str | None = None


@dataclass(frozen=True, slots=True)
class HeapScan:
    """Every arena found in a process, in malloc_info's order when ``chained``."""

    pid: int
    page_bytes: int
    chained: bool  # main_arena found and its ``next`` list followed: arenas in dump order
    arenas: tuple[ArenaScan, ...]
    heap_mapped_bytes: int
    heap_resident_bytes: int
    mmap_chunks: int
    mmap_chunk_bytes: int
    mmap_chunk_resident_bytes: int
    stack_resident_bytes: int
    anon_resident_bytes: int
    walk_seconds: float
    walk_budget_seconds: float
    notes: tuple[str, ...] = ()
    # The search for mmapped chunks looked at all anonymous memory (False: its time ran out,
    # ``mmap_chunks`` may miss some; a note says so).
    mmap_search_complete: bool = True
    # Only the arenas were read (no mmapped chunks, no stacks): their figures stand, the
    # process-wide ones (mmap_*, stack_resident_bytes) are not figures and must not be shown.
    arenas_only: bool = False
    # glibc's mp_ counters, when the read asked for malloc_info's figures and found them.
    malloc_params: MallocParams | None = None
    # The process's smaps summed as smaps_rollup sums them (Rss, Pss, Anonymous, Swap,
    # Private_Clean, Private_Dirty, bytes), from the read of smaps the scan started with.
    smaps_totals: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class ReadOnlyRead:
    """How a read-only report was read: the stops it cost the target, what decided the layout."""

    source: str  # "live" or "core"
    stops: int  # times every thread was held (0 for a core file)
    longest_stop_seconds: float
    total_stop_seconds: float
    lock_retries: int  # arenas found locked at a stop, read again after the target ran
    malloc_par_layout: str  # struct malloc_par's layout found in memory: "2.26" or "2.35"
    glibc_version: str | None  # from libc's banner; decides the document's dialect
    heap_info_bytes: int | None  # a thread arena's offset in its first heap: 32 (< 2.35) or 48
    tcache_chunk_bytes: int | None  # the main heap's first chunk when it is the tcache struct
    read_seconds: float  # the whole read, stops included
    # Heap bytes copied from the target inside the stops; arenas whose lists were scouted
    # first (their stops copied only the pages the lists lie on). 0 for a core.
    stop_copy_bytes: int = 0
    scouted_arenas: int = 0
    scout_kept_arenas: int = 0  # of those, arenas whose stop kept the scout's copy
    walked_before_stop_arenas: int = 0  # of those, arenas walked before their stops
    # Of those, arenas read in parts, one stop each (ArenaScan.parts), and their parts in all.
    parted_arenas: int = 0
    arena_parts: int = 0
    # Arenas read in relays (ArenaScan.relay_stops: lists too long for one stop), and the
    # stops their relays took in all.
    relayed_arenas: int = 0
    relay_stops: int = 0
    # Arenas whose lists were swept (ArenaScan.swept): live, of the relayed ones; a core's
    # lists past what its walk keeps are swept with no relay.
    swept_arenas: int = 0
    swept_in_one_stop_arenas: int = 0  # of those, swept in one stop (ArenaScan's)
