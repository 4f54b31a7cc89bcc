"""An arena whose free lists are too long to follow in one stop, read in relays: each long
list followed in the held target a stretch per stop (``_chunkwalk.relay``), from where the
stretch before left it, the target running between stops.

Contract:
- Every word a stretch checks is read in its own stop, with the arena's mutex free (a
  single-threaded target's thread outside the allocator). The first link of a stretch that
  resumes a list is checked again in that stop: the fd of the chunk before must still name
  the chunk the list goes on with. Where it does not, the list moved between stops (its
  threads ran): it is followed again from its head, at most RELAY_RESTARTS times, then the
  arena is not read (None: refused as before, never estimated).
- A check that fails inside one stretch failed on words read in that one stop. Where the list
  was followed in that stop alone, it is corrupt there (rule 8), named with glibc's words,
  and its bin is left unmeasured. Where it was followed over several stops, the words are of
  one moment but the path to them is not: the chunk the stretch resumed from may have left
  the bin since (a busy arena sorts its unsorted chunks into small bins and takes them out
  again), and its links then lead through another list, to another bin's head or to a chunk
  whose size does not fit. Such a failure is corrupt only when the list, followed again
  from its head, fails the same check at the same chunk with the same word: a heap that is
  corrupt stays so; one that moved does not fail twice alike. A loop back to a chunk passed
  in an earlier stop, or a count past what the heaps hold, is moved when the list was
  followed over several stops, corrupt when in one.
- A stop lasts about RELAY_STOP_SECONDS of following, whatever the list's length; our memory
  is the block cache's (RELAY_CACHE_BLOCKS blocks of 64 KiB), whatever the heap's size.
- On an arena no thread changes, the figures are those of the one moment of any stop: each
  chunk is counted once, as malloc_info counts it. On a busy arena, a list followed over
  several stops is counted as it was at each of them (like a split arena's bins).

- Lists whose chunks lie far apart (past 512 pages read, more than
  RELAY_MAX_PAGES_PER_CHUNK pages a chunk: a read for each) are not followed on; the lists
  not finished are read by a sweep of the arena's heaps instead (list_sweep).
- An arena whose lists moved under its relays, or under its sweep's stops, is swept again in
  one stop of every thread (_Relay.sweep_in_one_stop: the arena's one moment, the stop as
  long as the walk of its heaps, at most ONE_STOP_MAX_SECONDS), where the caller allows it
  (``one_stop``: not for the samples of `watch` and `collect`, nor for a part of a scouted
  arena, which heapmaps copies in one stop from its scout's pages instead).

The fastbins and the top are read in the first stop by the ordinary walk (a part [0, 0]).
A part of a split arena (``part``: bins [first, last]) is relayed the same way, its block
reads taking only the pages its scout found its lists on (``pages``). Without the C module
there is no relay (``available``): such an arena is refused as before.
"""

from __future__ import annotations

import contextlib
import mmap
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from memforensics.model import corruption as words
from memforensics.model import glibc
from memforensics.model.corruption import HeapCorruption, bin_name
from memforensics.sources import optional_native
from memforensics.sources.glibc import read_progress
from memforensics.sources.glibc.arena_figures import (
    LOCK_RETRIES,
    LOCKED_EVERY_TRY,
    ArenaHold,
    StillMemory,
)
from memforensics.sources.glibc.glibc_arenas import ArenaState, Heap, read_state
from memforensics.sources.glibc.glibc_walk import ArenaWalk, ArenaWalker, nonempty_bins
from memforensics.sources.glibc.heap_checks import bin_head, list_check
from memforensics.sources.glibc.heapcopy import FreshBuffers
from memforensics.sources.proc.cpu_quota import (
    WorkDeadline,
    stop_reading_seconds,
    wall_per_cpu_second,
)
from memforensics.sources.proc.procmem import MemoryReader, PageMap, ProcessMemoryReader
from memforensics.units import format_bytes

if TYPE_CHECKING:  # (list_sweep imports numpy: imported where a sweep runs)
    from memforensics.sources.glibc.list_sweep import SweepResult, SweepRoom, WalkedLists

_native = optional_native("memforensics.sources.glibc._chunkwalk")

