"""A sub-heap that sysmalloc left for a new one ends with its closing fenceposts, and the
census walk of it ends there, complete, with them counted as glibc's bookkeeping. sysmalloc
(glibc malloc/malloc.c) shrinks the old top by MINSIZE and writes, after it, a 16-byte chunk
(size 16, PREV_INUSE) and a last one (size 0, PREV_INUSE) that ends the heap; where the old
top kept 16 bytes it becomes a 32-byte chunk in use and only the last fencepost follows it
(a busy JVM's arenas end that way). The heaps are built by hand, as those words lie."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import pytest

from memforensics.model.chunks import ChunkState
from memforensics.sources.glibc import heap_window
from memforensics.sources.glibc.heap_lists import Tcache
from memforensics.sources.glibc.heap_window import ChunkRef, HeapWalk

START = 0x7F00_4000_0000
HEAP_BYTES = 64 << 10
CHUNK_BYTES = 1024


class _Memory:
    page_bytes = 4096

    def __init__(self, heap: bytearray) -> None:
        self.heap = heap

    def read_present(self, address: int, length: int, present: bytes | None = None) -> bytes:
        return bytes(self.heap[address - START : address - START + length])


def _left_heap(old_top_kept_bytes: int) -> tuple[bytearray, list[int]]:
    """In-use chunks, then the old top (``old_top_kept_bytes`` + 16, in use), then the
    fenceposts sysmalloc writes; (the heap, the addresses of the chunks that are not
    glibc's bookkeeping)."""
    heap = bytearray(HEAP_BYTES)
    at, chunks = 0, []
    closing = 32 + old_top_kept_bytes  # the old top, kept and made a chunk, and fenceposts
    while at + CHUNK_BYTES <= HEAP_BYTES - closing:
        struct.pack_into("<QQ", heap, at, 0, CHUNK_BYTES | 1)
        chunks.append(START + at)
        at += CHUNK_BYTES
    last = HEAP_BYTES - 16
    if old_top_kept_bytes:
        top_bytes = HEAP_BYTES - 16 - at  # the old top's 16 bytes became a 32-byte chunk
        struct.pack_into("<QQ", heap, at, 0, top_bytes | 1)
        chunks.append(START + at)
    else:
        struct.pack_into("<QQ", heap, last - 16, 0, 16 | 1)  # the 16-byte fencepost
        filler = last - 16 - at
        struct.pack_into("<QQ", heap, at, 0, filler | 1)  # the old top, freed: a chunk
        chunks.append(START + at)
    struct.pack_into("<QQ", heap, last, 16, 0 | 1)  # the last fencepost: size 0
    return heap, chunks


def _walk(heap: bytearray) -> tuple[HeapWalk, list[int], bytes]:
    addresses: list[int] = []
    states = bytearray()

    def visit(
        ref: ChunkRef,
        view: memoryview,
        base: int,
        found: Sequence[int],
        sizes: Sequence[int],
        kinds: bytes | bytearray,
    ) -> None:
        addresses.extend(found)
        states.extend(kinds)

    walk = HeapWalk(
        _Memory(heap),  # type: ignore[arg-type]
        ChunkRef(0, 0, None),
        START,
        START + len(heap),
        lambda: 0,  # the arena's top lies in another heap
        set(),
        Tcache(keys=set(), structs=set()),
        visit,
        keep=False,
    )
    while not walk.done:
        window = walk.read_window()
        if window is None:
            break
        walk.walk_window(*window)
    return walk, addresses, bytes(states)


@pytest.mark.parametrize("kept", [0, 16], ids=["two fenceposts", "old top kept 16 bytes"])
@pytest.mark.parametrize("native", [True, False], ids=["C", "Python"])
def test_a_left_sub_heap_ends_at_its_fenceposts(
    kept: int, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not native:
        monkeypatch.setattr(heap_window, "_native", None)
    heap, chunks = _left_heap(kept)
    walk, addresses, states = _walk(heap)
    assert walk.complete and walk.stop_reason is None, walk.stop_reason
    fenceposts = 2 if kept == 0 else 1
    assert addresses[: len(chunks)] == chunks
    assert len(addresses) == len(chunks) + fenceposts
    assert set(states[len(chunks) :]) == {ChunkState.BOOKKEEPING}
