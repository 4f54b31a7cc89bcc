"""The walk's two loops, a circular free list and a fastbin, on hand-built heap copies:
_chunkwalk.c's follow_list and follow_fastbin and their Python twins in heapcopy give the same
result for every case (a measurement, None, or out of time), from whole copies and from copies
filled block by block as the list leads there (the lazy walk of a big arena)."""

from __future__ import annotations

import array
import dataclasses
import random
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from memforensics.model import glibc
from memforensics.sources.glibc import heapcopy
from memforensics.sources.glibc.heapcopy import BufferPool, OutOfTime, Segment
from memforensics.sources.proc.procmem import PageMap

PAGE = 4096
START = 0x7F0000000000  # where the first copied heap lay in the target
SECOND = START + 64 * PAGE  # a second heap of the arena (a thread arena's chained heaps)
HEAP_PAGES = 16
HEAD = 0x7F00DEAD0000  # the bin's own address (outside the heaps, as in malloc_state)
FILL_PAGES = 4  # the lazy copies' block
OUT_OF_TIME = "out of time"

Outcome = tuple[int, ...] | None | str
Way = Callable[..., Outcome]


def _page_map(start: int, pages: int, absent: tuple[int, ...] = ()) -> PageMap:
    """A PageMap of ``pages`` pages, present (bit 63) but for ``absent``."""
    entries = b"".join(bytes(7) + (b"\x00" if i in absent else b"\x80") for i in range(pages))
    return PageMap(start, start + pages * PAGE, PAGE, entries)


class Heaps:
    """Zeroed heap copies made for one test, closed with it."""

    def __init__(self) -> None:
        self.pool = BufferPool()
        self.made: list[Segment] = []

    def segment(self, start: int, pages: int, absent: tuple[int, ...] = ()) -> Segment:
        segment = Segment(start, start + pages * PAGE, _page_map(start, pages, absent), self.pool)
        segment.view[:] = bytes(segment.length)
        segment.whole = True
        self.made.append(segment)
        return segment

    def two(self, absent: tuple[int, ...] = ()) -> list[Segment]:
        """Copies of two 16-page heaps at START and SECOND (``absent``: pages of the second
        one not in RAM)."""
        return [self.segment(START, HEAP_PAGES), self.segment(SECOND, HEAP_PAGES, absent)]

    def lazy_twins(self, segments: list[Segment]) -> tuple[list[Segment], heapcopy.Fill]:
        """Empty copies of ``segments`` and the ``fill`` that copies a block of them (plus
        one page, as glibc_walk.ArenaWalker._fill) when the loop first reads there."""
        twins = [Segment(s.start, s.end, s.pages, self.pool) for s in segments]
        self.made.extend(twins)
        for twin in twins:
            twin.view[:] = bytes(twin.length)  # a pooled buffer: another heap's bytes
        sources = {s.start: s for s in segments}

        def fill(segment: Segment, first_page: int) -> None:
            first = first_page * PAGE
            last = min(first + (FILL_PAGES + 1) * PAGE, segment.length)
            segment.view[first:last] = sources[segment.start].view[first:last]
            segment.filled[first_page : first_page + FILL_PAGES] = b"\x01" * FILL_PAGES

        return twins, fill

    def close(self) -> None:
        for segment in self.made:
            segment.close(self.pool)
        self.pool.close()


@pytest.fixture
def heaps() -> Iterator[Heaps]:
    made = Heaps()
    yield made
    made.close()


def _poke(segments: list[Segment], address: int, word: int) -> None:
    """Write ``word`` at target ``address`` in the copy that holds it."""
    (segment,) = [s for s in segments if s.start <= address < s.end]
    struct.pack_into("<Q", segment.view, address - segment.start, word)


def _link_list(segments: list[Segment], chunks: list[tuple[int, int]]) -> None:
    """A circular free list of (address, size) chunks, in that order, from HEAD."""
    for position, (address, size) in enumerate(chunks):
        forward = chunks[position + 1][0] if position + 1 < len(chunks) else HEAD
        back = chunks[position - 1][0] if position else HEAD
        for offset, word in ((8, size | 1), (16, forward), (24, back)):
            _poke(segments, address + offset, word)
        # glibc's set_foot: the next chunk's prev_size repeats a free chunk's size.
        foot = address + size
        if any(s.start <= foot and foot + 8 <= s.end for s in segments):
            _poke(segments, foot, size)


