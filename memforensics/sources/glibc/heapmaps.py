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
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from memforensics.model import glibc
from memforensics.model.heapscan import ArenaScan, HeapScan, MallocParams
from memforensics.sources.glibc.arena_figures import ArenaHold, held_read
from memforensics.sources.glibc.arena_read import Finish, read_arena
from memforensics.sources.glibc.glibc_arenas import (
    ArenaState,
    Heap,
    find_heaps,
    find_main_arena,
    heaps_from_top,
    libc_data_regions,
    read_state,
    reread_heaps,
)
from memforensics.sources.glibc.heap_search import (
    anonymous_spans,
    find_mmapped_chunks,
    main_arena_segments,
    stack_mappings,
    subtract_spans,
)
from memforensics.sources.glibc.heapcopy import BufferPool
from memforensics.sources.glibc.malloc_par import find_malloc_par, read_malloc_par
from memforensics.sources.proc.procmaps import Mapping, read_smaps
from memforensics.sources.proc.procmem import MemoryReader, ProcessMemoryReader

# The walk runs after detach, with the target running: its time is the user's wait, not a
# pause. Past this budget the remaining bins are estimated from the XML, and the report says so.
WALK_BUDGET_SECONDS = 3.0
# A non-main arena whose system_mem disagrees with its heaps is read again this many times.
LAYOUT_RETRIES = 3
# The page-by-page search for mmapped chunks (and a main arena's mmapped segments) in the
# anonymous memory that no arena holds stops after this long; the scan then says so.
MMAP_SEARCH_SECONDS = 1.0
# Heap copies a held read may keep for walks made after its stop: past this, the stop ends
# early and they are walked (their buffers then serve the next arenas).
_PENDING_MAX_BYTES = 256 << 20
# A held read walks an arena after its stop only from this size on: there the walk is worth
# taking out of the stop (a big arena's lists, millions of chunks), while each arena waiting
# for its walk keeps its own copy buffer, which a thousand small arenas would each fault in.
_DEFER_MIN_BYTES = 4 << 20
_MAX_ARENAS = 1 << 16  # a ``next`` list longer than this is not glibc's


