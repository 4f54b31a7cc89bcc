"""One read of a live glibc heap: arenas, their heaps and free lists, mmapped chunks, stacks.

Everything is read-only and never stops the target. One pass over smaps finds the mappings;
/proc/PID/mem gives each sub-heap's ``heap_info`` and each arena's ``malloc_state`` (to order
the arenas as malloc_info numbers them and to walk their bins); /proc/PID/pagemap says which
pages are in RAM, and only those are ever read (a swapped page is not faulted back in: chunks
on it count as not resident, a list through it leaves its bin unmeasured). The anonymous
memory no sub-heap holds is searched page by page, within MMAP_SEARCH_SECONDS, for glibc's
mmapped chunks (also inside mappings the kernel merged) and, for a main arena that fell back
to mmap when sbrk failed, for its segments beyond [heap], which are then walked with it.
Matching the arenas to a dump and estimating what could not be read is analysis
(memforensics.analysis.residency_build).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace

from memforensics.model import glibc
from memforensics.model.heapscan import ArenaScan, HeapScan, MallocParams
from memforensics.sources.core.corememory import CoreMemory
from memforensics.sources.glibc import bin_relay, read_progress
from memforensics.sources.glibc.arena_figures import ArenaHold, held_read
from memforensics.sources.glibc.arena_read import Finish, merge_parts, read_arena, relayed_scan
from memforensics.sources.glibc.glibc_arenas import (
    ArenaState,
    Heap,
    brk_extent,
    find_heaps,
    find_main_arena,
    heaps_from_top,
    libc_data_regions,
    never_grew,
    read_state,
    reread_heaps,
)
from memforensics.sources.glibc.glibc_walk import (
    SCOUT_DENSE_MIN_BYTES,
    SCOUT_MAX_BYTES,
    ArenaWalker,
    scout_together,
)
from memforensics.sources.glibc.heap_search import (
    anonymous_spans,
    find_mmapped_chunks,
    main_arena_segments,
    stack_mappings,
    subtract_spans,
)
from memforensics.sources.glibc.heapcopy import BufferPool, FreshBuffers, copy_budget_bytes
from memforensics.sources.glibc.malloc_par import find_malloc_par, read_malloc_par
from memforensics.sources.proc.cpu_quota import (
    WorkDeadline,
    stop_copy_max_bytes,
    stop_pacer,
    wall_per_cpu_second,
)
from memforensics.sources.proc.own_cgroup import MemoryLimits
from memforensics.sources.proc.procmaps import Mapping, read_maps, read_smaps_and_totals
from memforensics.sources.proc.procmem import MemoryReader, PageMap, ProcessMemoryReader

# The walk runs after detach, with the target running: its time is the user's wait, not a
# pause. Past this budget the remaining bins are estimated from the XML, and the report says so.
WALK_BUDGET_SECONDS = 3.0
# A non-main arena whose system_mem disagrees with its heaps is read again this many times.
LAYOUT_RETRIES = 3
# The page-by-page search for mmapped chunks (and a main arena's mmapped segments) in the
# anonymous memory that no arena holds stops after this long; the scan then says so.
MMAP_SEARCH_SECONDS = 1.0
# A core's arena is copied whole up to this many resident bytes; a bigger one is read a page at
# a time as its lists lead (nothing moves in a core, and no stop is to be kept short), and one
# whose lists lead past that many pages is swept (sweep_still_arenas), so that our memory stays
# within the same bound as a live read's, whatever the core's arenas' size.
CORE_COPY_MAX_BYTES = 64 << 20
# Heap copies a held read may keep for walks made after its stop: past this, the stop ends
# early and they are walked (their buffers then serve the next arenas).
_PENDING_MAX_BYTES = 32 << 20
# A held read walks an arena after its stop only from this size on: there the walk is worth
# taking out of the stop (a big arena's lists, millions of chunks), while each arena waiting
# for its walk keeps its own copy buffer, which a thousand small arenas would each fault in.
_DEFER_MIN_BYTES = 4 << 20
# A held read scouts an arena of this much heap or more before its stop (glibc_walk's
# ArenaWalker.scout): the stop then copies the pages its lists lie on, not the whole arena.
# A smaller one is copied whole in its stop, as many as _PENDING_MAX_BYTES at a time: that
# copy (a few milliseconds at the copy's 5 GB/s) stalls the target less than the read allows
# itself, while a scout costs our wall a scout and, where it gives up on dense lists, both.
_SCOUT_MIN_BYTES = SCOUT_DENSE_MIN_BYTES  # (as big as _PENDING_MAX_BYTES)
# Heaps whose pagemaps come to this many entries or more (256 MiB of address space) are read
# two at a time (read_residency): the kernel's walk of them is most of a big arena's scout
# start, and of a stop that must read its residency again.
_PARALLEL_RESIDENCY_PAGES = 1 << 16
# Arenas scouted side by side, as many as the pages the last scout found suggest fit this:
# their copies wait for their stops (our memory), while one scout of many lists needs about
# as many reads as the scout of one.
_SCOUT_GROUP_BYTES = 96 << 20
# After this many scouts in a row gave up (their time out, or their lists on more pages than
# the scouts' room), the read's other arenas are copied whole without a scout: a process's
# arenas tend to look alike (but for one above the copies' budget, never copied whole).
_SCOUT_GIVE_UPS = 2
# A scouted arena whose lists lie on more pages than this is read in parts, one stop each
# (ArenaWalker.split): a part's stop copies its lists' pages (~1.3 us a page by two threads
# of ours), so that no one stop of a big arena with long spread lists lasts more than a few
# milliseconds, whatever its lists' size. An arena whose lists are moving (its bins' heads
# changed since its scout, or an earlier arena's did) is cut the same: its lists are caught
# up before each stop (ArenaWalker.catch_up), so a stop follows page by page (~7 us a page)
# only what moved in the milliseconds since, and finer parts would only add stops. (Under a
# small CPU quota parts are smaller, to fit its room: StopRules.part_max_bytes.)
_PART_MAX_BYTES = 16 << 20
_MAX_ARENAS = 1 << 16  # a ``next`` list longer than this is not glibc's
# A held read's budget grows by this much per thread arena: it stops the target every few
# arenas, and each stop of a process of many threads costs more (1,500 threads: 20-40 ms to
# stop and release them all), so a read that takes 2-4 s on an idle machine (1,500 arenas
# of as many threads) must not turn into a refusal on a slower or loaded one. The time is
# the user's wait, not the target's.
_HELD_SECONDS_PER_ARENA = 0.005
# ... and by this much per GiB of heap (the thread arenas' heaps and the main heap): a big
# arena's read costs its scout, its catch-up and its stop, up to a second a GiB where its
# lists are busy, and a read that would only take longer must not end in a refusal, which
# the default answers with the stand-in call: one stop of the whole process as long as
# malloc_info's walk of every arena, where going on costs the target stops of milliseconds.
_HELD_SECONDS_PER_GIB = 2.0
# ... and a core's read by this much: nothing waits on it but the user, and a core that is not
# in the page cache (copied from elsewhere) is read from disk as its lists lead, a page at a
# time.
_CORE_SECONDS_PER_GIB = 10.0


def _is_64bit(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/exe", "rb") as handle:
            header = handle.read(5)
    except OSError:
        return True  # no readable exe (e.g. deleted): assume the machine's word size
    return header[:4] == b"\x7fELF" and header[4] == 2


def arena_addresses(pid: int, libc_path: str | None) -> list[int]:
    """main_arena and every arena along its ``next`` chain (malloc_info's order), from
    /proc/PID/maps and a few reads per arena: no walk of the page tables (smaps) nor of the
    lists. [] where main_arena is not found or the chain does not close (a 32-bit target, a
    corrupt chain)."""
    if not _is_64bit(pid):
        return []
    mappings = read_maps(pid)
    with ProcessMemoryReader(pid) as mem:
        owners = {heap.ar_ptr for heap in find_heaps(mappings, mem)}
        main = find_main_arena(mappings, mem, libc_path, owners)
        state = None if main is None else read_state(mem, main)
        if state is None:
            return []
        chain = _arena_chain(mem, state, {})
    return [] if chain is None else [state.address, *chain]


def _arena_chain(
    mem: MemoryReader, main: ArenaState, states: dict[int, ArenaState]
) -> list[int] | None:
    """Addresses of the non-main arenas along main_arena.next (malloc_info's order).

    An arena created after the heap scan is read on the way, its heaps found from its top.
    """
    order: list[int] = []
    seen: set[int] = set()
    address = main.next_arena
    while address != main.address:
        if address in seen or len(order) > _MAX_ARENAS:
            return None
        if address not in states:
            state = read_state(mem, address)
            if state is None:
                return None
            states[address] = state
        seen.add(address)
        order.append(address)
        address = states[address].next_arena
    return order


def _settle_layout(
    mem: MemoryReader, state: ArenaState, heaps: list[Heap]
) -> tuple[ArenaState, list[Heap], bool]:
    """Re-read an arena whose system_mem disagrees with its heaps (it grew meanwhile)."""
    for _ in range(LAYOUT_RETRIES):
        if heaps and state.system_bytes == sum(h.size_bytes for h in heaps):
            return state, heaps, True
        fresh_state = read_state(mem, state.address)
        if fresh_state is None:
            break
        state = fresh_state
        heaps = heaps_from_top(mem, state) or reread_heaps(mem, heaps)
    return state, heaps, bool(heaps) and state.system_bytes == sum(h.size_bytes for h in heaps)


def _top_at_brk(
    mem: MemoryReader, state: ArenaState, brk: tuple[int, int] | None, walked: ArenaScan
) -> bool | None:
    """Whether the main arena's top ends at the program break (the end of [heap], the break
    rounded up to a page as the kernel maps it; glibc moves it in whole pages): systrim gives
    back only such a top. False for a top beyond [heap] (a main arena that fell back to
    mmap); None when the top's size cannot be read."""
    if brk is None or not brk[0] <= state.top < brk[1]:
        return False
    size = walked.top_bytes
    if size is None:
        data = mem.read(state.top, glibc.CHUNK_HEADER_BYTES)
        if data is None:
            return None
        size = int.from_bytes(data[8:], "little") & ~glibc.SIZE_FLAGS
    return state.top + size == brk[1]


def read_residency(mem: MemoryReader, heaps: Sequence[Heap]) -> None:
    """Each heap's residency (``Heap.pages``, over its mprotect_bytes) read now: of a live
    process's heaps of _PARALLEL_RESIDENCY_PAGES pages or more in all, two heaps at a time,
    in two threads (the kernel's walk of the entries, ~80 ns a resident page, is most of the
    cost, and the GIL is let go while it runs; in a stop the target's CPUs are idle). The
    same PageMaps as one by one; an unreadable pagemap raises as it would."""
    ranges = [(h.start, h.start + h.mprotect_bytes) for h in heaps]
    pages = sum(end - start for start, end in ranges) // mem.page_bytes
    serial = len(ranges) < 2 or pages < _PARALLEL_RESIDENCY_PAGES
    if serial or not isinstance(mem, ProcessMemoryReader):
        maps = [mem.pagemap(start, end) for start, end in ranges]
    else:
        maps = _pagemaps_in_two(mem, ranges)
    for heap, pagemap in zip(heaps, maps, strict=True):
        heap.pages = pagemap


def _pagemaps_in_two(mem: MemoryReader, ranges: Sequence[tuple[int, int]]) -> list[PageMap]:
    """``mem.pagemap`` of each of ``ranges``, in order, read by this thread and one more, each
    taking the next range left; the first exception either met is raised once both are done.
    (A plain thread, not concurrent.futures: its import, with logging's, costs every command
    ~9 ms at start-up.)"""
    maps: list[PageMap | None] = [None] * len(ranges)
    failures: list[BaseException] = []
    taken = iter(range(len(ranges)))
    lock = threading.Lock()

    def work() -> None:
        while not failures:
            with lock:
                index = next(taken, None)
            if index is None:
                return
            try:
                maps[index] = mem.pagemap(*ranges[index])
            except BaseException as exc:  # (raised by the caller's thread, below)
                failures.append(exc)

    second = threading.Thread(target=work, name="pagemap")
    second.start()
    try:
        work()
    finally:
        second.join()
    if failures:
        raise failures[0]
    return [pagemap for pagemap in maps if pagemap is not None]


def scan_heap(
    pid: int,
    *,
    libc_path: str | None = None,
    budget_seconds: float = WALK_BUDGET_SECONDS,
    pause: Callable[[], object] | None = None,
    arenas_only: bool = False,
    figures: bool = False,
    hold: ArenaHold | None = None,
    is_64: bool | None = None,
    unwalked: Collection[int] = (),
    one_stop_sweeps: bool = True,
) -> HeapScan:
    """Read every arena of ``pid``: heaps, residency, free lists (within the time budget).

    ``pause`` is called before each arena is read and between slices of its copy (every
    ~1 ms of work): a caller may hold the scan there (while gdb attaches, see
    gdb_scan.BackgroundScan). ``arenas_only``: the arenas alone, without the search for
    mmapped chunks and thread stacks (those figures are then 0 and ``arenas_only`` says so);
    the quick read made while gdb holds a target. ``figures``: also malloc_info's figures
    (ArenaScan.figures, HeapScan.malloc_params), each arena's from one moment: read inside
    ``hold`` (a live target) or from a memory that does not move (a core file). ``is_64``:
    whether the target is a 64-bit program, where its executable's ELF class was read
    already (check_target's); else read here. ``unwalked``: arenas (malloc_state addresses)
    whose heaps are read but not their lists (``lists_too_long``: a read just before found
    them too long to follow). ``one_stop_sweeps``: an arena whose long lists move between
    stops is swept in one stop of every thread (bin_relay); else it is left unread.
    """
    started = time.monotonic()
    mappings, totals = read_smaps_and_totals(pid)
    pool = BufferPool()
    try:
        with ProcessMemoryReader(pid) as mem:
            scan = _scan(
                pid,
                mappings,
                mem,
                pool,
                libc_path,
                started,
                budget_seconds,
                pause,
                arenas_only,
                figures=figures,
                hold=hold,
                is_64=is_64,
                unwalked=unwalked,
                one_stop_sweeps=one_stop_sweeps,
            )
            return replace(scan, arenas_only=arenas_only, smaps_totals=tuple(totals.items()))
    finally:
        pool.close()


def scan_memory(
    mappings: Sequence[Mapping],
    mem: MemoryReader,
    *,
    pid: int,
    libc_path: str | None,
    budget_seconds: float = WALK_BUDGET_SECONDS,
) -> HeapScan:
    """scan_heap over a memory that does not move (a core file's, 64-bit), with malloc_info's
    figures: every arena is read at the one moment the memory was saved. Its "resident"
    pages are the ones the memory holds, not RAM. An arena is copied whole only up to
    CORE_COPY_MAX_BYTES."""
    pool = BufferPool()
    pool.copy_max_bytes = min(pool.copy_max_bytes, CORE_COPY_MAX_BYTES)
    try:
        return _scan(
            pid,
            list(mappings),
            mem,
            pool,
            libc_path,
            time.monotonic(),
            budget_seconds,
            figures=True,
            is_64=True,
        )
    finally:
        pool.close()


class StopRules:
    """What a read made inside a stop of every thread (``hold``) may do, stated once:

    - an arena's state is the one read in this stop (held_read's, or read now), never an
      earlier one: a walk in a stop takes it as the arena's state at the stop;
    - nothing is retried in a stop: a list that reads inconsistently there will not mend,
      and a retry would only lengthen the stop;
    - an arena of _DEFER_MIN_BYTES or more is copied in the stop and walked after it; such
      copies wait for their walks, at most _PENDING_MAX_BYTES of them: past that the stop
      ends early and they are walked (their buffers then serve the next copies);
    - before an arena is copied, a stop that cannot take it ends, and the walks it left are
      made first (a fresh buffer would fault its pages in during the stop).

    Without a hold (a running target, a core) none of this applies: an arena's read may
    retry within its share of the time budget, and is walked at once.
    """

    def __init__(self, hold: ArenaHold | None, copy_max_bytes: int) -> None:
        self.hold = hold
        # Where the copies' budget is cut (our memory cgroup's limit), so are the copies kept
        # for their walks, and an arena above it is scouted however small.
        self.pending_max_bytes = min(_PENDING_MAX_BYTES, copy_max_bytes // 2)
        self.scout_min_bytes = min(_SCOUT_MIN_BYTES, copy_max_bytes)
        self.rows: list[Finish] = []  # each arena's read, in order; deferred walks on demand
        self.done: list[ArenaScan] = []  # the results of rows[: len(done)]
        self.pending_bytes = 0  # heap copies kept for walks not made yet
        # Pages scouted for the scouted arenas (or parts) read in the stop running now, as
        # scouted (before a catch-up): what that stop cost is learnt per such page once it
        # ends (_learn_copy_cost).
        self.stop_scouted_pages = 0

    @property
    def held(self) -> bool:
        return self.hold is not None

    @property
    def holding(self) -> bool:
        """A stop holds the target now: an arena's read in its stop. False in a held read's
        arena locked at every stop, then read while the target runs (arena_figures.held_read):
        that read must not take a moving list for a corrupt one, nor pin a page (a fork may
        share it meanwhile), nor read with two threads."""
        return self.hold is not None and self.hold.stopped

    def defers(self, weight_bytes: int, deferrable: bool = True) -> bool:
        """This arena's walk is made after its stop (a scouted one's never is)."""
        return deferrable and self.hold is not None and weight_bytes >= _DEFER_MIN_BYTES

    @property
    def part_max_bytes(self) -> int:
        """What one stop may copy of a scouted arena's pages: _PART_MAX_BYTES, less under a
        CPU quota too small for that (cpu_quota.stop_copy_max_bytes, as the stops so far
        measured it)."""
        return stop_copy_max_bytes(_PART_MAX_BYTES)

    def scouts(self, weight_bytes: int) -> bool:
        """This arena's lists are scouted before its stop: from scout_min_bytes on, and
        under a CPU quota whose room one stop's copy of that much would not fit, from what
        fits it (cpu_quota.stop_copy_max_bytes): a copied whole arena is not cut to the
        room, a scouted one's pages are (part_max_bytes)."""
        if self.hold is None:
            return False
        return weight_bytes >= stop_copy_max_bytes(self.scout_min_bytes)

    def let_run(self) -> None:
        """End the stop running, if any: what comes next reads the running target."""
        if self.hold is not None:
            self.hold.release()
            self._learn_copy_cost()

    def _learn_copy_cost(self) -> None:
        """After a stop that read scouted arenas (or parts), under a CPU quota: what its
        reading cost per page scouted for them (cpu_quota.StopPacer.learn_copy_cost) sizes
        the parts and scouts after it. Counted per page as scouted, so that what a busy
        arena's stop adds (the pages its catch-up and its rescout copy too) makes the next
        parts smaller: each then fits the quota's room, movement included."""
        if self.stop_scouted_pages:
            stop_pacer().learn_copy_cost(self.stop_scouted_pages)
            self.stop_scouted_pages = 0

    def retry_deadline(self, share_seconds: float) -> float:
        """Until when a list caught moving is read again: never in a stop."""
        return time.monotonic() + (0.0 if self.hold is not None else share_seconds)

    def add(
        self,
        read: Callable[[ArenaState | None], Finish],
        fresh_state: Callable[[], ArenaState | None],
        weight_bytes: int,
        deferrable: bool = True,
    ) -> None:
        """Read one arena (inside the hold when there is one); its walk is made at settle()."""
        if self.hold is not None:
            self.hold.make_room(weight_bytes)
            self.settle()
            if not self.hold.stopped:
                self._learn_copy_cost()  # (the stop make_room ended)
        self.rows.append(held_read(self.hold, read, fresh_state, weight_bytes))
        if self.defers(weight_bytes, deferrable):
            self.pending_bytes += weight_bytes

    def add_parts(
        self,
        walker: ArenaWalker | None,
        read: Callable[..., Finish],
        fresh_state: Callable[[], ArenaState | None],
        weight_bytes: int,
        *,
        moving: bool = False,
        relay: Callable[[tuple[int, int], dict[int, bytes]], ArenaScan | None] | None = None,
    ) -> None:
        """Read one arena (``add``; ``read`` is handed the state, and ``weight_bytes=``), in
        parts where its scouted ``walker`` splits (ArenaWalker.split: ``part_max_bytes``): each
        part in a stop of its own, the stops ended between them (where the pages the last
        one copied are zeroed), their scans one arena's (arena_read.merge_parts). A part's
        read that closed the walker (the arena was read whole: a heap went since the scout,
        or grew past its copy's room) ends it. Where the lists are ``moving``, each part's
        are caught up with the running target just before its stop (ArenaWalker.catch_up).
        A part whose pages come to more than _PART_MAX_BYTES (one bin whose list alone is
        that long) is read in relays where ``relay`` is given and can (``relay(part)`` is its
        read), instead of copied in one stop. (Not past a smaller ``part_max_bytes``: a relay's own
        stops cost more than such a part's one, in an arena of a GiB 20 ms of CPU each.)"""
        parts = 1
        part_max_bytes = self.part_max_bytes
        if walker is not None and self.hold is not None and walker.scouted_bytes > part_max_bytes:
            # (Its lists may come to more than a part: the split's work, the plan and the
            # scout's copy zeroed, is made with the target running, never in a stop that an
            # arena read before this one left open.)
            self.let_run()
            parts = walker.split(part_max_bytes // walker.page_bytes)
        start = len(self.rows)
        for part in range(parts):
            if part:
                assert walker is not None
                self.let_run()  # (what the part's stop cost a page sizes the next's)
                if walker.closed:
                    break
                walker.next_part()
            scouted_pages = 0 if walker is None else walker.scouted_bytes // walker.page_bytes
            if (
                walker is not None
                and moving
                and self.hold is not None
                and walker.moved_since_scout(fresh_state())
            ):
                # (Running: what its lists took on since the scout is learnt now, and
                # copied at one go in the stop instead of followed there page by page. An
                # arena whose heads stayed keeps the stop an arena before it left open.)
                # (The walks the last stop left are made first, and under a CPU quota the
                # wait for room, for the catch-up and the stop both: neither may come between
                # them, while the lists move again.)
                self.settle(force=True)
                with stop_pacer().leading_to_stop():
                    walker.catch_up(fresh_state)
            if walker is not None:
                weight_bytes = walker.scouted_bytes
                part_bins = walker.part
                if (
                    relay is not None
                    and part_bins is not None
                    and weight_bytes > _PART_MAX_BYTES
                    and self.add_relayed(functools.partial(relay, part_bins, walker.part_pages()))
                ):
                    if walker.parts_left == 0:
                        # Its last part was relayed: no part's read is left to close it (its
                        # scouted pages, up to the copies' budget, would stay ours).
                        walker.close()
                    continue
            self.add(
                functools.partial(read, weight_bytes=weight_bytes),
                fresh_state,
                weight_bytes,
                deferrable=walker is None,
            )
            self.stop_scouted_pages += scouted_pages
        if len(self.rows) - start > 1:
            self._merge_rows(start)

    def add_relayed(self, read: Callable[[], ArenaScan | None]) -> bool:
        """Read one arena in relays (bin_relay: it begins and ends its own stops), after the
        stop running now has ended and the walks it left are made. False, and nothing
        added, when the relay could not read it."""
        self.settle(force=True)
        scan = read()
        if scan is None:
            return False
        self.rows.append(lambda: scan)
        self.done.append(scan)
        return True

    def _merge_rows(self, start: int) -> None:
        """rows[start:] are one arena's parts: one row, their merge (done kept in step)."""
        parts = self.rows[start:]
        settled = self.done[start:]
        del self.done[start:]

        def merged() -> ArenaScan:
            return merge_parts([*settled, *(finish() for finish in parts[len(settled) :])])

        self.rows[start:] = [merged]

    def settle(self, force: bool = False) -> None:
        """Walk the copies a stop left once the target runs again; with ``force``, end the
        stop first. Copies kept past _PENDING_MAX_BYTES end the stop."""
        hold = self.hold
        if hold is not None and hold.stopped:
            if not force and self.pending_bytes <= self.pending_max_bytes:
                return
            hold.release()
            self._learn_copy_cost()
        self.done.extend(finish() for finish in self.rows[len(self.done) :])
        self.pending_bytes = 0


class _HeapRead:
    """One read of a process's heap (scan_heap, scan_memory): locate the arenas, search the
    anonymous memory, read each arena under StopRules, then the process-wide figures."""

    def __init__(
        self,
        pid: int,
        mappings: list[Mapping],
        mem: MemoryReader,
        pool: BufferPool,
        libc_path: str | None,
        *,
        deadline: WorkDeadline,
        pause: Callable[[], object] | None,
        arenas_only: bool,
        figures: bool,
        hold: ArenaHold | None,
        is_64: bool,
        unwalked: Collection[int] = (),
        one_stop_sweeps: bool = True,
    ) -> None:
        self.pid, self.mappings, self.mem, self.pool = pid, mappings, mem, pool
        self.one_stop_sweeps = one_stop_sweeps  # (scan_heap's)
        # (Grown by the scouts: an arena above the copies' budget whose lists lead to more
        # pages than the budget is refused without being followed again in its stop.)
        self.unwalked = set(unwalked)
        # Of those, the ones a scout of this read refused: read in relays where it can be
        # (bin_relay), never those a caller named (read before, and refused then).
        self.relayable: set[int] = set()
        self.relay_gave_up: dict[int, str] = {}  # of those, why their relays gave up
        # Until when relays may go on: RELAY_BUDGET_SECONDS for all of this read's relays
        # together (however many arenas a target has), set by the first.
        self.relays_deadline: WorkDeadline | None = None
        self.libc_path = libc_path
        self.deadline = deadline
        self.pause = pause or (lambda: None)
        self.arenas_only, self.figures, self.is_64 = arenas_only, figures, is_64
        self.rules = StopRules(hold, pool.copy_max_bytes)
        self.memory_limits = MemoryLimits()  # read once; each arena's room reads the usage
        self.notes: list[str] = []
        self.quota_waited_seconds = stop_pacer().waited_seconds  # before this read
        self.params: MallocParams | None = None
        self.seen: dict[int, list[Heap]] = {}  # each non-main arena's heaps, as read
        self.scouted: dict[int, ArenaWalker] = {}  # scouted arenas waiting for their stop
        # The arenas (malloc_state addresses; None: the main arena) prepare() judged to be
        # scouted, so whose buffers it did not fault in: under a CPU quota the judgement
        # follows the stops' costs as measured, and one of them copied whole after all has
        # its buffers faulted in before its stop (_prepare_if_judged_otherwise).
        self.judged_scouted: set[int | None] = set()
        self.last_scouted_bytes = 0  # what the last arena scouted found its lists on
        self.moving = False  # an arena's lists moved between its scout and its stop
        self.scout_gave_up = 0  # scouts in a row that gave up (out of time or of room)
        self._locate()

    def _locate(self) -> None:
        """The sub-heaps by arena, their states, main_arena and malloc_info's order."""
        mem = self.mem
        self.heaps = find_heaps(self.mappings, mem) if self.is_64 else []
        if not self.is_64:
            self.notes.append(
                "32-bit target: arena heaps are not located (only 64-bit layouts known)"
            )
        self.by_arena: dict[int, list[Heap]] = {}
        for heap in self.heaps:
            self.by_arena.setdefault(heap.ar_ptr, []).append(heap)
        self.states: dict[int, ArenaState] = {}
        for address in self.by_arena:
            state = read_state(mem, address)
            if state is not None:
                self.states[address] = state
        self.main_state: ArenaState | None = None
        order: list[int] | None = None
        if self.is_64:
            found = find_main_arena(self.mappings, mem, self.libc_path, set(self.states))
            self.main_state = read_state(mem, found) if found is not None else None
            if self.main_state is None:
                self.notes.append("main_arena not found in libc's data; arenas matched by size")
            else:
                order = _arena_chain(mem, self.main_state, self.states)
        self.chained = self.main_state is not None and order is not None
        self.order = order if order is not None else list(self.states)
        self.chained = self.chained and len(self.order) == len(self.states)
        self.brk = brk_extent(self.mappings)

    def search_anonymous(self) -> None:
        """Before any arena is walked: the anonymous memory no sub-heap holds, searched for
        mmapped chunks and, where the main arena fell back to mmap, for its segments."""
        spans = anonymous_spans(self.mappings, self.heaps) if self.is_64 else []
        self.pause()
        main = self.main_state
        # A main arena that fell back to mmap needs the chunks, to tell its segments apart.
        search = not self.arenas_only or (main is not None and main.noncontiguous)
        # (Of our CPU time: under a CPU quota the search may take longer, not find less.)
        seconds = MMAP_SEARCH_SECONDS * wall_per_cpu_second()
        self.chunks, self.searched = (
            find_mmapped_chunks(self.mem, spans, time.monotonic() + seconds, self.pause)
            if search
            else ([], False)
        )
        if search and not self.searched:
            self.notes.append(
                f"mmapped chunks: the search stopped after {seconds:g} s, "
                "some anonymous memory was not looked at"
            )
        self.main_heaps = _main_heaps(self.mem, spans, self.chunks, main, self.brk, self.notes)

    def prepare(self) -> None:
        """mp_'s counters (for malloc_info's figures) and, for a held read, the copy buffers
        of the biggest arena faulted in before any stop (the copies then only copy); a held
        read's budget grown for its arenas and its heaps' size (_HELD_SECONDS_PER_ARENA,
        _HELD_SECONDS_PER_GIB), and a core's read's by _CORE_SECONDS_PER_GIB (its time is all
        the user's wait, and a core not in the page cache is read from disk)."""
        static = not isinstance(self.mem, ProcessMemoryReader)
        if self.rules.held or static:
            heap_bytes = sum(
                h.size_bytes for heaps in (self.main_heaps, *self.by_arena.values()) for h in heaps
            )
            per_gib = _CORE_SECONDS_PER_GIB if static else _HELD_SECONDS_PER_GIB
            self.deadline.extend(
                _HELD_SECONDS_PER_ARENA * len(self.order) + per_gib * heap_bytes / (1 << 30)
            )
        if self.figures and self.main_state is not None:
            bases = [h.start for h in self.main_heaps] or [0]
            regions = libc_data_regions(self.mappings, self.libc_path)
            self.params = find_malloc_par(self.mem, regions, sbrk_bases=bases)
            if self.params is None:
                self.notes.append(
                    "mp_ not found in libc's data: the mmapped chunks' counters are unknown"
                )
        if self.rules.held:
            # A scouted arena copies into fresh buffers of its own (heapcopy.FreshBuffers),
            # and one whose scout gives up has its buffers faulted in then (_prepare_for);
            # an arena above the copies' budget is never copied whole: read lazily.
            heaps_of: list[tuple[int | None, Sequence[Heap]]] = [
                (None, self.main_heaps),
                *self.by_arena.items(),
            ]
            sizes = []
            for address, heaps in heaps_of:
                if self.rules.scouts(sum(h.size_bytes for h in heaps)):
                    self.judged_scouted.add(address)
                else:
                    sizes.append([h.size_bytes for h in heaps])
            fitting = [each for each in sizes if sum(each) <= self.pool.copy_max_bytes]
            if fitting:
                self.pool.prepare(max(fitting, key=sum))

    def _prepare_if_judged_otherwise(self, address: int | None, heaps: Sequence[Heap]) -> None:
        """Before the stop of an arena not scouted (and not relayed): its buffers faulted in
        now where prepare() judged it scouted (a CPU quota's room, as the stops since
        measured it, now fits its whole copy), not in its stop, nor in a stop an arena before
        it left open (ended first)."""
        if address in self.judged_scouted:
            self.judged_scouted.discard(address)
            self.rules.let_run()
            self._prepare_for(heaps)

    def _prepare_for(self, heaps: Sequence[Heap]) -> None:
        """The copy buffers of an arena to be copied whole after all (its scout gave up, or
        prepare() judged it scouted), faulted in now rather than in its stop, where they fit
        the copies' budget (a bigger arena is never copied whole)."""
        sizes = [h.size_bytes for h in heaps]
        if sum(sizes) <= self.pool.copy_max_bytes:
            self.pool.prepare(sizes)

    def read_main_arena(self) -> None:
        # (No heap: a main arena that never grew is read from its state alone, its figures
        # malloc_info's; any other is not read, and the document is refused.)
        if not self.main_heaps and (self.main_state is None or not never_grew(self.main_state)):
            return
        self.pause()
        weight = sum(h.size_bytes for h in self.main_heaps)
        address = self.main_state.address if self.main_state is not None else None
        scouts = self.rules.scouts(weight)
        scouted = self._scout_main() if scouts else None
        if scouted is not None:
            weight = scouted.scouted_bytes
        elif address is not None and self._relayed(address, is_main=True):
            return
        elif scouts:
            self._prepare_for(self.main_heaps)
        else:
            self._prepare_if_judged_otherwise(None, self.main_heaps)
        moving = scouted is not None and (
            self.moving
            or address is None
            or scouted.moved_since_scout(read_state(self.mem, address))
        )
        self.rules.add_parts(
            scouted,
            functools.partial(self._read_main, scouted=scouted),
            lambda: None if address is None else read_state(self.mem, address),
            weight,
            moving=moving,
            relay=None if address is None else self._relay(address, is_main=True),
        )

    def _scout_main(self) -> ArenaWalker | None:
        """The main arena's lists scouted while the target runs (ArenaWalker.scout) over its
        heaps as they are now; None where the scout gave up or its state cannot be read.
        Its stop uses it only where it finds the same heaps (the break did not move)."""
        if self.main_state is None:
            return None
        self.rules.let_run()
        state = read_state(self.mem, self.main_state.address)
        if state is None:
            return None
        heaps, _ = self._main_heaps_now(state)
        walker = self._scout_walker(heaps, is_main=True)
        if walker.scout(state, self.deadline.at()):
            return walker
        self._outgrown(state.address, heaps)
        walker.close()
        return None

    def _main_heaps_now(
        self, state: ArenaState, scouted: ArenaWalker | None = None, *, pages: bool = True
    ) -> tuple[list[Heap], tuple[int, int] | None]:
        """The main arena's heaps as the target has them now, their residency read now (or,
        where ``scouted`` read the same heaps, the one read before its scout:
        ArenaWalker.keep_scout_residency), and the program break's extent: a contiguous
        main arena's top ends at the break, which a busy heap moves."""
        mem, brk = self.mem, self.brk
        if brk is None:
            heaps = list(self.main_heaps)
            if pages and (scouted is None or not scouted.keep_scout_residency(heaps)):
                for heap in heaps:
                    heap.pages = mem.pagemap(heap.start, heap.start + heap.size_bytes)
            return heaps, brk
        header = mem.read(state.top, glibc.CHUNK_HEADER_BYTES)
        if header is not None and brk[0] <= state.top < brk[1] + glibc.HEAP_MAX_BYTES:
            top_end = state.top + (int.from_bytes(header[8:], "little") & ~7)
            # A size read from the target: the break moves by what a busy heap grows in a
            # moment, never by an absurd top (heap_checks names that one corrupt).
            if top_end <= brk[1] + glibc.HEAP_MAX_BYTES:
                brk = (brk[0], max(glibc.page_ceil(top_end, mem.page_bytes), brk[0]))
                self.brk = brk
        first = Heap(brk[0], 0, brk[1] - brk[0], brk[1] - brk[0])
        heaps = [first, *(h for h in self.main_heaps if h.ar_ptr)]
        if pages and (scouted is None or not scouted.keep_scout_residency(heaps)):
            first.pages = mem.pagemap(brk[0], brk[1])
        return heaps, brk

    def _read_main(
        self, fresh: ArenaState | None, *, weight_bytes: int, scouted: ArenaWalker | None = None
    ) -> Finish:
        mem, held = self.mem, self.rules.holding
        heaps = self.main_heaps
        state = self.main_state if not held or self.main_state is None else fresh
        if state is None and self.main_state is not None:
            state = read_state(mem, self.main_state.address)  # this stop's, not the earlier
        if self.params is not None and held:
            self.params = read_malloc_par(mem, self.params)
        brk = self.brk
        if held and state is not None:
            # The heaps and their pages in RAM as of this stop (a scouted arena whose heaps
            # did not move: as of its scout, each page checked again as it is copied): a
            # copy never reads a page that left RAM since an earlier pagemap.
            heaps, brk = self._main_heaps_now(state, scouted)
        finish = read_arena(
            mem,
            self.pool,
            state,
            heaps,
            is_main=True,
            layout_ok=True,
            deadline=self.deadline.at(),
            retry_deadline=self.rules.retry_deadline(0.0) if held else None,
            pause=self.pause,
            figures=self.figures,
            held=held,
            defer=self.rules.defers(weight_bytes, scouted is None),
            scouted=scouted,
            walk=state is None or state.address not in self.unwalked,
        )
        if state is None:
            return finish
        at = state

        def with_top_at_brk() -> ArenaScan:
            # A deferred walk took the top's size from its copy: nothing more is read.
            row = finish()
            return replace(row, top_at_brk=_top_at_brk(mem, at, brk, row))

        return with_top_at_brk

    def read_thread_arenas(self) -> None:
        try:
            self._read_thread_arenas()
        finally:
            for walker in self.scouted.values():  # (the read ended before their stops)
                walker.close()
            self.scouted.clear()

    def _read_thread_arenas(self) -> None:
        for position, address in enumerate(self.order):
            self.pause()
            # Re-reads of a hot arena may use its fair share of what is left of the budget.
            share = self.deadline.left_seconds() / (len(self.order) - position)
            weight = sum(h.size_bytes for h in self.by_arena.get(address, ()))
            scouted = None
            # (Past the give-ups, an arena too big to be copied whole is still scouted: for
            # it, no scout means a refusal.)
            beyond = self._beyond(self.by_arena.get(address, ()))
            scouts = self.rules.scouts(weight)
            if scouts and (self.scout_gave_up < _SCOUT_GIVE_UPS or beyond):
                if address not in self.scouted:
                    self._scout_from(position)
                scouted = self.scouted.pop(address, None)
            if scouted is not None:
                weight = scouted.scouted_bytes
            elif self._relayed(address, is_main=False):
                continue
            elif not scouts:
                self._prepare_if_judged_otherwise(address, self.by_arena.get(address, ()))
            moving = scouted is not None and (
                self.moving or scouted.moved_since_scout(read_state(self.mem, address))
            )
            self.rules.add_parts(
                scouted,
                functools.partial(
                    self._read_thread_arena, address=address, share=share, scouted=scouted
                ),
                functools.partial(read_state, self.mem, address),
                weight,
                moving=moving,
                relay=self._relay(address, is_main=False),
            )
            # (A scouted arena is walked in its stop, so this is known now.)
            self.moving = self.moving or (scouted is not None and scouted.rescouted_pages > 0)
            self.rules.settle()
            read_progress.arenas(self.pid, 2 + position, 1 + len(self.order))
        self.rules.settle(force=True)

    def sweep_still_arenas(self) -> None:
        """In a memory that does not move (a core's): each arena whose lists led to more pages
        than its walk keeps (lists_too_long; a core has no relays) read by a sweep of its
        heaps instead (bin_relay.sweep_still_arena); refused as before where the sweep cannot
        read it (why: ``relay_gave_up``)."""
        if isinstance(self.mem, ProcessMemoryReader) or not self.figures:
            return
        for position, arena in enumerate(self.rules.done):
            if (
                arena.figures is not None
                or not arena.lists_too_long
                or arena.corruption  # (found corrupt already: reported, not read again)
                or arena.address is None
            ):
                continue
            state = read_state(self.mem, arena.address)
            heaps = self.main_heaps if arena.is_main else self.seen.get(arena.address, [])
            if state is None or not heaps or any(h.pages is None for h in heaps):
                continue
            # (The walks' kept copies and the core's pages mapped: the sweep's arrays need
            # the room.)
            self.pool.shrink(0)
            if isinstance(self.mem, CoreMemory):
                self.mem.forget_mapped()
            if self.relays_deadline is None:  # (the sweeps' time is their own, as relays')
                self.relays_deadline = WorkDeadline(bin_relay.RELAY_BUDGET_SECONDS)
            swept = bin_relay.sweep_still_arena(
                self.mem,
                state,
                list(heaps),
                is_main=arena.is_main,
                deadline=self.relays_deadline,
                sbrk_base=self.params.sbrk_base if self.params is not None else None,
                copy_max_bytes=self.pool.copy_max_bytes,
            )
            scan = relayed_scan(self.mem, swept, is_main=arena.is_main, figures=True)
            if scan is None:
                self.relay_gave_up[arena.address] = swept.gave_up or "not readable"
                continue
            if arena.is_main:
                scan = replace(scan, top_at_brk=_top_at_brk(self.mem, state, self.brk, scan))
            self.rules.done[position] = scan

    def _relayed(self, address: int, *, is_main: bool) -> bool:
        """An arena this read's scout refused (its lists lead past the copies' budget), read
        in relays instead (bin_relay) where it can be: True when it was read so. The arena
        is then walked; else refused as before."""
        relay = self._relay(address, is_main=is_main)
        return (
            address in self.relayable
            and relay is not None
            and self.rules.add_relayed(functools.partial(relay, None, None))
        )

    def _relay(
        self, address: int, *, is_main: bool
    ) -> Callable[[tuple[int, int] | None, dict[int, bytes] | None], ArenaScan | None] | None:
        """The read in relays (bin_relay) of the arena at ``address`` or of a part of its
        bins (``read(part, pages)``: its scan, None when the relay could not read it; ``pages``
        the part's scouted pages, bin_relay.relay_arena's); None
        where there is no relay: a target not held, a core, no C module."""
        hold, mem = self.rules.hold, self.mem
        if hold is None or not isinstance(mem, ProcessMemoryReader) or not bin_relay.available():
            return None

        def heaps_now(state: ArenaState, pages: bool) -> list[Heap]:
            if is_main:
                return self._main_heaps_now(state, pages=pages)[0]
            known = self.by_arena.get(address) or heaps_from_top(mem, state)
            heaps = _settle_layout(mem, state, known)[1]
            if pages:
                for heap in heaps:
                    heap.pages = mem.pagemap(heap.start, heap.start + heap.mprotect_bytes)
            return heaps

        def read(part: tuple[int, int] | None, pages: dict[int, bytes] | None) -> ArenaScan | None:
            if self.relays_deadline is None:  # (the first relay of this read starts the clock)
                self.relays_deadline = WorkDeadline(bin_relay.RELAY_BUDGET_SECONDS)
            # (The relay's time is its own: the arenas after it keep what the read had left.)
            with self.deadline.excluded():
                relayed = bin_relay.relay_arena(
                    mem,
                    hold,
                    address,
                    heaps_now,
                    is_main=is_main,
                    deadline=self.relays_deadline,
                    part=part,
                    pages=pages,
                    sbrk_base=self.params.sbrk_base if self.params is not None else None,
                    copy_max_bytes=self.pool.copy_max_bytes,
                    # (A part's relay that gives up is copied in one stop instead, from its
                    # scout's pages, add_parts: a stop as long as those pages take, where a
                    # sweep in one stop walks every heap of the arena.)
                    one_stop=self.one_stop_sweeps and part is None,
                )
            scan = relayed_scan(
                mem, relayed, is_main=is_main, figures=self.figures, scouted=part is not None
            )
            if scan is None:
                self.relay_gave_up[address] = relayed.gave_up or "not readable"
                return None
            self.unwalked.discard(address)
            if not is_main:
                self.seen[address] = relayed.heaps
                return scan
            assert relayed.state is not None
            return replace(scan, top_at_brk=_top_at_brk(mem, relayed.state, self.brk, scan))

        return read

    def _scout_from(self, position: int) -> None:
        """Scout, while the target runs, the arena at ``position`` of the order and the next
        arenas to scout, side by side (glibc_walk.scout_together), as many as the pages the
        last scout found suggest fit _SCOUT_GROUP_BYTES; one by one where that fails, until
        the pages scouted reach the copies' budget (the rest are scouted at their turn). The
        walkers wait in ``scouted`` for their arenas' stops. An arena whose scout gave up has
        none (its read copies it whole: its buffers are faulted in now, not in its stop)."""
        self.rules.let_run()
        group: list[tuple[ArenaWalker, ArenaState]] = []
        addresses: list[int] = []
        # (The first arena is scouted alone: what it finds sizes the groups after it; once
        # an arena's lists moved between its scout and its stop, each is scouted alone, just
        # before its stop: the longer the wait, the more a busy arena's stop re-reads.)
        last = self.last_scouted_bytes
        group_bytes = min(_SCOUT_GROUP_BYTES, self.pool.copy_max_bytes // 2)
        room = max(1, group_bytes // last) if last and not self.moving else 1
        for address in self.order[position:]:
            if len(group) >= room:
                break
            heaps = self.by_arena.get(address, ())
            if not self.rules.scouts(sum(h.size_bytes for h in heaps)):
                continue
            ready = self._scout_start(address)
            if ready is not None:
                group.append(ready)
                addresses.append(address)
        budget = self._scout_room_bytes(
            any(self._beyond(self.by_arena[address]) for address in addresses)
        )
        together = len(group) > 1 and scout_together(group, self.deadline.at(), budget)
        found = kept = 0
        for address, (walker, state) in zip(addresses, group, strict=True):
            if not together and kept >= budget:
                walker.close()  # our memory until their stops: scouted at their own turn
                continue
            if together or walker.scout(state, self.deadline.at()):
                kept += walker.scouted_bytes
                self.scouted[address] = walker
                found = max(found, walker.scouted_bytes)
                self.scout_gave_up = 0
            else:
                self.scout_gave_up += 1
                self._outgrown(address, self.by_arena[address])
                walker.close()
                self._prepare_for(self.by_arena[address])
        part_max_bytes = self.rules.part_max_bytes
        for address in addresses:
            # (Running still: what each stop would do over its copy alone is done now, the
            # stop then reads and compares the words its walk read. Not for an arena to be
            # read in parts: its copy is zeroed between them.)
            waiting = self.scouted.get(address)
            if waiting is not None and waiting.scouted_bytes <= part_max_bytes:
                now = read_state(self.mem, address)
                if now is not None:
                    waiting.prepare_stop(now, self.deadline.at())
        self.last_scouted_bytes = found or self.last_scouted_bytes

    def _scout_start(self, address: int) -> tuple[ArenaWalker, ArenaState] | None:
        """A walker for the arena's scout, with its state and residency read now; None for
        an arena whose state or heaps do not read back as one (read as without a scout)."""
        mem = self.mem
        state = read_state(mem, address)
        heaps = self.by_arena.get(address)
        if state is None or not heaps:
            return None
        state, heaps, layout_ok = _settle_layout(mem, state, heaps)
        if not layout_ok:
            return None
        read_residency(mem, heaps)
        return self._scout_walker(heaps, is_main=False), state

    def _scout_walker(self, heaps: Sequence[Heap], *, is_main: bool) -> ArenaWalker:
        """A walker for the scout of an arena of ``heaps`` (their residency read): fresh
        buffers with room for the heaps to grow until its stop, and the scouts' room."""
        return ArenaWalker(
            self.mem,
            heaps,
            is_main=is_main,
            pool=FreshBuffers(self.pool.copy_max_bytes),
            held=True,
            room_to_grow=True,
            scout_max_bytes=self._scout_room_bytes(self._beyond(heaps)),
        )

    def _outgrown(self, address: int, heaps: Sequence[Heap]) -> None:
        """After a scout that gave up: an arena above the copies' budget is not followed again
        in its stop (that read is never a whole copy, and would only hold every thread
        HELD_LAZY_SECONDS longer before a refusal): it is read in relays (bin_relay, whose
        checks in a stop tell a corrupt list from a moving one), else refused as lists too
        long (ArenaScan.lists_too_long). Whether its scout gave up on its pages or on its
        time (a loaded machine), only the relay can read it."""
        if self._beyond(heaps):
            self.unwalked.add(address)
            self.relayable.add(address)

    def _beyond(self, heaps: Sequence[Heap]) -> bool:
        """An arena of ``heaps`` is above the copies' budget: never copied whole."""
        return sum(h.size_bytes for h in heaps) > self.pool.copy_max_bytes

    def _scout_room_bytes(self, beyond: bool) -> int:
        """Bytes of pages scouts may hold until their stops: the copies' budget less the
        whole-copy buffers kept faulted in, which are unmapped first down to what leaves the
        scouts SCOUT_MAX_BYTES, and all of them for the scout of an arena above the budget
        (``beyond``: with no whole copy to fall back on, a scout cut short by buffers kept
        for other arenas would refuse it). Our memory stays within the budget whatever mix
        of arenas a process has, and so does its order."""
        budget = self.pool.copy_max_bytes
        least = min(SCOUT_MAX_BYTES, budget)  # (a budget cut by our memory cgroup's limit)
        self.pool.shrink(0 if beyond else budget - least)
        room = max(least, budget - self.pool.kept_bytes)
        # Under a memory limit, what it leaves us now: what the read took since its budget
        # was set (a relay's arrays, our own heap's free pieces) is no longer there.
        headroom = self.memory_limits.headroom_bytes()
        if headroom is not None:
            room = min(room, copy_budget_bytes(headroom_bytes=headroom))
        return room

    def _read_thread_arena(
        self,
        fresh: ArenaState | None,
        *,
        address: int,
        share: float,
        weight_bytes: int,
        scouted: ArenaWalker | None = None,
    ) -> Finish:
        mem, held = self.mem, self.rules.holding
        state = self.states[address]
        if held:
            held_state = fresh or read_state(mem, address)
            if held_state is None:  # unreadable in this stop: its figures stay unknown
                return read_arena(
                    mem,
                    self.pool,
                    None,
                    [],
                    is_main=False,
                    layout_ok=True,
                    deadline=self.deadline.at(),
                    scouted=scouted,
                )
            state = held_state
        arena_heaps = self.by_arena.get(address) or heaps_from_top(mem, state)
        state, arena_heaps, layout_ok = _settle_layout(mem, state, arena_heaps)
        if not (held and scouted is not None and scouted.keep_scout_residency(arena_heaps)):
            read_residency(mem, arena_heaps)
        self.seen[address] = arena_heaps
        return read_arena(
            mem,
            self.pool,
            state,
            arena_heaps,
            is_main=False,
            layout_ok=layout_ok,
            deadline=self.deadline.at(),
            retry_deadline=self.rules.retry_deadline(share),
            pause=self.pause,
            figures=self.figures,
            held=held,
            defer=self.rules.defers(weight_bytes, scouted is None),
            scouted=scouted,
            walk=address not in self.unwalked,
        )

    def result(self, started: float) -> HeapScan:
        """The scan: every arena read, with the process-wide figures."""
        mem = self.mem
        pacer = stop_pacer()
        if pacer.quota is not None and self.rules.held:
            self.notes.append(
                f"memforensics runs under a CPU quota of {pacer.quota.cpus:.2f} CPU: its stops "
                f"waited {pacer.waited_seconds - self.quota_waited_seconds:.2f} s in all for "
                f"room in it (a stop throttled by the quota would hold the target until its "
                f"next period, {pacer.quota.period_seconds * 1e3:.0f} ms)"
            )
        all_heaps = [*self.main_heaps, *(h for a in self.order for h in self.seen.get(a, ()))]
        chunk_spans = [(start, start + size) for start, size in self.chunks]
        chunk_resident = sum(mem.pagemap(lo, hi).total_resident_bytes for lo, hi in chunk_spans)
        beyond_brk = [(h.start, h.start + h.size_bytes) for h in self.main_heaps if h.ar_ptr]
        stacks = (
            0 if self.arenas_only else self._stack_resident(all_heaps, chunk_spans + beyond_brk)
        )
        return HeapScan(
            pid=self.pid,
            page_bytes=mem.page_bytes,
            chained=self.chained,
            arenas=tuple(
                replace(arena, relay_gave_up=self.relay_gave_up.get(arena.address))
                if arena.figures is None and arena.address in self.relay_gave_up
                else arena
                for arena in self.rules.done
            ),
            heap_mapped_bytes=sum(h.size_bytes for h in all_heaps),
            heap_resident_bytes=sum(h.pages.total_resident_bytes for h in all_heaps if h.pages),
            mmap_chunks=len(self.chunks),
            mmap_chunk_bytes=sum(size for _, size in self.chunks),
            mmap_chunk_resident_bytes=chunk_resident,
            stack_resident_bytes=stacks,
            anon_resident_bytes=sum(m.anon_bytes or 0 for m in self.mappings),
            walk_seconds=time.monotonic() - started,
            walk_budget_seconds=self.deadline.at() - started,
            notes=tuple(self.notes),
            mmap_search_complete=self.searched,
            malloc_params=self.params,
        )

    def _stack_resident(self, heaps: list[Heap], found: list[tuple[int, int]]) -> int:
        """Resident bytes of thread stacks, less what the heap's own pieces hold of them."""
        heap_starts = {h.start for h in heaps}
        total = 0
        for stack in stack_mappings(self.mappings):
            if stack.start_address in heap_starts:
                continue
            inside = sum(
                self.mem.pagemap(
                    max(lo, stack.start_address), min(hi, stack.end_address)
                ).total_resident_bytes
                for lo, hi in found
                if lo < stack.end_address and hi > stack.start_address
            )
            total += max((stack.anon_bytes or 0) - inside, 0)
        return total


def _scan(
    pid: int,
    mappings: list[Mapping],
    mem: MemoryReader,
    pool: BufferPool,
    libc_path: str | None,
    started: float,
    budget_seconds: float,
    pause: Callable[[], object] | None = None,
    arenas_only: bool = False,
    *,
    figures: bool = False,
    hold: ArenaHold | None = None,
    is_64: bool | None = None,
    unwalked: Collection[int] = (),
    one_stop_sweeps: bool = True,
) -> HeapScan:
    read = _HeapRead(
        pid,
        mappings,
        mem,
        pool,
        libc_path,
        deadline=WorkDeadline(budget_seconds, start=started),
        pause=pause,
        arenas_only=arenas_only,
        figures=figures,
        hold=hold,
        is_64=_is_64bit(pid) if is_64 is None else is_64,
        unwalked=unwalked,
        one_stop_sweeps=one_stop_sweeps,
    )
    read.search_anonymous()
    read.prepare()
    read.read_main_arena()
    read_progress.arenas(pid, 1, 1 + len(read.order))
    read.read_thread_arenas()
    read.sweep_still_arenas()
    return read.result(started)


def _main_heaps(
    mem: MemoryReader,
    spans: list[tuple[int, int]],
    chunks: list[tuple[int, int]],
    state: ArenaState | None,
    brk: tuple[int, int] | None,
    notes: list[str],
) -> list[Heap]:
    """The main arena's memory, with its pages: [heap] (first, when there is one), then the
    segments it mmapped beyond [heap] when sbrk failed (glibc then sets NONCONTIGUOUS_BIT),
    found in ``spans`` less the mmapped ``chunks``. A note says so, and whether [heap] and
    those segments add up to the arena's system_mem."""
    heaps: list[Heap] = []
    if brk is not None:
        heaps.append(Heap(brk[0], 0, brk[1] - brk[0], brk[1] - brk[0]))
    if state is not None and state.noncontiguous:
        pieces = subtract_spans(spans, [(start, start + size) for start, size in chunks])
        seconds = MMAP_SEARCH_SECONDS * wall_per_cpu_second()
        for low, high in main_arena_segments(mem, pieces, state, time.monotonic() + seconds):
            heaps.append(Heap(low, state.address, high - low, high - low))
        located = sum(h.size_bytes for h in heaps)
        notes.append(
            f"main arena fell back to mmap (sbrk failed): {len(heaps) - (brk is not None)} "
            f"segments beyond [heap] found"
            + (
                ""
                if located == state.system_bytes
                else f"; {located:,} bytes located of its system_mem {state.system_bytes:,}"
            )
        )
    for heap in heaps:
        heap.pages = mem.pagemap(heap.start, heap.start + heap.size_bytes)
    return heaps
