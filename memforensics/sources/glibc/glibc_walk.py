"""Walks of one glibc arena's free lists in a running process, consistent or retried.

Everything goes through /proc/PID/mem while the target runs, so any structure can change
between two reads. Each free list is therefore walked with a consistency check (every chunk
aligned and inside the arena's heaps, its size fitting the bin, its ``bk`` naming the chunk
before it, the list returning to the bin's head with the head's ``bk`` naming the last
chunk); a list caught moving is read again from a fresh copy, a bounded number of times, and
only a bin that still fails is left for the caller to estimate. Memory is copied in blocks of
whole resident pages, once per block, so dense free lists cost one read per run of pages,
not one per chunk. The loops that check and measure a list are heapcopy's (C where built);
whether fastbin pointers are safe-linked is decided here, once per arena, and handed to them.
Layout constants: memforensics.model.glibc.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import compress
from operator import ne

from memforensics.model import glibc
from memforensics.model.corruption import HeapCorruption
from memforensics.sources import optional_native
from memforensics.sources.glibc import arena_parts, heap_checks
from memforensics.sources.glibc.glibc_arenas import ArenaState, Heap, parse_state, read_state
from memforensics.sources.glibc.heap_checks import bin_head
from memforensics.sources.glibc.heapcopy import (
    EMPTY_TALLY,
    BufferPool,
    CopiesForC,
    OutOfPages,
    OutOfTime,
    Segment,
    Tally,
    both,
    copy_again,
    copy_into,
    follow_fastbin,
    follow_list,
    plan_holds,
    resident_runs,
    unchanged_in_target,
    unchanged_plan,
    walk_copies,
    walk_fastbin_copies,
)
from memforensics.sources.proc.cpu_quota import stop_reading_seconds, wall_per_cpu_second
from memforensics.sources.proc.procfs import runnable_tasks
from memforensics.sources.proc.procmem import (
    MemoryReader,
    PageMap,
    PagemapUnavailableError,
    ProcessMemoryReader,
)

_scout_native = optional_native("memforensics.sources.glibc._listscout")
# A segment as _listscout.scout takes it: (buffer, start, readable, filled[, lo, hi]).
ScoutSegment = (
    tuple[memoryview, int, bytes, bytearray]
    | tuple[memoryview, int, bytes, bytearray, bytearray, bytearray]
)
_CIRCULAR, _FASTBIN_PLAIN, _FASTBIN_SAFE_LINKED = 0, 1, 2  # _listscout.c's kinds of list
BIN_RETRIES = 4
_LAZY_FILL_PAGES = 16  # a big arena read lazily: 64 KiB per read
# ... and a core's: a page per read (a read of a file costs no stop, and a block's pages
# beyond the one a list needs would only fill our memory).
_CORE_FILL_PAGES = 0
_CHASE_MAX_CHUNKS = 2048  # each chunk may cost a read, and reads wait for the mmap lock
CHASE_SECONDS = 0.05  # time box of one arena's chase round
# An arena walked inside a stop (held, not deferred) of at most this many resident bytes is
# read lazily first, block by block as its lists lead there, for at most this many chunks
# in all: a copy of its every resident page costs more than a few short lists. Past that,
# the lists left are walked over a whole copy (in C, where built).
HELD_LAZY_MAX_BYTES = 4 << 20
HELD_LAZY_MAX_CHUNKS = 256
# A scout (ArenaWalker.scout) of an arena of SCOUT_DENSE_MIN_BYTES resident or more goes on
# while its lists' pages fit the scouts' room, for SCOUT_SECONDS per SCOUT_MAX_BYTES of that
# room (at least SCOUT_SECONDS), and gives up past it: its stops copy only those pages, a
# part of at most 16 MiB of them a stop (heapmaps), however dense the lists. An arena the
# copies' budget holds whose scout gives up is copied whole in its stop (as long a stop as
# its size takes to copy: the last resort); one above the budget has no whole copy to fall
# back on (relays, else a refusal). A smaller arena (scouted only under a CPU quota, whose
# stops cannot hold its whole copy) gives up past SCOUT_SECONDS, or once its lists lead to
# more than SCOUT_MAX_SHARE of its resident pages: there a scout page by page and stops cut
# to the quota's room cost the read more than twice the wall of a whole copy, for a stall no
# shorter in every quota. SCOUT_MAX_BYTES is also the least room the scouts keep however
# many copy buffers are kept.
SCOUT_SECONDS = 0.25
SCOUT_MAX_SHARE = 0.25
SCOUT_MAX_BYTES = 64 << 20
# The scout of an arena above the copies' budget gives up on a list in address order (nine
# pages in ten it walks to one next to the page before) once it has walked this many bytes
# of pages: the relay it gives way to reads such a list in blocks of pages from the held
# target, and a list that long is relayed anyway (more than a part's stop copies), so what
# the scout would read of it past here is read twice.
SCOUT_ORDERED_MAX_BYTES = 64 << 20
# The heap size from which heapmaps scouts an arena without a CPU quota (its _SCOUT_MIN_BYTES
# is this): a smaller arena is scouted only under one.
SCOUT_DENSE_MIN_BYTES = 32 << 20
# An arena walked inside its stop that the copies' budget cannot hold (a main heap of
# gigabytes) is followed lazily there, for at most this long (the stall the read allows
# itself): past it the read of that arena gives up (budget_reached) rather than hold every
# thread longer; where that refusal lets malloc_info be called instead, the call keeps only
# its calling thread busy.
HELD_LAZY_SECONDS = 0.015
# The catch-up of a moving arena's lists before its stop (ArenaWalker.catch_up) reads at most
# this many pages (our memory until the stop; its stop copies them again) for at most this
# long: a busy arena's lists change as fast as it frees, so past that it no longer keeps up.
# What it leaves is followed in the stop a page a round (~11 us a page, against ~1 us for a
# page the stop copies at one go): sized for a churning arena's part of tens of MiB of lists.
_CATCH_UP_MAX_PAGES = 8192
_CATCH_UP_SECONDS = 0.03
# A scouted copy is checked word by word in its stop (ArenaWalker._scout_unchanged) only where
# its pages lie far apart: at most this share of its heaps' pages. There each page costs the
# copy its pagemap entry, the kernel's lookup and 4 KiB, and the check the first two alone;
# where they lie close together the copy reads them in runs, and the check costs as much
# (a 1 GiB arena's lists on 1 page in 80: a third less; a 100 MiB one's on 1 page in 9: the
# same or more).
_CHECK_MAX_PAGE_SHARE = 1 / 32
HELD_CHECK_SECONDS = 0.1  # the least a list found inconsistent in a stop is diagnosed for
# A plan of that check made before the stop (ArenaWalker.prepare_stop) is kept only up to this
# size, and a quarter of the scouted pages' bytes (our memory until the stop, beside the
# scouts' copies, which the copies' budget bounds: an arena of a GiB with a few thousand free
# chunks needs ~0.2 MiB for 13 MiB of pages); past it the check is planned in the stop.
_PLAN_MAX_BYTES = 4 << 20
# A walk copying block by block as the lists lead gives up past this many bytes copied (the
# arena's figures then unknown): our memory, no more than the biggest whole copy.
LAZY_MAX_BYTES = 192 << 20
_TWO_WORDS = struct.Struct("<2Q")
_FASTBIN = 0  # pseudo bin number of the fastbins in ``unmeasured_bins``
_COPY_SLICE_BYTES = 4 << 20  # ~1 ms of copying: the longest a pause waits for the copy
_TOP_RUNS_MAX = 4096  # a top with more runs of resident pages is estimated, not listed


def nonempty_bins(state: ArenaState, first: int) -> list[int]:
    """Bins from ``first`` on whose fd does not point back at the bin itself."""
    heads = range(bin_head(state, 1), bin_head(state, glibc.NBINS), 16)
    # compress/map: the 127 comparisons in C (a held read makes one per arena, 1,500 of them
    # within a few stops).
    indexes = compress(range(1, glibc.NBINS), map(ne, state.bins[0::2], heads))
    return [index for index in indexes if index >= first]


def _moved_bins(heads: tuple[tuple[int, ...], tuple[int, ...]], state: ArenaState) -> list[int]:
    """The bins (_FASTBIN: the fastbins) whose heads in ``state`` differ from ``heads``
    (bins and fastbins as an earlier state had them), the non-empty ones."""
    bins, fastbins = heads
    moved = [_FASTBIN] if fastbins != state.fastbins and any(state.fastbins) else []
    return moved + [
        index
        for index in nonempty_bins(state, 1)
        if bins[2 * (index - 1) : 2 * index] != state.bins[2 * (index - 1) : 2 * index]
    ]


def _scout_lists_of(state: ArenaState, indexes: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """_listscout's lists for bins ``indexes`` of ``state`` (_FASTBIN: each fastbin, both
    ways: as stored and as safe-linked), each with its bin (the fastbins' is _FASTBIN)."""
    lists = [
        (bin_head(state, index), state.bins[2 * (index - 1)], _CIRCULAR, index)
        for index in indexes
        if index != _FASTBIN
    ]
    if _FASTBIN in indexes:
        lists += [
            (0, head, kind, _FASTBIN)
            for head in state.fastbins
            if head
            for kind in (_FASTBIN_PLAIN, _FASTBIN_SAFE_LINKED)
        ]
    return lists


def _reader_threads(held: bool) -> int:
    """Threads the C scout may read a big round of pages with, where this process may run on
    two CPUs: two in a stop (the target's CPUs are idle then), and while the target runs
    where fewer tasks than those CPUs are runnable now (procfs.runnable_tasks: one is idle,
    so the second reader takes no CPU from the target's threads); else one. A remote page
    costs the kernel's lookup of it, and a page of our buffer its first fault, whatever the
    bytes read, so two readers share the cost."""
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        return 1
    if held:
        return 2
    runnable = runnable_tasks()
    return 2 if runnable is not None and runnable < cpus else 1


def _native_scout(
    mem: ProcessMemoryReader,
    segments: Sequence[ScoutSegment],
    lists: Sequence[tuple[int, int, int, int]],
    max_pages: int | None,
    deadline: float = math.inf,
    *,
    live: bool = False,
    held: bool = False,
    fresh: bool = False,
    ordered_max_pages: int = 0,
) -> int:
    """One _listscout.scout call: the pages read; OutOfPages past ``max_pages`` (None: no
    bound; with the count of lists that failed glibc's bk check) or where a list in address
    order walked more than ``ordered_max_pages`` pages (0: none is cut so), OutOfTime past
    ``deadline``. ValueError for segments that overlap (heaps read while moving). ``live``:
    the segments' readable flags are older than this call (an earlier scout's), so whether
    a page is in RAM is read from the pagemap as each is about to be read. ``held``: the
    target is held still (a scout again, in its stop): two threads may read, and with
    ``live`` the pages it alone maps are read with process_vm_readv (_procmem_read.h).
    ``fresh`` (with ``live``): the pages copied before are read again where the lists lead
    through them, not trusted (they stay flagged)."""
    left = max(max_pages if max_pages is not None else 1 << 62, 0)
    assert _scout_native is not None
    status, pages, inconsistent, _steps = _scout_native.scout(
        mem.mem_fd,
        segments,
        lists,
        mem.page_bytes,
        deadline,
        left,
        mem.pagemap_fd if live else -1,
        _reader_threads(held),
        mem.pid if held else 0,
        fresh,
        ordered_max_pages,
    )
    if status in (1, 3):
        raise OutOfPages(int(inconsistent))
    if status:
        raise OutOfTime
    return int(pages)


def scout_together(
    walkers: Sequence[tuple[ArenaWalker, ArenaState]], deadline: float, max_bytes: int
) -> bool:
    """ArenaWalker.scout of several arenas at once: all their lists side by side in one C
    scout (the reads are as many as the longest chain of pages of any one list, not the sum
    over the arenas), within the sum of their page budgets (at most ``max_bytes`` of pages in
    all: our memory until their stops) and of their times (the first pages read of a target,
    and our buffers' first pages, cost several times what later ones do, so a group may need
    longer than one arena alone). True when every arena was scouted; False, and none of them
    scouted, when that could not be (no C scout, not a live target, or past the budgets): the
    caller may scout them one by one."""
    mems = {id(walker._mem) for walker, _ in walkers}
    mem = walkers[0][0]._mem if walkers else None
    if _scout_native is None or len(mems) != 1 or not isinstance(mem, ProcessMemoryReader):
        return False
    segments: list[ScoutSegment] = []
    lists: list[tuple[int, int, int, int]] = []
    budget = 0
    seconds = 0.0
    for walker, state in walkers:
        walker._begin_scout(deadline, state)
        budget += walker._scout_pages_left or 0
        seconds += walker._deadline - time.monotonic()
        segments += walker._scout_segments()
        lists += _scout_lists_of(state, [_FASTBIN, *nonempty_bins(state, 1)])
    segments.sort(key=lambda segment: segment[1])
    until = min(deadline, time.monotonic() + seconds)
    # (A list in order is cut only where every arena of the group has the relay to give way to.)
    ordered = min((walker._ordered_max_pages for walker, _ in walkers), default=0)
    try:
        _native_scout(
            mem,
            segments,
            lists,
            min(budget, max_bytes // mem.page_bytes),
            until,
            ordered_max_pages=ordered,
        )
    except (OutOfTime, ValueError):
        for walker, _ in walkers:
            walker._end_scout(False)
        return False
    for walker, _ in walkers:
        walker._end_scout(True)
    return True


class _NoTargetReads:
    """The memory of prepare_stop's walk (a MemoryReader): every read of the target is
    refused (nothing read, OutOfTime from a copy's read) and marks that walk dropped
    (ArenaWalker._prewalk_read). Not a ProcessMemoryReader, so no C loop is handed the
    target's files."""

    def __init__(self, target: MemoryReader, walker: ArenaWalker) -> None:
        self.page_bytes = target.page_bytes
        self.target = target  # (for ArenaWalker._copy_now alone)
        self._walker = walker

    def _refused(self) -> None:
        self._walker._prewalk_read = True

    def pagemap(self, start: int, end: int) -> PageMap:
        self._refused()
        raise OutOfTime

    def readable(self, address: int) -> bool:
        self._refused()
        return False

    def read(self, address: int, length: int) -> bytes | None:
        self._refused()
        return None

    def read_present(self, address: int, length: int, present: bytes | None = None) -> bytes:
        self._refused()
        raise OutOfTime

    def read_into(self, view: memoryview, address: int) -> bool:
        self._refused()
        return False


# What prepare_stop's walk (ArenaWalker._prewalk) changes of its walker, as the stop's walk
# would, and is put back after it: the stop's own walk, where the check fails, starts afresh.
_PREWALK_RESTORED = (
    "_mem",
    "_partial",
    "_mangled",
    "_max_chunks",
    "_deadline",
    "_fastbin_chunks",
    "_lazy_left",
    "stop_copy_bytes",
    "kept_scout",
    "_stop_check",
    "_prepared",
)


@dataclass(frozen=True)
class _Prepared:
    """What ArenaWalker.prepare_stop made before a scouted arena's stop, from its copy alone:
    for ``state`` (the whole malloc_state, as read then), the plan of the stop's check
    (heapcopy.unchanged_plan) and the walk over the copy, made as the stop would make it (None
    where that walk would have read the target)."""

    state: ArenaState
    plan: bytes
    walk: ArenaWalk | None


@dataclass
class ArenaWalk:
    """What a walk of one arena measured, and which bins it left unmeasured."""

    free_bytes: int = 0  # chunk bytes of the bins read consistently, plus the top
    resident_bytes: int = 0  # of those, bytes on resident pages
    trimmable_bytes: int = 0  # resident whole pages mtrim releases from the binned chunks
    chunks: int = 0
    retries: int = 0
    unmeasured_bins: list[int] = field(default_factory=list)
    budget_reached: bool = False
    # Of budget_reached: the lists were too long to follow within its stop, or to copy
    # within our memory (the read's own time had not run out).
    lists_too_long: bool = False
    top_bytes: int | None = None
    top_resident_bytes: int | None = None
    top_address: int | None = None
    # Per bin read consistently (0 = all fastbins, 1 = unsorted, 2 … 127): (chunks, bytes).
    bins: dict[int, tuple[int, int]] = field(default_factory=dict)
    # Per list bin read consistently (1 … 127): (chunks, smallest, largest and summed size
    # word with its flag bits): the figures malloc_info prints for the bin.
    bin_sizes: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)
    # Chunks in each fastbin (index 0 holds 32-byte chunks), when the fastbins were read.
    fastbin_chunks: tuple[int, ...] | None = None
    # Main arena only: the top's resident pages as [start, end) runs (None: too fragmented
    # to list, or not the main arena); what systrim releases is decided from them.
    top_resident_runs: tuple[tuple[int, int], ...] | None = None
    # What failed glibc's checks in a copy made while the target was held (heap_checks):
    # those bins are corrupt, not moving, and are not read again.
    corruption: list[HeapCorruption] = field(default_factory=list)
    # The bins [first, last] this walk read, of an arena read in parts (ArenaWalker.split);
    # None: all of them. Only the part from bin 0 has the fastbins (``fastbin_chunks`` is
    # () in the others) and the top.
    part: tuple[int, int] | None = None


class ArenaWalker:
    """Walks one arena's free lists over copies of its heap mappings."""

    def __init__(
        self,
        mem: MemoryReader,
        heaps: Sequence[Heap],
        *,
        is_main: bool,
        pool: BufferPool,
        pause: Callable[[], object] | None = None,
        held: bool = False,
        scout_max_bytes: int | None = None,
        room_to_grow: bool = False,
    ) -> None:
        self._mem = mem
        # An arena above the copies' budget is scouted up to this many bytes of pages (our
        # memory until its stop; None: the budget itself).
        self._scout_max_bytes = pool.copy_max_bytes if scout_max_bytes is None else scout_max_bytes
        # ``held``: the read-only path's walk, made while the target is held (ArenaHold): a
        # whole copy is made in one read per segment, by two threads of ours (the target's
        # threads are stopped, so its CPUs are idle), with no pause between slices (there is
        # no gdb session to make way for).
        self._held = held
        # A core file's memory does not move either: a list failing there is corrupt too.
        self._static = not isinstance(mem, ProcessMemoryReader)
        # Called between slices of a whole copy: a caller may hold the walk there (the scan
        # beside a gdb session parks while gdb attaches, gdb_background.QuietGate), and a closed
        # gate then waits for one slice (~1 ms), not for a whole arena's copy (~5 ms).
        self._pause = pause or (lambda: None)
        self._pool = pool
        self._page = mem.page_bytes
        self._is_main = is_main
        # ``room_to_grow`` (a scouted copy, kept until the stop): each copy's buffer leaves
        # its heap room to grow meanwhile (a thread heap up to HEAP_MAX_BYTES, the main
        # arena's by as much again), untouched and so costing nothing (adopt).
        self._room_to_grow = room_to_grow
        self._segments = [
            Segment(h.start, h.start + h.size_bytes, h.pages, pool, self._room_bytes(h))
            for h in sorted(heaps, key=lambda h: h.start)
            if h.pages is not None and h.size_bytes > 0
        ]
        self._mangled: bool | None = None  # fastbin safe-linking (glibc >= 2.32)
        self._fastbin_chunks: tuple[int, ...] = ()  # per fastbin, of the last fastbin read
        # An arena whose resident bytes fit the pool's copy budget (a few hundred MiB, at
        # most half of MemAvailable) is copied whole for each round of the walk, one read
        # per run of pages, all its heaps; a bigger one (a huge main heap with few free
        # chunks) is copied block by block as its lists lead there.
        resident = sum(s.pages.total_resident_bytes for s in self._segments)
        self._prefetch_whole = resident <= pool.copy_max_bytes
        self._lazy_in_stop = held and resident <= HELD_LAZY_MAX_BYTES
        self._lazy_fill_pages = _CORE_FILL_PAGES if self._static else _LAZY_FILL_PAGES
        self._fill_pages = self._lazy_fill_pages
        # (A core's: no more than its copies' budget, which keeps our memory within a live
        # read's bound; a live read's is LAZY_MAX_BYTES, its copies' budget cut for stops.)
        self._lazy_max_bytes = (
            min(LAZY_MAX_BYTES, pool.copy_max_bytes) if self._static else LAZY_MAX_BYTES
        )
        self._max_chunks: int | None = None  # a list longer than this reads as inconsistent
        self._lazy_left = 0  # chunks a lazy round (in a stop) may still read
        self._deadline = float("inf")
        # Scouted (``scout``): the copy holds only the pages the lists lay on when scouted,
        # copied again in the stop (``copy_scouted``), zeros elsewhere; ``_partial``: the
        # loops read it as whole (a list that left those pages reads back inconsistent).
        self._scouted = False
        self._partial = False
        # The copies as the C loops take them, for the lists of one _walk_bins round that
        # began with the copies read as whole (None otherwise).
        self._round_copies: CopiesForC | None = None
        self._scout_pages_left: int | None = None
        self._ordered_max_pages = 0  # (_begin_scout sets it: a list in order cut past it)
        self.scouted_bytes = 0  # bytes of the pages a scout found the lists on
        self.stop_copy_bytes = 0  # bytes copied from the target in stops (held reads)
        self.rescouted_pages = 0  # pages the lists that moved since the scout led to
        # The last stop of a scouted read found the scout's copy unchanged at every word its
        # walk reads (``copy_scouted``), and copied no page again; and took as its walk the
        # one prepare_stop made before it.
        self.kept_scout = False
        self.walked_before_stop = False
        self._lazy_bytes = 0  # copied block by block since the last reset (LAZY_MAX_BYTES)
        self._capped = False
        # The residency is the one read before the scout (keep_scout_residency): the stop's
        # copy and a rescout look each page up in the pagemap as they read it.
        self._residency_from_scout = False
        # A scout's bin tags (arena_parts), per segment start, while they may be split on;
        # once split: the parts, each part's pages per segment start, the part read now.
        self._tags: dict[int, tuple[bytearray, bytearray]] | None = None
        self._parts: list[tuple[int, int]] = []
        self._part_masks: list[dict[int, bytes]] = []
        self._part = 0
        self.closed = False
        self._scouted_heads: tuple[tuple[int, ...], tuple[int, ...]] | None = None
        # Made before the stop (prepare_stop) from the copy as it then was: dropped by every
        # change to a copy or its flags (_copy_changes). ``_stop_check``: the stop's check,
        # once made (None: not yet), for copy_scouted.
        self._prepared: _Prepared | None = None
        self._stop_check: bool | None = None
        self._prewalking = False  # the walk of prepare_stop: reads the copy alone
        self._prewalk_read = False  # ... and was about to read the target
        self._prewalk_filled = False  # ... and copied pages as it went (_fill)

    def _room_bytes(self, heap: Heap) -> int:
        """The buffer a copy of ``heap`` gets: room to grow (``room_to_grow``), else none."""
        if not self._room_to_grow:
            return 0
        return heap.size_bytes + glibc.HEAP_MAX_BYTES if self._is_main else glibc.HEAP_MAX_BYTES

    def close(self) -> None:
        self.closed = True
        self._copy_changes()
        for segment in self._segments:
            segment.release()
        self._pool.give_all([segment.buffer for segment in self._segments])

    def _copy_changes(self) -> None:
        """A copy or its flags is about to change: what prepare_stop made of them is dropped."""
        self._prepared = None

    def _segment_for(self, address: int) -> Segment | None:
        """The copy of the heap holding ``address``, or None."""
        for segment in self._segments:
            if segment.start <= address < segment.end:
                return segment
        return None

    def _fill(self, segment: Segment, first_page: int) -> None:
        """Copy the readable pages from ``first_page`` on (``_fill_pages`` of them, plus one
        more so a chunk header straddling the last page is whole): the loops' ``fill`` for a
        copy made block by block. Every read may wait for the target's mmap lock, so the
        clock is looked at before each: OutOfTime once the round's deadline has passed."""
        if self._prewalking:
            # (prepare_stop's walk, before the stop: the block is copied now, each page only
            # if the pagemap says it is in RAM now, and its walk is made again over the copy
            # as it then is; the stop's check compares what it read there.)
            self._prewalk_filled = True
            self._copy_now(segment, first_page, self._fill_pages + 1)
            return
        self._copy_changes()
        if time.monotonic() > self._deadline:
            raise OutOfTime
        if self._scout_pages_left is not None:
            self._scout_pages_left -= self._fill_pages
            if self._scout_pages_left < 0:
                raise OutOfPages  # lists this dense: a whole copy costs no more
        else:  # (the pages copied for the first time: what the copy holds resident)
            block = segment.filled[first_page : first_page + self._fill_pages + 1]
            self._lazy_bytes += (len(block) - block.count(1)) * self._page
            if self._lazy_bytes > self._lazy_max_bytes:
                self._capped = True  # our memory: no more of this arena than a whole copy
                raise OutOfTime
        page = self._page
        first = first_page * page
        last = min(first + (self._fill_pages + 1) * page, segment.length)
        if self._residency_from_scout:
            # The residency is the scout's, older than this stop: each page of the block is
            # read if the pagemap says it is in RAM now (recheck), whatever the scout's said.
            # A page that came into RAM since (a busy arena writes a big free chunk's links
            # as it bins the chunk), read as the scout's, would be zeros, and the checks
            # would call a healthy list corrupt.
            blocks = (last - first + page - 1) // page
            only = bytearray(len(segment.filled))
            only[first_page : first_page + blocks] = b"\x01" * blocks
            segment.view[first:last] = bytes(last - first)
            try:
                copy_into(self._mem, segment, first, last, only=only, recheck=True)
            except PagemapUnavailableError:
                raise OutOfTime from None  # which pages may be read is unknown: none is
        else:
            # A reused buffer holds another arena's bytes: an unread page reads as zeros.
            copy_into(self._mem, segment, first, last)
        if self._held and self._scout_pages_left is None:
            self.stop_copy_bytes += last - first
        # Every page copied is flagged, the extra one too: a scouted copy trusts the flags
        # alone (its stop copies those pages again; the others must be zeros).
        flagged = min(self._fill_pages + 1, (last - first + page - 1) // page)
        segment.filled[first_page : first_page + flagged] = b"\x01" * flagged

    def _reset(self, fill_pages: int) -> None:
        """Forget every copied page; later reads copy ``fill_pages`` pages at a time."""
        self._copy_changes()
        self._fill_pages = fill_pages
        if self._lazy_bytes:  # pages copied block by block: dropped, not kept resident
            for segment in self._segments:
                segment.buffer.madvise(mmap.MADV_DONTNEED)
        self._lazy_bytes = 0
        for segment in self._segments:
            segment.filled[:] = bytes(len(segment.filled))
            segment.whole = False

    def _prefetch(self) -> None:
        """Copy every readable page of the arena now, one read per run of resident pages
        (per _COPY_SLICE_BYTES at most, with a pause between slices)."""
        self._copy_changes()
        for segment in self._segments:
            if self._held:
                # Held still: the pages the pagemap (read as it copies, ~5% of the copy's
                # time) says the target alone maps are read pinned, many to a call.
                copy_into(self._mem, segment, 0, segment.length, threads=2, held=True)
                self.stop_copy_bytes += segment.pages.resident_pages * self._page
            else:
                for begin in range(0, segment.length, _COPY_SLICE_BYTES):
                    if begin:
                        self._pause()
                    end = min(begin + _COPY_SLICE_BYTES, segment.length)
                    copy_into(self._mem, segment, begin, end)
            segment.filled[:] = b"\x01" * len(segment.filled)
            segment.whole = True

    def scout(self, state: ArenaState, deadline: float) -> bool:
        """Learn which pages the lists of ``state`` lie on, reading the running target a page
        at a time as they lead (a list caught moving is followed as far as it reads back), so
        that a stop copies those pages alone (``copy_scouted``) instead of the whole arena.
        The copy's buffers must read as zeros where not written (heapcopy.FreshBuffers).
        False, and the walker left as if never scouted, when the lists lead to more pages than
        the scouts' room (``scout_max_bytes``; the arena's resident pages at most, and
        SCOUT_MAX_SHARE of them under SCOUT_DENSE_MIN_BYTES), or ``deadline`` (or
        SCOUT_SECONDS per SCOUT_MAX_BYTES of those pages) passes (whether or not a list
        failed glibc's bk check on the way: a running target's list caught moving, or a
        corrupt one; whatever reads it next checks it in a stop, and diagnoses it)."""
        self._begin_scout(deadline, state)
        try:
            self._scout_lists(state, [_FASTBIN, *nonempty_bins(state, 1)], self._scout_pages_left)
        except OutOfTime:
            self._end_scout(False)
            return False
        self._end_scout(True)
        return True

    def _begin_scout(self, deadline: float, state: ArenaState) -> None:
        self._reset(1)
        self._scouted_heads = (state.bins, state.fastbins)
        resident_pages = sum(s.pages.resident_pages for s in self._segments)
        room_pages = self._scout_max_bytes // self._page
        if not self._prefetch_whole:  # past the budget: the scout or a refusal
            max_pages = room_pages
        elif resident_pages * self._page >= SCOUT_DENSE_MIN_BYTES:
            max_pages = min(resident_pages, room_pages)
        else:  # (a small arena scouted under a CPU quota)
            max_pages = min(int(resident_pages * SCOUT_MAX_SHARE), room_pages)
        seconds = SCOUT_SECONDS * max(1.0, max_pages * self._page / SCOUT_MAX_BYTES)
        # (Of our CPU time: under a CPU quota a scout may take longer, not give up sooner.)
        self._deadline = min(deadline, time.monotonic() + seconds * wall_per_cpu_second())
        self._scout_pages_left = max_pages
        self._ordered_max_pages = (
            0 if self._prefetch_whole else SCOUT_ORDERED_MAX_BYTES // self._page
        )
        self._max_chunks = None
        tagged = _scout_native is not None and isinstance(self._mem, ProcessMemoryReader)
        self._tags = (
            {s.start: arena_parts.new_tags(len(s.filled)) for s in self._segments}
            if tagged
            else None
        )

    def _scout_segments(self) -> list[ScoutSegment]:
        """The segments as _listscout takes them: with their bin tags in a scout before the
        stop (where kept), without in a stop."""
        tags = self._tags if self._scout_pages_left is not None else None
        if tags is None:
            return [(s.view, s.start, s.pages.readable, s.filled) for s in self._segments]
        return [
            (s.view, s.start, s.pages.readable, s.filled, *tags[s.start]) for s in self._segments
        ]

    def _flagged_bytes(self) -> int:
        """Bytes of the pages flagged copied (or to be copied in the stop) in every segment."""
        return sum(s.filled.count(1) for s in self._segments) * self._page

    @property
    def scouted(self) -> bool:
        """The lists were scouted before the stop (``scout``)."""
        return self._scouted

    def _end_scout(self, scouted: bool) -> None:
        """The scout's end: scouted, or the walker as if never scouted."""
        self._scout_pages_left = None
        self._mangled = None  # decided again from the stop's copy
        self._scouted = scouted
        if scouted:
            self.scouted_bytes = self._flagged_bytes()
        else:
            self._tags = None
            self._reset(self._lazy_fill_pages)

    def split(self, max_pages: int) -> int:
        """After a scout that kept bin tags, outside a stop: the arena's bins cut into parts
        of about ``max_pages`` scouted pages at most (arena_parts.plan), to be read one per
        stop (``walk`` reads the part's bins alone; the first part's are the fastbins, the
        unsorted bin and the top, and the small bins from there). Each stop copies the pages
        its part's lists were scouted on; everything else in the copy is zeros (the scout's
        copy is zeroed now, each stop's after it: ``next_part``), so a list that moved since
        reads back inconsistent and is scouted again in that stop, never read from an older
        copy. The number of parts: 1 when not split (read as one)."""
        tags, self._tags = self._tags, None
        if not self._scouted or tags is None or self._parts:
            return 1
        self._copy_changes()
        parts = arena_parts.plan([lo for lo, _ in tags.values()], max_pages)
        if len(parts) < 2:
            return 1
        self._parts = parts
        self._part_masks = [
            {s.start: arena_parts.part_mask(s.filled, *tags[s.start], part) for s in self._segments}
            for part in parts
        ]
        self._part = -1
        self.next_part()
        return len(parts)

    def part_pages(self) -> dict[int, bytes]:
        """Of a split read, outside a stop: per heap start, one byte per page, the pages the
        lists of the part to be read now were scouted on."""
        return {segment.start: bytes(segment.filled) for segment in self._segments}

    def fastbins_and_top_only(self) -> None:
        """Before ``walk``: it reads the fastbins and the top alone (a part [0, 0]); the list
        bins are read in relays (bin_relay). Read block by block as the fastbins lead, never
        copied whole, even where the heaps' resident bytes fit the copies' budget: the copy
        would be most of the relay's first stop, for a few pages of fastbins."""
        self._parts = [(_FASTBIN, _FASTBIN)]
        self._part = 0
        self._prefetch_whole = False

    def next_part(self) -> None:
        """Outside a stop, between two parts of a split read: the pages copied so far zeroed
        and forgotten, those of the next part's lists to be copied in its stop."""
        self._copy_changes()
        self._part += 1
        masks = self._part_masks[self._part]
        for segment in self._segments:
            self._zero(segment, segment.filled)
            mask = masks.get(segment.start, b"")[: len(segment.filled)]
            segment.filled[:] = mask.ljust(len(segment.filled), b"\x00")
        self.scouted_bytes = self._flagged_bytes()

    def _zero(self, segment: Segment, flags: bytes | bytearray) -> None:
        """Zeros on the pages of ``segment``'s copy flagged in ``flags`` (a split walker's:
        its scout kept bin tags, so the C scout is built). Every page the copy wrote is
        flagged and the others are zeros (split, next_part), so the whole copy is given back
        to the kernel in one call (MADV_DONTNEED on its private anonymous mapping: it reads
        as zeros and costs no memory until written again). Not written with zeros, which
        kept every page the scout had copied in our memory through the parts' stops (our
        peak 296 MiB against 256 on a dense arena of 150 MiB read before a spread one, one
        read in three); not a call per run of flagged pages, which on lists a page apart
        came to ~230,000 calls a read."""
        buffer = segment.buffer
        if isinstance(buffer, mmap.mmap):
            length = glibc.page_ceil(len(segment.view), self._page)
            if length and flags.count(0) < len(flags):
                buffer.madvise(mmap.MADV_DONTNEED, 0, min(length, len(buffer)))
            return
        assert _scout_native is not None
        _scout_native.zero(segment.view, bytes(flags), self._page)

    def moved_since_scout(self, state: ArenaState | None) -> bool:
        """The bins' heads of ``state`` (read after the scout) differ from those the scout
        followed: the arena's lists are moving (a busy arena), and its stop will follow
        them again where they moved. None (unreadable) counts as moving."""
        return state is None or self._scouted_heads != (state.bins, state.fastbins)

    @property
    def page_bytes(self) -> int:
        return self._page

    @property
    def parts_left(self) -> int:
        """Parts of a split read after the one to be read now (0: none, or not split)."""
        return max(0, len(self._parts) - 1 - self._part)

    @property
    def part(self) -> tuple[int, int] | None:
        """The bins [first, last] of the part to be read now; None: not split."""
        return self._parts[self._part] if self._parts else None

    def _in_part(self, index: int) -> bool:
        part = self.part
        return part is None or part[0] <= index <= part[1]

    @property
    def _owns_top(self) -> bool:
        """This read (or part: the first) measures the top and checks it."""
        return self._in_part(_FASTBIN)

    def _rescout(self, state: ArenaState, pending: Sequence[int]) -> None:
        """In the stop of a scouted read: the lists of ``pending`` (they left the scouted
        pages: moved since the scout) scouted again from the target, held still, so that
        the copy holds every page they lie on now. Past the read's deadline they stay as
        they are (and read back inconsistent). Where the residency is the scout's, each page
        they lead to is looked up in the pagemap as it is read (a page that came into RAM
        since is read, one that left is not), not the arena's whole pagemap read again in
        the stop (~14 ms a GiB); the arena's residency figures stay the scout's."""
        with contextlib.suppress(OutOfTime):
            self._scout_lists(
                state,
                pending,
                sum(len(s.filled) for s in self._segments),
                live=self._residency_from_scout,
            )

    def catch_up(self, fresh_state: Callable[[], ArenaState | None]) -> int:
        """Outside a stop, just before the stop of a scouted read (of the part to be read
        now, where split) whose lists are moving: the lists of that part whose heads moved
        since the scout followed again from their heads as ``fresh_state()`` reads them now,
        while the target runs, each page they lead through read again (the scout's copy of
        it is old, or zeros after a split) and the pages new to them read and flagged for
        the stop's copy, each looked up in the pagemap as it is read; then once more those
        whose heads moved during that, through what it read. A busy arena puts each chunk
        it frees on its unsorted bin, a page of its own each: those pages are then copied in
        the stop at one go, not followed there a page a round. This only learns pages: the
        stop copies every flagged page again and checks the lists over that copy. The pages
        read (0: nothing moved, or the catch-up could not be made)."""
        if not self._scouted or self.closed or self._scouted_heads is None:
            return 0
        if _scout_native is None or not isinstance(self._mem, ProcessMemoryReader):
            return 0
        self._copy_changes()
        pages = 0
        heads = self._scouted_heads
        deadline = time.monotonic() + _CATCH_UP_SECONDS
        try:
            for fresh in (True, False):
                state = fresh_state()
                if state is None:
                    break
                moved = [i for i in _moved_bins(heads, state) if self._in_part(i)]
                heads = (state.bins, state.fastbins)
                if not moved:
                    break
                pages += _native_scout(
                    self._mem,
                    self._scout_segments(),
                    _scout_lists_of(state, moved),
                    _CATCH_UP_MAX_PAGES - pages,
                    deadline,
                    live=True,
                    fresh=fresh,
                )
        except (OutOfTime, ValueError):
            pass  # what it read stays flagged (copied in the stop, checked there)
        finally:
            self.scouted_bytes = self._flagged_bytes()
        return pages

    def _scout_lists(
        self, state: ArenaState, indexes: Sequence[int], max_pages: int | None, live: bool = False
    ) -> None:
        """The scout of the lists of bins ``indexes`` (_FASTBIN: every fastbin, both ways):
        side by side in C (_listscout, where built, for a live target), else one by one in
        Python, filling as they lead. OutOfTime past ``max_pages`` pages read (None: no
        bound) or the deadline."""
        self._copy_changes()
        mem = self._mem
        if _scout_native is None or not isinstance(mem, ProcessMemoryReader):
            saved, self._partial = self._partial, False  # the loops fill as they go
            try:
                for index in indexes:
                    self._walk_bin(state, index)
            finally:
                self._partial = saved
            return
        segments = self._scout_segments()
        lists = _scout_lists_of(state, indexes)
        in_stop = self._scout_pages_left is None
        pages = _native_scout(
            mem,
            segments,
            lists,
            max_pages,
            self._deadline,
            live=live,
            held=in_stop,
            ordered_max_pages=0 if in_stop else self._ordered_max_pages,
        )
        if not in_stop:
            assert self._scout_pages_left is not None
            self._scout_pages_left -= pages
        else:  # a scout again, in the stop
            self.stop_copy_bytes += pages * self._page
            self.rescouted_pages += pages

    def keep_scout_residency(self, heaps: Sequence[Heap]) -> bool:
        """In the stop of a scouted read: where ``heaps`` are the heaps the scout read (start
        and size), give them the residency read before the scout instead of reading a
        gigabyte arena's pagemap again while every thread is held (~10 ms a GiB); the copy
        then reads only the scouted pages the pagemap says are still in RAM (copy_scouted),
        and lists that moved meanwhile are scouted again with each page looked up in the
        pagemap as it is read (_rescout). False, and nothing changed, when the heaps differ
        (their residency must be read now)."""
        ordered = sorted(heaps, key=lambda h: h.start)
        if [(h.start, h.start + h.size_bytes) for h in ordered] != [
            (s.start, s.end) for s in self._segments
        ]:
            return False
        for heap, segment in zip(ordered, self._segments, strict=True):
            heap.pages = segment.pages
        self._residency_from_scout = True
        return True

    def adopt(self, heaps: Sequence[Heap]) -> bool:
        """Take the residency read in the stop of ``heaps``: the heaps the scout read, or
        those grown or shrunk since (a busy arena's top extends its heap, glibc gives back
        what lies past a top grown big, or a new heap is added). What they grew by is not in
        the scouted copy (zeros), so a list that leads there reads back inconsistent and is
        scouted again in the stop, held still (``_rescout``); what they shrank by is no
        longer copied (no free chunk lies past the top). False, and nothing changed, when a
        heap the scout read is gone, or grew past its copy's room."""
        ordered = sorted((h for h in heaps if h.pages is not None), key=lambda h: h.start)
        by_start = {h.start: h for h in ordered}
        for segment in self._segments:
            heap = by_start.get(segment.start)
            if heap is None or not segment.can_resize_to(heap.start + heap.size_bytes):
                return False
        if len(by_start) != len(self._segments) or any(
            by_start[segment.start].start + by_start[segment.start].size_bytes != segment.end
            or by_start[segment.start].pages is not segment.pages
            for segment in self._segments
        ):
            self._copy_changes()
        for segment in self._segments:
            heap = by_start.pop(segment.start)
            assert heap.pages is not None
            segment.resize(heap.start + heap.size_bytes, heap.pages)
        for heap in by_start.values():  # heaps added since the scout
            if heap.size_bytes > 0:
                assert heap.pages is not None
                # (With room to grow too: an arena read in parts adopts its heaps again at
                # each part's stop, and the heap added last is the one that grows.)
                self._segments.append(
                    Segment(
                        heap.start,
                        heap.start + heap.size_bytes,
                        heap.pages,
                        self._pool,
                        self._room_bytes(heap),
                    )
                )
        self._segments.sort(key=lambda segment: segment.start)
        return True

    def copy_scouted(self, state: ArenaState) -> None:
        """In a stop: copy again the pages the scout read, those still in RAM; a page that
        left RAM since is zeroed and forgotten (the lists through it are read again). Not
        where the copy is found unchanged (``_scout_unchanged``): then every word the walk
        of ``state``'s lists reads is the held target's already."""
        checked, self._stop_check = self._stop_check, None
        self.kept_scout = self._scout_unchanged(state) if checked is None else checked
        if self.kept_scout:
            return
        self._copy_changes()
        page = self._page
        again: list[tuple[Segment, int, bytes, bytearray]] = []
        for segment in self._segments:
            # (The residency may cover more than the segment: a heap's mprotect_size is the
            # most it was ever made writable, its size what it is now.)
            pages = min(len(segment.pages.readable), len(segment.filled))
            scouted = bytes(segment.filled[:pages])
            if scouted == bytes(pages):
                # (None of its pages is this part's: an arena of a GiB has 16 heaps, and a part's
                # lists lie in a few of them.)
                segment.filled[pages:] = bytes(len(segment.filled) - pages)
                continue
            again.append(
                (segment, pages, scouted, bytearray(both(scouted, segment.pages.readable)))
            )
        # A copy that rechecks the pagemap (its residency is the scout's) reads in it which
        # pages the held target alone maps, and reads those pinned (_procmem_read.h); one that
        # does not would pay ~12 ms per GiB of heap for the pagemap, more than the pins save,
        # and reads every page with pread. The heaps' pages are split between two threads as
        # one copy (heapcopy.copy_again): a GiB arena's few hundred a heap are too few each.
        copy_again(
            self._mem,
            [(segment, still) for segment, _, _, still in again],
            recheck=self._residency_from_scout,
            held=self._residency_from_scout,
        )
        for segment, pages, scouted, still in again:
            kept = bytes(still)
            self.stop_copy_bytes += kept.count(1) * page
            if kept != scouted:
                for index in range(pages):
                    if scouted[index] and not kept[index]:
                        segment.view[index * page : (index + 1) * page] = bytes(page)
                segment.filled[:pages] = kept
            segment.filled[pages:] = bytes(len(segment.filled) - pages)

    def _scout_unchanged(self, state: ArenaState) -> bool:
        """In a stop, before the scouted copy is made again: whether the copy (the scout's,
        and what a catch-up read again) already holds the held target's bytes at every word
        the walk and heap_checks will read of the lists of ``state`` (those of the part
        read now, and its top): each list followed through the copy as the walk follows it,
        and the words it read compared with the target's (heapcopy.unchanged_in_target: a
        few bytes a chunk instead of its pages). The lists are determined by their heads
        (``state``, read in this stop) and those words, so the walk over the copy then reads
        what it would read in the target. Where prepare_stop planned that check for this
        very ``state`` over the copy as it still is, its plan is used (heapcopy.plan_holds):
        the lists are not followed again in the stop. Not tried for a split read (its copy is
        zeroed between parts, so nothing would compare equal), nor where the bins' heads
        moved since the scout, nor where its pages lie close together
        (_CHECK_MAX_PAGE_SHARE)."""
        prepared, self._prepared = self._prepared, None
        if prepared is not None and prepared.state == state and self._held and not self._parts:
            read_bytes = plan_holds(self._mem, prepared.plan)
        else:
            checked = self._check_lists(state)
            if checked is None:
                return False
            read_bytes = unchanged_in_target(
                self._mem, self._segments, *checked, self._page, self._deadline
            )
        if read_bytes is None:
            return False
        self.stop_copy_bytes += read_bytes
        return True

    def _check_lists(
        self, state: ArenaState
    ) -> tuple[list[tuple[int, int, int, int, int, int, int]], list[tuple[int, int]]] | None:
        """The lists and extra ranges of the check of ``state`` (_scout_unchanged), as
        heapcopy.unchanged_in_target takes them; None where it is not tried."""
        if self._parts or not self._held or self.moved_since_scout(state):
            # (Lists whose heads moved since the scout have moved within too, most likely: the
            # check would cost most of the copy it is there to spare, and fail.)
            return None
        flagged = sum(segment.filled.count(1) for segment in self._segments)
        if flagged > _CHECK_MAX_PAGE_SHARE * sum(len(s.filled) for s in self._segments):
            return None
        lists: list[tuple[int, int, int, int, int, int, int]] = []
        for index in nonempty_bins(state, 1):
            if not self._in_part(index):
                continue
            fd, bk = state.bins[2 * (index - 1)], state.bins[2 * (index - 1) + 1]
            head = bin_head(state, index)
            if fd == head and bk == head:
                continue
            low, high = glibc.bin_size_range(index)
            # (A large bin's nextsize words too: heap_checks reads its ring.)
            lists.append((0, head, fd, bk, low, high, 40 if index >= 64 else 24))
        if self._in_part(_FASTBIN):
            for fast_index, head in enumerate(state.fastbins):
                if head:
                    size_bytes = (fast_index + 2) * glibc.MALLOC_ALIGNMENT
                    lists.append((1, head, size_bytes, 0, 0, 0, 0))
        extra = []
        top_segment = self._segment_for(state.top) if self._owns_top else None
        if top_segment is not None:
            # (_measure_top and heap_checks.check_top read the top's size from the copy where
            # its page is flagged copied; elsewhere from the target.)
            index = (state.top + 8 - top_segment.start) // self._page
            if index < len(top_segment.filled) and top_segment.filled[index]:
                extra.append((state.top, 16))
        return lists, extra

    def prepare_stop(self, state: ArenaState, deadline: float) -> None:
        """Outside a stop, after a scout whose lists ``state`` (read since) shows unmoved:
        what the stop would do over the copy alone, done now. The check's plan
        (heapcopy.unchanged_plan: the lists followed through the copy, the words they read
        and the copy's bytes there), and the walk over the copy as the stop would make it
        (_prewalk: dropped where it would read the target other than a page copied now).
        The stop whose malloc_state reads back as ``state``, the copy unchanged meanwhile,
        then only reads and compares the planned words (``walk``), and where they hold takes
        that walk as its own: the walk of the same lists over the same bytes. Pages the
        scout did not copy are copied now, pagemap-checked (_copy_now), before the plan is
        made, so the plan compares their words too: the top's header page, and the pages
        glibc's checks lead to (the walk is then made again over the copy as it now is).
        Nothing where the check would not be tried (_check_lists)."""
        self._prepared = None
        if not self._scouted or self.closed or not isinstance(self._mem, ProcessMemoryReader):
            return
        if self._check_lists(state) is None:
            return
        top = self._segment_for(state.top) if self._owns_top else None
        if top is not None:
            self._copy_now(top, (state.top + 8 - top.start) // self._page, 1)
        walk = self._prewalk(state, deadline)
        if walk is not None and self._prewalk_filled:
            # (Its heap checks led to pages the scout did not copy, copied since: the walk is
            # made again over the copy the plan is made of, and kept only if it copies no more.)
            walk = self._prewalk(state, deadline)
            walk = None if self._prewalk_filled else walk
        self.scouted_bytes = self._flagged_bytes()  # (with the pages copied since the scout)
        checked = self._check_lists(state)
        if checked is None:
            return
        plan = unchanged_plan(self._segments, *checked, self._page, deadline)
        if plan is None or len(plan) > min(_PLAN_MAX_BYTES, self.scouted_bytes // 4):
            return
        self._prepared = _Prepared(state, plan, walk)

    def _copy_now(self, segment: Segment, first_page: int, count: int) -> None:
        """Outside a stop (prepare_stop): the copy's pages [first_page, first_page + count)
        that it does not hold, copied from the running target, each only if the pagemap says
        it is in RAM now (read as the scout reads: never a page that is not), and all of them
        flagged, as ``_fill`` flags a block (the stop's check finds a page not in RAM)."""
        end = min(first_page + count, len(segment.filled), -(-segment.length // self._page))
        if first_page >= end or all(segment.filled[first_page:end]):
            return
        only = bytearray(len(segment.filled))
        only[first_page:end] = b"\x01" * (end - first_page)
        for index in range(first_page, end):  # (a page held already is not read again)
            only[index] = not segment.filled[index]
        first = first_page * self._page
        mem = self._mem.target if isinstance(self._mem, _NoTargetReads) else self._mem
        with contextlib.suppress(PagemapUnavailableError):
            copy_into(
                mem,
                segment,
                first,
                min(end * self._page, segment.length),
                only=only,
                recheck=True,
            )
        segment.filled[first_page:end] = b"\x01" * (end - first_page)

    def _prewalk(self, state: ArenaState, deadline: float) -> ArenaWalk | None:
        """prepare_stop's walk: ``walk`` as in the stop of ``state``, over the copy as it is
        (copy_scouted makes no copy), where every list reads back consistently in its first
        round; None otherwise, or where it would read the target other than through ``_fill``
        (whose blocks are copied now, from the running target: ``_prewalk_filled``). The
        walker is left as it was."""
        saved = {name: getattr(self, name) for name in _PREWALK_RESTORED}
        self._mem = _NoTargetReads(self._mem, self)
        self._prewalking, self._prewalk_read, self._prewalk_filled = True, False, False
        try:
            walk: ArenaWalk | None = self.walk(state, deadline=deadline)
        except OutOfTime:
            walk = None
        finally:
            for name, value in saved.items():
                setattr(self, name, value)
            self._prewalking = False
        if walk is None or self._prewalk_read or walk.budget_reached or walk.unmeasured_bins:
            return None
        return walk

    def _walk_list(self, head: int, fd: int, bk: int, low: int, high: int) -> Tally | None:
        """One circular free list measured, or None when it does not read back consistently:
        through whole copies by walk_copies (C where built), else by follow_list, filling
        blocks as the list leads there (a chase follows at most _CHASE_MAX_CHUNKS chunks)."""
        ends = (self._segments, head, fd, bk, low, high, self._page, self._deadline)
        if self._read_as_whole():
            return walk_copies(*ends, copies=self._round_copies)
        return follow_list(*ends, fill=self._fill, max_chunks=self._max_chunks)

    def _walk_fastbin(self, head: int, size_bytes: int) -> Tally | None:
        """One fastbin measured, or None when it does not read back consistently.

        Whether this glibc safe-links fastbin pointers (>= 2.32) is decided here, once per
        arena, by one rule: the first non-empty fastbin is read both ways, and when exactly
        one way reads back consistently, that way is kept for the arena's other fastbins (a
        pointer taken the wrong way is scrambled by (its position >> 12) and leads outside
        the heaps; a lone chunk tells too, as its NULL is stored scrambled). An empty fastbin
        reads back either way, so it never decides."""
        if head == 0:
            return EMPTY_TALLY
        if self._mangled is not None:
            return self._follow_fastbin(head, size_bytes, self._mangled)
        safe_linked = self._follow_fastbin(head, size_bytes, True)
        plain = self._follow_fastbin(head, size_bytes, False)
        if (safe_linked is None) != (plain is None):
            self._mangled = safe_linked is not None
        return safe_linked if safe_linked is not None else plain

    def _follow_fastbin(self, head: int, size_bytes: int, mangled: bool) -> Tally | None:
        """One fastbin read one way: through whole copies by walk_fastbin_copies (C where
        built), else by follow_fastbin, filling blocks as the list leads there."""
        if self._read_as_whole():
            return walk_fastbin_copies(
                self._segments,
                head,
                size_bytes,
                self._page,
                mangled,
                self._deadline,
                copies=self._round_copies,
            )
        return follow_fastbin(
            self._segments, head, size_bytes, self._page, mangled, self._deadline, fill=self._fill
        )

    def _snapshot(self, state: ArenaState, *, chase: bool) -> ArenaState | None:
        """Fresh reads for a round of the walk, and the arena's malloc_state as of them.

        A snapshot round copies a small arena whole, in runs of resident pages, within
        milliseconds (a big one block by block as its lists lead there): a list read from
        one such copy is far likelier to be consistent than one read lazily while the target
        works. A non-main arena's malloc_state lies in its first heap, so it comes out of the
        same copy. A chase round reads page by page as the lists lead, each list right after
        its head is read again: a short hot list is read within microseconds.
        """
        self._max_chunks = _CHASE_MAX_CHUNKS if chase else None
        if self._scouted:
            # In the stop of the scouted round: its copy stays (the lists it left are
            # scouted again from the target, held still: ``_rescout``).
            return state
        if chase:
            self._reset(1)
            return read_state(self._mem, state.address)
        if not self._prefetch_whole:
            self._reset(self._lazy_fill_pages)
            return read_state(self._mem, state.address)
        self._prefetch()
        return self._copied_state(state.address)

    def _copied_state(self, address: int) -> ArenaState | None:
        """The malloc_state at ``address`` as the whole copy just made holds it: a thread
        arena's lies in its first heap, so in the copy; main_arena's, in libc's data, is
        read from the target now."""
        segment = self._segment_for(address)
        if segment is None:
            return read_state(self._mem, address)
        offset = address - segment.start
        return parse_state(address, segment.view[offset : offset + glibc.STATE_BYTES])

    def capture(self, state: ArenaState) -> ArenaState | None:
        """The first round's snapshot taken now (the arena copied whole) for a walk made
        later, ``walk(…, snapshot=…)``: the malloc_state as the copy holds it. A walk of a
        whole copy reads nothing more from the target, so a held target's arena can be
        copied in a stop and walked after it. None, and nothing copied or a copy to be made
        again, when the walk must read the target as it goes: an arena above the copy budget
        (read lazily), or whose malloc_state or top chunk the copy does not hold whole."""
        if not self._prefetch_whole or self._scouted:
            return None
        self._prefetch()
        snapshot = self._copied_state(state.address)  # as the first round's snapshot has it
        if snapshot is None or self._top_header(snapshot) is None:
            return None
        return snapshot

    def _top_header(self, state: ArenaState) -> tuple[Segment, bytes] | None:
        """The top chunk's segment and header from the whole copy, or from a scouted copy's
        page flagged copied (copied or checked in this stop: copy_scouted), when the copy
        holds the header on a page read from RAM and the chunk ends inside the segment."""
        segment = self._segment_for(state.top)
        if segment is None:
            return None
        offset = state.top - segment.start
        page = offset // self._page
        flagged = self._scouted and self._partial and page < len(segment.filled)
        if not (segment.whole or (flagged and segment.filled[page])):
            return None
        if offset + 16 > segment.length or not segment.pages.readable[page]:
            return None
        header = bytes(segment.view[offset : offset + 16])
        top_bytes = _TWO_WORDS.unpack(header)[1] & ~glibc.SIZE_FLAGS
        return (segment, header) if state.top + top_bytes <= segment.end else None

    def walk(
        self,
        state: ArenaState,
        *,
        deadline: float,
        retry_deadline: float | None = None,
        snapshot: ArenaState | None = None,
    ) -> ArenaWalk:
        """Measure every bin (fastbins, unsorted, small, large) and the top of the arena.

        Rounds: the first reads a snapshot (or takes ``snapshot``, what ``capture`` gave) and
        walks every bin; later rounds, alternately chasing and from a fresh snapshot, walk
        only the bins whose lists read inconsistently, at most BIN_RETRIES more times, and
        only until ``retry_deadline`` (the caller's fair share of the budget: one hot arena
        must not starve the rest). Walked inside a stop (held, no ``snapshot``), the target
        does not move and ``state`` must be as read in that stop: a small arena's first round
        takes it and reads lazily (HELD_LAZY_MAX_CHUNKS), the lists it leaves and every later
        round read a whole copy, and no round chases. A scouted arena's first round copies
        the scouted pages and reads the lists over that copy; the lists that left it (moved
        since the scout) are followed on from the target, in the same stop, in the second.
        Where prepare_stop walked that copy before the stop, for this very ``state``, and
        the stop's check finds every word that walk read unchanged, that walk is the stop's.
        """
        in_stop = self._held and snapshot is None
        made = self._walked_before(state) if in_stop else None
        if made is not None:
            return made
        return self._walk_rounds(
            state, deadline=deadline, retry_deadline=retry_deadline, snapshot=snapshot
        )

    def _walk_rounds(
        self,
        state: ArenaState,
        *,
        deadline: float,
        retry_deadline: float | None,
        snapshot: ArenaState | None,
    ) -> ArenaWalk:
        """``walk``'s rounds."""
        in_stop = self._held and snapshot is None
        # (A part without the fastbins has none: the first part's are the arena's.)
        walk = ArenaWalk(part=self.part, fastbin_chunks=None if self._owns_top else ())
        clock = time.monotonic
        pending: list[int] = []
        corrupt_bins: list[int] = []  # failed glibc's checks: unmeasured, never read again
        lazy = in_stop and (self._lazy_in_stop or self._scouted)
        read_deadline = deadline
        if in_stop and not self._prefetch_whole and not self._scouted:
            deadline = min(deadline, clock() + stop_reading_seconds(HELD_LAZY_SECONDS))
        for attempt in range(BIN_RETRIES + 1 + lazy):
            if clock() > deadline:
                walk.budget_reached = True
                break
            if attempt > lazy and retry_deadline is not None and clock() > retry_deadline:
                break  # its share of the time is spent: the bins still moving are estimated
            chase = attempt % 2 == 1 and not in_stop
            # A chase reads page by page, and each read waits for the target's mmap lock,
            # which a busy allocator holds often: a chase round gets a short time box.
            self._deadline = min(deadline, clock() + CHASE_SECONDS) if chase else deadline
            lazy_round = lazy and attempt == 0
            fresh = self._round_state(state, snapshot if attempt == 0 else None, lazy_round, chase)
            if fresh is None:
                break
            state = fresh
            if attempt == 1 and self._scouted and in_stop:
                self._rescout(state, pending)
            if attempt == 0:
                # Which bins to walk comes from this snapshot, never from the state read
                # before it: meanwhile a malloc (gdb's own, at the dump) may have sorted the
                # unsorted bin into a large bin that the earlier state showed empty.
                pending = self._first_pending(state, walk)
            state, failed, inconsistent = self._walk_bins(
                state, pending, walk, deadline=deadline, chase=chase, lazy_round=lazy_round
            )
            if self._capped:  # its lists lead to more than a whole copy would hold
                walk.budget_reached = True
                pending = failed
                break
            # A copy made while every thread was held cannot have moved: a list that fails
            # there is corrupt (named by heap_checks), and is not read again.
            stop_copy = self._static or (
                self._held
                and ((in_stop and not lazy_round) or (attempt == 0 and snapshot is not None))
            )
            if stop_copy and inconsistent:
                corrupt = self._check(state, walk, inconsistent)
                failed = [index for index in failed if index not in corrupt]
                corrupt_bins.extend(sorted(corrupt))
            if attempt == 0 and snapshot is not None and self._held:
                self._check(state, walk, ())
            pending = failed
            if not pending or walk.budget_reached or self._prewalk_ends():
                break
            # What the lazy round leaves is read in the next: no retry (the target is held).
            walk.retries += not lazy_round and attempt < BIN_RETRIES + lazy
        # (Decided before the checks below, which may take the clock past the read's end.)
        walk.lists_too_long = walk.budget_reached and (self._capped or clock() <= read_deadline)
        if in_stop or self._static:
            self._check(state, walk, ())
        walk.unmeasured_bins.extend(sorted({*pending, *corrupt_bins}))
        return walk

    def _prewalk_ends(self) -> bool:
        """In prepare_stop's walk, lists are left for a later round, which would read the
        target: that walk ends here, and is dropped."""
        self._prewalk_read = self._prewalk_read or self._prewalking
        return self._prewalking

    def _walked_before(self, state: ArenaState) -> ArenaWalk | None:
        """In the stop of ``state``: the walk prepare_stop made of this state's lists over
        this copy, where the held target holds what the copy holds at every word that walk
        read (the stop's check, made now: the same lists over the same bytes, so the same
        walk); else None (the check's verdict kept for copy_scouted)."""
        prepared = self._prepared
        if (
            self._prewalking
            or prepared is None
            or prepared.walk is None
            or prepared.state != state
            or not self._residency_from_scout
        ):
            return None
        self._stop_check = self._scout_unchanged(state)
        if not self._stop_check:
            return None
        self._stop_check = None
        self.kept_scout = self.walked_before_stop = True
        return prepared.walk

    def _first_pending(self, state: ArenaState, walk: ArenaWalk) -> list[int]:
        """The first round's bins: the non-empty ones (of the part read now); the top is
        measured with the part that owns it."""
        if self._owns_top:
            self._measure_top(state, walk)
        return [i for i in (_FASTBIN, *nonempty_bins(state, 1)) if self._in_part(i)]

    def _round_state(
        self, state: ArenaState, snapshot: ArenaState | None, lazy_round: bool, chase: bool
    ) -> ArenaState | None:
        """The arena's state a round walks from: the caller's ``snapshot`` (first round), the
        state read in this stop (a lazy round: the target has not moved), else a fresh
        snapshot (None when it cannot be read)."""
        if snapshot is not None:
            return snapshot
        if lazy_round and self._scouted:
            if not self._prewalking:  # (prepare_stop's walk is over the copy as it is)
                self.copy_scouted(state)
            self._partial = True
            return state
        if lazy_round:
            self._reset(self._lazy_fill_pages)
            self._lazy_left = HELD_LAZY_MAX_CHUNKS
            return state
        return self._snapshot(state, chase=chase)

    def _walk_bins(
        self,
        state: ArenaState,
        pending: list[int],
        walk: ArenaWalk,
        *,
        deadline: float,
        chase: bool,
        lazy_round: bool,
    ) -> tuple[ArenaState, list[int], list[int]]:
        """One round over the bins of ``pending``: each measured into ``walk``, or left
        (failed) for a later round; (the state, failed, those read inconsistently)."""
        with self._copies_made_once():
            clock = time.monotonic
            failed: list[int] = []
            inconsistent: list[int] = []
            for position, index in enumerate(pending):
                if clock() > self._deadline:
                    walk.budget_reached = clock() > deadline
                    failed.extend(pending[position:])
                    break
                if chase:
                    state = self._reread_heads(state, index)
                if lazy_round and not self._lazy_may_walk(state, index):
                    failed.append(index)
                    continue
                try:
                    result = self._walk_bin(state, index)
                except OutOfTime:
                    walk.budget_reached = clock() > deadline
                    failed.extend(pending[position:])
                    break
                if result is None:
                    failed.append(index)
                    inconsistent.append(index)
                    continue
                if lazy_round:
                    self._lazy_left -= result[0]
                self._add(walk, result)
                walk.bins[index] = (result[0], result[1])
                if index == _FASTBIN:
                    walk.fastbin_chunks = self._fastbin_chunks
                else:
                    walk.bin_sizes[index] = (result[0], *result[4:7])
        return state, failed, inconsistent

    @contextlib.contextmanager
    def _copies_made_once(self) -> Iterator[None]:
        """For one round of the walk: where the copies are read as whole, the segments made
        for the C loops once, for every list of the round (nothing in a round changes the
        copies); dropped when the round ends."""
        self._round_copies = CopiesForC(self._segments) if self._read_as_whole() else None
        try:
            yield
        finally:
            self._round_copies = None

    def _read_as_whole(self) -> bool:
        """The copies are read as whole copies (walk_copies), not filled as lists lead."""
        if self._round_copies is not None and self._round_copies.of(self._segments) is not None:
            return True
        return self._partial or all(segment.whole for segment in self._segments)

    def _lazy_may_walk(self, state: ArenaState, index: int) -> bool:
        """Whether a lazy round walks bin ``index`` (capped at what it has left). Fastbins
        wait for the whole copy: a long one read lazily would also decide safe-linking from a
        list cut short."""
        if self._scouted:
            self._max_chunks = None
            return True
        if (index == _FASTBIN and any(state.fastbins)) or self._lazy_left <= 0:
            return False
        self._max_chunks = self._lazy_left
        return True

    def _check(self, state: ArenaState, walk: ArenaWalk, indexes: Sequence[int]) -> set[int]:
        """heap_checks over a copy made in a stop: the bins of ``indexes`` (read back
        inconsistently) that fail one of glibc's checks, returned; without ``indexes``, the
        top and the large bins' nextsize rings. Findings go to ``walk.corruption``."""
        fill = None if all(segment.whole for segment in self._segments) else self._fill
        if not indexes:
            large = [i for i, sizes in sorted(walk.bin_sizes.items()) if i >= 64 and sizes[0]]
            found = {
                0: heap_checks.check_unlisted(
                    state, self._segments, large, self._page, fill=fill, top=self._owns_top
                )
            }
        else:
            # Naming a corruption is worth more than the stall the walk allows itself: a
            # list that read back inconsistently in a stop is diagnosed for at least
            # HELD_CHECK_SECONDS (an undiagnosed heap could be called into).
            saved = self._deadline
            self._deadline = max(saved, time.monotonic() + HELD_CHECK_SECONDS)
            try:
                found = heap_checks.diagnose_bins(
                    state,
                    self._segments,
                    indexes,
                    self._page,
                    self._deadline,
                    self._mangled,
                    fill=fill,
                )
            finally:
                self._deadline = saved
        for findings in found.values():
            walk.corruption.extend(findings)
        return set(found)

    def _reread_heads(self, state: ArenaState, index: int) -> ArenaState:
        """``state`` with bin ``index``'s head (or the fastbin heads) read again just now."""
        if index == _FASTBIN:
            data = self._mem.read(state.address + glibc.OFF_FASTBINS, 8 * glibc.NFASTBINS)
            if data is None:
                return state
            return replace(state, fastbins=tuple(memoryview(data).cast("Q")))
        data = self._mem.read(state.address + glibc.OFF_BINS + 16 * (index - 1), 16)
        if data is None:
            return state
        bins = list(state.bins)
        bins[2 * (index - 1) : 2 * index] = _TWO_WORDS.unpack(data)
        return replace(state, bins=tuple(bins))

    def _walk_bin(self, state: ArenaState, index: int) -> Tally | None:
        """One bin of ``state`` measured: all fastbins for pseudo bin 0, else one list."""
        if index == _FASTBIN:
            counts = [0] * len(state.fastbins)
            chunks = total = resident = 0
            for fast_index, head in enumerate(state.fastbins):
                if not head:
                    continue
                result = self._walk_fastbin(head, (fast_index + 2) * glibc.MALLOC_ALIGNMENT)
                if result is None:
                    return None
                counts[fast_index] = result[0]
                chunks += result[0]
                total += result[1]
                resident += result[2]
            self._fastbin_chunks = tuple(counts)
            return chunks, total, resident, 0, 0, 0, 0
        fd, bk = state.bins[2 * (index - 1)], state.bins[2 * (index - 1) + 1]
        head = bin_head(state, index)
        if fd == head and bk == head:
            return EMPTY_TALLY  # emptied meanwhile: measured, nothing in it
        low, high = glibc.bin_size_range(index)
        return self._walk_list(head, fd, bk, low, high)

    @staticmethod
    def _add(walk: ArenaWalk, result: Tally) -> None:
        chunks, total, resident, trimmable = result[:4]
        walk.chunks += chunks
        walk.free_bytes += total
        walk.resident_bytes += resident
        walk.trimmable_bytes += trimmable

    def _measure_top(self, state: ArenaState, walk: ArenaWalk) -> None:
        # From the whole copy where it holds the header (the lists were read from it too),
        # else from the target.
        copied = self._top_header(state)
        segment = copied[0] if copied else self._segment_for(state.top)
        data = copied[1] if copied else self._mem.read(state.top, 16) if segment else None
        if segment is None or data is None:
            return
        top_bytes = _TWO_WORDS.unpack(data)[1] & ~glibc.SIZE_FLAGS
        if state.top + top_bytes > segment.end:
            return
        walk.top_bytes = top_bytes
        walk.top_address = state.top
        walk.top_resident_bytes = segment.pages.resident_bytes(state.top, state.top + top_bytes)
        walk.free_bytes += top_bytes
        walk.resident_bytes += walk.top_resident_bytes
        if self._is_main:
            # What systrim gives back depends on malloc_trim's pad and on where the program
            # break is: decided by the analysis from these runs (glibc.systrim_release_bytes).
            walk.top_resident_runs = resident_runs(
                segment.pages, state.top, state.top + top_bytes, _TOP_RUNS_MAX
            )
