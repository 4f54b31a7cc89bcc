"""A live walk whose window fails a header walks again from the window before (the heap
changed between two stops): every chunk must still be visited exactly once, in the C loop and
in the Python one, including the chunk the window before left pending across its edge.

The heap is built by hand in a bytearray (chunks of 1,008 bytes, all in use, the last one
the top); the memory
stand-in serves it, with one header of the second window broken in that window's first read
only, as a chunk being split in the target would look between two stops.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import pytest

from memforensics.sources.glibc import heap_window
from memforensics.sources.glibc.heap_lists import Tcache
from memforensics.sources.glibc.heap_window import ChunkRef, HeapWalk

START = 0x5555_0000_0000
CHUNK_BYTES = 1008
CHUNKS = 3000  # about 2.9 MiB: three windows of 1 MiB


def _heap() -> bytearray:
    heap = bytearray(CHUNKS * CHUNK_BYTES)
    for i in range(CHUNKS):
        struct.pack_into("<QQ", heap, i * CHUNK_BYTES, 0, CHUNK_BYTES | 1)
    return heap


class _ChangingMemory:
    """The heap's bytes, one header of the second window broken in the first read of it."""

    page_bytes = 4096

    def __init__(self, heap: bytearray, broken_at: int) -> None:
        self.heap = heap
        self.broken_at = broken_at
        self.broke = False

    def read_present(self, address: int, length: int, present: bytes | None = None) -> bytes:
        data = bytearray(self.heap[address - START : address - START + length])
        if not self.broke and address <= self.broken_at < address + length - 16:
            self.broke = True
            struct.pack_into("<Q", data, self.broken_at - address + 8, 0x7)  # size 0: fails
        return bytes(data)


def _walk(heap: bytearray, broken_at: int) -> list[int]:
    visited: list[int] = []

    def visit(
        ref: ChunkRef,
        view: memoryview,
        base: int,
        addresses: Sequence[int],
        sizes: Sequence[int],
        states: bytes | bytearray,
    ) -> None:
        visited.extend(addresses)

    mem = _ChangingMemory(heap, broken_at)
    walk = HeapWalk(
        mem,  # type: ignore[arg-type]
        ChunkRef(0, 0, None),
        START,
        START + len(heap),
        lambda: START + len(heap) - CHUNK_BYTES,  # the last chunk is the arena's top
        set(),
        Tcache(keys=set(), structs=set()),
        visit,
        keep=True,
        retry=True,
    )
    while not walk.done:
        window = walk.read_window()
        if window is None:
            break
        walk.walk_window(*window)
    assert mem.broke and walk.resyncs == 1
    result = walk.result(START + len(heap))
    assert list(result.addresses) == sorted(set(visited))
    return visited


@pytest.mark.parametrize("native", [True, False])
def test_every_chunk_visited_once_after_a_walk_goes_back(
    native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(heap_window, "WINDOW_SECONDS", 0.0)  # one piece per window
    if not native:
        monkeypatch.setattr(heap_window, "_native", None)
    heap = _heap()
    # A header well inside the second window (it begins near START + 1 MiB).
    broken_at = START + ((3 << 19) // CHUNK_BYTES) * CHUNK_BYTES
    visited = _walk(heap, broken_at)
    expected = [START + i * CHUNK_BYTES for i in range(CHUNKS)]
    assert sorted(visited) == expected
    assert len(visited) == len(expected)  # none twice
