"""The forward walk of every heap of every glibc arena, chunk after chunk, of a live process
or a core: what the census classifies and what the pins read (model.chunks).

API (stable; the pins build on it):

- ``walk_process_chunks(pid, *, visit=None, keep=True, timeout_seconds=1.0, held=True,
  stops_seconds=None, pause_budget_seconds=None, each_heap=None) -> ProcessChunks``: a live
  process, read in short stops of every thread (sources.glibc.arena_hold.StopBatches) unless
  ``held`` is False; ``stops_seconds``, a list, receives every stop's length. Once the stops
  sum to ``pause_budget_seconds`` no window is read any more: the heaps not walked to their
  end are ``complete=False`` with ``stop_reason`` PAUSE_BUDGET_SPENT (so the stops sum to at
  most the budget plus one window's stop). Under a memory limit the windows shrink
  (heap_window.window_bytes_within).
- ``walk_core_chunks(path, *, visit=None, keep=True, each_heap=None) -> ProcessChunks``: a
  core file.
- ``walk_memory_chunks(mappings, mem, *, pid, libc_path, hold=None, visit=None,
  keep=True, go_on=None, each_heap=None) -> ProcessChunks``: any MemoryReader (both above
  end here); no window is read once ``go_on()`` is False;
  ``core_mappings(core, mem)`` and ``libc_of(mappings)`` give a core's arguments.

``visit(ref, view, base, addresses, sizes, states)`` is called as chunks are walked, while
their bytes are at hand: chunk ``i``'s bytes are ``view[addresses[i] - base:]`` (clipped to
the view: the first WINDOW_TAIL_BYTES of a chunk at least, unless the heap ends first); the
view is valid during the call only (the next window reuses its buffer). ``ref`` is a
ChunkRef (arena, heap, the heap's PageMap: a chunk whose page is not present read as zeros).
Mmapped chunks are visited with ``ref.arena == MMAPPED_ARENA``. ``keep=False`` keeps no
per-chunk arrays (a census of a GB heap needs none): each HeapChunks then has empty arrays,
``chunk_count`` and ``walked_to``. With ``keep=True`` the arrays cost 17 bytes a chunk;
``each_heap(heap)``, when given, receives each heap with its arrays as soon as it is walked,
and the ProcessChunks returned keeps it without them (as with ``keep=False``): the arrays of
one heap at a time are held, not those of every heap.

How a live read stays consistent: each heap is read in windows (1 MiB pieces for about 3 ms,
at most 16 MiB, plus a tail: sources.glibc.heap_window), each window in a stop of every
thread at a moment its arena's mutex is free (a single-threaded target: no thread inside the
allocator), copied through /proc/PID/mem (in C where the optional copy is built); the stop ends
as soon as the window is copied, so the target's longest stall does not grow with the heap.
The chunks are walked after the stop, from the copy. A chunk crossing a window's end is
continued from the next window (another moment): every header is validated (aligned, at
least MINSIZE, within the heap); a window that fails one is walked again once from the
previous window's start in one stop, and a header that still fails ends that heap's walk
(``complete=False``, ``stop_reason`` in glibc's words). Only pages present in the pagemap
are read (nothing is faulted in); a header on a page not present ends the heap's walk too.

States: LIVE unless the next chunk's PREV_INUSE bit is clear (FREE); FAST when on one of
its arena's fastbin lists (followed in a stop over a copy of the pages they lay on just
before it, at most FASTBIN_MAX_CHUNKS and FASTBIN_SECONDS per arena: past those, a note
says so and the chunks not reached count LIVE); TCACHE
when its second word is the process's tcache key (glibc 2.34+: ``tcache_key``, a random
word; 2.29-2.33: the owning tcache_perthread_struct), the key taken from a non-empty tcache
list; BOOKKEEPING for tcache_perthread_structs (validated: every count zero exactly when its
entry is) and a sub-heap's closing fenceposts; TOP for the arena's top.
"""

from __future__ import annotations

import os
import re
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

