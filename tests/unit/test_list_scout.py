"""_listscout.scout: which pages an arena's free lists lie on, read from a live process.

The target here is this test's own process (/proc/self/mem reads it as /proc/PID/mem reads
another): a heap laid out in an anonymous mapping, with a circular bin list and
fastbins through it. The oracle is the layout itself: the pages flagged must be exactly the
pages of the chunks' headers and of the words after the binned chunks (their feet), the copy
must hold the heap's bytes there and zeros everywhere else, and a page the pagemap flags as
not in RAM is never read.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import time
from collections.abc import Iterator

import pytest

from memforensics.sources import optional_native

PAGE = mmap.PAGESIZE
PAGES = 32
HEAD = 0x7F00DEAD0000  # the bin's own address (in malloc_state, outside the heaps)
CIRCULAR, FASTBIN, FASTBIN_SAFE_LINKED = 0, 1, 2

native = optional_native("memforensics.sources.glibc._listscout")


class Heap:
    """An anonymous mapping of this process laid out as a glibc heap, and a copy to fill."""

    def __init__(self) -> None:
        self.memory = mmap.mmap(-1, PAGES * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.start = ctypes.addressof(ctypes.c_char.from_buffer(self.memory))
        self.copy = mmap.mmap(-1, PAGES * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.filled = bytearray(PAGES + 2)
        self.readable = bytearray(b"\x01" * PAGES)
        self.inconsistent = -1  # lists failing glibc's bk check, as the last scout found
        self.tags: tuple[bytearray, bytearray] | None = None  # (lo, hi) bins per page, if kept
        self.pages_read = 0  # what the last scout said it read
        self.steps = 0  # the chunks the last scout's lists advanced by
        self.fd = os.open("/proc/self/mem", os.O_RDONLY)

    def chunk(self, offset: int, size: int, fd: int, bk: int) -> int:
        """A free chunk of ``size`` at ``offset`` with its foot; its address."""
        struct.pack_into("<4Q", self.memory, offset, 0, size | 1, fd, bk)
        if offset + size + 8 <= PAGES * PAGE:
            struct.pack_into("<Q", self.memory, offset + size, size)
        return self.start + offset

    def scout(
        self,
        lists: list[tuple[int, ...]],
        max_pages: int = 1 << 30,
        pagemap_fd: int = -1,
        threads: int = 1,
        *,
        fresh: bool = False,
        ordered_max: int = 0,
    ) -> int:
        view = memoryview(self.copy)
        flagged_before = len(self.flagged())
        try:
            status, pages, self.inconsistent, self.steps = native.scout(  # type: ignore[union-attr]
                self.fd,
                [(view, self.start, bytes(self.readable), self.filled, *(self.tags or ()))],
                lists,
                PAGE,
                time.monotonic() + 10,
                max_pages,
                pagemap_fd,
                threads,
                0,
                fresh,
                ordered_max,
            )
        finally:
            view.release()
        assert set(self.filled) <= {0, 1}  # no flag of the scout's own is left behind
        if not fresh:  # (a fresh scout reads flagged pages again: more reads than new flags)
            assert pages == len(self.flagged()) - flagged_before
        self.pages_read = int(pages)
        return int(status)

    def flagged(self) -> set[int]:
        return {index for index, flag in enumerate(self.filled) if flag}

    def assert_copied(self) -> None:
        """The copy holds the heap's bytes on the flagged pages and zeros elsewhere."""
        for index in range(PAGES):
            page = slice(index * PAGE, (index + 1) * PAGE)
            expected = self.memory[page] if self.filled[index] else bytes(PAGE)
            assert self.copy[page] == expected, index

    def close(self) -> None:
        os.close(self.fd)
        self.copy.close()
        # (the ctypes view of ``memory`` pins it: left to the process's end)


@pytest.fixture
def heap() -> Iterator[Heap]:
    assert native is not None, "the C scout is built wherever the tests run (pip install)"
    made = Heap()
    try:
        yield made
    finally:
        made.close()


def _ring(heap: Heap, spots: list[tuple[int, int]]) -> int:
    """A circular list of chunks at (offset, size) ``spots``, in that order; its first."""
    addresses = [heap.start + offset for offset, _ in spots]
    for position, (offset, size) in enumerate(spots):
        following = addresses[position + 1] if position + 1 < len(spots) else HEAD
        before = addresses[position - 1] if position else HEAD
        heap.chunk(offset, size, following, before)
    return addresses[0]