def _outcome(call: Callable[[], object]) -> Outcome:
    try:
        result = call()
    except OutOfTime:
        return OUT_OF_TIME
    return OUT_OF_TIME if result is False else result  # type: ignore[return-value]


def _list_ways(heaps: Heaps) -> dict[str, Way]:
    """Every way a list is followed: C (where built), Python, Python over lazy copies."""

    def python(segments: list[Segment], *args: float) -> Outcome:
        return _outcome(lambda: heapcopy.follow_list(segments, *args))  # type: ignore[arg-type]

    def lazy(segments: list[Segment], *args: float) -> Outcome:
        twins, fill = heaps.lazy_twins(segments)
        return _outcome(lambda: heapcopy.follow_list(twins, *args, fill=fill))  # type: ignore[arg-type]

    ways: dict[str, Way] = {"python": python, "python, lazy copies": lazy}
    native = heapcopy._native
    if native is not None:
        ways["c"] = lambda segments, *args: _outcome(
            lambda: native.walk_segments(heapcopy._native_copies(segments), *args)
        )
    return ways


def _fastbin_ways(heaps: Heaps) -> dict[str, Way]:
    """Every way a fastbin is followed, as _list_ways."""

    def python(segments: list[Segment], *args: float) -> Outcome:
        return _outcome(lambda: heapcopy.follow_fastbin(segments, *args))  # type: ignore[arg-type]

    def lazy(segments: list[Segment], *args: float) -> Outcome:
        twins, fill = heaps.lazy_twins(segments)
        return _outcome(lambda: heapcopy.follow_fastbin(twins, *args, fill=fill))  # type: ignore[arg-type]

    ways: dict[str, Way] = {"python": python, "python, lazy copies": lazy}
    native = heapcopy._native
    if native is not None:
        ways["c"] = lambda segments, *args: _outcome(
            lambda: native.walk_fastbin(heapcopy._native_copies(segments), *args)
        )
    return ways


def test_c_and_python_look_at_the_clock_as_often() -> None:
    if heapcopy._native is None:
        pytest.skip("the C loop is not in use (not built here, or MEMFORENSICS_PURE_PYTHON is set)")
    assert heapcopy._native.CLOCK_EVERY_CHUNKS == heapcopy.CLOCK_EVERY_CHUNKS == 0xFFFF
    assert heapcopy._native.TALLY_FIELDS == heapcopy.TALLY_FIELDS == 7


# A list through both heaps; the big chunk's one mtrim page is 0x4000 … 0x5000 of the second.
HOPS = [(START + 0x100, 0x40), (SECOND + 0x3000, 0x2040), (START + 0x800, 0x100)]
TOTAL = 0x40 + 0x2040 + 0x100


@dataclasses.dataclass
class ListCase:
    expected: Outcome
    chunks: list[tuple[int, int]] = dataclasses.field(default_factory=lambda: list(HOPS))
    pokes: tuple[tuple[int, int], ...] = ()  # (address, word) written after linking
    absent: tuple[int, ...] = ()  # pages of the second heap not in RAM
    low: int = glibc.MINSIZE
    high: int = 1 << 62
    head_bk: int | None = None  # the head's bk, when not the last chunk


