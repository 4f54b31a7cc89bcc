"""One read of a live glibc heap: arenas, their heaps and free lists, mmapped chunks, stacks.

Everything is read-only and never stops the target. One pass over smaps finds the mappings;
/proc/PID/mem gives each sub-heap's ``heap_info`` and each arena's ``malloc_state`` (to order
the arenas as malloc_info numbers them and to walk their bins); /proc/PID/pagemap says which
pages are in RAM. Matching the arenas to a dump and estimating what could not be read is
analysis (memforensics.analysis.residency_build).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from memforensics.model import glibc
from memforensics.model.heapscan import ArenaScan, HeapScan
from memforensics.model.process import HeapSegment
from memforensics.sources.glibc.glibc_arenas import (
    ArenaState,
    Heap,
    find_heaps,
    find_main_arena,
    heaps_from_top,
    read_state,
    reread_heaps,
)
from memforensics.sources.glibc.glibc_walk import ArenaWalker
from memforensics.sources.glibc.heapcopy import BufferPool
from memforensics.sources.proc.procmaps import Mapping, read_smaps
from memforensics.sources.proc.procmem import ProcessMemoryReader

# The walk runs after detach, with the target running: its time is the user's wait, not a
# pause. Past this budget the remaining bins are estimated from the XML, and the report says so.
WALK_BUDGET_SECONDS = 3.0
# A non-main arena whose system_mem disagrees with its heaps is read again this many times.
LAYOUT_RETRIES = 3
_MAX_ARENAS = 1 << 16  # a ``next`` list longer than this is not glibc's


def _is_64bit(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/exe", "rb") as handle:
            header = handle.read(5)
    except OSError:
        return True  # no readable exe (e.g. deleted): assume the machine's word size
    return header[:4] == b"\x7fELF" and header[4] == 2


def _arena_chain(
    mem: ProcessMemoryReader, main: ArenaState, states: dict[int, ArenaState]
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
    mem: ProcessMemoryReader, state: ArenaState, heaps: list[Heap]
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


def _stack_resident_bytes(mappings: Sequence[Mapping], heap_starts: set[int]) -> int:
    """Anonymous RW mappings directly above an inaccessible guard page: thread stacks."""
    total = 0
    for below, mapping in itertools.pairwise(mappings):
        if mapping.path == "[stack]" or (
            mapping.anonymous
            and mapping.perms.startswith("rw")
            and mapping.start_address not in heap_starts
            and below.end_address == mapping.start_address
            and below.perms.startswith("---")
            and below.anonymous
            and below.size_bytes < glibc.HEAP_MAX_BYTES // 16
        ):
            total += mapping.anon_bytes or 0
    if mappings and mappings[0].path == "[stack]":
        total += mappings[0].anon_bytes or 0
    return total


def _mmapped_chunks(
    mappings: Iterable[Mapping], mem: ProcessMemoryReader
) -> Iterator[tuple[Mapping, int, int]]:
    """(mapping, start, bytes) of chunks glibc served with mmap: a chunk header at a
    mapping's start whose size has IS_MMAPPED set and is whole pages; several may share a
    mapping when adjacent mmaps merged, so follow them one after the other."""
    page = mem.page_bytes
    for mapping in mappings:
        address = mapping.start_address
        while address + glibc.CHUNK_HEADER_BYTES <= mapping.end_address:
            data = mem.read(address, 16) if mem.readable(address) else None
            if data is None:
                break
            prev_size = int.from_bytes(data[:8], "little")
            size_field = int.from_bytes(data[8:], "little")
            size = size_field & ~glibc.SIZE_FLAGS
            if (
                prev_size != 0
                or not size_field & glibc.IS_MMAPPED
                or size == 0
                or size % page
                or address + size > mapping.end_address
            ):
                break
            yield mapping, address, size
            address += size


def scan_heap(
    pid: int,
    *,
    libc_path: str | None = None,
    budget_seconds: float = WALK_BUDGET_SECONDS,
    pause: Callable[[], object] | None = None,
) -> HeapScan:
    """Read every arena of ``pid``: heaps, residency, free lists (within the time budget).

    ``pause`` is called before each arena is read and between slices of its copy (every
    ~1 ms of work): a caller may hold the scan there (while gdb attaches, see
    scanning.BackgroundScan).
    """
    started = time.monotonic()
    mappings = read_smaps(pid)
    pool = BufferPool()
    try:
        with ProcessMemoryReader(pid) as mem:
            return _scan(pid, mappings, mem, pool, libc_path, started, budget_seconds, pause)
    finally:
        pool.close()


def _scan(
    pid: int,
    mappings: list[Mapping],
    mem: ProcessMemoryReader,
    pool: BufferPool,
    libc_path: str | None,
    started: float,
    budget_seconds: float,
    pause: Callable[[], object] | None = None,
) -> HeapScan:
    pause = pause or (lambda: None)
    notes: list[str] = []
    is_64 = _is_64bit(pid)
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
    rows: list[ArenaScan] = []
    all_heaps: list[Heap] = []
    if brk is not None:
        main_heap = Heap(brk[0], 0, brk[1] - brk[0], brk[1] - brk[0])
        pause()
        main_heap.pages = mem.pagemap(brk[0], brk[1])
        all_heaps.append(main_heap)
        rows.append(
            _scan_arena(mem, pool, main_state, [main_heap], True, True, deadline, pause=pause)
        )
    for position, address in enumerate(order):
        pause()
        arena_heaps = by_arena.get(address) or heaps_from_top(mem, states[address])
        state, arena_heaps, layout_ok = _settle_layout(mem, states[address], arena_heaps)
        for heap in arena_heaps:
            heap.pages = mem.pagemap(heap.start, heap.start + heap.mprotect_bytes)
        all_heaps.extend(arena_heaps)
        # Re-reads of a hot arena may use its fair share of what is left of the budget.
        share = (deadline - time.monotonic()) / (len(order) - position)
        rows.append(
            _scan_arena(
                mem,
                pool,
                state,
                arena_heaps,
                False,
                layout_ok,
                deadline,
                time.monotonic() + share,
                pause=pause,
            )
        )

    heap_starts = {h.start for h in all_heaps}
    candidates = [
        m
        for m in mappings
        if m.anonymous
        and m.perms.startswith("rw")
        and m.rss_bytes
        and m.start_address not in heap_starts
    ]
    chunk_count = chunk_bytes = chunk_resident = 0
    for mapping, start, size in _mmapped_chunks(candidates, mem):
        chunk_count += 1
        chunk_bytes += size
        if size == mapping.size_bytes:
            chunk_resident += mapping.anon_bytes or 0
        else:
            chunk_resident += mem.pagemap(start, start + size).total_resident_bytes
    return HeapScan(
        pid=pid,
        page_bytes=mem.page_bytes,
        chained=main_state is not None and order is not None and len(order) == len(states),
        arenas=tuple(rows),
        heap_mapped_bytes=sum(h.size_bytes for h in all_heaps),
        heap_resident_bytes=sum(h.pages.total_resident_bytes for h in all_heaps if h.pages),
        mmap_chunks=chunk_count,
        mmap_chunk_bytes=chunk_bytes,
        mmap_chunk_resident_bytes=chunk_resident,
        stack_resident_bytes=_stack_resident_bytes(mappings, heap_starts),
        anon_resident_bytes=sum(m.anon_bytes or 0 for m in mappings),
        walk_seconds=time.monotonic() - started,
        walk_budget_seconds=budget_seconds,
        notes=tuple(notes),
    )


def _scan_arena(
    mem: ProcessMemoryReader,
    pool: BufferPool,
    state: ArenaState | None,
    heaps: list[Heap],
    is_main: bool,
    layout_ok: bool,
    deadline: float,
    retry_deadline: float | None = None,
    pause: Callable[[], object] | None = None,
) -> ArenaScan:
    segments = tuple(
        HeapSegment(h.start, h.size_bytes, h.pages.total_resident_bytes)
        for h in heaps
        if h.pages is not None
    )
    if state is None or not layout_ok:
        return ArenaScan(
            address=None if state is None else state.address,
            is_main=is_main,
            system_bytes=None if state is None else state.system_bytes,
            layout_ok=layout_ok,
            segments=segments,
            walked=False,
        )
    walker = ArenaWalker(mem, heaps, is_main=is_main, pool=pool, pause=pause)
    try:
        walk = walker.walk(state, deadline=deadline, retry_deadline=retry_deadline)
    finally:
        walker.close()
    return ArenaScan(
        address=state.address,
        is_main=is_main,
        system_bytes=state.system_bytes,
        layout_ok=layout_ok,
        segments=segments,
        walked=True,
        free_bytes=walk.free_bytes,
        free_resident_bytes=walk.resident_bytes,
        trimmable_bytes=walk.trimmable_bytes,
        chunks=walk.chunks,
        unmeasured_bins=tuple(walk.unmeasured_bins),
        retries=walk.retries,
        budget_reached=walk.budget_reached,
        top_bytes=walk.top_bytes,
        top_resident_bytes=walk.top_resident_bytes,
    )
