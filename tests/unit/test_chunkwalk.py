"""The walk's list loop, C and Python, on hand-built heap copies: good lists measured the
same, every kind of inconsistency refused the same way."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest

from memforensics.sources import heapcopy

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
