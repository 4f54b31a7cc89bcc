"""The walk's list loop, C and Python, on hand-built heap copies: good lists measured the
same, every kind of inconsistency refused the same way."""

from __future__ import annotations

import array
import struct
import sys
import threading
import time
from collections.abc import Callable

import pytest

from memforensics.sources.glibc import heapcopy
from memforensics.sources.glibc.glibc_walk import ArenaWalker
from memforensics.sources.glibc.heapcopy import BufferPool, Segment
from memforensics.sources.proc.procmem import PageMap

PAGE = 4096
START = 0x7F0000000000  # where the copied heap lay in the target
HEAD = 0x7F00DEAD0000  # the bin's own address (outside the heap, as in malloc_state)


def _heap(chunks: list[tuple[int, int]], length: int = 16 * PAGE) -> tuple[bytearray, int, int]:
    """A heap copy holding one free list of (offset, size) chunks in that order; (copy,
    fd of the head, bk of the head)."""
    heap = bytearray(length)
    addresses = [START + offset for offset, _ in chunks]
    for position, (offset, size) in enumerate(chunks):
        forward = addresses[position + 1] if position + 1 < len(chunks) else HEAD
        back = addresses[position - 1] if position else HEAD
        struct.pack_into("<4Q", heap, offset, 0, size | 1, forward, back)
    return heap, addresses[0], addresses[-1]


Walk = Callable[..., tuple[int, ...] | None]


def _walks() -> list[Walk]:
    walks: list[Walk] = [heapcopy.walk_resident_copy_py]
    native = heapcopy._native
    if native is not None:
        walks.append(lambda buf, *args: native.walk(buf, *args, None))
    return walks


def _run(
    walk: Walk, heap: bytearray, fd: int, bk: int, low: int = 32, high: int = 1 << 62
) -> object:
    return walk(memoryview(heap), START, HEAD, fd, bk, low, high, PAGE)


LIST = [(0x100, 0x40), (0x3000, 0x2040), (0x800, 0x100)]


@pytest.mark.parametrize("walk", _walks())
def test_a_consistent_list_is_measured(walk: Walk) -> None:
    heap, fd, bk = _heap(LIST)
    # 0x2040 bytes at 0x3000: whole pages from align_up(0x3000 + 48) = 0x4000 to 0x5040 -> 1.
    assert _run(walk, heap, fd, bk) == (3, 0x40 + 0x2040 + 0x100, 0x40 + 0x2040 + 0x100, PAGE)


@pytest.mark.parametrize("walk", _walks())
def test_every_inconsistency_is_refused(walk: Walk) -> None:
    heap, fd, bk = _heap(LIST)
    assert _run(walk, heap, fd, bk + 16) is None  # the head's bk names another chunk
    assert _run(walk, heap, fd, bk, low=0x50) is None  # a size the bin cannot hold
    broken = bytearray(heap)
    struct.pack_into("<Q", broken, 0x3000 + 24, START + 0x999)  # bk not the previous chunk
    assert _run(walk, broken, fd, bk) is None
    outside = bytearray(heap)
    struct.pack_into("<Q", outside, 0x100 + 16, START + 64 * PAGE)  # fd leaves the heap
    assert _run(walk, outside, fd, bk) is None
    looped = bytearray(heap)
    struct.pack_into("<Q", looped, 0x800 + 16, START + 0x100)  # back to the first chunk
    assert _run(walk, looped, fd, bk) is None
    too_big = bytearray(heap)
    struct.pack_into("<Q", too_big, 0x3000 + 8, 0x100000 | 1)  # runs past the heap's end
    assert _run(walk, too_big, fd, bk) is None


def test_the_c_loop_counts_partly_resident_pages_like_the_page_map() -> None:
    native = heapcopy._native
    if native is None:
        pytest.skip("the C loop is not in use (not built here, or MEMFORENSICS_PURE_PYTHON is set)")
    heap, fd, bk = _heap(LIST)
    present = bytearray([1] * 16)
    present[4] = 0  # the page 0x4000 … 0x5000 inside the big chunk was released
    count, total, resident, trimmable = native.walk(
        memoryview(heap), START, HEAD, fd, bk, 32, 1 << 62, PAGE, bytes(present)
    )
    assert (count, total) == (3, 0x40 + 0x2040 + 0x100)
    assert resident == total - PAGE and trimmable == 0


