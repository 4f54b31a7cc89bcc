"""Free lists whose chunks lie too far apart to follow in stops (bin_relay gives up on them:
a read per chunk), read by sweeping their arena's heaps instead: every chunk header walked
window by window, each window copied in a stop of every thread with the arena unlocked
(heap_window, as the census walks a heap), the free chunks' size words and links kept, and
the lists checked and counted in our memory.

Contract:
- A chunk is in a bin exactly when the next chunk's PREV_INUSE bit is clear (the top apart):
  glibc clears it when it bins a chunk, and sets it when it takes one out. Every such chunk
  must be linked both ways (its fd names a free chunk or a bin head whose bk names it back,
  and its bk likewise), and following fd from each bin's head must come back to that head:
  the lists as malloc_info follows them, each chunk counted once, in the bin whose head its
  list comes back to. The sizes are checked as the walk checks them (the bin's range, the next
  chunk's prev_size where the window holds it).
- The windows are copied at different moments: on an arena no thread changes they are one
  heap; on a busy one a link may disagree because the heap moved between two windows. So a
  disagreement is looked at again in one stop (the arena unlocked): where it still holds
  there, the heap is corrupt (rule 8: named, never called into); where it does not, the heap
  moved and the sweep gives up (MOVED_WHY: bin_relay may then sweep the arena again in one
  stop, every window of walk_lists ``held``, the counting after the stop).
- A chunk header the walk cannot pass (a size that is not one, or runs past the heap) fails
  for good only once read again in one stop from a boundary trusted before (HeapWalk's
  retry). Where the arena's malloc_state read the same in every stop that window rests on,
  the arena did not move: the heap is corrupt there (bin "heap", glibc's words, every bin
  unmeasured); else the sweep gives up.
- A core's memory does not move: swept with arena_figures.StillMemory as its hold (no stop),
  a disagreement found again is corruption there at once.
- Our memory: 33 bytes a free chunk (size word, fd, bk, address, a flag) plus the window
  buffer, at most SWEEP_MAX_CHUNKS chunks, fewer under a memory limit (past them it gives
  up); the counting is numpy's over those arrays and a few of 4 bytes a chunk (its other
  temporaries in blocks of _BLOCK), the lookups of each link's node and each chunk's bin in
  C where _heapwindow is built.
"""

from __future__ import annotations

import functools
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from memforensics.model import corruption as words
from memforensics.model import glibc
from memforensics.model.chunks import ChunkState
from memforensics.model.corruption import HeapCorruption, bin_name
from memforensics.sources import optional_native
from memforensics.sources.glibc.arena_figures import (
    LOCK_RETRIES,
    LOCKED_EVERY_TRY,
    ArenaHold,
    StillMemory,
)
from memforensics.sources.glibc.glibc_arenas import ArenaState, Heap, parse_state, read_state
from memforensics.sources.glibc.heap_checks import bin_head, list_check
from memforensics.sources.glibc.heap_chunks import main_first_chunk, subheap_first_chunk
from memforensics.sources.glibc.heap_lists import Tcache
from memforensics.sources.glibc.heap_window import (
    WINDOW_BYTES,
    ChunkRef,
    HeapWalk,
    held_window_buffer,
    window_buffer,
    window_bytes_within,
    window_max_bytes_of,
)
from memforensics.sources.proc.cpu_quota import WorkDeadline
from memforensics.sources.proc.own_cgroup import memory_headroom_bytes
from memforensics.sources.proc.procmem import MemoryReader

_FREE = int(ChunkState.FREE)
_native = optional_native("memforensics.sources.glibc._heapwindow")  # (numpy the fallback)
# The most free chunks a sweep keeps (33 bytes each, and a few arrays of 4 bytes each while
# counting): past it the sweep gives up (our memory, issue 31: 256 MiB at any heap size).
SWEEP_MAX_CHUNKS = 3_000_000
# Our memory a free chunk costs at the sweep's peak (its arrays, and numpy's sorts and
# searches over them while counting): under a memory limit (a container's), a sweep keeps
# no more chunks than what the limit leaves us allows, and gives up (the arena refused, with
# why) rather than have the kernel OOM-kill us in the middle of the read.
SWEEP_PEAK_BYTES_PER_CHUNK = 96
Figures = tuple[int, int, int, int, int, int, int]  # heapcopy.Tally's: count … raw_total