def test_a_bin_list_flags_its_headers_pages_and_its_feet(heap: Heap) -> None:
    # Chunks on pages 3, 9 (foot on 12), 20 (a header straddling pages 20 and 21), 2.
    spots = [(3 * PAGE + 64, 96), (9 * PAGE, 3 * PAGE + 16), (21 * PAGE - 16, 64), (2 * PAGE, 48)]
    first = _ring(heap, spots)
    assert heap.scout([(HEAD, first, CIRCULAR)]) == 0
    assert heap.flagged() == {3, 9, 12, 20, 21, 2}
    assert heap.inconsistent == 0
    heap.assert_copied()


def test_fastbins_are_followed_both_ways(heap: Heap) -> None:
    """A safe-linked fastbin read as stored leaves the heap at once, and the other way
    round: both ways asked for, only the true pages are flagged."""
    first, second = heap.start + 5 * PAGE, heap.start + 17 * PAGE + 32
    mangled = ((first + 16) >> 12) ^ second
    heap.chunk(5 * PAGE, 48, mangled, 0)
    heap.chunk(17 * PAGE + 32, 48, (second + 16) >> 12, 0)  # safe-linked NULL
    assert heap.scout([(0, first, FASTBIN), (0, first, FASTBIN_SAFE_LINKED)]) == 0
    assert heap.flagged() == {5, 17}
    heap.assert_copied()


def test_a_page_not_in_ram_is_never_read_and_ends_the_list(heap: Heap) -> None:
    spots = [(1 * PAGE, 64), (6 * PAGE, 64), (11 * PAGE, 64)]
    first = _ring(heap, spots)
    heap.readable[6] = 0
    assert heap.scout([(HEAD, first, CIRCULAR)]) == 0
    assert heap.flagged() == {1}
    heap.assert_copied()


def test_past_max_pages_the_scout_says_so_and_flags_only_what_it_read(heap: Heap) -> None:
    spots = [(index * PAGE, 64) for index in range(0, 30, 3)]
    first = _ring(heap, spots)
    assert heap.scout([(HEAD, first, CIRCULAR)], max_pages=4) == 1
    assert heap.flagged() == {0, 3, 6, 9}
    heap.assert_copied()


def test_lists_are_read_side_by_side_and_a_cycle_ends(heap: Heap) -> None:
    """Two lists, one a cycle that never returns to its head (a hostile heap): both end,
    every page either leads to is flagged once."""
    first = _ring(heap, [(4 * PAGE, 64), (8 * PAGE, 64)])
    a, b = heap.start + 14 * PAGE, heap.start + 15 * PAGE
    heap.chunk(14 * PAGE, 64, b, a)
    heap.chunk(15 * PAGE, 64, a, b)
    assert heap.scout([(HEAD, first, CIRCULAR), (HEAD + 16, a, CIRCULAR)]) == 0
    assert heap.flagged() == {4, 8, 14, 15}
    assert heap.inconsistent == 1  # the cycle: its first chunk's bk is not its bin
    heap.assert_copied()
    # The cycle ends once it comes round, not after as many chunks as the heap could hold
    # (4,096 here; 50 million in 1.6 GiB of heaps, a second of spinning through copied pages).
    assert heap.steps <= 2 + 4 * 2, heap.steps


def test_a_loop_behind_a_tail_ends_within_a_few_turns(heap: Heap) -> None:
    """head -> c0 -> c1 -> c2 -> c3 -> c4 -> c1: a loop of 4 behind a tail of 1, a fastbin
    (no bk check to notice it) as a moving heap's stale copies can make one: followed a few
    times round at most, every page it leads to flagged."""
    spots = [heap.start + index * PAGE for index in range(5, 10)]
    for position, address in enumerate(spots):
        following = spots[position + 1] if position + 1 < len(spots) else spots[1]
        heap.chunk(address - heap.start, 48, following, 0)
    assert heap.scout([(0, spots[0], FASTBIN)]) == 0
    assert heap.flagged() == set(range(5, 10))
    assert heap.steps <= 4 * (1 + 4), heap.steps
    heap.assert_copied()


