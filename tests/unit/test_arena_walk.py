"""One arena walked whole and block by block gives the same figures: ArenaWalker over a
hand-built thread arena (heap_info, malloc_state, fastbins, unsorted, small and large bins,
top) in this process's own memory, read through /proc/self/mem and pagemap as a target's
would be. Copied whole (the C loops where built, else the Python ones) or lazily (64 KiB
blocks as the lists lead there, the Python loops), the walk measures the same bytes; whether
fastbin pointers are safe-linked is decided from the first non-empty fastbin, never from an
empty one."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import mmap
import os
import struct
import time
from collections.abc import Callable, Iterator

import pytest

from memforensics.model import corruption, glibc
from memforensics.sources.glibc import heapcopy
from memforensics.sources.glibc.glibc_arenas import Heap, read_state
from memforensics.sources.glibc.glibc_walk import ArenaWalk, ArenaWalker
from memforensics.sources.glibc.heapcopy import BufferPool
from memforensics.sources.proc.procmem import ProcessMemoryReader

PAGE = 4096
PAGES = 96  # six 16-page blocks of the lazy walk
STATE = 0x30  # malloc_state after the heap_info, as in a thread arena's first heap
TOP = 0x54000  # the top chunk, to the heap's end

pytestmark = pytest.mark.skipif(mmap.PAGESIZE != PAGE, reason="laid out for 4 KiB pages")


class Arena:
    """A thread arena's first heap in an anonymous mapping of this process."""

    def __init__(self, *, safe_linked: bool) -> None:
        self.safe_linked = safe_linked
        self.map = mmap.mmap(-1, PAGES * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.map.write(b"\0" * len(self.map))  # every page written: resident
        pointer = ctypes.c_char.from_buffer(self.map)
        self.base = ctypes.addressof(pointer)
        del pointer  # the mapping's buffer is no longer exported
        self.state = self.base + STATE
        self.chunks = 0
        self.free_bytes = 0
        self.resident_bytes = 0
        self.trimmable_bytes = 0
        self.bins: dict[int, tuple[int, int]] = {}
        for index in range(1, glibc.NBINS):  # every bin empty: fd and bk at its own head
            self._link(index, [])

    def close(self) -> None:
        self.map.close()

    def word(self, address: int, value: int) -> None:
        struct.pack_into("<Q", self.map, address - self.base, value)

    def chunk(self, offset: int, size: int) -> int:
        address = self.base + offset
        self.word(address + 8, size | 1)
        if offset + size + 8 <= len(self.map):
            self.word(address + size, size)  # glibc's set_foot: the next chunk's prev_size
        return address

    def head(self, index: int) -> int:
        return self.state + glibc.OFF_BINS + 16 * (index - 1) - 16

    def _link(self, index: int, chunks: list[int]) -> None:
        head = self.head(index)
        ring = [head, *chunks, head]
        for previous, chunk, following in zip(ring, ring[1:], ring[2:], strict=False):
            self.word(chunk + 16, following)
            self.word(chunk + 24, previous)
        self.word(self.state + glibc.OFF_BINS + 16 * (index - 1), ring[1])
        self.word(self.state + glibc.OFF_BINS + 16 * (index - 1) + 8, ring[-2])

    def bin(self, index: int, chunks: list[tuple[int, int]]) -> None:
        """Bin ``index`` holding free chunks of (offset, size), all resident."""
        self._link(index, [self.chunk(offset, size) for offset, size in chunks])
        sizes = [size for _, size in chunks]
        self._count(index, len(chunks), sum(sizes))
        for offset, size in chunks:
            self.trimmable_bytes += glibc.mtrim_whole_pages_bytes(self.base + offset, size, PAGE)

    def fastbin(self, index: int, offsets: list[int]) -> None:
        size = (index + 2) * glibc.MALLOC_ALIGNMENT
        chunks = [self.chunk(offset, size) for offset in offsets]
        for chunk, following in zip(chunks, [*chunks[1:], 0], strict=True):
            position = chunk + glibc.OFF_FD
            self.word(position, (position >> 12) ^ following if self.safe_linked else following)
        self.word(self.state + glibc.OFF_FASTBINS + 8 * index, chunks[0])
        self._count(0, len(chunks), size * len(chunks))

    def _count(self, index: int, chunks: int, total: int) -> None:
        chunks_before, bytes_before = self.bins.get(index, (0, 0))
        self.bins[index] = (chunks_before + chunks, bytes_before + total)
        self.chunks += chunks
        self.free_bytes += total
        self.resident_bytes += total

    def top(self, offset: int) -> None:
        self.word(self.state + glibc.OFF_TOP, self.chunk(offset, PAGES * PAGE - offset))

    def release(self, offset: int) -> None:
        """The page at ``offset`` given back (as mtrim does), so no longer resident."""
        self.map.madvise(mmap.MADV_DONTNEED, offset, PAGE)


def _arena(*, safe_linked: bool, fastbins: bool = True) -> Arena:
    """Free chunks in every kind of bin, spread over the six 64 KiB blocks (offsets from the
    heap's start; the malloc_state takes its first 0x8C8 bytes, the top its last 48 KiB)."""
    arena = Arena(safe_linked=safe_linked)
    if fastbins:
        # Fastbin 0 stays empty: it must not decide how pointers are stored.
        arena.fastbin(1, [0x1000, 0x1030, 0x21000, 0x1060])  # 48-byte chunks
        arena.fastbin(3, [0x42000])  # one 80-byte chunk
    arena.bin(10, [(0x2000, 0xA0), (0x12000, 0xA0), (0x2100, 0xA0), (0x52000, 0xA0)])
    arena.bin(1, [(0x3000, 0x400), (0x23010, 0x3000), (0x4000, 0x200)])  # unsorted
    arena.bin(glibc.bin_index(0x8000), [(0x30010, 0x8000)])  # large, 7 pages mtrim releases
    arena.bin(glibc.bin_index(0x9000), [(0x44010, 0x9000)])
    arena.top(TOP)
    return arena


@pytest.fixture
def arena() -> Iterator[Arena]:
    made = _arena(safe_linked=True)
    yield made
    made.close()


def _walk(arena: Arena, *, lazy: bool) -> tuple[ArenaWalk, ArenaWalker]:
    with ProcessMemoryReader(os.getpid()) as mem:
        end = arena.base + PAGES * PAGE
        heap = Heap(
            arena.base, arena.state, PAGES * PAGE, PAGES * PAGE, mem.pagemap(arena.base, end)
        )
        pool = BufferPool(copy_max_bytes=0 if lazy else 1 << 30)
        walker = ArenaWalker(mem, [heap], is_main=False, pool=pool)
        try:
            state = read_state(mem, arena.state)
            assert state is not None
            return walker.walk(state, deadline=time.monotonic() + 60), walker
        finally:
            walker.close()
            pool.close()


def _every_way(arena: Arena, monkeypatch: pytest.MonkeyPatch) -> dict[str, ArenaWalk]:
    walks = {}
    for native in {heapcopy._native, None}:
        monkeypatch.setattr(heapcopy, "_native", native)
        way = "C" if native is not None else "Python"
        walks[f"whole copy, {way}"] = _walk(arena, lazy=False)[0]
        walks[f"lazy, {way}"] = _walk(arena, lazy=True)[0]
    return walks


def test_whole_and_lazy_walks_measure_the_same_arena(
    arena: Arena, monkeypatch: pytest.MonkeyPatch
) -> None:
    walks = _every_way(arena, monkeypatch)
    first = next(iter(walks.values()))
    for way, walk in walks.items():
        assert dataclasses.asdict(walk) == dataclasses.asdict(first), way
    assert first.unmeasured_bins == [] and first.retries == 0
    top = PAGES * PAGE - TOP
    assert (first.chunks, first.bins) == (arena.chunks, arena.bins)
    assert first.free_bytes == arena.free_bytes + top
    assert first.resident_bytes == arena.resident_bytes + top
    assert first.trimmable_bytes == arena.trimmable_bytes > 0


def test_released_pages_are_measured_the_same_whole_and_lazy(
    arena: Arena, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages given back inside free chunks (a trimmed heap): not resident, not trimmable,
    and the walk over the partly resident copy agrees every way."""
    arena.release(0x33000)  # inside the large chunk at 0x30010 … 0x38010, after its header
    arena.release(0x24000)  # inside the unsorted chunk at 0x23010 … 0x26010
    walks = _every_way(arena, monkeypatch)
    first = next(iter(walks.values()))
    for way, walk in walks.items():
        assert dataclasses.asdict(walk) == dataclasses.asdict(first), way
    top = PAGES * PAGE - TOP
    assert first.unmeasured_bins == []
    assert first.resident_bytes == arena.resident_bytes + top - 2 * PAGE
    assert first.trimmable_bytes == arena.trimmable_bytes - 2 * PAGE


@pytest.mark.parametrize("safe_linked", [True, False], ids=["glibc >= 2.32", "glibc < 2.32"])
@pytest.mark.parametrize("lazy", [False, True], ids=["whole copy", "lazy"])
def test_safe_linking_is_decided_by_the_first_non_empty_fastbin(
    safe_linked: bool, lazy: bool
) -> None:
    made = _arena(safe_linked=safe_linked)
    try:
        walk, walker = _walk(made, lazy=lazy)
    finally:
        made.close()
    assert walker._mangled is safe_linked
    assert walk.bins[0] == (5, 4 * 0x30 + 0x50)
    assert walk.unmeasured_bins == []


def test_an_arena_without_fastbin_chunks_decides_nothing() -> None:
    made = _arena(safe_linked=True, fastbins=False)
    try:
        walk, walker = _walk(made, lazy=False)
    finally:
        made.close()
    assert walker._mangled is None
    assert walk.bins[0] == (0, 0)


def _scouted_walk(arena: Arena, between: Callable[[], None]) -> ArenaWalk:
    """The arena scouted as a held read scouts it, ``between()`` (the target running on),
    then walked in the stop with the scout's residency kept, as a scouted arena's stop does."""
    with ProcessMemoryReader(os.getpid()) as mem:
        end = arena.base + PAGES * PAGE
        pages = mem.pagemap(arena.base, end)
        heap = Heap(arena.base, arena.state, PAGES * PAGE, PAGES * PAGE, pages)
        walker = ArenaWalker(mem, [heap], is_main=False, pool=heapcopy.FreshBuffers(), held=True)
        try:
            state = read_state(mem, arena.state)
            assert state is not None
            assert walker.scout(state, time.monotonic() + 60)
            between()
            assert walker.keep_scout_residency([heap]) and walker.adopt([heap])
            return walker.walk(state, deadline=time.monotonic() + 60)
        finally:
            walker.close()


def test_a_scouted_stop_reads_a_page_that_came_into_ram_after_the_scout() -> None:
    """A busy arena bins a big free chunk between the scout and the stop: glibc writes its
    nextsize links on a page the scout's residency called not in RAM (the chunk's header
    ends a page; its fd_nextsize and bk_nextsize begin the next, untouched until then). The
    stop's checks must read that page as it is now, not as zeros: a healthy ring is not
    corruption (and a broken one still is)."""
    big, bigger = 0x8000, 0x8400
    index = glibc.bin_index(big)
    assert glibc.bin_index(bigger) == index >= 64  # one large bin, two sizes

    def ring(arena: Arena, first: int, second: int, *, broken: bool) -> None:
        for chunk, other in ((first, second), (second, first)):
            arena.word(chunk + 32, other)  # fd_nextsize
            arena.word(chunk + 40, other)  # bk_nextsize
        if broken:
            arena.word(second + 40, second)

    for broken in (False, True):
        arena = Arena(safe_linked=True)
        try:
            first = arena.chunk(0x30FE0, bigger)  # its header: the last 32 bytes of page 0x30
            second = arena.chunk(0x44010, big)
            arena._link(index, [first, second])
            arena.top(TOP)
            arena.word(arena.state + glibc.OFF_SYSTEM_MEM, PAGES * PAGE)  # the top fits it
            arena.release(0x31000)  # the page after that header: not in RAM at the scout
            binned = functools.partial(ring, arena, first, second, broken=broken)
            walk = _scouted_walk(arena, binned)
        finally:
            arena.close()
        assert walk.bins[index] == (2, big + bigger)
        checks = [finding.check for finding in walk.corruption]
        assert checks == ([corruption.LARGEBIN_NEXTSIZE] if broken else []), broken


def test_a_scouted_stop_reads_a_heap_that_shrank_after_the_scout(arena: Arena) -> None:
    """A busy arena's top grows past glibc's trim threshold between the scout and the stop,
    and glibc gives the heap's last pages back (shrink_heap: a smaller heap, its pages
    released). The stop keeps the scouted copy, cut to the heap as it is now (before, it
    was dropped and the arena copied whole in the stop, which no CPU quota's room cuts):
    every bin measures what the unshrunk arena's scouted walk does, the top what is left
    of it, and nothing is found corrupt."""
    for offset in (0x30010, 0x44010):
        _lone_in_its_large_bin(arena, offset)
    arena.word(arena.state + glibc.OFF_SYSTEM_MEM, PAGES * PAGE)  # the top fits it
    before = _scouted_walk(arena, lambda: None)
    assert before.corruption == [] and before.unmeasured_bins == []
    shrunk_bytes = PAGES * PAGE - 4 * PAGE
    with ProcessMemoryReader(os.getpid()) as mem:
        full = Heap(
            arena.base,
            arena.state,
            PAGES * PAGE,
            PAGES * PAGE,
            mem.pagemap(arena.base, arena.base + PAGES * PAGE),
        )
        walker = ArenaWalker(mem, [full], is_main=False, pool=heapcopy.FreshBuffers(), held=True)
        try:
            state = read_state(mem, arena.state)
            assert state is not None
            assert walker.scout(state, time.monotonic() + 60)
            arena.chunk(TOP, shrunk_bytes - TOP)  # the top, to the heap's new end
            arena.word(arena.state + glibc.OFF_SYSTEM_MEM, shrunk_bytes)
            for offset in range(shrunk_bytes, PAGES * PAGE, PAGE):
                arena.release(offset)
            pages = mem.pagemap(arena.base, arena.base + shrunk_bytes)
            shrunk = Heap(arena.base, arena.state, shrunk_bytes, PAGES * PAGE, pages)
            assert not walker.keep_scout_residency([shrunk])  # (not the scout's heaps)
            assert walker.adopt([shrunk])
            state = read_state(mem, arena.state)
            assert state is not None
            walk = walker.walk(state, deadline=time.monotonic() + 60)
        finally:
            walker.close()
    assert walk.bins == before.bins and walk.unmeasured_bins == []
    assert walk.corruption == [] and walk.budget_reached is False
    assert walk.top_bytes == shrunk_bytes - TOP == before.top_bytes - 4 * PAGE


def _lone_in_its_large_bin(arena: Arena, offset: int) -> None:
    """The large chunk at ``offset``, alone of its size in its bin: its nextsize ring is
    itself (what glibc writes, and what a stop's checks read)."""
    chunk = arena.base + offset
    arena.word(chunk + 32, chunk)
    arena.word(chunk + 40, chunk)


def _parted_walks(
    arena: Arena, between: Callable[[int], None], heap_bytes: Callable[[int], int] | None = None
) -> list[ArenaWalk]:
    """The arena scouted, split into parts of a page or two each (ArenaWalker.split), each
    part walked as its own stop walks it, ``between(part)`` run before each part's walk
    (the target running on between two stops). ``heap_bytes(part)``: the heap's size as
    that part's stop finds it (its residency read again where it is not the scout's)."""
    for offset in (0x30010, 0x44010):
        _lone_in_its_large_bin(arena, offset)
    arena.word(arena.state + glibc.OFF_SYSTEM_MEM, PAGES * PAGE)  # the top fits it
    with ProcessMemoryReader(os.getpid()) as mem:
        end = arena.base + PAGES * PAGE
        pages = mem.pagemap(arena.base, end)
        heap = Heap(arena.base, arena.state, PAGES * PAGE, PAGES * PAGE, pages)
        walker = ArenaWalker(mem, [heap], is_main=False, pool=heapcopy.FreshBuffers(), held=True)
        walks = []
        try:
            state = read_state(mem, arena.state)
            assert state is not None
            assert walker.scout(state, time.monotonic() + 60)
            parts = walker.split(2)
            adopted_bytes = PAGES * PAGE
            for part in range(parts):
                if part:
                    walker.next_part()
                between(part)
                state = read_state(mem, arena.state)
                assert state is not None
                size = heap_bytes(part) if heap_bytes is not None else PAGES * PAGE
                now = heap
                if size != PAGES * PAGE:
                    pages = mem.pagemap(arena.base, arena.base + size)
                    now = Heap(arena.base, arena.state, size, PAGES * PAGE, pages)
                # (The residency read before the scout serves as long as the heap is the
                # size the last stop adopted.)
                assert walker.keep_scout_residency([now]) == (size == adopted_bytes)
                assert walker.adopt([now])
                adopted_bytes = size
                walks.append(walker.walk(state, deadline=time.monotonic() + 60))
            assert walker.parts_left == 0
        finally:
            walker.close()
    return walks


def test_an_arena_read_in_parts_measures_what_a_whole_read_does(arena: Arena) -> None:
    """Every bin is measured in exactly one part, the top and the fastbins in the first:
    the parts add up to the arena (its own layout the oracle), with nothing found corrupt."""
    walks = _parted_walks(arena, lambda part: None)
    assert len(walks) >= 3
    bins: dict[int, tuple[int, int]] = {}
    for walk in walks:
        assert walk.part is not None and not walk.unmeasured_bins and not walk.corruption
        assert not set(bins) & set(walk.bins)
        bins |= {index: counts for index, counts in walk.bins.items() if counts[0]}
    assert bins == arena.bins
    first, *rest = walks
    assert first.part is not None and first.part[0] == 0
    assert first.top_bytes == PAGES * PAGE - TOP and first.fastbin_chunks is not None
    assert all(walk.top_bytes is None and walk.fastbin_chunks == () for walk in rest)
    assert sum(walk.chunks for walk in walks) == arena.chunks


def test_an_arena_read_in_parts_whose_heap_shrank_between_two_parts(arena: Arena) -> None:
    """After the first part's stop (the top and the fastbins read there), glibc gives the
    heap's last 4 pages back (shrink_heap: the top shortened, the pages past the heap's new
    end released). The later parts' stops read the heap as it is then: the parts still add
    up to every bin, nothing is found corrupt, and no page past the new end is read (a read
    would map it again: the kernel's pagemap of this process is the oracle)."""
    shrunk_bytes = PAGES * PAGE - 4 * PAGE

    def shrink(part: int) -> None:
        if part == 1:
            arena.chunk(TOP, shrunk_bytes - TOP)
            arena.word(arena.state + glibc.OFF_SYSTEM_MEM, shrunk_bytes)
            for offset in range(shrunk_bytes, PAGES * PAGE, PAGE):
                arena.release(offset)

    walks = _parted_walks(arena, shrink, lambda part: shrunk_bytes if part else PAGES * PAGE)
    assert len(walks) >= 3
    bins: dict[int, tuple[int, int]] = {}
    for walk in walks:
        assert not walk.unmeasured_bins and not walk.corruption and not walk.budget_reached
        assert not set(bins) & set(walk.bins)
        bins |= {index: counts for index, counts in walk.bins.items() if counts[0]}
    assert bins == arena.bins
    assert walks[0].top_bytes == PAGES * PAGE - TOP
    with ProcessMemoryReader(os.getpid()) as mem:
        released = mem.pagemap(arena.base + shrunk_bytes, arena.base + PAGES * PAGE)
    assert released.resident_pages == 0


def test_a_list_that_moved_before_its_parts_stop_is_read_as_it_is_then(arena: Arena) -> None:
    """Between the first part's stop and the last's, a chunk of the last part's bin is
    moved onto a page an earlier part's list lies on (page 2, bin 10's), which an earlier
    stop copied as it was before the move: the part's stop reads the list as it is then
    (scouted again there), not as the scout or an earlier stop copied it."""
    big = glibc.bin_index(0x9000)

    def move(part: int) -> None:
        if part == 0:
            return
        arena.bins.pop(big)
        arena.chunks -= 1
        arena.free_bytes -= 0x9000
        arena.bin(big, [(0x2210, 0x9400)])  # bin_index(0x9400) is the same bin
        _lone_in_its_large_bin(arena, 0x2210)

    assert glibc.bin_index(0x9400) == big
    walks = _parted_walks(arena, move)
    last = walks[-1]
    assert last.part is not None and last.part[0] <= big <= last.part[1]
    assert last.bins[big] == (1, 0x9400)
    assert not last.unmeasured_bins and not last.corruption


def test_an_arena_whose_bins_heads_changed_since_its_scout_is_moving(arena: Arena) -> None:
    """moved_since_scout: the heads the scout followed against a state read after it. The
    same heads: not moving; a chunk freed into a bin meanwhile (its head's fd changed):
    moving; no state to compare: moving."""
    with ProcessMemoryReader(os.getpid()) as mem:
        end = arena.base + PAGES * PAGE
        heap = Heap(
            arena.base, arena.state, PAGES * PAGE, PAGES * PAGE, mem.pagemap(arena.base, end)
        )
        walker = ArenaWalker(mem, [heap], is_main=False, pool=heapcopy.FreshBuffers(), held=True)
        try:
            state = read_state(mem, arena.state)
            assert state is not None
            assert walker.scout(state, time.monotonic() + 60)
            assert not walker.moved_since_scout(read_state(mem, arena.state))
            arena.bin(12, [(0x5A000, 0xC0)])
            assert walker.moved_since_scout(read_state(mem, arena.state))
            assert walker.moved_since_scout(None)
        finally:
            walker.close()


@pytest.mark.parametrize("caught_up", [False, True], ids=["stop-alone", "caught-up"])
def test_a_catch_up_before_the_stop_leaves_the_stop_no_page_to_follow(caught_up: bool) -> None:
    """A busy arena's bin takes on chunks between the scout and the stop: one at its head on
    a page the scout never read, one after a chunk whose page the scout copied (that copy is
    old by then: it still ends the list there). Caught up before the stop (the target
    running), both pages are flagged, so the stop copies them at one go and follows nothing
    page by page; without it, its stop reads both itself (ArenaWalker._rescout). Either way
    the bin's figures are the list as it is in the stop."""
    size = 0x100
    index = glibc.bin_index(size)
    arena = Arena(safe_linked=True)
    try:
        old = [arena.chunk(0x10010, size), arena.chunk(0x20010, size)]
        arena._link(index, old)
        arena.top(TOP)
        arena.word(arena.state + glibc.OFF_SYSTEM_MEM, PAGES * PAGE)  # the top fits it
        with ProcessMemoryReader(os.getpid()) as mem:
            pages = mem.pagemap(arena.base, arena.base + PAGES * PAGE)
            heap = Heap(arena.base, arena.state, PAGES * PAGE, PAGES * PAGE, pages)
            walker = ArenaWalker(
                mem, [heap], is_main=False, pool=heapcopy.FreshBuffers(), held=True
            )
            try:
                state = functools.partial(read_state, mem, arena.state)
                scouted = state()
                assert scouted is not None and walker.scout(scouted, time.monotonic() + 60)
                assert walker.catch_up(state) == 0  # nothing moved yet: nothing read
                added = [arena.chunk(0x38010, size), arena.chunk(0x4C010, size)]
                arena._link(index, [added[0], *old, added[1]])
                if caught_up:
                    # 0x38 and 0x4C new; 0x10 and 0x20 read again (their copies were old).
                    assert walker.catch_up(state) == 4
                    filled = walker._segments[0].filled
                    assert [filled[p] for p in (0x10, 0x20, 0x38, 0x4C)] == [1, 1, 1, 1]
                    assert set(filled) <= {0, 1}
                assert walker.keep_scout_residency([heap]) and walker.adopt([heap])
                now = state()
                assert now is not None
                walk = walker.walk(now, deadline=time.monotonic() + 60)
                assert walk.bins[index] == (4, 4 * size)
                assert walk.unmeasured_bins == []
                assert walker.rescouted_pages == (0 if caught_up else 2)
            finally:
                walker.close()
    finally:
        arena.close()


def test_a_relayed_arenas_fastbins_and_top_are_read_lazily_in_its_first_stop(
    arena: Arena,
) -> None:
    """bin_relay's first stop reads the fastbins and the top alone (fastbins_and_top_only):
    as the whole walk measures them, from the blocks the fastbins and the top lie in, never
    a copy of the whole heap, which fits the copies' budget here (a relayed heap may be
    gigabytes: a whole copy would be most of the stop)."""
    whole = _walk(arena, lazy=False)[0]
    with ProcessMemoryReader(os.getpid()) as mem:
        end = arena.base + PAGES * PAGE
        heap = Heap(
            arena.base, arena.state, PAGES * PAGE, PAGES * PAGE, mem.pagemap(arena.base, end)
        )
        assert heap.pages is not None
        resident = heap.pages.total_resident_bytes
        walker = ArenaWalker(mem, [heap], is_main=False, pool=heapcopy.FreshBuffers(), held=True)
        try:
            walker.fastbins_and_top_only()
            state = read_state(mem, arena.state)
            assert state is not None
            part = walker.walk(state, deadline=time.monotonic() + 60)
        finally:
            walker.close()
    assert part.fastbin_chunks == whole.fastbin_chunks and part.bins[0] == whole.bins[0]
    assert (part.top_bytes, part.top_resident_bytes) == (whole.top_bytes, whole.top_resident_bytes)
    assert set(part.bins) == {0} and part.unmeasured_bins == []
    assert walker.stop_copy_bytes <= 4 * 16 * PAGE < resident