RELAY_STOP_SECONDS = 0.008  # following per stop (the stop's own cost comes on top)
RELAY_FIRST_SECONDS = 0.002  # the first stop's following
# The chunks a list follows before the next list's turn, in a stop (_Relay.stop).
RELAY_SLICE_CHUNKS = 256
RELAY_GAP_SECONDS = 0.002  # the target runs this long between two stops
RELAY_RESTARTS = 3  # a list that moved between stops is followed again from its head
RELAY_CACHE_BLOCKS = 64  # 4 MiB of pages read in one stop, forgotten at the next
# The relays' own time, whatever is left of the read's: their stops are bounded each, and a
# list of millions of chunks that keeps being followed is a wait, not a refusal (on a loaded
# machine the 2 million of tests/integration/test_seeds_read.py outlasted the read's 3 s).
# One budget for all the relays of a read: a target of many such arenas waits no longer.
RELAY_BUDGET_SECONDS = 15.0
_MADV_POPULATE_WRITE = 23  # linux/mman.h (5.14+)
# A sweep in one stop holds every thread for the walk of the arena's heaps: tried only where
# their bytes in RAM, at ONE_STOP_BYTES_PER_SECOND (about half what the walk does on a
# 2-CPU VM), come to at most ONE_STOP_MAX_SECONDS (less under a CPU quota: what one stop may
# read within it, one_stop_seconds), and cut there whatever they come to.
ONE_STOP_MAX_SECONDS = 1.5
ONE_STOP_BYTES_PER_SECOND = 1 << 30
# A relay reading more than this many pages per chunk followed (past _SCATTERED_MIN_PAGES)
# follows a list whose chunks lie apart (a block read for each): it stops, and the lists not
# finished are swept (list_sweep). A list in address order reads ~0.1 page a chunk; one
# scattered over the heap, 16.
RELAY_MAX_PAGES_PER_CHUNK = 4
_SCATTERED_MIN_PAGES = 512

# _chunkwalk.c's relay statuses.
_DONE, _TIME, _MOVED, _NOT_IN_RAM = 0, 1, 2, 3
_OUTSIDE, _ALIGN, _BK, _SIZE, _FOOT, _LOOP, _LIMIT = 4, 5, 6, 7, 8, 9, 10
_CHECKS = (_DONE, _OUTSIDE, _ALIGN, _BK, _SIZE, _FOOT)  # (_DONE here: the bin's bk differs)


def available() -> bool:
    """The relay is built (the C module, with its ``relay``)."""
    return _native is not None and hasattr(_native, "relay")


class _List:
    """One list bin's relay: its cursor (_chunkwalk.c's Cursor fields), the stop it was
    (re)started in, and how often it was."""

    def __init__(self, index: int, head: int) -> None:
        self.index, self.head = index, head
        self.cursor: tuple[int, ...] | None = None  # None: to be (re)started from the head
        self.started_stop = 0
        self.restarts = 0
        # (chunk, status, word) of each check failed on the list followed over several stops
        # (at most RELAY_RESTARTS + 1): it is corrupt where one of them fails again, whatever
        # failed in between (a walk cut short by the list moving must not hide the first).
        self.suspects: set[tuple[int, int, int]] = set()

    def followed(self) -> int:
        """Chunks followed since the list was (re)started."""
        return self.cursor[2] if self.cursor is not None else 0

    def start(self, fd: int, stop: int) -> None:
        # (previous, chunk, count, total, resident, trimmable, raw min/max/total, Brent's
        # mark, power, steps)
        self.cursor = (self.head, fd, 0, 0, 0, 0, 0, 0, 0, self.head, 1, 0)
        self.started_stop = stop


class RelayRead:
    """What relay_arena read: the arena's walk (every bin and the top, as ArenaWalker's) and
    in how many stops; ``walk`` None when the arena could not be read."""

    def __init__(self) -> None:
        self.walk: ArenaWalk | None = None
        self.state: ArenaState | None = None  # as read in the last stop
        self.heaps: list[Heap] = []  # as of the first stop, with their residency
        self.stops = 0
        self.pages_read = 0
        self.swept_bytes = 0  # of its heaps, copied in its sweep's stops (list_sweep)
        self.swept = False  # its lists were read by a sweep of its heaps (list_sweep)
        self.one_stop = False  # ... in one stop of every thread (its lists moved between stops)
        self.gave_up: str | None = None  # with no walk: why the relay (or sweep) gave up