def test_a_list_whose_bk_does_not_name_the_chunk_before_is_counted_even_when_cut_short(
    heap: Heap,
) -> None:
    """glibc's bk check, noted by the scout (the target runs: noted, not acted on), also
    when the scout stops at its page budget before the list's end."""
    spots = [(index * PAGE, 64) for index in range(0, 30, 3)]
    first = _ring(heap, spots)
    heap.chunk(3 * PAGE, 64, heap.start + 6 * PAGE, heap.start + 27 * PAGE)  # a wrong bk
    assert heap.scout([(HEAD, first, CIRCULAR)], max_pages=4) == 1
    assert heap.inconsistent == 1
    clean = _ring(heap, spots)
    heap.filled[:] = bytes(len(heap.filled))
    assert heap.scout([(HEAD, clean, CIRCULAR)], max_pages=4) == 1
    assert heap.inconsistent == 0


def test_with_the_pagemap_the_scout_reads_what_is_in_ram_now_not_the_old_flags(heap: Heap) -> None:
    """Flags older than the scout (an earlier scout's residency): with the target's pagemap
    the scout reads a page that came into RAM since (flagged not readable) and never one
    that left RAM since (flagged readable, dropped here with MADV_DONTNEED)."""
    spots = [(1 * PAGE, 64), (6 * PAGE, 64), (11 * PAGE, 64), (16 * PAGE, 64)]
    first = _ring(heap, spots)
    heap.readable[6] = 0  # "not in RAM" when the flags were read; it is now
    heap.memory.madvise(mmap.MADV_DONTNEED, 11 * PAGE, PAGE)  # in RAM then; not now
    pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
    try:
        assert heap.scout([(HEAD, first, CIRCULAR)], pagemap_fd=pagemap) == 0
    finally:
        os.close(pagemap)
    assert heap.flagged() == {1, 6}  # the list ends at page 11, never read
    assert heap.copy[11 * PAGE : 12 * PAGE] == bytes(PAGE)
    heap.assert_copied()


@pytest.mark.parametrize("live", [False, True], ids=["flags", "pagemap"])
def test_two_readers_read_a_big_round_as_one_does(heap: Heap, live: bool) -> None:
    """A round of 24 pages (24 one-chunk lists) split between two threads reads what one
    reader reads: each list's page, and with the pagemap not the page that left RAM (one in
    the second reader's half), which ends its list."""
    lists = []
    for page in range(1, 25):
        first = _ring(heap, [(page * PAGE + 64, 64)])
        lists.append((HEAD + 16 * page, first, CIRCULAR))
    dropped = 20
    for threads in (1, 2):
        heap.filled[:] = bytes(len(heap.filled))
        heap.copy[:] = bytes(PAGES * PAGE)
        _ring(heap, [(dropped * PAGE + 64, 64)])  # in RAM again (dropped below when live)
        pagemap = -1
        if live:
            heap.memory.madvise(mmap.MADV_DONTNEED, dropped * PAGE, PAGE)
            pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
        try:
            assert heap.scout(lists, pagemap_fd=pagemap, threads=threads) == 0
        finally:
            if live:
                os.close(pagemap)
        assert heap.flagged() == set(range(1, 25)) - ({dropped} if live else set()), threads
        heap.assert_copied()


def test_a_second_reader_kept_for_many_big_rounds_reads_what_one_reader_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """24 lists of three chunks each, on pages 1-24, 25-48 and 49-72: three rounds of 24 pages,
    each split with the one second reader the call keeps. Every list's every page is read
    and copied whole, as one reader reads them, and the scout says it read each once."""
    monkeypatch.setitem(globals(), "PAGES", 80)  # (Heap's size)
    big = Heap()
    try:
        lists = []
        for index in range(24):
            pages = (1 + index, 25 + index, 49 + index)
            first = _ring(big, [(page * PAGE + 128, 64) for page in pages])
            lists.append((HEAD + 16 * index, first, CIRCULAR))
        for threads in (1, 2, 2):
            big.filled[:] = bytes(len(big.filled))
            big.copy[:] = bytes(80 * PAGE)
            assert big.scout(lists, threads=threads) == 0
            assert big.flagged() == set(range(1, 73)), threads
            assert big.pages_read == 72
            assert big.steps == 72
            big.assert_copied()
    finally:
        big.close()


