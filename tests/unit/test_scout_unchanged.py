"""_chunkwalk.unchanged (a scouted copy checked word by word against the target, instead of
copied again in the stop) on a free list built in this process's own memory, read back
through /proc/self/mem: equal where every word the walk reads is, whatever else differs;
not where one such word differs or lies on a page that is not in RAM (never read)."""

from __future__ import annotations

import ctypes
import mmap
import os
import struct

import pytest

from memforensics.model import glibc
from memforensics.sources import optional_native
from memforensics.sources.proc.procmem import ProcessMemoryReader

_native = optional_native("memforensics.sources.glibc._chunkwalk")
pytestmark = pytest.mark.skipif(_native is None, reason="the C module is not built")

PAGE = mmap.PAGESIZE
CHUNK = 0x90  # one small bin's size
CHUNKS = 40  # over two pages and more


class _Heap:
    """A circular list of CHUNKS free chunks (a live 32-byte chunk after each) in an
    anonymous mapping, behind a head in another; ``copy`` is a copy of it, as a scout's."""

    def __init__(self, chunks: int = CHUNKS, size: int = CHUNK, gap: int = 32) -> None:
        stride = size + gap
        pages = max(4, (0x20 + chunks * stride) // PAGE + 2)
        self.live = mmap.mmap(-1, pages * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.head_buffer = mmap.mmap(-1, PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.start = ctypes.addressof(ctypes.c_char.from_buffer(self.live))
        self.head = ctypes.addressof(ctypes.c_char.from_buffer(self.head_buffer)) + 0x100
        self.size = size
        self.chunks = [self.start + 0x20 + i * stride for i in range(chunks)]
        for i, at in enumerate(self.chunks):
            fd = self.chunks[i + 1] if i + 1 < chunks else self.head
            bk = self.chunks[i - 1] if i else self.head
            struct.pack_into("<QQQ", self.live, at - self.start + 8, size | 1, fd, bk)
            if gap:
                struct.pack_into("<Q", self.live, at - self.start + size + 8, gap | 1)
        for at in self.chunks:  # the feet: each next chunk's prev_size (glibc's set_foot)
            struct.pack_into("<Q", self.live, at - self.start + size, size)
        self.copy = bytearray(self.live[:])
        self.filled = bytearray(b"\x01" * pages)

    def unchanged(self, extra: list[tuple[int, int]] | None = None) -> tuple[bool, int]:
        assert _native is not None
        low, high = glibc.bin_size_range(glibc.bin_index(self.size))
        with ProcessMemoryReader(os.getpid()) as mem:
            same, read_bytes = _native.unchanged(
                [(self.copy, self.start, None)],
                [self.filled],
                [(0, self.head, self.chunks[0], self.chunks[-1], low, high, 24)],
                extra or [],
                PAGE,
                0,  # (no pinned reads: this process is not held)
                mem.mem_fd,
                mem.pagemap_fd,
                float("inf"),
            )
        return bool(same), int(read_bytes)

    def _args(self, extra: list[tuple[int, int]] | None) -> tuple[object, ...]:
        low, high = glibc.bin_size_range(glibc.bin_index(self.size))
        return (
            [(self.copy, self.start, None)],
            [self.filled],
            [(0, self.head, self.chunks[0], self.chunks[-1], low, high, 24)],
            extra or [],
            PAGE,
        )

    def plan(self, extra: list[tuple[int, int]] | None = None) -> bytes | None:
        """_chunkwalk.plan of the list over the copy, as prepare_stop makes it."""
        assert _native is not None
        made = _native.plan(*self._args(extra), float("inf"))
        return None if made is None else bytes(made)

    def holds(self, plan: bytes) -> tuple[bool, int]:
        """_chunkwalk.same of ``plan`` against this process's memory now."""
        assert _native is not None
        with ProcessMemoryReader(os.getpid()) as mem:
            same, read_bytes = _native.same(plan, 0, mem.mem_fd, mem.pagemap_fd)
        return bool(same), int(read_bytes)

    def close(self) -> None:
        self.live.close()
        self.head_buffer.close()


@pytest.fixture
def heap() -> _Heap:
    built = _Heap()
    yield built  # type: ignore[misc]
    built.close()


def test_a_copy_equal_at_every_word_the_walk_reads_is_unchanged_and_reads_those_words_alone(
    heap: _Heap,
) -> None:
    same, read_bytes = heap.unchanged()
    assert same
    # Per page, from the first word the walk reads there to the last: not the empty pages.
    assert 0 < read_bytes <= CHUNKS * (CHUNK + 32) < len(heap.live) - PAGE


def test_bytes_the_walk_does_not_read_may_differ(heap: _Heap) -> None:
    # A free chunk's body and the live chunk after it: a running program's own data.
    for at in heap.chunks[::3]:
        struct.pack_into("<QQ", heap.live, at - heap.start + 0x40, 0xDEAD, 0xBEEF)
        struct.pack_into("<Q", heap.live, at - heap.start + CHUNK + 16, 0xFEED)
    assert heap.unchanged()[0]


@pytest.mark.parametrize("word", [8, 16, 24, CHUNK])  # size, fd, bk, the foot
def test_one_word_the_walk_reads_changed_in_the_target_is_not_unchanged(
    heap: _Heap, word: int
) -> None:
    at = heap.chunks[CHUNKS // 2] - heap.start + word
    (value,) = struct.unpack_from("<Q", heap.live, at)
    struct.pack_into("<Q", heap.live, at, value ^ 0x10)
    assert not heap.unchanged()[0]


def test_a_list_that_does_not_read_back_consistently_from_the_copy_is_not_unchanged(
    heap: _Heap,
) -> None:
    at = heap.chunks[7] - heap.start + 24
    struct.pack_into("<Q", heap.copy, at, 0x1234560)  # a bk naming no chunk: in the copy alone
    assert heap.unchanged() == (False, 0)


def test_a_word_on_a_page_the_copy_does_not_hold_is_not_compared(heap: _Heap) -> None:
    extra_at = heap.start + 3 * PAGE + 0x40  # past the list
    struct.pack_into("<Q", heap.live, 3 * PAGE + 0x40, 7)
    assert not heap.unchanged([(extra_at, 8)])[0]  # held, and different
    heap.filled[3] = 0
    assert heap.unchanged([(extra_at, 8)])[0]  # not held: read from the target by its reader


def test_a_word_on_a_page_not_in_ram_is_never_read(heap: _Heap) -> None:
    extra_at = heap.start + 3 * PAGE + 0x40
    heap.live.madvise(mmap.MADV_DONTNEED, 3 * PAGE, PAGE)  # (zeros, and not in RAM)
    heap.copy[3 * PAGE : 4 * PAGE] = bytes(PAGE)  # the copy agrees on the bytes
    assert not heap.unchanged([(extra_at, 8)])[0]
    with ProcessMemoryReader(os.getpid()) as mem:
        entry = mem.pagemap(heap.start + 3 * PAGE, heap.start + 4 * PAGE)
    assert not entry.readable[0]  # the check did not fault it in


def test_a_check_past_its_bounds_is_not_unchanged_and_reads_nothing() -> None:
    # Two ranges a chunk (its header, its foot): at most 2**18 ranges (4 MiB of trace), and
    # 8 MiB of words read, whatever the lists; past either the pages are copied as before.
    # Chunks of 32 bytes side by side: 256 ranges a page, ~4 MiB read at the first bound.
    within, past_ranges = _Heap(120_000, 32, 0), _Heap(140_000, 32, 0)
    # Chunks of 0x90 with a live one between: a page read almost whole for 23 of them.
    past_bytes = _Heap(60_000)
    try:
        same, read_bytes = within.unchanged()
        assert same and read_bytes > 3 << 20
        assert past_ranges.unchanged() == (False, 0)
        assert past_bytes.unchanged() == (False, 0)
    finally:
        for heap in (within, past_ranges, past_bytes):
            heap.close()


def test_a_list_whose_chunks_lie_pages_apart_is_unchanged_and_reads_a_span_a_page() -> None:
    # Each page's span read on its own, pages apart in the target and side by side in what
    # is read: each word compared with its own page's copy.
    apart = _Heap(CHUNKS, CHUNK, 2 * PAGE)
    try:
        same, read_bytes = apart.unchanged()
        assert same
        assert read_bytes <= CHUNKS * (CHUNK + 16)  # from its header to its foot, a chunk
        at = apart.chunks[CHUNKS // 2] - apart.start + 16
        (value,) = struct.unpack_from("<Q", apart.live, at)
        struct.pack_into("<Q", apart.live, at, value ^ 0x10)
        assert not apart.unchanged()[0]
    finally:
        apart.close()


def test_a_plan_made_before_the_stop_holds_what_unchanged_holds(heap: _Heap) -> None:
    plan = heap.plan()
    assert plan is not None
    assert heap.holds(plan) == heap.unchanged()
    assert heap.holds(plan)[0]


@pytest.mark.parametrize("word", [8, 16, 24, CHUNK])  # size, fd, bk, the foot
def test_a_word_changed_in_the_target_after_the_plan_fails_it(heap: _Heap, word: int) -> None:
    plan = heap.plan()
    assert plan is not None
    at = heap.chunks[CHUNKS // 3] - heap.start + word
    (value,) = struct.unpack_from("<Q", heap.live, at)
    struct.pack_into("<Q", heap.live, at, value ^ 0x10)
    assert not heap.holds(plan)[0]


def test_no_plan_for_a_list_that_does_not_read_back_from_the_copy(heap: _Heap) -> None:
    struct.pack_into("<Q", heap.copy, heap.chunks[7] - heap.start + 24, 0x1234560)
    assert heap.plan() is None


def test_a_plan_not_made_by_plan_is_refused(heap: _Heap) -> None:
    assert _native is not None
    plan = heap.plan()
    assert plan is not None
    with ProcessMemoryReader(os.getpid()) as mem:
        for bad in (plan[:-1], plan[:8], b"", plan[:40] + bytes(len(plan) - 40)):
            with pytest.raises(ValueError, match="not a plan"):
                _native.same(bad, 0, mem.mem_fd, mem.pagemap_fd)