LIST_CASES = {
    "consistent": ListCase((3, TOTAL, TOTAL, PAGE, 0x41, 0x2041, TOTAL + 3)),
    "its mtrim page released": ListCase(
        (3, TOTAL, TOTAL - PAGE, 0, 0x41, 0x2041, TOTAL + 3), absent=(4,)
    ),
    "a page under no chunk released": ListCase(
        (3, TOTAL, TOTAL, PAGE, 0x41, 0x2041, TOTAL + 3), absent=(10,)
    ),
    "the page of a chunk's tail released": ListCase(
        (3, TOTAL, TOTAL - 0x40, PAGE, 0x41, 0x2041, TOTAL + 3), absent=(5,)
    ),
    "empty": ListCase((0, 0, 0, 0, 0, 0, 0), chunks=[]),
    "misaligned chunk": ListCase(None, chunks=[HOPS[0], (SECOND + 0x3008, 0x40), HOPS[2]]),
    "fd into the gap between heaps": ListCase(None, pokes=((START + 0x110, START + 20 * PAGE),)),
    "fd below every heap": ListCase(None, pokes=((START + 0x110, START - PAGE),)),
    "header past the heap's end": ListCase(
        None, pokes=((START + 0x110, SECOND + HEAP_PAGES * PAGE - 16),)
    ),
    "size below the bin's": ListCase(None, low=0x50),
    "size above the bin's": ListCase(None, high=0x2000),
    "chunk past its heap's end": ListCase(
        None, chunks=[HOPS[0], (SECOND + 0x3000, 0x10000), HOPS[2]]
    ),
    "bk not the chunk before": ListCase(None, pokes=((SECOND + 0x3018, START + 0x990),)),
    "never back to the head": ListCase(None, pokes=((START + 0x810, 0),)),
    "head's bk not the last chunk": ListCase(None, head_bk=START + 0x100),
    "a cycle back to the first chunk": ListCase(None, pokes=((START + 0x810, START + 0x100),)),
}


@pytest.mark.parametrize("case", LIST_CASES.values(), ids=LIST_CASES.keys())
def test_every_list_case_reads_the_same_every_way(heaps: Heaps, case: ListCase) -> None:
    segments = heaps.two(case.absent)
    _link_list(segments, case.chunks)
    for address, word in case.pokes:
        _poke(segments, address, word)
    fd = case.chunks[0][0] if case.chunks else HEAD
    bk = case.chunks[-1][0] if case.chunks else HEAD
    bk = bk if case.head_bk is None else case.head_bk
    ways = _list_ways(heaps)
    outcomes = {
        name: way(segments, HEAD, fd, bk, case.low, case.high, PAGE) for name, way in ways.items()
    }
    assert outcomes == dict.fromkeys(ways, case.expected)