# Several heaps (a thread arena's chained heaps): two copies with a gap between them.
SECOND = START + 64 * PAGE


def _page_map(start: int, pages: int, absent: tuple[int, ...] = ()) -> PageMap:
    """A PageMap of ``pages`` pages, present (bit 63) but for ``absent``."""
    entries = b"".join(bytes(7) + (b"\x00" if i in absent else b"\x80") for i in range(pages))
    return PageMap(start, start + pages * PAGE, PAGE, entries)


def _empty_heaps(absent: tuple[int, ...] = ()) -> tuple[list[Segment], BufferPool]:
    """Two zeroed 16-page heap copies at START and SECOND (``absent``: pages of the second
    heap not in RAM)."""
    pool = BufferPool()
    segments = [
        Segment(START, START + 16 * PAGE, _page_map(START, 16), pool),
        Segment(SECOND, SECOND + 16 * PAGE, _page_map(SECOND, 16, absent), pool),
    ]
    for segment in segments:
        segment.view[:] = bytes(segment.length)
    return segments, pool


def _two_heaps(
    chunks: list[tuple[int, int]], absent: tuple[int, ...] = ()
) -> tuple[list[Segment], int, int, BufferPool]:
    """Two 16-page heap copies at START and SECOND holding one free list of (address, size)
    chunks in that order (``absent``: pages of the second heap not in RAM)."""
    segments, pool = _empty_heaps(absent)
    for position, (address, size) in enumerate(chunks):
        forward = chunks[position + 1][0] if position + 1 < len(chunks) else HEAD
        back = chunks[position - 1][0] if position else HEAD
        segment = segments[address >= SECOND]
        struct.pack_into("<4Q", segment.view, address - segment.start, 0, size | 1, forward, back)
    return segments, chunks[0][0], chunks[-1][0], pool


def _segment_walks() -> list[Walk]:
    walks: list[Walk] = [heapcopy.walk_copies_py]
    native = heapcopy._native
    if native is not None:
        walks.append(
            lambda segments, *args: native.walk_segments(
                [
                    (s.view, s.start, None if s.pages.all_resident else s.pages.present)
                    for s in segments
                ],
                *args,
            )
        )
    return walks


HOPS = [(START + 0x100, 0x40), (SECOND + 0x3000, 0x2040), (START + 0x800, 0x100)]


@pytest.mark.parametrize("walk", _segment_walks())
@pytest.mark.parametrize("absent", [(), (4,)])
def test_a_list_across_heaps_is_measured(walk: Walk, absent: tuple[int, ...]) -> None:
    segments, fd, bk, pool = _two_heaps(HOPS, absent)
    try:
        result = walk(segments, HEAD, fd, bk, 32, 1 << 62, PAGE)
    finally:
        for segment in segments:
            segment.close(pool)
        pool.close()
    total = 0x40 + 0x2040 + 0x100
    # Page 4 of the second heap lies inside the big chunk, whose one mtrim page it is.
    assert result == ((3, total, total, PAGE) if not absent else (3, total, total - PAGE, 0))


@pytest.mark.parametrize("walk", _segment_walks())
def test_every_inconsistency_across_heaps_is_refused(walk: Walk) -> None:
    def refused(chunks: list[tuple[int, int]], fd_of_first: int | None = None) -> bool:
        segments, fd, bk, pool = _two_heaps(chunks)
        try:
            if fd_of_first is not None:  # the first chunk's fd leads astray
                struct.pack_into("<Q", segments[0].view, chunks[0][0] - START + 16, fd_of_first)
            return walk(segments, HEAD, fd, bk, 32, 1 << 62, PAGE) is None
        finally:
            for segment in segments:
                segment.close(pool)
            pool.close()

    assert refused(HOPS, fd_of_first=START + 20 * PAGE)  # into the gap between the heaps
    assert refused(HOPS, fd_of_first=START - PAGE)  # below every heap
    assert refused(HOPS, fd_of_first=SECOND + 16 * PAGE - 16)  # header past the second's end
    assert refused([HOPS[0], (SECOND + 0x3000, 0x10000), HOPS[2]])  # runs past its heap
    # Misaligned, though every bk names the chunk before: not a chunk glibc made.
    assert refused([HOPS[0], (SECOND + 0x3008, 0x40), HOPS[2]])
    assert not refused(HOPS)