from memforensics.model import glibc
from memforensics.model.chunks import ChunkState, HeapChunks, ProcessChunks
from memforensics.sources.glibc.arena_figures import LOCK_RETRIES, ArenaHold
from memforensics.sources.glibc.glibc_arenas import (
    ArenaState,
    Heap,
    find_heaps,
    find_main_arena,
    heaps_from_top,
    libc_data_regions,
    read_state,
)
from memforensics.sources.glibc.heap_lists import (
    TCACHE_LAYOUTS,
    Tcache,
    fast_chunks,
    learn_key,
    tcache_struct,
)
from memforensics.sources.glibc.heap_search import anonymous_spans, find_mmapped_chunks
from memforensics.sources.glibc.heap_window import (
    WINDOW_BYTES,
    WINDOW_MAX_BYTES,
    WINDOW_TAIL_BYTES,
    ChunkRef,
    HeapWalk,
    Visit,
    window_buffer,
    window_bytes_within,
)
from memforensics.sources.glibc.malloc_par import find_malloc_par
from memforensics.sources.proc.cpu_quota import stop_copy_max_bytes, wall_per_cpu_second
from memforensics.sources.proc.own_cgroup import memory_headroom_bytes
from memforensics.sources.proc.procmaps import Mapping, read_smaps
from memforensics.sources.proc.procmem import MemoryReader, PageMap, ProcessMemoryReader

MMAP_SEARCH_SECONDS = 1.0
# The fastbins are followed first with the target running, for at most this long, to learn
# the pages their chunks lie on; the stop copies at most this many of those pages (16 MiB).
FAST_SCOUT_SECONDS = 0.25
FAST_COPY_MAX_PAGES = 4096
# In a stop kept for a batch of small heaps, an arena's fastbins are followed there for at
# most this long; lists longer than that get a scout and a stop of their own, as any arena's.
FAST_IN_BATCH_SECONDS = 0.001
MMAPPED_ARENA = -1
# A heap of at most this much (one window reads it whole) is copied in the stop running, if
# any, and walked after it with the other heaps copied in that stop, up to BATCH_MAX_BYTES of
# copies: a stop of a thousand threads costs tens of ms to make, a small heap's copy a tenth
# of one (1,500 arenas of a few hundred KiB each were otherwise a stop each).
BATCH_HEAP_MAX_BYTES = 1 << 20
BATCH_MAX_BYTES = 8 << 20
# A heap's stop_reason when the walk's pause budget ran out before its end.
PAUSE_BUDGET_SPENT = "the pause budget was spent"
_MAX_ARENAS = 1 << 16
_T = TypeVar("_T")
_Window = tuple[int, memoryview, int | None]  # HeapWalk.read_window's: base, bytes, top

if TYPE_CHECKING:
    from memforensics.sources.core.corefile import CoreFile
    from memforensics.sources.glibc.arena_hold import StopBatches


@dataclass
class _PlannedHeap:
    arena: int
    index: int
    start: int  # the first chunk
    heap_start: int  # the mapping's (or sub-heap's) start
    limit: int  # nothing of this heap lies at or beyond
    state_address: int | None  # its arena's malloc_state (None: unknown)
    pages: PageMap


def _arena_order(mem: MemoryReader, main: ArenaState | None, known: set[int]) -> list[int]:
    """The non-main arenas in malloc_info's order (main_arena.next), else as found."""
    if main is None:
        return sorted(known)
    order: list[int] = []
    address = main.next_arena
    while address != main.address and len(order) < _MAX_ARENAS:
        if address in order:
            break
        order.append(address)
        state = read_state(mem, address)
        if state is None:
            break
        address = state.next_arena
    return order + sorted(known - set(order))