@pytest.mark.parametrize("seed", range(6))
def test_big_chunks_over_pages_in_and_out_of_ram_tally_the_same_every_way(
    heaps: Heaps, seed: int
) -> None:
    """Chunks of up to 70 pages, at any 16-byte offset, in a 160-page heap whose pages are in
    RAM or not at random (runs of them, and single ones): each way's resident and trimmable
    bytes are the same (C counts a chunk's pages in RAM eight flags at a time; Python one by
    one), and match a count made here page by page from the layout."""
    rng = random.Random(seed)
    pages = 160
    absent = tuple(sorted({i for i in range(pages) if rng.random() < (0.5 if seed % 2 else 0.1)}))
    segment = heaps.segment(START, pages, absent)
    chunks: list[tuple[int, int]] = []
    at = START + 16 * rng.randrange(1, 64)
    while True:
        size = 16 * rng.randrange(2, 70 * PAGE // 16)
        if at + size + 64 > START + pages * PAGE:
            break
        chunks.append((at, size))
        at += size + 16 * rng.randrange(2, 64)  # (a used chunk between two free ones)
    _link_list([segment], chunks)
    ways = _list_ways(heaps)
    fd, bk = chunks[0][0], chunks[-1][0]
    outcomes = {name: way([segment], HEAD, fd, bk, 32, 1 << 62, PAGE) for name, way in ways.items()}
    in_ram = [index not in absent for index in range(pages)]
    resident = trimmable = 0
    for address, size in chunks:
        resident += (
            sum(1 for byte in range(address, address + size, 16) if in_ram[(byte - START) // PAGE])
            * 16
        )
        first, last = glibc.mtrim_span(address, size, PAGE)
        trimmable += sum(PAGE for p in range(first, last, PAGE) if in_ram[(p - START) // PAGE])
    total = sum(size for _, size in chunks)
    assert outcomes["python"] is not None
    assert outcomes["python"][:4] == (len(chunks), total, resident, trimmable)
    assert outcomes == dict.fromkeys(ways, outcomes["python"])
    assert "c" in ways, "the C loops are built wherever the tests run"


def _long_list(heaps: Heaps, count: int) -> tuple[list[Segment], int, int]:
    """One copy holding a list of ``count`` 32-byte chunks in address order."""
    pages = (count * 32) // PAGE + 1
    segment = heaps.segment(START, pages)
    words = segment.words
    addresses = range(START, START + 32 * count, 32)
    words[1 : 4 * count : 4] = array.array("Q", [32 | 1]) * count
    words[2 : 4 * count : 4] = array.array("Q", [*addresses[1:], HEAD])
    words[3 : 4 * count : 4] = array.array("Q", [HEAD, *addresses[:-1]])
    words[4 : 4 * count + 1 : 4] = array.array("Q", [32]) * count  # each next prev_size
    return [segment], addresses[0], addresses[-1]


@pytest.mark.parametrize("count", [heapcopy.CLOCK_EVERY_CHUNKS, heapcopy.CLOCK_EVERY_CHUNKS + 1])
def test_the_clock_is_looked_at_after_the_same_count_every_way(heaps: Heaps, count: int) -> None:
    """A deadline long past: a list shorter than the clock's interval is measured, one chunk
    more is out of time, alike in C and Python (a list of millions must not overrun the
    walk's budget, and no loop looks at the clock more often than the other)."""
    segments, fd, bk = _long_list(heaps, count)
    past = time.monotonic() - 1
    measured = (count, 32 * count, 32 * count, 0, 33, 33, 33 * count)
    expected = measured if count <= 0xFFFF else OUT_OF_TIME
    for name, way in _list_ways(heaps).items():
        assert way(segments, HEAD, fd, bk, 32, 32, PAGE, past) == expected, name
        assert way(segments, HEAD, fd, bk, 32, 32, PAGE) == measured
    # Fastbins too: the same chunks, NULL-terminated through plain fd pointers.
    segments[0].words[2 : 4 * count : 4][-1] = 0
    for name, way in _fastbin_ways(heaps).items():
        assert way(segments, fd, 32, PAGE, False, past) == expected, name


def test_a_fastbin_loop_ends_long_before_the_clock_every_way(heaps: Heaps) -> None:
    """A fastbin looping through three chunks (a corrupt heap's: no bk catches it) in a copy
    that could hold more than the clock's interval of chunks: every way gives it up as
    inconsistent within a few turns, the deadline long past never looked at (followed to
    chunk_limit, it would run into the clock: out of time, after 65,536 steps)."""
    segments, _, _ = _long_list(heaps, 2 * heapcopy.CLOCK_EVERY_CHUNKS)
    assert heapcopy.chunk_limit(segments) > heapcopy.CLOCK_EVERY_CHUNKS
    loop = [START, START + 0x100, START + 0x200]
    for address, following in _chain(loop, loop[0]):
        _poke(segments, address + 8, 0x40 | 1)
        _poke(segments, address + 16, following)
    past = time.monotonic() - 1
    for name, way in _fastbin_ways(heaps).items():
        assert way(segments, loop[0], 0x40, PAGE, False, past) is None, name


def test_walk_copies_raises_out_of_time_c_or_python(
    heaps: Heaps, monkeypatch: pytest.MonkeyPatch
) -> None:
    segments, fd, bk = _long_list(heaps, 70_000)
    for native in {heapcopy._native, None}:
        monkeypatch.setattr(heapcopy, "_native", native)
        assert heapcopy.walk_copies(segments, HEAD, fd, bk, 32, 32, PAGE) == (
            70_000,
            32 * 70_000,
            32 * 70_000,
            0,
            33,
            33,
            33 * 70_000,
        )
        with pytest.raises(OutOfTime):
            heapcopy.walk_copies(segments, HEAD, fd, bk, 32, 32, PAGE, time.monotonic() - 1)


def test_a_copy_that_moves_under_the_loop_stops_at_the_chunk_limit(heaps: Heaps) -> None:
    """A static copy cannot cycle (a chunk seen twice would need two predecessors), but a
    copy filled while the list is followed can: here every read finds the other chunk's
    ``bk`` just right. The loop gives up after chunk_limit() chunks, or ``max_chunks``."""
    source = heaps.segment(START, 2)
    first, second = START + 0x100, START + PAGE + 0x100
    reads: list[int] = []

    def fill(segment: Segment, first_page: int) -> None:  # never marks a page copied
        reads.append(first_page)
        back = HEAD if len(reads) == 1 else (second if first_page == 0 else first)
        chunk = (first, second)[first_page]
        following = (second, first)[first_page]
        struct.pack_into("<4Q", segment.view, chunk - START, 0, 0x40 | 1, following, back)
        struct.pack_into("<Q", segment.view, chunk - START + 0x40, 0x40)  # its foot

    segments = [source]
    source.whole = False
    assert heapcopy.follow_list(segments, HEAD, first, first, 32, 64, PAGE, fill=fill) is None
    assert len(reads) == heapcopy.chunk_limit(segments) + 1 == 2 * PAGE // 32 + 1
    reads.clear()
    assert (
        heapcopy.follow_list(segments, HEAD, first, first, 32, 64, PAGE, fill=fill, max_chunks=5)
        is None
    )
    assert len(reads) == 6


@pytest.mark.parametrize("seed", range(5))
def test_mtrim_whole_pages_is_the_length_of_the_mtrim_span(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(2000):
        chunk = START + 16 * rng.randrange(4 * PAGE // 16)
        size = 16 * rng.randrange(2, 6 * PAGE // 16)
        start, end = glibc.mtrim_span(chunk, size, PAGE)
        assert glibc.mtrim_whole_pages_bytes(chunk, size, PAGE) == max(end - start, 0)


# Fastbins: NULL-terminated, one size, fd safe-linked ((address of fd >> 12) ^ next) since
# glibc 2.32.
FAST = [START + 0x100, SECOND + 0x3000, START + 0x2FE0]  # the last one straddles a page


def _chain(chunks: list[int], end: int = 0) -> list[tuple[int, int]]:
    """(chunk, next) links of a fastbin through ``chunks`` whose last one leads to ``end``."""
    return list(zip(chunks, [*chunks[1:], end], strict=True))


@dataclasses.dataclass
class FastCase:
    expected: Outcome
    links: list[tuple[int, int]] = dataclasses.field(default_factory=lambda: _chain(FAST))
    stored_mangled: bool = True  # how the fd pointers are stored
    read_mangled: bool = True  # how the loop is told to read them
    size: int = 0x40  # of every chunk
    absent: tuple[int, ...] = ()


LAST = SECOND + HEAP_PAGES * PAGE  # the second heap's end
FAST_CASES = {
    "safe-linked": FastCase((3, 0xC0, 0xC0, 0, 0x41, 0x41, 0xC3)),
    "plain": FastCase(
        (3, 0xC0, 0xC0, 0, 0x41, 0x41, 0xC3), stored_mangled=False, read_mangled=False
    ),
    "a page released": FastCase((3, 0xC0, 0x80, 0, 0x41, 0x41, 0xC3), absent=(3,)),
    "empty": FastCase((0, 0, 0, 0, 0, 0, 0), links=[]),
    "a lone chunk": FastCase((1, 0x40, 0x40, 0, 0x41, 0x41, 0x41), links=_chain(FAST[:1])),
    "safe-linked read plain": FastCase(None, read_mangled=False),
    "plain read safe-linked": FastCase(None, stored_mangled=False),
    "a lone safe-linked chunk read plain": FastCase(
        None, links=_chain(FAST[:1]), read_mangled=False
    ),
    "a lone plain chunk read safe-linked": FastCase(
        None, links=_chain(FAST[:1]), stored_mangled=False
    ),
    "another size than the bin's": FastCase(None, size=0x50),
    "fd into the gap between heaps": FastCase(None, links=_chain([FAST[0]], START + 20 * PAGE)),
    "fd misaligned": FastCase(None, links=_chain([FAST[0], START + 0x208])),
    "header past the heap's end": FastCase(None, links=_chain([FAST[0]], LAST - 16)),
    "chunk past its heap's end": FastCase(None, links=_chain([FAST[0], LAST - 32])),
    "not NULL-terminated": FastCase(None, links=_chain(FAST, HEAD)),
    "a cycle": FastCase(None, links=_chain(FAST, FAST[0])),
}


@pytest.mark.parametrize("case", FAST_CASES.values(), ids=FAST_CASES.keys())
def test_every_fastbin_case_reads_the_same_every_way(heaps: Heaps, case: FastCase) -> None:
    segments = heaps.two(case.absent)
    for address, following in case.links:
        stored = ((address + 16) >> 12) ^ following if case.stored_mangled else following
        _poke(segments, address + 8, case.size | 1)
        _poke(segments, address + 16, stored)
    head = case.links[0][0] if case.links else 0
    ways = _fastbin_ways(heaps)
    outcomes = {
        name: way(segments, head, 0x40, PAGE, case.read_mangled) for name, way in ways.items()
    }
    assert outcomes == dict.fromkeys(ways, case.expected)


def test_heaps_the_c_loops_refuse_are_walked_in_python(heaps: Heaps) -> None:
    """Overlapping copies (heaps read while they moved) are no error: the Python loops,
    which need no order, walk them."""
    segments = heaps.two()
    _link_list(segments, HOPS)
    overlapping = [segments[0], segments[0], segments[1]]
    expected = heapcopy.follow_list(segments, HEAD, HOPS[0][0], HOPS[-1][0], 32, 1 << 62, PAGE)
    assert expected is not None
    walked = heapcopy.walk_copies(overlapping, HEAD, HOPS[0][0], HOPS[-1][0], 32, 1 << 62, PAGE)
    assert walked == expected
    fast = heaps.two()
    for address, following in _chain(FAST):
        _poke(fast, address + 8, 0x40 | 1)
        _poke(fast, address + 16, following)
    overlapping = [fast[0], fast[0], fast[1]]
    assert heapcopy.walk_fastbin_copies(overlapping, FAST[0], 0x40, PAGE, False) == (
        3,
        0xC0,
        0xC0,
        0,
        0x41,
        0x41,
        0xC3,
    )


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
    for slot, forward, back in zip(
        slots, [*addresses[1:], HEAD], [HEAD, *addresses[:-1]], strict=True
    ):
        words[slot + 1] = 32 | 1
        words[slot + 2] = forward
        words[slot + 3] = back
        if slot + 4 < len(words):
            words[slot + 4] = 32  # the next chunk's prev_size (glibc's set_foot)
    calls: list[tuple[float, float, object]] = []
    copies = [(words, START, None)]

    def walker() -> None:
        for _ in range(5):
            before = time.monotonic()
            result = native.walk_segments(copies, HEAD, addresses[0], addresses[-1], 32, 32, PAGE)
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
    assert all(
        result == (count, 32 * count, 32 * count, 0, 33, 33, 33 * count) for *_, result in calls
    )
    during = [
        sum(before + (after - before) / 4 < tick < after - (after - before) / 4 for tick in ticks)
        for before, after, _ in calls
    ]
    assert max(during) > 0, (during, [after - before for before, after, _ in calls])


@pytest.mark.parametrize("seed", range(4))
def test_both_in_c_is_the_bitwise_and_python_makes(seed: int) -> None:
    """heapcopy.both (C where built) against both_python on flag strings of any byte values
    and unequal lengths (a heap's 16,384 pages, a residency longer or shorter than the flags):
    the same bytes, as long as the shorter; and the tests run where C is built."""
    assert heapcopy._native is not None, "the C loops are built wherever the tests run"
    rng = random.Random(seed)
    for length_a, length_b in ((16384, 16384), (16384, 16000), (7, 4096), (0, 5)):
        first = bytes(rng.choice((0, 1, 1, 2, 3, 255)) for _ in range(length_a))
        second = bytearray(rng.choice((0, 1, 7, 254)) for _ in range(length_b))
        expected = heapcopy.both_python(first, second)
        assert len(expected) == min(length_a, length_b)
        assert heapcopy.both(first, second) == expected
        assert heapcopy.both(second, first) == expected
        assert expected == bytes(a & b for a, b in zip(first, second, strict=False))