def test_each_page_is_tagged_with_the_lowest_and_highest_bin_whose_list_needed_it(
    heap: Heap,
) -> None:
    """Bin 5's list on pages 3 and 9 (its foot on 12), bin 40's on pages 9 (the same page as
    one of bin 5's chunks) and 20, a fastbin (bin 0) on page 25: every page a list needed
    carries the bins that needed it, whether that list read it or found it read already; a
    page no list needed keeps the untouched tags (255, 0)."""
    heap.tags = (bytearray([255]) * (PAGES + 2), bytearray(PAGES + 2))
    low = _ring(heap, [(3 * PAGE, 64), (9 * PAGE, 3 * PAGE + 16)])
    high_first, high_second = heap.start + 9 * PAGE + 512, heap.start + 20 * PAGE
    heap.chunk(9 * PAGE + 512, 64, high_second, HEAD + 16)
    heap.chunk(20 * PAGE, 64, HEAD + 16, high_first)
    heap.chunk(25 * PAGE, 48, 0, 0)
    lists = [
        (HEAD, low, CIRCULAR, 5),
        (HEAD + 16, high_first, CIRCULAR, 40),
        (0, heap.start + 25 * PAGE, FASTBIN, 0),
    ]
    assert heap.scout(lists) == 0
    lo, hi = heap.tags
    tagged = {index: (lo[index], hi[index]) for index in range(PAGES) if lo[index] != 255}
    assert tagged == {3: (5, 5), 9: (5, 40), 12: (5, 5), 20: (40, 40), 25: (0, 0)}
    assert all(hi[index] == 0 for index in range(PAGES) if index not in tagged)
    assert heap.flagged() == set(tagged)
    heap.assert_copied()


@pytest.mark.parametrize(("bin_index", "also"), [(5, set()), (63, set()), (64, {8}), (90, {8})])
def test_a_large_bins_chunk_brings_the_page_of_its_nextsize_words(
    heap: Heap, bin_index: int, also: set[int]
) -> None:
    """A chunk in the last 32 bytes of page 7: its header is on page 7 alone, but a large
    bin's chunk (bin 64 and up) has its fd_nextsize and bk_nextsize on page 8, which the
    stop's check of the bin's nextsize ring reads; a small bin's does not need page 8."""
    first = _ring(heap, [(8 * PAGE - 32, 3 * PAGE), (12 * PAGE, 3 * PAGE)])
    assert heap.scout([(HEAD, first, CIRCULAR, bin_index)]) == 0
    assert heap.flagged() == {7, 10, 12, 15} | also  # (headers, feet, and nextsize words)
    heap.assert_copied()


def test_a_list_without_a_bin_tags_nothing_and_bad_tags_are_refused(heap: Heap) -> None:
    heap.tags = (bytearray([255]) * (PAGES + 2), bytearray(PAGES + 2))
    first = _ring(heap, [(7 * PAGE, 64)])
    assert heap.scout([(HEAD, first, CIRCULAR)]) == 0
    assert heap.flagged() == {7}
    assert set(heap.tags[0]) == {255}
    heap.filled[:] = bytes(len(heap.filled))
    with pytest.raises(ValueError, match=r"0\.\.127"):
        heap.scout([(HEAD, first, CIRCULAR, 128)])
    heap.tags = (bytearray([255]) * 2, bytearray(2))
    with pytest.raises(ValueError, match="one byte per page"):
        heap.scout([(HEAD, first, CIRCULAR, 3)])


def _moved_ring(heap: Heap) -> tuple[int, int]:
    """A list on pages 2 and 7 scouted (with the pagemap, as a catch-up reads), then moved as
    a busy arena moves it: a chunk on page 12 put at its head, and one on page 18 put after
    the chunk of page 7 (that page's copy is now old: it still ends the list there). The
    list's old first chunk and its new one."""
    old = _ring(heap, [(2 * PAGE, 64), (7 * PAGE, 64)])
    pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
    try:
        assert heap.scout([(HEAD, old, CIRCULAR)], pagemap_fd=pagemap) == 0
    finally:
        os.close(pagemap)
    assert heap.flagged() == {2, 7}
    new = _ring(heap, [(12 * PAGE, 64), (2 * PAGE, 64), (7 * PAGE, 64), (18 * PAGE, 64)])
    return old, new