def _plan(
    mappings: Sequence[Mapping], mem: MemoryReader, libc_path: str | None
) -> tuple[list[_PlannedHeap], list[Heap], list[str]]:
    """Every heap to walk, in arena order, with where its chunks begin and end."""
    notes: list[str] = []
    subheaps = find_heaps(mappings, mem)
    by_arena: dict[int, list[Heap]] = {}
    for heap in subheaps:
        by_arena.setdefault(heap.ar_ptr, []).append(heap)
    main_address = find_main_arena(mappings, mem, libc_path, set(by_arena))
    main = read_state(mem, main_address) if main_address is not None else None
    if main is None:
        notes.append("main_arena not found in libc's data: the main heap's top is unknown")
    planned: list[_PlannedHeap] = []
    parts = [m for m in mappings if m.path == "[heap]"]
    if parts:
        start, end = parts[0].start_address, parts[0].end_address
        for part in parts[1:]:
            if part.start_address == end:
                end = part.end_address
        pages = mem.pagemap(start, end)
        found = find_malloc_par(mem, libc_data_regions(mappings, libc_path), sbrk_bases=[start])
        chunk0 = main_first_chunk(start, end, found.sbrk_base if found is not None else None)
        planned.append(_PlannedHeap(0, 0, chunk0, start, end, main_address, pages))
    if main is not None and main.noncontiguous:
        notes.append(
            "main arena fell back to mmap (sbrk failed): its mmapped segments are not walked"
        )
    for position, address in enumerate(_arena_order(mem, main, set(by_arena)), start=1):
        state = read_state(mem, address)
        heaps = sorted(
            by_arena.get(address) or (heaps_from_top(mem, state) if state else []),
            key=lambda h: h.start,
        )
        first = next((h for h in heaps if h.start < address < h.start + h.size_bytes), None)
        if first is None:
            notes.append(f"arena {position}: its first heap was not found; not walked")
            continue
        for index, heap in enumerate([first, *(h for h in heaps if h is not first)]):
            chunk0 = subheap_first_chunk(address, heap, first)
            limit = heap.start + heap.mprotect_bytes
            pages = mem.pagemap(heap.start, limit)
            planned.append(_PlannedHeap(position, index, chunk0, heap.start, limit, address, pages))
    return planned, subheaps, notes