def relay_arena(
    mem: ProcessMemoryReader,
    hold: ArenaHold,
    address: int,
    heaps_now: Callable[[ArenaState, bool], list[Heap]],
    *,
    is_main: bool,
    deadline: WorkDeadline,
    part: tuple[int, int] | None = None,
    pages: dict[int, bytes] | None = None,
    sbrk_base: int | None = None,
    copy_max_bytes: int | None = None,
    one_stop: bool = True,
) -> RelayRead:
    """Read the arena at ``address`` in relays (the module's contract). ``heaps_now(state,
    pages)``: its heaps as of the stop it is called in (their residency read when
    ``pages``); a list is followed within them. ``part``: only the bins [first, last] (the
    fastbins and the top with bin 0), the walk a part's (ArenaWalk.part). ``pages``: per heap
    start, one byte a page, those its lists were scouted on: a block read takes those alone
    (a page the lists lead to since is read alone). ``sbrk_base``: mp_'s, for a sweep of the
    main heap (list_sweep). ``copy_max_bytes``: the read's copies' budget (None: worked out
    now, heapcopy.copy_budget_bytes). ``one_stop``: an arena whose lists moved between
    stops is swept in one stop (_Relay.sweep_in_one_stop); else it is not read. Ends every
    stop it begins."""
    hold.release()  # (a stop an earlier arena left open is not made longer by this one)
    relay = _Relay(
        mem, address, heaps_now, is_main, deadline, part, pages or {}, sbrk_base, copy_max_bytes
    )
    running = read_state(mem, address)
    if running is not None:  # (the residency of a big heap read in a stop would lengthen it)
        relay.known = {(h.start, h.size_bytes): h.pages for h in heaps_now(running, True)}
    locked = 0
    try:
        while not deadline.passed() and not relay.over:
            with hold.arena(0):
                busy = relay.stop(hold)
            hold.release()
            read_progress.detail(mem.pid, relay.progress())
            if busy:
                if locked >= LOCK_RETRIES or not hold.let_run(locked):
                    relay.read.gave_up = LOCKED_EVERY_TRY
                    break
                locked += 1
            elif not relay.over:
                locked = 0
                time.sleep(RELAY_GAP_SECONDS)
        if relay.scattered:
            read_progress.detail(mem.pid, "long lists: sweeping the heaps")
            relay.sweep(hold)
        if one_stop and relay.read.walk is None and relay.moved and not deadline.passed():
            read_progress.detail(mem.pid, "long lists, moving: sweeping the heaps in one stop")
            relay.sweep_in_one_stop(hold)
        read_progress.detail(mem.pid, "")
        read = relay.read
        if read.walk is None and read.gave_up is None:
            read.gave_up = "the read's time ran out" if deadline.passed() else "not readable"
        return read
    finally:
        hold.release()
        relay.close()


def sweep_still_arena(
    mem: MemoryReader,
    state: ArenaState,
    heaps: list[Heap],
    *,
    is_main: bool,
    deadline: WorkDeadline,
    sbrk_base: int | None = None,
    copy_max_bytes: int | None = None,
) -> RelayRead:
    """The arena of ``state`` in a memory that does not move (a core's), whose lists lead to
    more pages than its walk keeps: its fastbins and top read by the ordinary walk, every
    list bin by a sweep of ``heaps`` (with their pages; list_sweep, with no stop to make). Its
    ``walk`` is None where the sweep could not read them (``gave_up`` says why)."""
    from memforensics.sources.glibc.list_sweep import count_lists  # (numpy: see _Relay.sweep)

    read = RelayRead()
    read.state, read.heaps = state, heaps
    walk, bins, walked = _swept_whole(
        mem, state, heaps, None, is_main, deadline, sbrk_base, copy_max_bytes, held=False
    )
    swept = walked if isinstance(walked, str) else count_lists(mem, StillMemory(), walked)
    _take_sweep(read, walk, state, bins, swept)
    return read