def test_a_long_list_stops_at_the_deadline_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    """70,000 chunks in one copy: measured alike with time left, OutOfTime (C and Python)
    once the deadline has passed: a list of millions must not overrun the walk's budget."""
    count = 70_000
    pool = BufferPool()
    length = count * 32 + PAGE
    segment = Segment(START, START + length, _page_map(START, length // PAGE), pool)
    try:
        words = segment.words
        addresses = range(START, START + 32 * count, 32)
        words[1 : 4 * count : 4] = array.array("Q", [32 | 1]) * count
        words[2 : 4 * count : 4] = array.array("Q", [*addresses[1:], HEAD])
        words[3 : 4 * count : 4] = array.array("Q", [HEAD, *addresses[:-1]])
        args = (HEAD, START, addresses[-1], 32, 32, PAGE)
        ways = {"native": heapcopy._native, "python": None}
        for way, native in ways.items():
            if way == "native" and native is None:
                continue
            monkeypatch.setattr(heapcopy, "_native", native)
            assert heapcopy.walk_copies([segment], *args) == (count, 32 * count, 32 * count, 0)
            with pytest.raises(heapcopy.OutOfTime):
                heapcopy.walk_copies([segment], *args, time.monotonic() - 1)
    finally:
        segment.close(pool)
        pool.close()


def test_the_c_loop_lets_other_threads_run() -> None:
    """inspect walks in a worker thread while its main thread drives gdb: the C loop
    releases the GIL, so Python code in another thread runs while one list is walked (with
    the GIL held no bytecode could run between the call's start and its return)."""
    native = heapcopy._native
    if native is None:
        pytest.skip("the C loop is not in use (not built here, or MEMFORENSICS_PURE_PYTHON is set)")
    count = 1 << 20  # 32 MiB, followed in a scattered order: tens of milliseconds per walk
    stride = 7919
    order = [k * stride % count for k in range(count)]
    buffer = bytearray(32 * count)
    words = memoryview(buffer).cast("Q")
    addresses = [START + 32 * i for i in order]
    slots = array.array("Q", [4 * i for i in order])
    sizes = array.array("Q", [32 | 1])
    for slot, forward, back in zip(
        slots, [*addresses[1:], HEAD], [HEAD, *addresses[:-1]], strict=True
    ):
        words[slot + 1] = sizes[0]
        words[slot + 2] = forward
        words[slot + 3] = back
    calls: list[tuple[float, float, object]] = []

    def walker() -> None:
        for _ in range(5):
            before = time.monotonic()
            result = native.walk(words, START, HEAD, addresses[0], addresses[-1], 32, 32, PAGE)
            calls.append((before, time.monotonic(), result))

    thread = threading.Thread(target=walker)
    # Short GIL turns: with the GIL held by the C code, the main thread could only tick
    # within a switch interval of the call's start or end, far from its middle half.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    ticks: list[float] = []
    try:
        thread.start()
        while thread.is_alive():
            ticks.append(time.monotonic())
        thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert all(result == (count, 32 * count, 32 * count, 0) for *_, result in calls)
    # Ticks in the middle half of a call: with the GIL held, the main thread could tick only
    # just before the C code took over or just after it returned, never in between.
    during = [
        sum(before + (after - before) / 4 < tick < after - (after - before) / 4 for tick in ticks)
        for before, after, _ in calls
    ]
    assert max(during) > 0, (during, [after - before for before, after, _ in calls])


def test_heaps_the_c_loop_refuses_are_walked_in_python() -> None:
    """Overlapping copies (heaps read while they moved) are no error: the Python loop,
    which needs no order, walks them."""
    segments, fd, bk, pool = _two_heaps(HOPS)
    try:
        expected = heapcopy.walk_copies_py(segments, HEAD, fd, bk, 32, 1 << 62, PAGE)
        overlapping = [segments[0], segments[0], segments[1]]
        assert heapcopy.walk_copies(overlapping, HEAD, fd, bk, 32, 1 << 62, PAGE) == expected
        assert expected is not None
    finally:
        for segment in segments:
            segment.close(pool)
        pool.close()


# Fastbins: NULL-terminated, one size, fd safe-linked ((address of fd >> 12) ^ next) since
# glibc 2.32.
FAST = [START + 0x100, SECOND + 0x3000, START + 0x2FE0]  # the last one straddles a page


def _fastbin(
    chunks: list[int], size: int, *, mangled: bool, absent: tuple[int, ...] = ()
) -> tuple[list[Segment], BufferPool]:
    segments, pool = _empty_heaps(absent)
    for position, address in enumerate(chunks):
        following = chunks[position + 1] if position + 1 < len(chunks) else 0
        stored = ((address + 16) >> 12) ^ following if mangled else following
        segment = segments[address >= SECOND]
        struct.pack_into("<3Q", segment.view, address - segment.start, 0, size | 1, stored)
    return segments, pool


def _fastbin_walks() -> list[Walk]:
    walks: list[Walk] = [heapcopy.walk_fastbin_copies_py]
    if heapcopy._native is not None:
        walks.append(heapcopy.walk_fastbin_copies)
    return walks


@pytest.mark.parametrize("walk", _fastbin_walks())
@pytest.mark.parametrize("mangled", [True, False])
@pytest.mark.parametrize("absent", [(), (3,)])
def test_a_fastbin_is_measured_the_same_both_ways(
    walk: Walk, mangled: bool, absent: tuple[int, ...]
) -> None:
    segments, pool = _fastbin(FAST, 0x40, mangled=mangled, absent=absent)
    try:
        result = walk(segments, FAST[0], 0x40, PAGE, mangled)
    finally:
        for segment in segments:
            segment.close(pool)
        pool.close()
    # Page 3 of the second heap holds the middle chunk (0x3000..0x3040) when it is absent.
    assert result == (3, 3 * 0x40, 3 * 0x40 - (0x40 if absent else 0), 0)


@pytest.mark.parametrize("mangled", [True, False])
@pytest.mark.parametrize("chunks", [FAST, FAST[:1]], ids=["three chunks", "a lone chunk"])
def test_an_arena_walk_learns_from_its_first_fastbin_whether_pointers_are_safe_linked(
    mangled: bool, chunks: list[int]
) -> None:
    """The arena's first fastbin is read both ways by the copies' loop; the way it reads
    back consistently is kept for the arena's other fastbins (a lone chunk tells too: its
    NULL next pointer is stored scrambled by safe-linking)."""
    segments, pool = _fastbin(chunks, 0x40, mangled=mangled)
    walker = ArenaWalker.__new__(ArenaWalker)  # only what a walk over whole copies uses
    walker._segments, walker._page, walker._mangled = segments, PAGE, None
    try:
        for segment in segments:
            segment.whole = True
        first = walker._walk_fastbin(chunks[0], 0x40)
        assert walker._mangled is mangled
        again = walker._walk_fastbin(chunks[0], 0x40)
    finally:
        for segment in segments:
            segment.close(pool)
        pool.close()
    assert first == again == (len(chunks), len(chunks) * 0x40, len(chunks) * 0x40, 0)


@pytest.mark.parametrize("walk", _fastbin_walks())
def test_every_fastbin_inconsistency_is_refused(walk: Walk) -> None:
    def refused(size: int = 0x40, *, next_of_first: int | None = None) -> bool:
        segments, pool = _fastbin(FAST, size, mangled=True)
        try:
            if next_of_first is not None:  # the first chunk's fd leads astray
                stored = ((FAST[0] + 16) >> 12) ^ next_of_first
                struct.pack_into("<Q", segments[0].view, FAST[0] - START + 16, stored)
            return walk(segments, FAST[0], 0x40, PAGE, True) is None
        finally:
            for segment in segments:
                segment.close(pool)
            pool.close()

    assert not refused()
    assert refused(size=0x50)  # chunks of another size than the bin's
    assert refused(next_of_first=START + 20 * PAGE)  # into the gap between the heaps
    assert refused(next_of_first=START + 0x208)  # misaligned
    assert refused(next_of_first=SECOND + 16 * PAGE - 16)  # a header past the heap's end
    # Read as plain pointers, safe-linked ones lead nowhere.
    segments, pool = _fastbin(FAST, 0x40, mangled=True)
    try:
        assert walk(segments, FAST[0], 0x40, PAGE, False) is None
    finally:
        for segment in segments:
            segment.close(pool)
        pool.close()


def test_a_fastbin_cycle_is_refused_both_ways() -> None:
    for walk in _fastbin_walks():
        segments, pool = _fastbin([START + 0x100, START + 0x200], 0x40, mangled=False)
        struct.pack_into("<Q", segments[0].view, 0x200 + 16, START + 0x100)  # back to the first
        try:
            assert walk(segments, START + 0x100, 0x40, PAGE, False) is None
        finally:
            for segment in segments:
                segment.close(pool)
            pool.close()