def main_first_chunk(start: int, end: int, sbrk_base: int | None) -> int:
    """Where the chunks of the main heap [start, end) begin: at mp_'s ``sbrk_base`` (aligned,
    as sysmalloc aligns its first chunk) where it lies in the heap, else at its start. They
    differ where the loader's own sbrk came first (glibc < 2.34's ld.so copies GLIBC_TUNABLES
    there: read from [heap]'s start, that text ends the walk at once)."""
    if sbrk_base is not None and start <= sbrk_base < end:
        return -(-sbrk_base // glibc.MALLOC_ALIGNMENT) * glibc.MALLOC_ALIGNMENT
    return start


def subheap_first_chunk(arena_address: int, heap: Heap, first: Heap) -> int:
    """Where the chunks of a thread arena's sub-heap ``heap`` begin: past its heap_info, and
    past the arena's malloc_state in the arena's ``first`` heap (the one holding it)."""
    info_bytes = arena_address - first.start  # sizeof(heap_info): 32, or 48 from 2.35
    at = arena_address + glibc.STATE_BYTES if heap is first else heap.start + info_bytes
    return -(-at // glibc.MALLOC_ALIGNMENT) * glibc.MALLOC_ALIGNMENT


def _chunk_reader(
    mem: MemoryReader, heaps: Sequence[_PlannedHeap]
) -> Callable[[int], bytes | None] | None:
    """A chunk's first 24 bytes in one pread of /proc/PID/mem, its page's presence taken from
    the heaps' page maps (MemoryReader.read reads the pagemap again each time); None for a
    memory that is not a live process's."""
    if not isinstance(mem, ProcessMemoryReader):
        return None
    fd = mem.mem_fd

    def read(address: int) -> bytes | None:
        for heap in heaps:
            pages = heap.pages
            if pages.start <= address and address + 24 <= pages.end:
                first = (address - pages.start) // pages.page_bytes
                last = (address + 23 - pages.start) // pages.page_bytes
                if not all(pages.present[first : last + 1]):
                    return None
                try:
                    data = os.pread(fd, 24, address)
                except OSError:
                    return None
                return data if len(data) == 24 else None
        return None

    return read


def _top_reader(mem: MemoryReader, state_address: int | None) -> Callable[[], int | None]:
    def top() -> int | None:
        if state_address is None:
            return None
        data = mem.read(state_address + glibc.OFF_TOP, 8)
        return None if data is None else int.from_bytes(data, "little")

    return top


def _locked(mem: MemoryReader, state_address: int | None) -> bool:
    if state_address is None:
        return False
    data = mem.read(state_address, 4)
    return data is not None and int.from_bytes(data, "little") != 0


def walk_memory_chunks(
    mappings: Sequence[Mapping],
    mem: MemoryReader,
    *,
    pid: int,
    libc_path: str | None,
    hold: ArenaHold | None = None,
    visit: Visit | None = None,
    keep: bool = True,
    go_on: Callable[[], bool] | None = None,
    each_heap: Callable[[HeapChunks], None] | None = None,
    window_max_bytes: int = WINDOW_MAX_BYTES,
) -> ProcessChunks:
    """Every heap's chunks of the memory ``mem`` (see the module), in stops of ``hold``;
    no window is read once ``go_on()`` is False (the rest: PAUSE_BUDGET_SPENT). Each heap
    goes to ``each_heap`` (when given) as soon as walked, and is kept without its arrays.
    A window reads at most ``window_max_bytes``; the small heaps' copies waiting for their
    walk come to at most that and BATCH_MAX_BYTES (less under a CPU quota: one stop's copy)."""
    planned, subheaps, notes = _plan(mappings, mem, libc_path)
    tcache = _first_tcache_keys(mem, planned)
    fast_by_arena: dict[int, set[int]] = {}
    heaps: list[HeapChunks] = []
    buffer = window_buffer(window_max_bytes) if planned else None
    batch_max_bytes = min(stop_copy_max_bytes(BATCH_MAX_BYTES), window_max_bytes)
    # Small heaps copied in the stop running, to walk once it ends: (heap, walk, its window).
    batch: list[tuple[_PlannedHeap, HeapWalk, _Window | None]] = []

    def done(walked: HeapChunks) -> None:
        if each_heap is not None:
            each_heap(walked)
            walked = replace(walked, addresses=array("Q"), sizes=array("Q"), states=b"")
        heaps.append(walked)

    def walk_batch() -> None:
        if hold is not None:
            hold.release()
        for heap, walk, window in batch:
            if window is not None:
                walk.walk_window(*window)
            done(_walk_on(walk, mem, hold, heap, go_on))
        batch.clear()

    for heap in planned:
        if go_on is not None and not go_on():
            walk_batch()
            done(_unwalked(heap))
            continue
        if heap.arena not in fast_by_arena:
            fast_by_arena[heap.arena] = _arena_fast_chunks(mem, hold, heap, planned, notes)
        fast = fast_by_arena[heap.arena]
        if hold is None or heap.limit - heap.start > BATCH_HEAP_MAX_BYTES:
            walk_batch()
            retry = hold is not None
            walk = _heap_walk(mem, heap, fast, tcache, visit, keep, buffer, retry, window_max_bytes)
            done(_walk_on(walk, mem, hold, heap, go_on))
            continue
        walk = _heap_walk(mem, heap, fast, tcache, visit, keep, None, True, window_max_bytes)
        weight = heap.limit - heap.start
        window = _held(hold, mem, heap.state_address, walk.read_window, weight)
        batch.append((heap, walk, window))
        if not hold.stopped or sum(w.buffer_bytes for _, w, _ in batch) >= batch_max_bytes:
            walk_batch()
    walk_batch()
    spans = anonymous_spans(mappings, subheaps)
    seconds = MMAP_SEARCH_SECONDS * wall_per_cpu_second()  # our CPU's, under a quota too
    mmapped, searched = find_mmapped_chunks(mem, spans, time.monotonic() + seconds)
    if not searched:
        notes.append("mmapped chunks: the search ran out of time; some were not looked at")
    if visit is not None:
        _visit_mmapped(mem, mmapped, visit)
    return ProcessChunks(
        pid=pid,
        page_bytes=mem.page_bytes,
        heaps=tuple(heaps),
        mmapped=tuple(mmapped),
        notes=tuple(notes),
        tcache_keys=len(tcache.keys),
    )


def _first_tcache_keys(mem: MemoryReader, planned: Sequence[_PlannedHeap]) -> Tcache:
    """The tcache key learnt before any window is walked: the main thread's tcache is the
    main heap's first chunk; a thread arena's first thread's, its first chunk."""
    tcache = Tcache(keys=set(), structs=set())
    for heap in planned:
        if heap.index == 0:
            header = mem.read(heap.start, 16)
            size = int.from_bytes(header[8:], "little") & ~glibc.SIZE_FLAGS if header else 0
            data = mem.read(heap.start, size) if size in TCACHE_LAYOUTS else None
            entries = tcache_struct(data, size) if data else None
            if entries:
                learn_key(mem, tcache, heap.start, entries)
    return tcache


def _arena_fast_chunks(
    mem: MemoryReader,
    hold: ArenaHold | None,
    heap: _PlannedHeap,
    planned: Sequence[_PlannedHeap],
    notes: list[str],
) -> set[int]:
    """The chunks on the fastbin lists of ``heap``'s arena, read in a stop (none when its
    malloc_state is unknown; a note when the lists were longer than the stop could follow).

    The lists are first followed with the target running, to learn the pages they lie on;
    the stop copies those pages in one read each run and follows the lists over the copy,
    reading from the held target only where a list moved off them since."""
    state_address = heap.state_address
    if state_address is None:
        return set()
    arena_heaps = [h for h in planned if h.arena == heap.arena]
    low = min(h.heap_start for h in arena_heaps)
    high = max(h.limit for h in arena_heaps)
    reader = _chunk_reader(mem, arena_heaps)
    if reader is not None and hold is not None and hold.stopped:
        # A stop kept from the heaps before (a batch: BATCH_HEAP_MAX_BYTES) holds the target:
        # short lists are followed in it, chunk by chunk; longer ones as below, in a stop of
        # their own after a scout with the target running.
        with hold.arena():
            quick = _fast_now(mem, hold, state_address, low, high, reader)
        if quick is not None:
            return quick
        hold.release()
    pages: set[int] = set()
    if reader is not None and hold is not None:
        state = read_state(mem, state_address)
        if state is not None:
            seconds = FAST_SCOUT_SECONDS * wall_per_cpu_second()
            seen, _ = fast_chunks(mem, state, low, high, seconds, reader)
            page_bytes = mem.page_bytes
            pages = {address // page_bytes for address in seen}
            pages |= {(address + 23) // page_bytes for address in seen}

    def read_fast() -> tuple[set[int], bool]:
        state = read_state(mem, state_address)
        if state is None:
            return set(), True
        read = reader
        if reader is not None and pages:
            read = _copied_reader(mem, arena_heaps, pages, reader)
        return fast_chunks(mem, state, low, high, read=read)

    found, complete = _held(hold, mem, state_address, read_fast)
    if not complete:
        notes.append(
            f"arena {heap.arena}: its fastbins were longer than a stop could follow;"
            f" {len(found):,} fast chunks were found, the rest count as live"
        )
    return found


def _fast_now(
    mem: MemoryReader,
    hold: ArenaHold,
    state_address: int,
    low: int,
    high: int,
    reader: Callable[[int], bytes | None],
) -> set[int] | None:
    """Inside ``hold.arena()``: the arena's fast chunks, when its mutex is free (no thread
    in the allocator, single-threaded) and its lists end within FAST_IN_BATCH_SECONDS and
    fast_chunks' count; else None."""
    if _locked(mem, state_address) or hold.in_allocator():
        return None
    state = read_state(mem, state_address)
    if state is None:
        return None
    found, complete = fast_chunks(mem, state, low, high, FAST_IN_BATCH_SECONDS, reader)
    return found if complete else None


def _copied_reader(
    mem: MemoryReader,
    heaps: Sequence[_PlannedHeap],
    pages: set[int],
    fallback: Callable[[int], bytes | None],
) -> Callable[[int], bytes | None]:
    """A chunk reader (as _chunk_reader's) over a copy of ``pages`` (page numbers) made now,
    at most FAST_COPY_MAX_PAGES of them, each run of neighbouring present pages in one read;
    a chunk off the copy is read by ``fallback``."""
    page_bytes = mem.page_bytes
    copied: dict[int, memoryview] = {}  # views into the runs' buffers: no copy per page
    wanted = sorted(pages)[:FAST_COPY_MAX_PAGES]
    present = []
    for page in wanted:
        address = page * page_bytes
        for heap in heaps:
            pagemap = heap.pages
            if pagemap.start <= address < pagemap.end:
                if pagemap.present[(address - pagemap.start) // page_bytes]:
                    present.append(page)
                break
    runs: list[list[int]] = []
    for page in present:
        if runs and runs[-1][-1] + 1 == page:
            runs[-1].append(page)
        else:
            runs.append([page])
    for run in runs:
        view = memoryview(bytearray(len(run) * page_bytes))
        if mem.read_into(view, run[0] * page_bytes):
            for i, page in enumerate(run):
                copied[page] = view[i * page_bytes : (i + 1) * page_bytes]

    def read(address: int) -> bytes | None:
        page, offset = divmod(address, page_bytes)
        data = copied.get(page)
        if data is not None:
            if offset + 24 <= page_bytes:
                return bytes(data[offset : offset + 24])
            after = copied.get(page + 1)
            if after is not None:
                return (bytes(data[offset:]) + bytes(after))[:24]
        return fallback(address)

    return read


def _heap_walk(
    mem: MemoryReader,
    heap: _PlannedHeap,
    fast: set[int],
    tcache: Tcache,
    visit: Visit | None,
    keep: bool,
    buffer: bytearray | None,
    retry: bool,
    window_max_bytes: int,
) -> HeapWalk:
    """A walk of ``heap`` in windows of at most ``window_max_bytes``, copied into ``buffer``
    (heap_window.window_buffer of that size; None: a buffer of its own, as big as its
    windows)."""
    return HeapWalk(
        mem,
        ChunkRef(heap.arena, heap.index, heap.pages),
        heap.start,
        heap.limit,
        _top_reader(mem, heap.state_address),
        fast,
        tcache,
        visit,
        keep,
        retry=retry,
        buffer=buffer,
        window_max_bytes=window_max_bytes,
    )


def _walk_on(
    walk: HeapWalk,
    mem: MemoryReader,
    hold: ArenaHold | None,
    heap: _PlannedHeap,
    go_on: Callable[[], bool] | None,
) -> HeapChunks:
    """``walk`` taken to the heap's end window by window, each window read in a stop of its
    own and walked with the target running, while ``go_on()`` (when given) is True."""
    while not walk.done:
        if go_on is not None and not go_on():
            return walk.result(heap.limit, PAUSE_BUDGET_SPENT)
        window = _held(hold, mem, heap.state_address, walk.read_window, WINDOW_BYTES)
        if hold is not None:
            hold.release()  # the walk of the copy is made with the target running
        if window is None:
            break
        walk.walk_window(*window)
    return walk.result(heap.limit)


def _unwalked(heap: _PlannedHeap) -> HeapChunks:
    """A heap not walked at all: the pause budget was spent before it."""
    return HeapChunks(
        arena=heap.arena,
        heap=heap.index,
        start=heap.start,
        mapped_end=heap.limit,
        addresses=array("Q"),
        sizes=array("Q"),
        states=b"",
        complete=False,
        stopped_at=heap.start,
        stop_reason=PAUSE_BUDGET_SPENT,
        walked_to=heap.start,
    )


def _visit_mmapped(mem: MemoryReader, mmapped: Sequence[tuple[int, int]], visit: Visit) -> None:
    """Each mmapped chunk visited with its first bytes (ref.arena == MMAPPED_ARENA)."""
    for address, size in mmapped:
        data = mem.read_present(address, min(size, WINDOW_TAIL_BYTES))
        pages = mem.pagemap(address, address + mem.page_bytes)
        visit(
            ChunkRef(MMAPPED_ARENA, 0, pages),
            memoryview(data),
            address,
            [address],
            [size],
            bytes((ChunkState.LIVE,)),
        )


def _held(
    hold: ArenaHold | None,
    mem: MemoryReader,
    state_address: int | None,
    read: Callable[[], _T],
    weight_bytes: int = 0,
) -> _T:
    """``read()`` inside a stop at a moment the arena is not being changed (its mutex free,
    no single thread inside the allocator), or unheld when there is no hold or the arena
    stayed locked through every retry."""
    if hold is None:
        return read()
    for attempt in range(LOCK_RETRIES + 1):
        with hold.arena(weight_bytes):
            if not (_locked(mem, state_address) or hold.in_allocator()):
                return read()
        if not hold.let_run(attempt):
            break
    return read()


def _single_threaded(pid: int) -> bool:
    try:
        return len(os.listdir(f"/proc/{pid}/task")) == 1
    except OSError:
        return False


def walk_process_chunks(
    pid: int,
    *,
    visit: Visit | None = None,
    keep: bool = True,
    timeout_seconds: float = 1.0,
    held: bool = True,
    stops_seconds: list[float] | None = None,
    pause_budget_seconds: float | None = None,
    each_heap: Callable[[HeapChunks], None] | None = None,
) -> ProcessChunks:
    """Every heap's chunks of live ``pid``; ``stops_seconds`` (when given) receives the
    length of every stop the read made. No window is read once the stops sum to
    ``pause_budget_seconds`` (None: no budget). ``each_heap``: see walk_memory_chunks."""
    from memforensics.sources.glibc.arena_hold import StopBatches
    from memforensics.sources.glibc.libc_elf import load_libc_image

    mappings = read_smaps(pid)
    libc_path = libc_of(mappings)
    hold: StopBatches | None = None
    if held:
        libc = load_libc_image(pid, libc_path) if libc_path else None
        hold = StopBatches(
            pid, libc=libc, single_threaded=_single_threaded(pid), timeout_seconds=timeout_seconds
        )
    try:
        with ProcessMemoryReader(pid) as mem:
            return walk_memory_chunks(
                mappings,
                mem,
                pid=pid,
                libc_path=libc_path,
                hold=hold,
                visit=visit,
                keep=keep,
                go_on=_within(hold, pause_budget_seconds),
                each_heap=each_heap,
                window_max_bytes=window_bytes_within(memory_headroom_bytes()),
            )
    finally:
        if hold is not None:
            hold.close()
            if stops_seconds is not None:
                stops_seconds.extend(hold.stops_seconds)


def _within(hold: StopBatches | None, budget_seconds: float | None) -> Callable[[], bool] | None:
    """True while ``hold``'s stops sum to less than ``budget_seconds`` (None: no bound)."""
    if hold is None or budget_seconds is None:
        return None
    return lambda: hold.total_stop_seconds < budget_seconds


_OLD_LIBC_NAME = re.compile(r"libc-\d+\.\d+(?:\.\d+)?\.so$")


def libc_of(mappings: Sequence[Mapping]) -> str | None:
    """The path of glibc's libc among ``mappings`` (libc.so.6, or libc-2.NN.so before 2.34)."""
    for mapping in mappings:
        base = os.path.basename(mapping.path)
        if base.startswith("libc.so") or _OLD_LIBC_NAME.match(base):
            return mapping.path
    return None


def core_mappings(core: CoreFile, mem: MemoryReader) -> list[Mapping]:
    """A core's mappings as /proc's readers expect them: the likely [heap] named so, and
    each mapping's bytes held in the core as its "resident" bytes (what can be read)."""
    hint = core.heap_range_hint
    mappings = []
    for mapping in core.mappings():
        held = mem.pagemap(mapping.start_address, mapping.end_address).total_resident_bytes
        span = (mapping.start_address, mapping.end_address)
        named = "[heap]" if hint is not None and span == hint else mapping.path
        anon = held if mapping.inode == 0 else 0
        mappings.append(replace(mapping, path=named, rss_bytes=held, anon_bytes=anon))
    return mappings


def walk_core_chunks(
    path: str,
    *,
    visit: Visit | None = None,
    keep: bool = True,
    each_heap: Callable[[HeapChunks], None] | None = None,
) -> ProcessChunks:
    """Every heap's chunks of the process a core file saved (``each_heap``: see
    walk_memory_chunks)."""
    from memforensics.sources.core.corefile import CoreFile

    with CoreFile(path) as core:
        mem = core.memory()
        try:
            mappings = core_mappings(core, mem)
            libc_path = libc_of(mappings)
            return walk_memory_chunks(
                mappings,
                mem,
                pid=core.pid or 0,
                libc_path=libc_path,
                visit=visit,
                keep=keep,
                each_heap=each_heap,
            )
        finally:
            mem.close()