def test_a_fresh_scout_reads_again_the_copied_pages_a_moved_list_leads_through(
    heap: Heap,
) -> None:
    """Through pages copied before, a scout trusts their old bytes and misses what the list
    took on past them; a fresh one reads each again (once) and finds it. Both keep every
    page flagged, and the copy then holds the list as it is now."""
    _, new = _moved_ring(heap)
    kept_filled, kept_copy = bytes(heap.filled), bytes(heap.copy)
    pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
    try:
        assert heap.scout([(HEAD, new, CIRCULAR)], pagemap_fd=pagemap) == 0
        assert heap.flagged() == {2, 7, 12}  # page 18 missed: page 7's old bytes end the list
        assert heap.pages_read == 1
        heap.filled[:], heap.copy[:] = kept_filled, kept_copy
        assert heap.scout([(HEAD, new, CIRCULAR)], pagemap_fd=pagemap, fresh=True) == 0
    finally:
        os.close(pagemap)
    assert heap.flagged() == {2, 7, 12, 18}
    assert heap.pages_read == 4  # 12 and 18 new, 2 and 7 read again
    assert heap.inconsistent == 0
    heap.assert_copied()


def test_a_fresh_scout_never_reads_a_copied_page_that_left_ram_and_keeps_it_flagged(
    heap: Heap,
) -> None:
    """A page copied before that is no longer in RAM (swapped out since) is not read again
    (that would fault it back into the target): it keeps its flag and its old copy, and the
    list ends there; the stop's copy decides about it."""
    _, new = _moved_ring(heap)
    old_page_7 = bytes(heap.copy[7 * PAGE : 8 * PAGE])
    heap.memory.madvise(mmap.MADV_DONTNEED, 7 * PAGE, PAGE)
    pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
    try:
        assert heap.scout([(HEAD, new, CIRCULAR)], pagemap_fd=pagemap, fresh=True) == 0
    finally:
        os.close(pagemap)
    assert heap.flagged() == {2, 7, 12}
    assert heap.copy[7 * PAGE : 8 * PAGE] == old_page_7 != bytes(PAGE)
    assert heap.pages_read == 2  # 12 new, 2 again; never 7 (nor 18, past it)


def test_a_fresh_scout_cut_short_leaves_the_pages_it_did_not_reach_flagged(heap: Heap) -> None:
    _, new = _moved_ring(heap)
    pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
    try:
        status = heap.scout([(HEAD, new, CIRCULAR)], max_pages=2, pagemap_fd=pagemap, fresh=True)
    finally:
        os.close(pagemap)
    assert status == 1
    assert heap.flagged() == {2, 7, 12}  # 7 asked for in the round cut: flagged as before


def test_a_fresh_scout_reads_the_pagemap_or_is_refused(heap: Heap) -> None:
    first = _ring(heap, [(7 * PAGE, 64)])
    with pytest.raises(ValueError, match="pagemap"):
        heap.scout([(HEAD, first, CIRCULAR)], fresh=True)


def test_a_long_list_in_address_order_ends_the_scout_a_scattered_one_does_not(
    heap: Heap,
) -> None:
    """A list that walks page after page (address order) past ``ordered_max`` pages ends the
    scout (status 3: the relay reads such a list in blocks) having read no more than that and
    the round it was in; the same chunks linked in a scattered order are followed to their
    end; and with ``ordered_max`` 0 the list in order is followed to its end too."""
    in_order = [(index * PAGE + 64, 64) for index in range(24)]
    first = _ring(heap, in_order[::-1])  # (descending: chunks freed in address order)
    assert heap.scout([(HEAD, first, CIRCULAR)], ordered_max=8) == 3
    assert 8 <= heap.pages_read <= 10, heap.pages_read
    heap.filled[:] = bytes(len(heap.filled))
    first = _ring(heap, in_order)
    assert heap.scout([(HEAD, first, CIRCULAR)], ordered_max=8) == 3
    assert 8 <= heap.pages_read <= 10, heap.pages_read
    heap.filled[:] = bytes(len(heap.filled))
    assert heap.scout([(HEAD, first, CIRCULAR)], ordered_max=0) == 0
    assert heap.flagged() == set(range(24))
    heap.filled[:] = bytes(len(heap.filled))
    scattered = [in_order[(index * 7) % 24] for index in range(24)]  # (7 and 24: coprime)
    first = _ring(heap, scattered)
    assert heap.scout([(HEAD, first, CIRCULAR)], ordered_max=8) == 0
    assert heap.flagged() == set(range(24))
    heap.assert_copied()
