"""A held walk's windows copied ahead (heap_window._Ahead: the next window copied by a thread
of ours while this one is walked) give the walk the very chunks a walk that copies each
window when it asks for it sees: same addresses, sizes and states, on a heap of small chunks
(the next window guessed right) with big ones across window edges here and there (guessed
wrong: copied when asked for). The oracle is the heap laid out here, chunk by chunk."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Sequence

import pytest

from memforensics.sources.glibc import heap_window
from memforensics.sources.glibc.heap_lists import Tcache
from memforensics.sources.glibc.heap_window import ChunkRef, HeapWalk, Visit, held_buffers
from memforensics.sources.proc.procmem import PageMap
from tests.support.heap_memory import HeapMemory

START = 0x5555_0000_0000
PAGE = 4096
PRESENT = 1 << 63
WINDOW_MAX_BYTES = 1 << 20


def _heap(seed: int) -> tuple[bytearray, list[tuple[int, int, int]]]:
    """~12 MiB of chunks (sizes 32 bytes to 64 KiB, a few of 1-3 MiB), about one in three
    free (the next chunk's PREV_INUSE clear, never two free in a row), then a top chunk; the
    chunks as (address, size, free)."""
    rng = random.Random(seed)
    sizes: list[int] = []
    total = 0
    while total < 12 << 20:
        size = 16 * rng.randrange(2, 4096) if rng.random() < 0.99 else (rng.randrange(1, 4) << 20)
        sizes.append(size)
        total += size
    top = 64 << 10
    heap = bytearray(total + top + PAGE)
    chunks, at, free_before = [], 0, False
    for size in sizes:
        free = not free_before and rng.random() < 0.33
        struct.pack_into("<QQ", heap, at, 0, size | (0 if free_before else 1))
        chunks.append((START + at, size, int(free)))
        free_before, at = free, at + size
    struct.pack_into("<QQ", heap, at, 0, top | (0 if free_before else 1))
    chunks.append((START + at, top, 0))  # (the top: visited as in use)
    return heap, chunks


def _held_walk(
    heap: bytearray, top: Callable[[], int | None], visit: Visit | None, ahead: bool
) -> HeapWalk:
    """A held walk of ``heap`` (every page in RAM) in windows of at most WINDOW_MAX_BYTES,
    its windows copied ahead where ``ahead``."""
    pages = len(heap) // PAGE
    pagemap = PageMap(START, START + pages * PAGE, PAGE, struct.pack("<Q", PRESENT) * pages)
    buffers = held_buffers(WINDOW_MAX_BYTES)
    return HeapWalk(
        HeapMemory(heap, START),  # type: ignore[arg-type]
        ChunkRef(0, 0, pagemap),
        START,
        START + len(heap) - PAGE,
        top,
        set(),
        Tcache(keys=set(), structs=set()),
        visit,
        keep=False,
        buffer=buffers.now,
        window_max_bytes=buffers.window_max_bytes,
        held=True,
        ahead=buffers.ahead if ahead else None,
    )


def _walked(heap: bytearray, ahead: bool) -> tuple[list[tuple[int, int, int]], int]:
    """The chunks a held walk of ``heap`` visited (address, size, free), and how many windows
    it took from a copy made ahead."""
    seen: list[tuple[int, int, int]] = []

    def visit(
        ref: ChunkRef,
        view: memoryview,
        base: int,
        addresses: Sequence[int],
        sizes: Sequence[int],
        states: bytes | bytearray,
    ) -> None:
        seen.extend(zip(addresses, sizes, (int(s == 1) for s in states), strict=True))

    top_at = START + len(heap) - PAGE - (64 << 10)
    walk = _held_walk(heap, lambda: top_at, visit, ahead)
    hits = 0
    take = heap_window._Ahead.take

    def counted(self: heap_window._Ahead, base: int) -> tuple[memoryview, int] | None:
        nonlocal hits
        got = take(self, base)
        hits += got is not None
        return got

    heap_window._Ahead.take = counted  # type: ignore[method-assign]
    try:
        while not walk.done:
            window = walk.read_window()
            if window is None:
                break
            walk.walk_window(*window)
    finally:
        walk.close()
        heap_window._Ahead.take = take  # type: ignore[method-assign]
    assert walk.complete, walk.stop_reason
    return seen, hits


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_windows_copied_ahead_are_walked_as_windows_copied_when_asked_for(seed: int) -> None:
    if heap_window._native is None or heap_window.native_loop() is None:
        pytest.fail("the C loops (_heapwindow, _chunkwalk) are not built: setup.py build_ext")
    heap, chunks = _heap(seed)
    plain, none = _walked(heap, ahead=False)
    ahead, hits = _walked(heap, ahead=True)
    assert none == 0
    assert plain == chunks
    assert ahead == plain
    assert hits >= 4  # most windows were copied ahead (12 MiB in windows of 1 MiB)


def test_a_walk_closed_early_waits_for_the_window_in_flight() -> None:
    heap, _ = _heap(4)
    walk = _held_walk(heap, lambda: None, None, ahead=True)
    assert walk._ahead is not None
    thread = walk._ahead._thread
    assert walk.read_window() is not None  # (the next window now being copied)
    walk.close()
    walk.close()  # (idempotent)
    assert not thread.is_alive()
