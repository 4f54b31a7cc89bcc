"""The proof's arithmetic (sources.glibc.list_proof): over free chunks and bin heads linked
both ways, the keyed sums of the pairs (c, c->fd) and (d->bk, d) agree in every stretch; one
link overwritten (an fd, a bk, a loop without its head, a pointer out of the heaps) makes
them differ, first in the stretch holding the chunk whose link reads wrong from the pair's
first address. Lists are built here by hand over two sub-heaps, as a permutation of the
chunks cut into cycles, each through one head: the oracle is that construction, not the
code under test.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from memforensics.sources.glibc.glibc_arenas import Heap
from memforensics.sources.glibc.list_proof import _Sums

HEAP_BYTES = 64 << 20
HEAPS = [
    Heap(0x7F00_0000_0000, 1, HEAP_BYTES, HEAP_BYTES),
    Heap(0x7F00_0800_0000, 1, 1 << 20, 1 << 20),
]
HEADS = [0x7FFF_0000_1000 + 16 * i for i in range(8)]  # libc's data: in no heap


def _lists(seed: int, chunks: int = 20_000) -> tuple[dict[int, int], dict[int, int], list[int]]:
    """fd and bk of every node (chunks and heads): the chunks, shuffled, cut into one list
    per head; the chunks' addresses, 16-aligned, spread over both heaps."""
    rng = random.Random(seed)
    addresses = sorted(
        {
            heap.start + 16 * rng.randrange(2, heap.size_bytes // 16 - 2)
            for heap in HEAPS
            for _ in range(chunks // 2)
        }
    )
    order = addresses[:]
    rng.shuffle(order)
    fd: dict[int, int] = {}
    cuts = sorted(rng.sample(range(1, len(order)), len(HEADS) - 1))
    for head, part in zip(HEADS, np.split(np.array(order, dtype=np.uint64), cuts), strict=True):
        ring = [head, *(int(a) for a in part)]
        for here, there in zip(ring, [*ring[1:], head], strict=True):
            fd[here] = there
    bk = {there: here for here, there in fd.items()}
    return fd, bk, addresses


def _sums(fd: dict[int, int], bk: dict[int, int]) -> _Sums:
    sums = _Sums(HEAPS)
    nodes = np.array(sorted(fd), dtype=np.uint64)
    forward = np.array([fd[int(n)] for n in nodes], dtype=np.uint64)
    back = np.array([bk[int(n)] for n in nodes], dtype=np.uint64)
    sums.add(nodes, forward, sums.left, nodes)
    sums.add(back, nodes, sums.right, back)
    return sums


@pytest.mark.parametrize("seed", range(5))
def test_lists_linked_both_ways_agree_in_every_stretch(seed: int) -> None:
    fd, bk, _ = _lists(seed)
    assert _sums(fd, bk).first_difference() is None


@pytest.mark.parametrize("seed", range(5))
def test_an_fd_that_loops_without_its_head_differs_at_that_chunk(seed: int) -> None:
    fd, bk, addresses = _lists(seed)
    chunk = random.Random(seed).choice(addresses)
    head = next(h for h in HEADS if h in fd)
    fd[chunk] = fd[head]  # the list's first chunk: following fd now loops without the head
    sums = _sums(fd, bk)
    stretch = sums.first_difference()
    assert stretch is not None
    low, high = sums.span(stretch)
    assert low <= chunk < high


@pytest.mark.parametrize("seed", range(5))
def test_a_bk_overwritten_differs_at_the_chunk_before_it(seed: int) -> None:
    fd, bk, addresses = _lists(seed)
    chunk = random.Random(seed).choice(addresses)
    before = bk[chunk]
    bk[chunk] = 0x5A5A5A5A5A50  # out of every heap
    sums = _sums(fd, bk)
    stretch = sums.first_difference()
    assert stretch is not None
    low, high = sums.span(stretch)
    # The pair (before, chunk) is missing on the bk side: its stretch is before's; and the
    # pair (0x5a…, chunk) lands in the stretch of addresses outside the heaps.
    assert low <= before < high or (before in HEADS and stretch == sums.outside)


def test_every_heap_byte_has_a_stretch_whose_span_holds_it() -> None:
    sums = _Sums(HEAPS)
    rng = random.Random(7)
    inside = [h.start + rng.randrange(h.size_bytes) for h in HEAPS for _ in range(1000)]
    where = sums.stretch(np.array(inside, dtype=np.uint64))
    for address, stretch in zip(inside, where.tolist(), strict=True):
        low, high = sums.span(stretch)
        assert low <= address < high
    outside = np.array([0, HEAPS[0].start - 1, HEAPS[1].start + (1 << 20), *HEADS], dtype=np.uint64)
    assert set(sums.stretch(outside).tolist()) == {sums.outside}


class _Words:
    """A memory stand-in for the chunks whose links lie past a window: their words by address."""

    page_bytes = 4096

    def __init__(self, words: dict[int, int]) -> None:
        self.words = words

    def read(self, address: int, length: int) -> bytes | None:
        return b"".join(self.words.get(address + i, 0).to_bytes(8, "little") for i in (0, 8))


def test_the_c_sums_of_a_window_equal_numpys(monkeypatch: pytest.MonkeyPatch) -> None:
    """One window of free and live chunks (the last free one's links past its end) summed by
    _heapwindow.link_sums and by the numpy fallback: the same sums, stretch by stretch."""
    from array import array

    from memforensics.sources.glibc import list_proof
    from memforensics.sources.glibc.heap_window import ChunkRef

    if list_proof._native is None:
        pytest.fail("the C module (_heapwindow) is not built: setup.py build_ext")
    rng = random.Random(3)
    base = HEAPS[0].start
    window = bytearray(1 << 16)
    addresses, states, past = array("Q"), bytearray(), {}
    for offset in range(32, len(window), 96):
        at = base + offset
        free = rng.random() < 0.6
        fd = rng.choice([base + 16 * rng.randrange(1 << 20), HEADS[0], 0x5A5A5A5A5A50])
        bk = rng.choice([base + 16 * rng.randrange(1 << 20), HEADS[1]])
        if offset + 32 <= len(window):
            window[offset + 16 : offset + 32] = fd.to_bytes(8, "little") + bk.to_bytes(8, "little")
        past[at + 16], past[at + 24] = fd, bk
        addresses.append(at)
        states.append(1 if free else 0)
    addresses.append(base + len(window) - 16)  # its fd and bk lie past the window
    states.append(1)
    past[base + len(window)], past[base + len(window) + 8] = HEADS[2], HEADS[3]
    sums = {}
    for native in (list_proof._native, None):
        monkeypatch.setattr(list_proof, "_native", native)
        each = _Sums(HEAPS)
        each.keys = np.array([0x1234, 0x5678], dtype=np.uint64)
        links = list_proof._FreeLinks(_Words(past), each)  # type: ignore[arg-type]
        links.visit(
            ChunkRef(0, 0, None), memoryview(window), base, addresses, [0] * len(addresses), states
        )
        sums[native is None] = (each.left.copy(), each.right.copy())
    assert sums[False][0].any() and sums[False][1].any()
    assert np.array_equal(sums[False][0], sums[True][0])
    assert np.array_equal(sums[False][1], sums[True][1])


def test_a_free_chunk_whose_links_lie_on_a_page_not_in_ram_leaves_its_arena_unproved() -> None:
    """A free chunk whose header ends a page in RAM and whose fd and bk begin the next page,
    swapped out: the copy holds zeros there, which must not be summed as its links (they
    would differ, and a healthy heap be named corrupt). The visitor keeps the chunk as unread
    instead, in C and numpy alike; with every page in RAM it sums it."""
    from array import array

    from memforensics.sources.glibc import list_proof
    from memforensics.sources.glibc.heap_window import ChunkRef
    from memforensics.sources.proc.procmem import PageMap

    base = HEAPS[0].start
    window = bytearray(3 * 4096)
    chunk = base + 4096 - 16  # its header ends page 0, its fd and bk begin page 1
    window[4096 : 4096 + 16] = (base + 64).to_bytes(8, "little") + (base + 96).to_bytes(8, "little")
    addresses, states = array("Q", [base + 32, chunk]), bytes([0, 1])
    for present in (b"\x01\x00\x01", b"\x01\x01\x01"):
        pages = PageMap.from_flags(base, base + len(window), 4096, present, bytes(3))
        links = list_proof._FreeLinks(None, _Sums(HEAPS))  # type: ignore[arg-type]
        ref = ChunkRef(0, 0, pages)
        links.visit(ref, memoryview(window), base, addresses, [0, 0], states)
        if present[1]:
            assert links.unread is None and links.sums.left.any()
        else:
            assert links.unread == chunk
            assert not links.sums.left.any() and not links.sums.right.any()