def _swept_whole(
    mem: MemoryReader,
    state: ArenaState,
    heaps: list[Heap],
    part: tuple[int, int] | None,
    is_main: bool,
    deadline: WorkDeadline,
    sbrk_base: int | None,
    copy_max_bytes: int | None,
    *,
    held: bool,
    room: SweepRoom | None = None,
) -> tuple[ArenaWalk, list[int], WalkedLists | str]:
    """In memory that does not move while this runs (a core's; every thread held, with
    ``held``): the fastbins and the top by the ordinary walk (where ``part``, bins [first,
    last], has them: first 0; None: the whole arena), and the walk of a sweep of the part's
    non-empty list bins (list_sweep.walk_lists, in ``room``), to be counted."""
    from memforensics.sources.glibc.list_sweep import walk_lists

    first, last = part or (0, glibc.NBINS - 1)
    if first == 0:
        walk = fastbins_and_top(mem, heaps, state, is_main, deadline.at(), copy_max_bytes)
    else:  # (a part without the fastbins has none: the first part's are the arena's)
        walk = ArenaWalk(fastbin_chunks=())
    walk.part = part
    bins = [i for i in nonempty_bins(state, max(first, 1)) if i <= last]
    walked = walk_lists(
        mem,
        StillMemory(),
        state,
        heaps,
        bins,
        is_main=is_main,
        deadline=deadline,
        sbrk_base=sbrk_base,
        held=held,
        room=room,
    )
    return walk, bins, walked


def _take_sweep(
    read: RelayRead,
    walk: ArenaWalk,
    state: ArenaState,
    bins: list[int],
    swept: SweepResult | str,
    how: str = "swept",
) -> None:
    """A whole sweep's outcome into ``read``: its walk (the fastbins and top with the swept
    bins), or why it gave up (``how`` it was swept, then why)."""
    if isinstance(swept, str):
        read.gave_up = f"{how}, but {swept}"
        return
    _merge_swept(walk, {i: _List(i, bin_head(state, i)) for i in bins}, swept)
    walk.unmeasured_bins.sort()
    read.walk, read.swept = walk, True


