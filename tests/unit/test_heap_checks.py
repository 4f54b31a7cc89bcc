"""heap_checks on hand-built heap copies: a list the walk's loops (C and Python) refuse is
named by a check in glibc's words, one they accept is not; every check ends within the copy's
bounds whatever the corrupted header holds (hypothesis draws the corruptions: random words,
other chunks, small integers, the chunk itself), and the top and nextsize checks find what
the loops do not look at."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import given, settings
from hypothesis import strategies as st

from memforensics.model import corruption as words
from memforensics.model import glibc
from memforensics.sources.glibc import heap_checks, heapcopy
from memforensics.sources.glibc.glibc_arenas import ArenaState
from memforensics.sources.glibc.heapcopy import Segment
from tests.unit.test_chunkwalk import HEAD, PAGE, START, Heaps

ARENA = HEAD - glibc.OFF_BINS  # a made-up malloc_state whose bin 1 head is HEAD (+16 * index)
SMALL = 17  # small bin of 0x110-byte chunks
SMALL_BYTES = 0x110
SLOT_BYTES = 0x200  # chunks laid out one per slot, a used chunk between them
SLOTS = 24
DEADLINE = float("inf")


@contextmanager
def copies(pages: int = 16) -> Iterator[tuple[Heaps, list[Segment]]]:
    made = Heaps()
    try:
        yield made, [made.segment(START, pages)]
    finally:
        made.close()


def _poke(segment: Segment, address: int, word: int) -> None:
    struct.pack_into("<Q", segment.view, address - segment.start, word & (1 << 64) - 1)


def _small_list(segment: Segment, slots: list[int], head: int = HEAD) -> list[int]:
    """A consistent small-bin list through chunks at ``slots``; their addresses."""
    chunks = [START + SLOT_BYTES * slot for slot in slots]
    for position, chunk in enumerate(chunks):
        forward = chunks[position + 1] if position + 1 < len(chunks) else head
        back = chunks[position - 1] if position else head
        for offset, word in ((8, SMALL_BYTES | 1), (16, forward), (24, back)):
            _poke(segment, chunk + offset, word)
        _poke(segment, chunk + SMALL_BYTES, SMALL_BYTES)  # the next chunk's prev_size
    return chunks


def _loops_accept(segments: list[Segment], fd: int, bk: int) -> bool:
    """Both loops (C where built, and Python) agree; True when they read the list back."""
    python = heapcopy.follow_list(segments, HEAD, fd, bk, SMALL_BYTES, SMALL_BYTES, PAGE)
    either = heapcopy.walk_copies(segments, HEAD, fd, bk, SMALL_BYTES, SMALL_BYTES, PAGE)
    assert (python is None) == (either is None)
    return python is not None


def _diagnose(segments: list[Segment], fd: int, bk: int) -> words.HeapCorruption | None:
    return heap_checks.diagnose_list(ARENA, segments, SMALL, HEAD, fd, bk, PAGE, DEADLINE)


def test_a_consistent_list_is_not_named() -> None:
    with copies() as (_made, segments):
        chunks = _small_list(segments[0], [1, 5, 3, 9])
        assert _loops_accept(segments, chunks[0], chunks[-1])
        assert _diagnose(segments, chunks[0], chunks[-1]) is None


def test_the_issue_cases_are_named_in_glibcs_words() -> None:
    with copies() as (_made, segments):
        a, b, c = _small_list(segments[0], [1, 2, 3])
        _poke(segments[0], b + 16, a)  # b's fd back to a: a cycle
        found = _diagnose(segments, a, c)
        assert found is not None and found.check == words.LIST_LOOPS and found.chunk_address == b
    with copies() as (_made, segments):
        a, b, c = _small_list(segments[0], [1, 2, 3])
        _poke(segments[0], a + 16, a)  # linked to itself
        found = _diagnose(segments, a, c)
        assert found is not None and found.check == words.LIST_LOOPS and found.chunk_address == a
    with copies() as (_made, segments):
        a, b, c = _small_list(segments[0], [1, 2, 3])
        _poke(segments[0], b + 16, 0x10000000000)  # to unmapped memory
        found = _diagnose(segments, a, c)
        assert found is not None and found.check == words.OUTSIDE_HEAPS
    with copies() as (_made, segments):
        a, b, c = _small_list(segments[0], [1, 2, 3])
        _poke(segments[0], c + 24, a)  # c's bk names a, not b
        found = _diagnose(segments, a, c)
        assert found is not None and found.check == words.SMALLBIN_LIST and found.chunk_address == c
    for size in (0, 0x4141414141414141):
        with copies() as (_made, segments):
            a, b, c = _small_list(segments[0], [1, 2, 3])
            _poke(segments[0], b + 8, size)
            found = _diagnose(segments, a, c)
            assert found is not None and found.check == words.SIZE_VS_PREV_SIZE


_FIELDS = (8, 16, 24)  # size, fd, bk


@settings(max_examples=300, deadline=None)
@given(
    order=st.permutations(range(1, SLOTS)).map(lambda p: p[:6]),
    victim=st.integers(0, 5),
    field=st.sampled_from(_FIELDS),
    kind=st.sampled_from(("random", "chunk", "small", "self")),
    random_word=st.integers(0, (1 << 64) - 1),
    other=st.integers(0, SLOTS - 1),
    small=st.integers(0, 64),
)
def test_loops_refuse_exactly_what_the_checks_name(
    order: list[int],
    victim: int,
    field: int,
    kind: str,
    random_word: int,
    other: int,
    small: int,
) -> None:
    with copies() as (_made, segments):
        chunks = _small_list(segments[0], list(order))
        chunk = chunks[victim]
        value = {
            "random": random_word,
            "chunk": START + SLOT_BYTES * other,
            "small": small,
            "self": chunk,
        }[kind]
        _poke(segments[0], chunk + field, value)
        accepted = _loops_accept(segments, chunks[0], chunks[-1])
        found = _diagnose(segments, chunks[0], chunks[-1])
        assert accepted == (found is None), (accepted, found)
        if found is not None:
            assert found.check in vars(words).values()
            assert found.bin == "small bin 17" and found.arena_address == ARENA


def _fastbin(segment: Segment, slots: list[int], size: int, mangled: bool) -> list[int]:
    chunks = [START + SLOT_BYTES * slot for slot in slots]
    for position, chunk in enumerate(chunks):
        forward = chunks[position + 1] if position + 1 < len(chunks) else 0
        stored = ((chunk + 16) >> 12) ^ forward if mangled else forward
        _poke(segment, chunk + 8, size | 1)
        _poke(segment, chunk + 16, stored)
    return chunks


@settings(max_examples=300, deadline=None)
@given(
    order=st.permutations(range(1, SLOTS)).map(lambda p: p[:5]),
    victim=st.integers(0, 4),
    field=st.sampled_from((8, 16)),
    kind=st.sampled_from(("random", "chunk", "small", "self")),
    random_word=st.integers(0, (1 << 64) - 1),
    other=st.integers(0, SLOTS - 1),
    small=st.integers(0, 64),
    mangled=st.booleans(),
)
def test_fastbin_loops_refuse_exactly_what_the_checks_name(
    order: list[int],
    victim: int,
    field: int,
    kind: str,
    random_word: int,
    other: int,
    small: int,
    mangled: bool,
) -> None:
    size = 0x40
    with copies() as (_made, segments):
        chunks = _fastbin(segments[0], list(order), size, mangled)
        chunk = chunks[victim]
        value = {
            "random": random_word,
            "chunk": START + SLOT_BYTES * other,
            "small": small,
            "self": chunk,
        }[kind]
        if field == 16 and kind != "random" and mangled:
            value = ((chunk + 16) >> 12) ^ value  # stored the way glibc stores it
        _poke(segments[0], chunk + field, value)
        python = heapcopy.follow_fastbin(segments, chunks[0], size, PAGE, mangled)
        either = heapcopy.walk_fastbin_copies(segments, chunks[0], size, PAGE, mangled)
        assert (python is None) == (either is None)
        _count, found = heap_checks.diagnose_fastbin(
            ARENA, segments, 2, chunks[0], PAGE, mangled, DEADLINE
        )
        assert (python is None) == (found is not None), (python, found)


def test_a_fastbin_cycle_is_found_in_constant_memory() -> None:
    with copies() as (_made, segments):
        chunks = _fastbin(segments[0], list(range(1, 21)), 0x40, True)
        last = chunks[-1]
        _poke(segments[0], last + 16, ((last + 16) >> 12) ^ chunks[7])  # back into the list
        _count, found = heap_checks.diagnose_fastbin(
            ARENA, segments, 2, chunks[0], PAGE, True, DEADLINE
        )
        assert found is not None and found.check == words.LIST_LOOPS


def test_an_absurd_top_is_named_and_a_fitting_one_is_not() -> None:
    with copies() as (_made, segments):
        top = START + 8 * PAGE
        _poke(segments[0], top + 8, (8 * PAGE) | 1)  # up to the end of the copy
        assert heap_checks.check_top(ARENA, segments, top, 16 * PAGE, PAGE) is None
        _poke(segments[0], top + 8, 0x7FFFFFFFFFF1)
        found = heap_checks.check_top(ARENA, segments, top, 16 * PAGE, PAGE)
        assert found is not None and found.check == words.TOP_SIZE and found.bin == "top"


def _large_list(segment: Segment, sizes: list[int]) -> list[int]:
    """Chunks of decreasing distinct ``sizes`` in one large bin, fd/bk and nextsize rings."""
    chunks = [START + 0x800 * (slot + 1) for slot in range(len(sizes))]
    n = len(chunks)
    for position, chunk in enumerate(chunks):
        forward = chunks[position + 1] if position + 1 < n else HEAD
        back = chunks[position - 1] if position else HEAD
        _poke(segment, chunk + 8, sizes[position] | 1)
        _poke(segment, chunk + 16, forward)
        _poke(segment, chunk + 24, back)
        _poke(segment, chunk + 32, chunks[(position + 1) % n])
        _poke(segment, chunk + 40, chunks[(position - 1) % n])
    return chunks


@settings(max_examples=100, deadline=None)
@given(
    victim=st.integers(0, 2),
    field=st.sampled_from((32, 40)),
    value=st.one_of(st.integers(0, (1 << 64) - 1), st.integers(0, 64)),
)
def test_a_corrupt_nextsize_ring_is_named(victim: int, field: int, value: int) -> None:
    with copies() as (_made, segments):
        chunks = _large_list(segments[0], [0x520, 0x510, 0x500])
        assert heap_checks.check_nextsize(ARENA, segments, 68, HEAD, chunks[0], PAGE) is None
        _poke(segments[0], chunks[victim] + field, value)
        found = heap_checks.check_nextsize(ARENA, segments, 68, HEAD, chunks[0], PAGE)
        assert found is not None and found.check in (words.LARGEBIN_NEXTSIZE, words.LIST_LOOPS)


@settings(max_examples=200, deadline=None)
@given(
    victim=st.integers(0, 3),
    field=st.sampled_from((8, 32, 40)),
    value=st.one_of(
        st.integers(0, (1 << 64) - 1),
        st.integers(0, 64),
        st.sampled_from([START + 0x800 * k + d for k in range(6) for d in (0, 8, 16)]),
    ),
    corrupt=st.booleans(),
)
def test_the_rings_c_passes_are_exactly_those_python_passes(
    victim: int, field: int, value: int, corrupt: bool
) -> None:
    """heapcopy.rings_hold (C) against heap_checks.check_nextsize (Python) on a large bin's
    ring, whole or with one word of a chunk changed (its size, fd_nextsize or bk_nextsize: to
    anything, to a small number, or to another chunk of the ring or an address beside one),
    and read from each chunk of the ring and from the bin's head: 1 exactly where Python finds
    nothing. The oracle is the Python check; the tests run where C is built."""
    assert heapcopy._native is not None, "the C loops are built wherever the tests run"
    with copies() as (_made, segments):
        chunks = _large_list(segments[0], [0x540, 0x530, 0x520, 0x510])
        if corrupt:
            _poke(segments[0], chunks[victim] + field, value)
        firsts = [HEAD, *chunks, START, START + 16 * PAGE - 32]
        passed = heapcopy.rings_hold(segments, [(HEAD, first) for first in firsts], PAGE)
        assert passed is not None and len(passed) == len(firsts)
        for first, verdict in zip(firsts, passed, strict=True):
            found = heap_checks.check_nextsize(ARENA, segments, 68, HEAD, first, PAGE)
            assert verdict == (found is None), (hex(first), found)
        if not corrupt:
            assert passed[1] == 1  # (the whole ring from its first chunk passes)
            assert passed[2] == 0  # (from the second, the sizes rise where it wraps)


@settings(max_examples=100, deadline=None)
@given(
    held_pages=st.sets(st.integers(0, 15), max_size=16),
    victim=st.integers(0, 3),
    value=st.integers(0, (1 << 64) - 1),
    corrupt=st.booleans(),
)
def test_rings_over_a_copy_filled_block_by_block_name_the_same(
    held_pages: set[int], victim: int, value: int, corrupt: bool
) -> None:
    """check_unlisted over copies filled block by block (the pages ``held_pages`` copied
    before, the rest filled as read) finds what it finds over the whole copy (the oracle: the
    whole copy's Python check): C's verdict over the pages held is that check's, and where C
    says 2 (a word on a page not held) the Python check it leaves the ring to fills a page."""
    with copies() as (made, segments):
        chunks = _large_list(segments[0], [0x540, 0x530, 0x520, 0x510])
        if corrupt:
            _poke(segments[0], chunks[victim] + 32, value)
        twins, filling = made.lazy_twins(segments)
        filled_pages: list[int] = []

        def fill(segment: Segment, first_page: int) -> None:
            filled_pages.append(first_page)
            filling(segment, first_page)

        for index in held_pages:
            twins[0].view[index * PAGE : (index + 1) * PAGE] = segments[0].view[
                index * PAGE : (index + 1) * PAGE
            ]
            twins[0].filled[index] = 1
        bins = [0] * 254
        bins[2 * 67], bins[2 * 67 + 1] = chunks[0], chunks[-1]  # (bin 68: this ring)
        state = ArenaState(ARENA, 0, ARENA, 16 * PAGE, tuple(bins), (0,) * 10)
        head = heap_checks.bin_head(state, 68)
        whole = heap_checks.check_nextsize(ARENA, segments, 68, head, chunks[0], PAGE)
        verdict = heapcopy.rings_hold(twins, [(head, chunks[0])], PAGE, filled=True)
        assert verdict is not None and verdict[0] in (0, 1, 2)
        lazy = heap_checks.check_unlisted(state, twins, [68], PAGE, fill=fill, top=False)
        assert lazy == ([] if whole is None else [whole])
        if verdict[0] == 2:
            assert filled_pages  # (the word C could not read, Python filled)
        else:
            assert verdict[0] == (whole is None)
            assert verdict[0] == 0 or not filled_pages  # (a ring C passed is not followed)


def test_a_list_filled_block_by_block_is_named_the_same() -> None:
    with copies() as (made, segments):
        a, _b, c = _small_list(segments[0], [1, 9, 17])
        _poke(segments[0], c + 24, a)
        whole = _diagnose(segments, a, c)
        twins, fill = made.lazy_twins(segments)
        lazy = heap_checks.diagnose_list(ARENA, twins, SMALL, HEAD, a, c, PAGE, DEADLINE, fill=fill)
        assert whole is not None and lazy == whole