class _Free:
    """The free chunks a sweep found: address, size word (with its flags), fd, bk, and
    whether the next chunk's prev_size (where the window held it) repeats the size."""

    def __init__(self) -> None:
        self.columns: tuple[list[np.ndarray], ...] = ([], [], [], [], [])
        self.count = 0  # free chunks kept

    def visit(
        self,
        ref: ChunkRef,
        view: memoryview,
        base: int,
        addresses: Sequence[int],
        sizes: Sequence[int],
        states: bytes | bytearray,
    ) -> None:
        if _native is not None:  # (the columns in C; numpy below, the fallback)
            kept = states.count(_FREE)
            if not kept:
                return
            columns = [np.empty(kept, dtype=np.uint64) for _ in range(4)]
            foot = np.empty(kept, dtype=bool)
            wanted = addresses if isinstance(addresses, array) else array("Q", addresses)
            lengths = sizes if isinstance(sizes, array) else array("Q", sizes)
            kept = _native.free_columns(view, base, wanted, lengths, states, _FREE, *columns, foot)
            for column, values in zip(self.columns, (*columns, foot), strict=True):
                column.append(values[:kept])
            self.count += kept
            return
        free = np.frombuffer(bytes(states), dtype=np.uint8) == _FREE
        if not free.any():
            return
        at = np.asarray(addresses, dtype=np.uint64)[free]
        size = np.asarray(sizes, dtype=np.uint64)[free]
        usable = len(view) // 8 * 8
        memory = np.frombuffer(view[:usable], dtype=np.uint64)
        slot = ((at - np.uint64(base)) // np.uint64(8)).astype(np.int64)
        raw, fd, bk = memory[slot + 1], memory[slot + 2], memory[slot + 3]
        foot_slot = slot + (size // np.uint64(8)).astype(np.int64)
        held = foot_slot < len(memory)
        foot_ok = np.ones(len(at), dtype=bool)
        foot_ok[held] = memory[foot_slot[held]] == size[held]
        for column, values in zip(self.columns, (at, raw, fd, bk, foot_ok), strict=True):
            column.append(values)
        self.count += len(at)

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The five columns, each joined once its parts are let go (a column at a time: the
        join never holds two copies of everything)."""
        joined = []
        for column, kind in zip(self.columns, (np.uint64,) * 4 + (bool,), strict=True):
            joined.append(np.concatenate(column) if column else np.zeros(0, dtype=kind))
            column.clear()
        return tuple(joined)


class SweepResult:
    """What sweep_lists read: per bin its figures, the corruptions found (all bins then
    unmeasured), the bins it could not measure, and the stops it took."""

    def __init__(self) -> None:
        self.figures: dict[int, Figures] = {}
        self.corruption: list[HeapCorruption] = []
        self.unmeasured: list[int] = []
        self.stops = 0
        self.copied_bytes = 0  # of the heaps, copied in the sweep's stops (its windows)
        # The arena's malloc_state words as every stop of the sweep read them: one value
        # where no thread changed the arena's lists, bins or top meanwhile.
        self.arena_words: set[bytes | None] = set()

    def still(self, now: bytes | None) -> bool:
        """The arena read the same in every stop of the sweep and now (``now``)."""
        return now is not None and self.arena_words == {now}


def sweep_lists(
    mem: MemoryReader,
    hold: ArenaHold,
    state: ArenaState,
    heaps: Sequence[Heap],
    bins: Sequence[int],
    *,
    is_main: bool,
    deadline: WorkDeadline,
    sbrk_base: int | None = None,
) -> SweepResult | str:
    """The list bins ``bins`` of the arena of ``state`` (its heaps ``heaps``, as read in a
    stop, with their residency), read by a sweep (see the module): walk_lists, then
    count_lists. Where the sweep could not read them, why, in a few words: a heap walk cut
    short (a page not in RAM, the read's time, more free chunks than it keeps), the arena
    locked at every try, or a heap that moved under it (MOVED_WHY).
    ``sbrk_base``: where the main arena's first sbrk began (mp_'s; a program run through
    ld.so finds its break moved by the loader's own sbrk)."""
    walked = walk_lists(
        mem, hold, state, heaps, bins, is_main=is_main, deadline=deadline, sbrk_base=sbrk_base
    )
    return walked if isinstance(walked, str) else count_lists(mem, hold, walked)


@dataclass
class WalkedLists:
    """What a sweep's walk of the heaps kept, for count_lists: the free chunks' columns, the
    arena's bin heads as read once the heaps were walked, and the stops so far."""

    state: ArenaState
    heaps: Sequence[Heap]
    bins: Sequence[int]
    free: tuple[np.ndarray, ...]
    result: SweepResult


def walk_lists(
    mem: MemoryReader,
    hold: ArenaHold,
    state: ArenaState,
    heaps: Sequence[Heap],
    bins: Sequence[int],
    *,
    is_main: bool,
    deadline: WorkDeadline,
    sbrk_base: int | None = None,
    held: bool = False,
    room: SweepRoom | None = None,
) -> WalkedLists | str:
    """The sweep's walk of the heaps (sweep_lists' arguments and refusals), each window in a
    stop of ``hold``, the bins' heads read again in a stop after the last. ``held``: every
    thread is held for the whole walk by the caller (``hold`` a StillMemory then): its
    windows are HeapWalk's held ones, and a header that fails is not read again (nothing
    moved). ``room``: sweep_room(held), made before the caller's stop (None: made now)."""
    free = _Free()
    result = SweepResult()
    room = room if room is not None else sweep_room(held)
    max_chunks, buffer, window_max_bytes = room.max_chunks, room.buffer, room.window_max_bytes
    list_heads = _heads(state, bins)
    walked, total_bytes = 0, sum(h.size_bytes for h in heaps)
    for index, heap in enumerate(sorted(heaps, key=lambda h: h.start)):
        if heap.pages is None:
            return "a heap's residency could not be read"
        start = first_chunk(state, heap, heaps, is_main, sbrk_base)
        limit = heap.start + (heap.size_bytes if is_main else heap.mprotect_bytes)
        at = start
        walk = HeapWalk(
            mem,
            ChunkRef(0, index, heap.pages),
            start,
            limit,
            lambda: _top(mem, state.address),
            set(),
            Tcache(keys=set(), structs=set()),
            free.visit,
            keep=False,
            retry=not held,
            buffer=buffer,
            window_max_bytes=window_max_bytes,
            held=held,
        )
        arena_words: list[bytes | None] = []  # the malloc_state as each window's stop read it
        while not walk.done:
            walked += walk.at - at
            at = walk.at
            if deadline.passed():
                return "the read's time ran out"
            if _too_many(free.count, walked, total_bytes, max_chunks):
                cut = " within our memory cgroup's limit" if max_chunks < SWEEP_MAX_CHUNKS else ""
                return f"more free chunks than a sweep keeps{cut} ({max_chunks:,})"
            read = _in_a_stop(
                hold, mem, state.address, functools.partial(_window, mem, walk, state)
            )
            hold.release()
            if read is _LOCKED:
                return LOCKED_EVERY_TRY
            result.stops += 1
            window, now = cast(_Windowed, read)
            result.copied_bytes += len(window[1]) if window is not None else 0
            arena_words = [*arena_words[-(_STILL_STOPS - 1) :], now]
            result.arena_words.add(now)
            if now is None or _heads(parse_state(state.address, now), bins) != list_heads:
                # A list it sweeps gained or lost a chunk at an end: the chunks read in
                # other windows then disagree with it, and a disagreement not found again
                # in a stop ends the sweep anyway (after the whole heap).
                return MOVED_WHY
            if window is None:
                break
            walk.walk_window(*window)
        if not walk.complete:
            if walk.stop_check is None:  # a header on a page not in RAM when the heap was read
                return _absent_why(mem, walk)
            if not _still(arena_words):
                return MOVED_WHY
            return WalkedLists(state, heaps, bins, (), _broken_header(state, walk, result))
    state_words = _in_a_stop(
        hold, mem, state.address, lambda: mem.read(state.address, glibc.STATE_BYTES)
    )
    hold.release()
    if not isinstance(state_words, bytes):
        return LOCKED_EVERY_TRY
    result.arena_words.add(state_words)
    heads = parse_state(state.address, state_words)
    return WalkedLists(heads, heaps, bins, free.arrays(), result)


@dataclass(frozen=True)
class SweepRoom:
    """What a sweep's walk may take of our memory, worked out from our cgroup's limits: the
    free chunks it keeps at most, and its window buffer with the most one window reads."""

    max_chunks: int
    buffer: bytearray
    window_max_bytes: int


def sweep_room(held: bool) -> SweepRoom:
    """The room of a sweep's walk (``held``: HeapWalk's held windows), its buffer's pages
    faulted in now: to be made outside any stop (the limits' files read and a fresh 5 MiB
    buffer faulted in cost a stop ~1-10 ms)."""
    headroom_bytes = memory_headroom_bytes()
    if held:
        buffer = held_window_buffer(headroom_bytes)
        return SweepRoom(sweep_max_chunks(headroom_bytes), buffer, window_max_bytes_of(buffer))
    window_max_bytes = window_bytes_within(headroom_bytes)
    return SweepRoom(
        sweep_max_chunks(headroom_bytes), window_buffer(window_max_bytes), window_max_bytes
    )


def count_lists(mem: MemoryReader, hold: ArenaHold, walked: WalkedLists) -> SweepResult | str:
    """The lists of ``walked`` checked and counted (the module's contract); a disagreement
    is looked at again in a stop of ``hold`` (a corruption where it holds there, else
    MOVED_WHY)."""
    if walked.result.corruption:  # (a header that failed on a heap that did not move)
        return walked.result
    return _count(mem, hold, walked.state, walked.heaps, walked.bins, walked.free, walked.result)


_LOCKED = object()


MOVED_WHY = "its lists changed between the sweep's stops (threads busy in it)"
# A header that failed was read, in its last stop, from a chunk boundary the walk trusted
# since at most the three stops before: where the arena's malloc_state read the same in all
# of them, the header failed on one heap, not on one caught moving. (A malloc or free that
# changes a header changes a bin, a fastbin or the top, all in malloc_state; the exception is
# a realloc in place that grows into a free chunk in the middle of its bin's list, or
# shrinks, leaving the rest to tcache: a boundary the walk trusted could then lie under a
# grown block's data. Such a finding is a false alarm of exit 8, never a call.)
_STILL_STOPS = 4


_Windowed = tuple[tuple[int, memoryview, int | None] | None, bytes | None]


def _window(mem: MemoryReader, walk: HeapWalk, state: ArenaState) -> _Windowed:
    """In a stop: the walk's next window, and the arena's malloc_state words at that moment."""
    return walk.read_window(), mem.read(state.address, glibc.STATE_BYTES)


def _still(arena_words: list[bytes | None]) -> bool:
    """The arena did not change over the stops the failed header's window rests on: its
    malloc_state read the same in each of the last _STILL_STOPS (in all of them where the
    heap's walk had fewer: its first window begins at the heap's first chunk, a boundary in
    any stop). A header fails for good only in a window walked again from the window before
    (HeapWalk's retry) or in a heap's first window."""
    return bool(arena_words) and arena_words[-1] is not None and len(set(arena_words)) == 1


def _heads(state: ArenaState, bins: Sequence[int]) -> tuple[int, ...]:
    """The fd and bk of the heads of ``bins`` in ``state``."""
    return tuple(state.bins[2 * (number - 1) + side] for number in bins for side in (0, 1))


def _absent_why(mem: MemoryReader, walk: HeapWalk) -> str:
    """Why a walk stopped at a header on a page its heap's residency had not in RAM: the
    page is in RAM now (the heap grew into it or moved since: busy), or still not."""
    page = mem.page_bytes
    at = walk.stopped_at if walk.stopped_at is not None else walk.at
    if mem.pagemap(at // page * page, at // page * page + page).present[:1] == b"\x01":
        return MOVED_WHY
    return walk.stop_reason or "its heap's walk stopped"


def _broken_header(state: ArenaState, walk: HeapWalk, result: SweepResult) -> SweepResult:
    """The sweep's finding where a header failed on an arena that did not move (rule 8: the
    heap is corrupt there; nothing is called into it): every bin unmeasured."""
    assert walk.stop_check is not None and walk.stopped_at is not None
    result.corruption.append(
        HeapCorruption(
            state.address, "heap", walk.stopped_at, walk.stop_check, walk.stop_reason or ""
        )
    )
    result.unmeasured = list(range(1, glibc.NBINS))
    return result


_PROJECT_AFTER_BYTES = 64 << 20  # heap walked before the chunks to come are projected


def sweep_max_chunks(headroom_bytes: int | None) -> int:
    """The most free chunks a sweep keeps: SWEEP_MAX_CHUNKS, fewer where ``headroom_bytes``
    (what our memory cgroup's limit leaves us; None: no limit) holds fewer at
    SWEEP_PEAK_BYTES_PER_CHUNK."""
    if headroom_bytes is None:
        return SWEEP_MAX_CHUNKS
    return min(SWEEP_MAX_CHUNKS, headroom_bytes // SWEEP_PEAK_BYTES_PER_CHUNK)


def _too_many(kept: int, walked_bytes: int, total_bytes: int, max_chunks: int) -> bool:
    """More than ``max_chunks`` kept, or, past _PROJECT_AFTER_BYTES walked, as many free
    chunks a byte as so far over the whole heap would come to a quarter more than that."""
    if kept > max_chunks:
        return True
    if walked_bytes < _PROJECT_AFTER_BYTES:
        return False
    return kept * total_bytes > 1.25 * max_chunks * walked_bytes


def _in_a_stop(hold: ArenaHold, mem: MemoryReader, address: int, read: object) -> object:
    """``read()`` inside a stop at a moment the arena is unlocked (no single thread inside
    the allocator); _LOCKED when it was locked at every try."""
    assert callable(read)
    # A core's arena is swept as its walk reads it, its lock held or not: a core saved by an
    # abort inside the allocator (glibc's malloc_printerr) has the lock held, and its heap is
    # the one wanted.
    still = isinstance(hold, StillMemory)
    for attempt in range(LOCK_RETRIES + 1):
        with hold.arena(WINDOW_BYTES):
            state = read_state(mem, address)
            if state is not None and (state.mutex == 0 or still) and not hold.in_allocator():
                return read()
        if not hold.let_run(attempt):
            break
    return _LOCKED


def _top(mem: MemoryReader, address: int) -> int | None:
    state = read_state(mem, address)
    return state.top if state is not None else None


def first_chunk(
    state: ArenaState, heap: Heap, heaps: Sequence[Heap], is_main: bool, sbrk_base: int | None
) -> int:
    """Where the chunks of ``heap`` begin: in the main heap, at ``sbrk_base`` where it lies
    in the heap (heap_chunks.main_first_chunk); in a sub-heap, past heap_info (and the
    malloc_state, in an arena's first heap)."""
    if is_main:
        return main_first_chunk(heap.start, heap.start + heap.size_bytes, sbrk_base)
    first = next((h for h in heaps if h.start < state.address < h.start + h.size_bytes), heap)
    return subheap_first_chunk(state.address, heap, first)


def _count(
    mem: MemoryReader,
    hold: ArenaHold,
    state: ArenaState,
    heaps: Sequence[Heap],
    bins: Sequence[int],
    free: tuple[np.ndarray, ...],
    result: SweepResult,
) -> SweepResult | str:
    """The lists checked and counted over the free chunks (the module's contract). Our
    memory: the four arrays of the chunks (8 bytes each a chunk) and a few of 4 bytes."""
    at, raw, fd, bk, foot_ok = free
    n = len(at)
    if n and not bool(np.all(at[1:] > at[:-1])):  # (windows are walked in address order)
        order = np.argsort(at, kind="stable")
        at, raw, fd, bk, foot_ok = at[order], raw[order], fd[order], bk[order], foot_ok[order]
        del order
    every_bin = np.arange(1, glibc.NBINS)
    heads = np.array([bin_head(state, int(i)) for i in every_bin], dtype=np.uint64)
    head_order = np.argsort(heads)
    sorted_heads = heads[head_order]
    head_fd = np.array(state.bins[0::2], dtype=np.uint64)
    head_bk = np.array(state.bins[1::2], dtype=np.uint64)
    # Nodes: the free chunks 0 … n-1, then the bin heads n … n+126 (int32: n < 2**31).

    def node_of(values: np.ndarray) -> np.ndarray:
        found = _chunk_index(at, values)
        position = np.minimum(np.searchsorted(sorted_heads, values), len(heads) - 1)
        hit = sorted_heads[position] == values
        found[hit] = n + head_order[position[hit]]
        return found

    linked, bin_of = _lists(
        np.concatenate([node_of(fd), node_of(head_fd)]),
        np.concatenate([node_of(bk), node_of(head_bk)]),
        n,
    )
    on_a_list = bin_of >= 1
    low = np.array([glibc.bin_size_range(int(i))[0] for i in every_bin], dtype=np.uint64)
    high = np.array(
        [min(glibc.bin_size_range(int(i))[1], (1 << 64) - 1) for i in every_bin], dtype=np.uint64
    )
    bad = ~linked[:n] | ~on_a_list | ~foot_ok
    for block in range(0, n, _BLOCK):  # (in blocks: no whole-length temporaries)
        part = slice(block, block + _BLOCK)
        sizes = raw[part] & ~np.uint64(glibc.SIZE_FLAGS)
        index = np.clip(bin_of[part] - 1, 0, len(every_bin) - 1)
        bad[part] |= (sizes < low[index]) | (sizes > high[index])
    bad_heads = ~linked[n:]
    del linked
    if bad.any() or bad_heads.any():
        return _confirm(mem, hold, state, at, raw, fd, bk, bad, bad_heads, bin_of, result)
    del bad, fd, bk
    page = mem.page_bytes
    adjust = _adjustments(heaps, at, raw, bin_of, page)
    # Grouped by bin once (a sort), each bin's figures over its slice, in blocks. (Bins as
    # 16-bit keys: numpy's stable sort of those is a radix sort, and the bins' bounds are
    # searched for at once, in keys of the same type: a search for int64 values in int32
    # keys converts the whole array first, at every call.)
    keys = bin_of.astype(np.int16)  # (1..127 here: a chunk on no list returned above)
    del bin_of
    grouped = np.argsort(keys, kind="stable").astype(np.int32)
    bounds = np.searchsorted(keys[grouped], np.arange(1, glibc.NBINS + 1, dtype=np.int16))
    del keys
    for number in sorted(set(bins)):
        members = grouped[bounds[number - 1] : bounds[number]]
        if not len(members):
            if int(head_fd[number - 1]) == int(heads[number - 1]):
                result.figures[number] = (0, 0, 0, 0, 0, 0, 0)
            continue
        result.figures[number] = _bin_figures(members, at, raw, page, adjust.get(number, (0, 0)))
    result.unmeasured = [number for number in sorted(set(bins)) if number not in result.figures]
    return result


_BLOCK = 1 << 18  # chunks a temporary array covers at most


def _chunk_index(at: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each value's index in ``at`` (sorted), -1 where it is none of them (int32): in C
    where built (a bucket table and prefetching: a lookup per value in millions of chunks
    is otherwise a cache miss at each level of a binary search), else numpy's search."""
    found = np.full(len(values), -1, dtype=np.int32)
    if _native is not None:
        _native.chunk_index(np.ascontiguousarray(at), np.ascontiguousarray(values), found)
        return found
    if len(at):
        position = np.minimum(np.searchsorted(at, values), len(at) - 1)
        hit = at[position] == values
        found[hit] = position[hit]
    return found


def _bin_figures(
    members: np.ndarray,
    at: np.ndarray,
    raw: np.ndarray,
    page: int,
    adjust: tuple[int, int],
) -> Figures:
    """One bin's figures (heapcopy.Tally's) over its chunks ``members``: each chunk in RAM
    whole, then ``adjust`` added to the resident and trimmable bytes (its chunks over pages
    not in RAM)."""
    total = resident = trimmable = raw_total = 0
    raw_min, raw_max = (1 << 64) - 1, 0
    flags = ~np.uint64(glibc.SIZE_FLAGS)
    for block in range(0, len(members), _BLOCK):
        chunks = members[block : block + _BLOCK]
        words = raw[chunks]
        sizes = words & flags
        starts = at[chunks]
        first = (starts + np.uint64(glibc.MALLOC_CHUNK_BYTES + page - 1)) // np.uint64(page)
        last = (starts + sizes) // np.uint64(page)
        total += int(sizes.sum())
        trimmable += int(np.where(last > first, last - first, 0).sum()) * page
        raw_total += int(words.sum())
        raw_min, raw_max = min(raw_min, int(words.min())), max(raw_max, int(words.max()))
    resident = total + adjust[0]
    trimmable += adjust[1]
    return len(members), total, resident, trimmable, raw_min, raw_max, raw_total


def _adjustments(
    heaps: Sequence[Heap], at: np.ndarray, raw: np.ndarray, bin_of: np.ndarray, page: int
) -> dict[int, tuple[int, int]]:
    """Per bin, what its chunks over pages not in RAM take off its resident and trimmable
    bytes (counted as if in RAM whole by _bin_figures)."""
    adjust: dict[int, tuple[int, int]] = {}
    for chunk, (in_ram, trim) in _not_in_ram(heaps, at, raw, page).items():
        size = int(raw[chunk]) & ~glibc.SIZE_FLAGS
        start = int(at[chunk])
        whole = max(0, (start + size) // page - -(-(start + glibc.MALLOC_CHUNK_BYTES) // page))
        number = int(bin_of[chunk])
        before = adjust.get(number, (0, 0))
        adjust[number] = (before[0] + in_ram - size, before[1] + trim - whole * page)
    return adjust


def _not_in_ram(
    heaps: Sequence[Heap], at: np.ndarray, raw: np.ndarray, page: int
) -> dict[int, tuple[int, int]]:
    """The chunks (``at`` sorted) lying over a page not in RAM, each with its bytes on pages
    in RAM and the bytes of its whole pages mtrim releases that are in RAM (the heaps'
    residency, as read before the sweep); every other chunk is in RAM whole."""
    found: dict[int, tuple[int, int]] = {}
    for heap in heaps:
        pages = heap.pages
        if pages is None or pages.all_resident:
            continue
        absent = np.flatnonzero(np.frombuffer(pages.present, dtype=np.uint8) == 0)
        if not len(absent):
            continue
        # Runs of absent pages, and the chunks over each (chunks do not overlap: a range).
        breaks = np.flatnonzero(np.diff(absent) != 1) + 1
        firsts = absent[np.concatenate([[0], breaks])].astype(np.uint64)
        lasts = absent[np.concatenate([breaks - 1, [len(absent) - 1]])].astype(np.uint64)
        run_starts = np.uint64(pages.start) + firsts * np.uint64(page)
        run_ends = np.uint64(pages.start) + (lasts + np.uint64(1)) * np.uint64(page)
        low = np.maximum(np.searchsorted(at, run_starts, side="right") - 1, 0)
        high = np.searchsorted(at, run_ends, side="left")
        for lo, hi in zip(low.tolist(), high.tolist(), strict=True):
            for chunk in range(lo, hi):
                start = int(at[chunk])
                end = start + (int(raw[chunk]) & ~glibc.SIZE_FLAGS)
                first = -(-(start + glibc.MALLOC_CHUNK_BYTES) // page) * page
                last = end // page * page
                trim = pages.whole_pages_resident_bytes(first, last) if last > first else 0
                found[chunk] = (pages.resident_bytes(start, end), trim)
    return found


def _lists(nexts: np.ndarray, prevs: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Over the nodes (``n`` chunks, then the bin heads) and their fd and bk as node numbers
    (-1: neither a free chunk nor a head): which nodes are linked both ways, and each chunk's
    bin (the head its fds lead to; 0 or less where they lead to none)."""
    total = len(nexts)
    linked = (nexts >= 0) & (prevs >= 0)
    both = np.flatnonzero(linked).astype(np.int32)
    linked[both] = (prevs[nexts[both]] == both) & (nexts[prevs[both]] == both)
    del both, prevs
    # Each node's list: follow fd until a head (by fd alone: a chunk whose bk is wrong still
    # names the bin its list leads to). In C, each node once; else numpy, doubling the
    # stride (heads stay put).
    if _native is not None:
        bins = np.zeros(n, dtype=np.int32)
        _native.list_bins(np.ascontiguousarray(nexts, dtype=np.int32), n, bins)
        return linked, bins
    reach = np.where(nexts >= 0, nexts, np.arange(total, dtype=np.int32)).astype(np.int32)
    del nexts
    reach[n:] = np.arange(n, total, dtype=np.int32)
    for _ in range(max(1, total.bit_length() + 1)):
        reach = reach[reach]
    return linked, reach[:n] - (n - 1)


def _confirm(
    mem: MemoryReader,
    hold: ArenaHold,
    state: ArenaState,
    at: np.ndarray,
    raw: np.ndarray,
    fd: np.ndarray,
    bk: np.ndarray,
    bad: np.ndarray,
    bad_heads: np.ndarray,
    bin_of: np.ndarray,
    result: SweepResult,
) -> SweepResult | str:
    """A chunk (or bin head) the sweep found inconsistent, looked at again in one stop with
    the arena unlocked: still so there, a corruption (the heap's words, in glibc's terms);
    else the heap moved between the windows (why, MOVED_WHY)."""
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        chunk, was = int(at[i]), (int(raw[i]), int(fd[i]), int(bk[i]))
        # (Its bin: where its list leads, or the bin of the chunk whose fd names it.)
        number = int(bin_of[i]) if bin_of[i] >= 1 else 0
        named = np.flatnonzero(fd == np.uint64(chunk))
        if not number and len(named) and bin_of[named[0]] >= 1:
            number = int(bin_of[named[0]])
        looked_at, last = chunk, was
    else:
        number = int(np.flatnonzero(bad_heads)[0]) + 1
        looked_at, last = bin_head(state, number), None

    def look() -> HeapCorruption | None:
        still = result.still(mem.read(state.address, glibc.STATE_BYTES))
        return _look_again(mem, looked_at, last, number, still=still)

    found = _in_a_stop(hold, mem, state.address, look)
    hold.release()
    if found is _LOCKED:
        return LOCKED_EVERY_TRY
    if not isinstance(found, HeapCorruption):
        return MOVED_WHY
    result.corruption.append(
        HeapCorruption(state.address, found.bin, found.chunk_address, found.check, found.detail)
    )
    result.unmeasured = sorted({*result.unmeasured, *range(1, glibc.NBINS)})
    return result


def _look_again(
    mem: MemoryReader,
    chunk: int,
    was: tuple[int, int, int] | None,
    number: int = 0,
    *,
    still: bool,
) -> HeapCorruption | None:
    """In a stop: the links of ``chunk`` (a free chunk whose size word, fd and bk the sweep
    read as ``was``, or the head of bin ``number``; ``number`` 0: its bin is not known), read
    now; a corruption where they still disagree, None where the chunk changed or is in use
    now (the heap moved). Its bk is looked at first: a chunk whose bk was overwritten is
    named itself. Where its links agree now, the sweep's lists disagreed with them: a
    corruption only where the arena was ``still`` (read the same in every stop of the
    sweep and in this one), else the heap moved (None)."""
    data = mem.read_present(chunk, 32)
    size_word, forward, back = (int.from_bytes(data[o : o + 8], "little") for o in (8, 16, 24))
    if was is not None and (size_word, forward, back) != was:
        return None  # it changed between the window and now: moved
    size = size_word & ~glibc.SIZE_FLAGS
    if was is not None:
        following = int.from_bytes(mem.read_present(chunk + size + 8, 8), "little") if size else 1
        if following & 1:
            return None  # in use now (the next chunk's PREV_INUSE): the heap moved
    name = bin_name(number) if number else "a bin"
    check = list_check(number) if number else words.DOUBLE_LINKED
    back_forward = (
        int.from_bytes(mem.read_present(back + 16, 8), "little") if back % 16 == 0 else -1
    )
    if back_forward != chunk:
        detail = f"its bk is {back:#x}, whose fd is {back_forward:#x}, not it"
        return HeapCorruption(0, name, chunk, check, detail)
    forward_back = (
        int.from_bytes(mem.read_present(forward + 24, 8), "little") if forward % 16 == 0 else -1
    )
    if forward_back != chunk:
        detail = f"its bk is {forward_back:#x}, not the chunk before it ({chunk:#x})"
        return HeapCorruption(0, name, forward, check, detail)
    if not still:
        return None  # its links agree now: the lists the sweep saw moved since
    detail = "a free chunk in no bin's list, or its size does not fit its bin"
    return HeapCorruption(0, name, chunk, words.UNNAMED, detail)