class _Relay:
    """One arena's relay: its lists still followed, and what was read."""

    def __init__(
        self,
        mem: ProcessMemoryReader,
        address: int,
        heaps_now: Callable[[ArenaState, bool], list[Heap]],
        is_main: bool,
        deadline: WorkDeadline,
        part: tuple[int, int] | None,
        scouted_pages: dict[int, bytes],
        sbrk_base: int | None,
        copy_max_bytes: int | None,
    ) -> None:
        assert _native is not None
        self.mem, self.address, self.heaps_now = mem, address, heaps_now
        self.is_main, self.deadline, self.part = is_main, deadline, part
        block = _native.RELAY_BLOCK_PAGES
        self.cache = mmap.mmap(
            -1,
            RELAY_CACHE_BLOCKS * (block * mem.page_bytes + 8 + block),
            flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
        )
        with contextlib.suppress(OSError):  # faulted in now, not in a stop (Linux 5.14+)
            self.cache.madvise(_MADV_POPULATE_WRITE)
        # Each heap's residency (by start and size) as read before the first stop.
        self.known: dict[tuple[int, int], PageMap | None] = {}
        self.scouted_pages = scouted_pages  # relay_arena's ``pages``
        self.sbrk_base = sbrk_base  # relay_arena's
        self.copy_max_bytes = copy_max_bytes  # relay_arena's
        self.lists: dict[int, _List] = {}
        self.walk: ArenaWalk | None = None
        self.read = RelayRead()
        self.over = False  # read (``read.walk``), or given up
        self.scattered = False  # given up on as scattered: to be swept (list_sweep)
        # Given up because the lists moved between stops (threads busy in the arena): to be
        # swept in one stop (sweep_in_one_stop).
        self.moved = False
        # (Chunks followed, pages read) by the end of the first stop, where that stop did not
        # find the lists scattered: _scattered judges the stops after it.
        self.after_first: tuple[int, int] | None = None
        self.last_state: ArenaState | None = None  # as read in the last stop

    def close(self) -> None:
        self.cache.close()

    def progress(self) -> str:
        """How far the relay got, for read_progress: chunks followed, in how many stops."""
        followed = sum(entry.followed() for entry in self.lists.values())
        return f"long lists: {followed:,} chunks followed in {self.read.stops:,} stops"

    def stop(self, hold: ArenaHold) -> bool:
        """Inside a stop: one stretch of each list still followed, as far as the stop's time
        goes. True when the arena was locked (nothing read)."""
        began = time.monotonic()  # (the stop's own reads count against its time too)
        state = read_state(self.mem, self.address)
        if state is None:
            self.over = True
            return False
        if state.mutex != 0 or hold.in_allocator():
            return True
        read = self.read
        read.stops += 1
        heaps = self.heaps_now(state, False)
        if self.walk is None:
            self.walk = self._begin(state, heaps)
        spans = [
            (h.start, h.start + h.size_bytes, self.scouted_pages[h.start])
            if h.start in self.scouted_pages
            else (h.start, h.start + h.size_bytes)
            for h in heaps
        ]
        limit = sum(h.size_bytes for h in heaps) // glibc.MINSIZE
        # (The first stretch is short: it tells a scattered list, _scattered, at little cost.)
        first = read.stops == 1
        following = stop_reading_seconds(RELAY_FIRST_SECONDS if first else RELAY_STOP_SECONDS)
        end = min(began + following, self.deadline.at())
        # The lists are followed side by side, RELAY_SLICE_CHUNKS chunks at a time, the list
        # that has followed the fewest chunks next (over all stops), the block cache kept from
        # slice to slice: lists whose chunks interleave through one heap (a bin's chunks sorted
        # into several small bins, each in address order) then move through it together,
        # within a slice of each other, and read each block about once, not once a list.
        # (At least one slice a stop, whatever its own reads took: a stop whose overhead
        # outlasts its following, under a CPU quota, still moves a list on.)
        keep_cache = False  # (a stop's first call forgets what an earlier stop read)
        while self.lists:
            each = min(self.lists.values(), key=_List.followed)
            chunks = RELAY_SLICE_CHUNKS if len(self.lists) > 1 else 0
            outcome = _stretch(
                self.mem, self.cache, each, state, spans, limit, end, read, keep_cache, chunks
            )
            keep_cache = True
            if outcome is not None:  # (None: its slice of this stop ran out)
                del self.lists[each.index]
                if outcome == "gave up":
                    self.over = self.moved = True
                    read.gave_up = (
                        f"a list changed under its relay {RELAY_RESTARTS + 1} times "
                        "(threads busy in the arena)"
                    )
                    return False
                _record(self.walk, each, outcome)
            if time.monotonic() > end:
                break
        if not self.lists:
            self.walk.unmeasured_bins.sort()
            read.walk, read.state, self.over = self.walk, state, True
        elif self._scattered():
            # Following them would outlast the read: they are swept instead (list_sweep).
            self.over = self.scattered = True
        self.last_state = state
        return False

    def sweep(self, hold: ArenaHold) -> None:
        """The lists given up on as scattered, read by a sweep of the heaps (list_sweep);
        the read stays empty where the sweep cannot read them."""
        walk, state, read = self.walk, self.last_state, self.read
        if walk is None or state is None:
            return
        # (Imported here: numpy costs every inspect ~45 ms of start-up, a sweep is rare.)
        from memforensics.sources.glibc.list_sweep import MOVED_WHY, sweep_lists

        swept = sweep_lists(
            self.mem,
            hold,
            state,
            read.heaps,
            sorted(self.lists),
            is_main=self.is_main,
            deadline=self.deadline,
            sbrk_base=self.sbrk_base,
        )
        if isinstance(swept, str):
            read.gave_up = f"swept, but {swept}"
            self.moved = swept == MOVED_WHY
            return
        _merge_swept(walk, self.lists, swept)
        read.walk, read.state, read.swept = walk, state, True
        read.stops += swept.stops
        read.swept_bytes += swept.copied_bytes

    def sweep_in_one_stop(self, hold: ArenaHold) -> None:
        """The arena (or part), whose lists moved between stops (threads busy in it), swept
        in one stop of every thread at a moment it is unlocked (a single-threaded target's
        thread outside the allocator): its fastbins, top and list bins all read at that one
        moment, from heaps and residency read in that stop, and counted once the target
        runs again (a disagreement looked at again in a stop, as any sweep's). That stop
        lasts the walk of the heaps: the price of reading a busy arena's lists at all
        rather than calling into them unread. The read stays empty where it cannot be
        made (``gave_up`` says why)."""
        from memforensics.sources.glibc.list_sweep import count_lists

        read = self.read
        too_long = past_one_stop(read.heaps, ONE_STOP_BYTES_PER_SECOND)
        if too_long is not None:
            read.gave_up = f"{read.gave_up}; not swept in one stop: its {too_long}"
            return
        found = self._held_sweep(hold)
        if found is None:
            why = "the read's time ran out" if self.deadline.passed() else LOCKED_EVERY_TRY
            read.gave_up = f"swept in one stop, but {why}"
            return
        hold.release()
        state, heaps, (walk, bins, walked) = found
        read.stops += 1
        read.heaps, read.state = heaps, state
        swept = walked if isinstance(walked, str) else count_lists(self.mem, hold, walked)
        read.swept_bytes += 0 if isinstance(walked, str) else walked.result.copied_bytes
        _take_sweep(read, walk, state, bins, swept, how="swept in one stop")
        read.one_stop = read.walk is not None

    def _held_sweep(
        self, hold: ArenaHold
    ) -> tuple[ArenaState, list[Heap], tuple[ArenaWalk, list[int], WalkedLists | str]] | None:
        """sweep_in_one_stop's stop: at a moment the arena is unlocked, its state, its heaps
        (with their residency) and _swept_whole of them, all read in that stop; None when it
        was locked at every try, or the read's time ran out first."""
        from memforensics.sources.glibc.list_sweep import sweep_room

        room = sweep_room(held=True)  # (before the stop: our limits read, the buffer faulted)
        for attempt in range(LOCK_RETRIES + 1):
            if self.deadline.passed():
                return None
            # (The stop's own bound, in wall time: the read's relays may have seconds left.)
            bound = min(self.deadline.left_seconds(), one_stop_seconds())
            deadline = WorkDeadline(bound / wall_per_cpu_second())
            with hold.arena(0):
                state = read_state(self.mem, self.address)
                if state is not None and state.mutex == 0 and not hold.in_allocator():
                    heaps = self.heaps_now(state, True)
                    whole = _swept_whole(
                        self.mem,
                        state,
                        heaps,
                        self.part,
                        self.is_main,
                        deadline,
                        self.sbrk_base,
                        self.copy_max_bytes,
                        held=True,
                        room=room,
                    )
                    return state, heaps, whole
            if not hold.let_run(attempt):
                return None
        return None

    def _begin(self, state: ArenaState, heaps: list[Heap]) -> ArenaWalk:
        """In the first stop: the heaps' residency (as read before it where they did not
        change), the fastbins and the top (with bin 0), and the lists to follow."""
        for heap in heaps:
            heap.pages = self.known.get((heap.start, heap.size_bytes))
            if heap.pages is None:  # (its heap changed since: read in this stop)
                heap.pages = self.mem.pagemap(heap.start, heap.start + heap.mprotect_bytes)
        self.read.heaps = heaps
        first, last = self.part or (0, glibc.NBINS - 1)
        if first == 0:
            walk = fastbins_and_top(
                self.mem, heaps, state, self.is_main, self.deadline.at(), self.copy_max_bytes
            )
        else:  # (a part without the fastbins has none: the first part's are the arena's)
            walk = ArenaWalk(fastbin_chunks=())
        walk.part = self.part
        bins = [i for i in nonempty_bins(state, max(first, 1)) if i <= last]
        self.lists = {i: _List(i, bin_head(state, i)) for i in bins}
        return walk

    def _scattered(self) -> bool:
        """The lists lead to a block not read yet at most chunks (consecutive chunks lie
        far apart): followed so, millions of them would take seconds of stops. Told from the
        first stop's short stretch only at twice RELAY_MAX_PAGES_PER_CHUNK; after it, from
        what the stops after it read. (A busy arena's first lists are short ones of chunks
        its threads just freed, far apart wherever they fell, before its long lists in
        address order: judged on those, one read in five of such an arena was swept, and a
        sweep of a busy arena gives up.)"""
        followed = self.walk.chunks if self.walk is not None else 0
        followed += sum(each.cursor[2] for each in self.lists.values() if each.cursor)
        pages = self.read.pages_read
        if self.after_first is None:
            if self.read.stops == 1:
                scattered = pages > 2 * RELAY_MAX_PAGES_PER_CHUNK * followed
                if not scattered:
                    self.after_first = (followed, pages)
                return scattered and pages > _SCATTERED_MIN_PAGES
            self.after_first = (0, 0)
        followed -= self.after_first[0]
        pages -= self.after_first[1]
        return pages > _SCATTERED_MIN_PAGES and pages > RELAY_MAX_PAGES_PER_CHUNK * followed