def _is_64bit(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/exe", "rb") as handle:
            header = handle.read(5)
    except OSError:
        return True  # no readable exe (e.g. deleted): assume the machine's word size
    return header[:4] == b"\x7fELF" and header[4] == 2


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


def _brk_extent(mappings: Sequence[Mapping]) -> tuple[int, int] | None:
    """[start, end) of the main arena's brk heap. The kernel may show it as several adjacent
    [heap] mappings (a forked child's inherited part and what it grew since, as in every
    PostgreSQL backend): one heap for the walk, whose chunks cross that boundary."""
    parts = [m for m in mappings if m.path == "[heap]"]
    if not parts:
        return None
    end = parts[0].end_address
    for part in parts[1:]:
        if part.start_address != end:
            break
        end = part.end_address
    return parts[0].start_address, end


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


def scan_heap(
    pid: int,
    *,
    libc_path: str | None = None,
    budget_seconds: float = WALK_BUDGET_SECONDS,
    pause: Callable[[], object] | None = None,
    arenas_only: bool = False,
    figures: bool = False,
    hold: ArenaHold | None = None,
) -> HeapScan:
    """Read every arena of ``pid``: heaps, residency, free lists (within the time budget).

    ``pause`` is called before each arena is read and between slices of its copy (every
    ~1 ms of work): a caller may hold the scan there (while gdb attaches, see
    scanning.BackgroundScan). ``arenas_only``: the arenas alone, without the search for
    mmapped chunks and thread stacks (those figures are then 0 and ``arenas_only`` says so);
    the quick read made while gdb holds a target. ``figures``: also malloc_info's figures
    (ArenaScan.figures, HeapScan.malloc_params), each arena's from one moment: read inside
    ``hold`` (a live target) or from a memory that does not move (a core file).
    """
    started = time.monotonic()
    mappings = read_smaps(pid)
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
            )
            return replace(scan, arenas_only=arenas_only)
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
    pages are the ones the memory holds, not RAM."""
    pool = BufferPool()
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
) -> HeapScan:
    pause = pause or (lambda: None)
    notes: list[str] = []
    is_64 = _is_64bit(pid) if is_64 is None else is_64
    heaps = find_heaps(mappings, mem) if is_64 else []
    if not is_64:
        notes.append("32-bit target: arena heaps are not located (only 64-bit layouts known)")
    by_arena: dict[int, list[Heap]] = {}
    for heap in heaps:
        by_arena.setdefault(heap.ar_ptr, []).append(heap)
    states: dict[int, ArenaState] = {}
    for address in by_arena:
        state = read_state(mem, address)
        if state is not None:
            states[address] = state
    main_state: ArenaState | None = None
    order: list[int] | None = None
    if is_64:
        main_address = find_main_arena(mappings, mem, libc_path, set(states))
        main_state = read_state(mem, main_address) if main_address is not None else None
        if main_state is None:
            notes.append("main_arena not found in libc's data; arenas matched by size")
        else:
            order = _arena_chain(mem, main_state, states)
    if order is None:
        order = list(states)
    brk = _brk_extent(mappings)

    deadline = started + budget_seconds
    # Before any arena is walked: the anonymous memory no sub-heap holds, searched for
    # mmapped chunks and, where the main arena fell back to mmap, for its segments.
    spans = anonymous_spans(mappings, heaps) if is_64 else []
    pause()
    # A main arena that fell back to mmap needs the chunks, to tell its segments from them.
    search = not arenas_only or (main_state is not None and main_state.noncontiguous)
    chunks, searched = (
        find_mmapped_chunks(mem, spans, time.monotonic() + MMAP_SEARCH_SECONDS, pause)
        if search
        else ([], False)
    )
    if search and not searched:
        notes.append(
            f"mmapped chunks: the search stopped after {MMAP_SEARCH_SECONDS:g} s, "
            "some anonymous memory was not looked at"
        )
    main_heaps = _main_heaps(mem, spans, chunks, main_state, brk, notes)
    rows: list[Finish] = []  # each arena's read, in order; a deferred walk is made on demand
    done: list[ArenaScan] = []  # the results of rows[: len(done)]
    pending_bytes = 0  # heap copies kept for walks not made yet

    def settle(force: bool = False) -> None:
        """Walk the copies a stop left (deferred reads) once the target runs again; with
        ``force``, end the stop first. Copies kept past _PENDING_MAX_BYTES end the stop."""
        nonlocal pending_bytes
        if hold is not None and hold.stopped:
            if not force and pending_bytes <= _PENDING_MAX_BYTES:
                return
            hold.release()
        done.extend(finish() for finish in rows[len(done) :])
        pending_bytes = 0

    all_heaps: list[Heap] = list(main_heaps)
    params: MallocParams | None = None
    seen: dict[int, list[Heap]] = {}  # each non-main arena's heaps, as its read found them
    if figures and main_state is not None:
        bases = [h.start for h in main_heaps] or [0]
        params = find_malloc_par(mem, libc_data_regions(mappings, libc_path), sbrk_bases=bases)
        if params is None:
            notes.append("mp_ not found in libc's data: the mmapped chunks' counters are unknown")
    if hold is not None:
        # The copy buffers of the biggest arena, faulted in before any stop (the copies
        # made during the stops then only copy).
        biggest = max(
            [[h.size_bytes for h in main_heaps]]
            + [[h.size_bytes for h in arena_heaps] for arena_heaps in by_arena.values()],
            key=sum,
        )
        pool.prepare(biggest)
    if main_heaps:
        pause()
        main_weight = sum(h.size_bytes for h in main_heaps)

        def read_main(fresh: ArenaState | None) -> Finish:
            nonlocal params, brk
            heaps = main_heaps
            state = main_state if hold is None or main_state is None else fresh
            if state is None and main_state is not None:
                state = read_state(mem, main_state.address)  # this stop's, not the earlier
            if params is not None and hold is not None:
                params = read_malloc_par(mem, params)
            if hold is not None and brk is not None and state is not None:
                # The program break of this stop (a busy heap grows and shrinks it): a
                # contiguous main arena's top ends there.
                header = mem.read(state.top, glibc.CHUNK_HEADER_BYTES)
                if header is not None and brk[0] <= state.top < brk[1] + glibc.HEAP_MAX_BYTES:
                    top_end = state.top + (int.from_bytes(header[8:], "little") & ~7)
                    # A size read from the target: the break moves by what a busy heap grows
                    # in a moment, never by an absurd top (heap_checks names that corrupt).
                    if top_end <= brk[1] + glibc.HEAP_MAX_BYTES:
                        brk = (brk[0], max(glibc.page_ceil(top_end, mem.page_bytes), brk[0]))
                first = Heap(brk[0], 0, brk[1] - brk[0], brk[1] - brk[0])
                first.pages = mem.pagemap(brk[0], brk[1])
                heaps = [first, *(h for h in main_heaps if h.ar_ptr)]
            # In a stop nothing moves: a list that reads inconsistently will not mend, and
            # retrying would only lengthen the stop (no retry_deadline left).
            retry_by = time.monotonic() if hold is not None else None
            finish = read_arena(
                mem,
                pool,
                state,
                heaps,
                True,
                True,
                deadline,
                retry_by,
                pause=pause,
                figures=figures,
                held=hold is not None,
                defer=hold is not None and main_weight >= _DEFER_MIN_BYTES,
            )
            if state is None:
                return finish
            at, at_brk = state, brk

            def with_top_at_brk() -> ArenaScan:
                # A deferred walk took the top's size from its copy: nothing more is read.
                row = finish()
                return replace(row, top_at_brk=_top_at_brk(mem, at, at_brk, row))

            return with_top_at_brk

        main_address = main_state.address if main_state is not None else None
        rows.append(
            held_read(
                hold,
                read_main,
                lambda: None if main_address is None else read_state(mem, main_address),
                main_weight,
            )
        )
        if hold is not None and main_weight >= _DEFER_MIN_BYTES:
            pending_bytes += main_weight
    for position, address in enumerate(order):
        pause()
        # Re-reads of a hot arena may use its fair share of what is left of the budget.
        share = (deadline - time.monotonic()) / (len(order) - position)

        weight = sum(h.size_bytes for h in by_arena.get(address, ()))

        def read_one(
            fresh: ArenaState | None,
            address: int = address,
            share: float = share,
            weight: int = weight,
        ) -> Finish:
            state = states[address]
            if hold is not None:
                # This stop's (held_read's, or read now), never the earlier: a walk in a stop
                # takes it as the arena's state at the stop (glibc_walk.ArenaWalker.walk).
                held_state = fresh or read_state(mem, address)
                if held_state is None:  # unreadable in this stop: its figures stay unknown
                    return read_arena(mem, pool, None, [], False, True, deadline)
                state = held_state
            arena_heaps = by_arena.get(address) or heaps_from_top(mem, state)
            state, arena_heaps, layout_ok = _settle_layout(mem, state, arena_heaps)
            for heap in arena_heaps:
                heap.pages = mem.pagemap(heap.start, heap.start + heap.mprotect_bytes)
            seen[address] = arena_heaps
            return read_arena(
                mem,
                pool,
                state,
                arena_heaps,
                False,
                layout_ok,
                deadline,
                time.monotonic() + (share if hold is None else 0.0),
                pause=pause,
                figures=figures,
                held=hold is not None,
                defer=hold is not None and weight >= _DEFER_MIN_BYTES,
            )

        if hold is not None:
            # A stop that cannot take this arena ends here, and the walks it left are made
            # before the arena is copied: their buffers serve its copy (a fresh buffer faults
            # its pages in during the stop).
            hold.make_room(weight)
            settle()
        rows.append(held_read(hold, read_one, functools.partial(read_state, mem, address), weight))
        if hold is not None and weight >= _DEFER_MIN_BYTES:
            pending_bytes += weight
        all_heaps.extend(seen.get(address, []))
        settle()
    settle(force=True)

    chunk_spans = [(start, start + size) for start, size in chunks]
    chunk_resident = sum(mem.pagemap(lo, hi).total_resident_bytes for lo, hi in chunk_spans)
    heap_starts = {h.start for h in all_heaps}
    beyond_brk = [(h.start, h.start + h.size_bytes) for h in main_heaps if h.ar_ptr]
    found = [*chunk_spans, *beyond_brk]
    stack_resident = 0
    for stack in stack_mappings(mappings) if not arenas_only else ():
        if stack.start_address in heap_starts:
            continue
        inside = sum(
            mem.pagemap(
                max(lo, stack.start_address), min(hi, stack.end_address)
            ).total_resident_bytes
            for lo, hi in found
            if lo < stack.end_address and hi > stack.start_address
        )
        stack_resident += max((stack.anon_bytes or 0) - inside, 0)
    return HeapScan(
        pid=pid,
        page_bytes=mem.page_bytes,
        chained=main_state is not None and order is not None and len(order) == len(states),
        arenas=tuple(done),
        heap_mapped_bytes=sum(h.size_bytes for h in all_heaps),
        heap_resident_bytes=sum(h.pages.total_resident_bytes for h in all_heaps if h.pages),
        mmap_chunks=len(chunks),
        mmap_chunk_bytes=sum(size for _, size in chunks),
        mmap_chunk_resident_bytes=chunk_resident,
        stack_resident_bytes=stack_resident,
        anon_resident_bytes=sum(m.anon_bytes or 0 for m in mappings),
        walk_seconds=time.monotonic() - started,
        walk_budget_seconds=budget_seconds,
        notes=tuple(notes),
        mmap_search_complete=searched,
        malloc_params=params,
    )


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
        for low, high in main_arena_segments(
            mem, pieces, state, time.monotonic() + MMAP_SEARCH_SECONDS
        ):
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