def one_stop_seconds() -> float:
    """How long a sweep in one stop may hold the target: ONE_STOP_MAX_SECONDS, under a CPU
    quota at most what one stop may read within it by the held copy's two threads
    (cpu_quota.stop_reading_seconds: every stop is sized by it, so that the kernel never
    throttles us while the target is held)."""
    return stop_reading_seconds(ONE_STOP_MAX_SECONDS, readers=2)


def past_one_stop(heaps: Sequence[Heap], bytes_per_second: float) -> str | None:
    """Why a walk of ``heaps`` in one stop of every thread is not made (the sweep in one
    stop's, or the stand-in call's proof, list_proof): their bytes in RAM, walked at
    ``bytes_per_second``, would hold the target past one_stop_seconds() ("heaps' ... in RAM
    would hold every thread past ... s"); None where they fit."""
    resident = sum(
        h.pages.resident_bytes(h.pages.start, h.pages.end) for h in heaps if h.pages is not None
    )
    bound = one_stop_seconds()
    if resident <= bound * bytes_per_second:
        return None
    return f"heaps' {format_bytes(resident)} in RAM would hold every thread past {bound:g} s"


def fastbins_and_top(
    mem: MemoryReader,
    heaps: Sequence[Heap],
    state: ArenaState,
    is_main: bool,
    deadline: float,
    copy_max_bytes: int | None,
) -> ArenaWalk:
    """In the first stop (or from a core, or in the stand-in call's hold: list_proof): the
    fastbins and the top, read as any arena's walk reads them."""
    pool = FreshBuffers(copy_max_bytes)
    held = isinstance(mem, ProcessMemoryReader)
    walker = ArenaWalker(mem, heaps, is_main=is_main, pool=pool, held=held)
    try:
        walker.fastbins_and_top_only()
        return walker.walk(state, deadline=deadline)
    finally:
        walker.close()


def _stretch(
    mem: ProcessMemoryReader,
    cache: mmap.mmap,
    each: _List,
    state: ArenaState,
    spans: list[tuple[int, int] | tuple[int, int, bytes]],
    limit: int,
    end: float,
    read: RelayRead,
    keep_cache: bool = False,
    max_chunks: int = 0,
) -> tuple[int, ...] | HeapCorruption | str | None:
    """One stretch of ``each`` in this stop, until ``end`` or ``max_chunks`` chunks (0: no
    bound): None when it ended so, else what the list came to (the figures, a corruption,
    "not in RAM", or "gave up": moved too often). ``keep_cache``: ``cache`` holds blocks read
    earlier in this same stop."""
    assert _native is not None
    fd, bk = state.bins[2 * (each.index - 1)], state.bins[2 * (each.index - 1) + 1]
    while True:
        resume = each.cursor is not None
        if each.cursor is None:
            each.start(fd, read.stops)
        assert each.cursor is not None
        low, high = glibc.bin_size_range(each.index)
        status, cursor, detail, pages = _native.relay(
            mem.pid,
            mem.mem_fd,
            mem.pagemap_fd,
            spans,
            each.head,
            low,
            high,
            mem.page_bytes,
            limit,
            end,
            cache,
            resume,
            each.cursor,
            keep_cache,
            max_chunks,
        )
        keep_cache = True
        read.pages_read += pages
        each.cursor = cursor
        spanned = each.started_stop != read.stops  # followed over more than this stop
        if status == _TIME:
            return None
        if status == _DONE and bk == cursor[0]:
            figures: tuple[int, ...] = tuple(cursor[2:9])
            return figures
        again = False  # a check failed over several stops, not seen before: followed again
        if spanned and status in _CHECKS:
            failed = (cursor[1], status, detail)
            again = failed not in each.suspects
            each.suspects.add(failed)
        if again or status == _MOVED or (spanned and status in (_LOOP, _LIMIT)):
            each.restarts += 1
            if each.restarts > RELAY_RESTARTS:
                return "gave up"
            each.cursor = None  # followed again from the head, in this stop
            if time.monotonic() > end:
                return None
            continue
        if status == _NOT_IN_RAM:
            return "not in RAM"
        return _finding(state.address, each.index, each.head, status, cursor, detail, bk)


def _finding(
    arena: int,
    index: int,
    head: int,
    status: int,
    cursor: Sequence[int],
    detail: int,
    bk: int,
) -> HeapCorruption:
    """The corruption a stretch found (``cursor``: its chunk before and its chunk), in
    heap_checks' words (the same checks, on words read from the held target)."""
    previous, chunk = cursor[0], cursor[1]
    name = bin_name(index)
    whose = "the bin's fd" if previous == head else f"the fd of {previous:#x}"
    check = list_check(index)
    if status == _DONE:
        return HeapCorruption(
            arena,
            name,
            head,
            check,
            f"the bin's bk is {bk:#x}, its last chunk {previous:#x}",
        )
    if status == _OUTSIDE:
        return HeapCorruption(
            arena,
            name,
            previous,
            words.OUTSIDE_HEAPS,
            f"{whose} is {chunk:#x}, outside the arena's heaps",
        )
    if status == _ALIGN:
        return HeapCorruption(
            arena, name, previous, words.DOUBLE_LINKED, f"{whose} is {chunk:#x}, not aligned"
        )
    if status == _BK:
        return HeapCorruption(
            arena,
            name,
            chunk,
            check,
            f"its bk is {detail:#x}, not the chunk before it ({previous:#x})",
        )
    if status == _SIZE:
        return HeapCorruption(
            arena,
            name,
            chunk,
            words.UNSORTED_SIZE if index == 1 else words.SIZE_VS_PREV_SIZE,
            f"size {detail:#x} does not fit {name} or runs past its heap",
        )
    if status == _FOOT:
        return HeapCorruption(
            arena,
            name,
            chunk,
            words.UNSORTED_PREV_SIZE if index == 1 else words.SIZE_VS_PREV_SIZE,
            f"the next chunk's prev_size is {detail:#x}, not its size",
        )
    return HeapCorruption(arena, name, chunk, words.LIST_LOOPS, "the list loops")


def _merge_swept(walk: ArenaWalk, lists: dict[int, _List], swept: SweepResult) -> None:
    """What a sweep read of the lists still followed (``lists``) into the arena's walk: a
    bin is unmeasured once however many of the relay's lists and the sweep's findings name
    it (a sweep that found the heap corrupt names every bin, some of which the relay had
    already left unmeasured)."""
    for number, figures in swept.figures.items():
        _record(walk, lists[number], figures)
    walk.corruption.extend(swept.corruption)
    walk.unmeasured_bins[:] = sorted({*walk.unmeasured_bins, *swept.unmeasured})


def _record(walk: ArenaWalk, each: _List, outcome: tuple[int, ...] | HeapCorruption | str) -> None:
    """A list's outcome into the arena's walk: its figures, or the bin left unmeasured."""
    if isinstance(outcome, tuple):
        count, total, resident, trimmable, raw_min, raw_max, raw_total = outcome
        walk.chunks += count
        walk.free_bytes += total
        walk.resident_bytes += resident
        walk.trimmable_bytes += trimmable
        walk.bins[each.index] = (count, total)
        walk.bin_sizes[each.index] = (count, raw_min, raw_max, raw_total)
        return
    if isinstance(outcome, HeapCorruption):
        walk.corruption.append(outcome)
    walk.unmeasured_bins.append(each.index)
