"""A heap picture whose every figure is known: hand-built walks of two heaps (the main heap
with two pins, part of its free memory released; a thread arena's heap with one pin), read
through a stand-in memory reader that says which pages are resident."""

from __future__ import annotations

from array import array

from memforensics.entry.pins import picture_of
from memforensics.model.chunks import ChunkState, HeapChunks, ProcessChunks
from memforensics.model.pins import HeapPicture

MIB = 1 << 20
MAIN_START = 0x5555_0000_0000
THREAD_START = 0x7F00_0000_0020
RELEASED = (MAIN_START + 0x20000, MAIN_START + 100 * MIB)
REQUEST = b"GET /api/v1/orders?page=7 HTTP/1.1\r\n"


class _Pages:
    def __init__(self, present: bytes) -> None:
        self.present = present


class StandInMemory:
    """pagemap() and read() as procmem's readers answer them, from fixed figures."""

    def pagemap(self, start: int, end: int) -> _Pages:
        return _Pages(
            bytes(
                0 if RELEASED[0] <= address < RELEASED[1] else 1
                for address in range(start, end, 4096)
            )
        )

    def read(self, address: int, length: int) -> bytes | None:
        return REQUEST.ljust(length, b"x")[:length]


def _heap(layout: list[tuple[ChunkState, int]], arena: int, start: int) -> HeapChunks:
    addresses, sizes, states = array("Q"), array("Q"), bytearray()
    address = start
    for state, size in layout:
        addresses.append(address)
        sizes.append(size)
        states.append(int(state))
        address += size
    return HeapChunks(arena, 0, start, address, addresses, sizes, bytes(states), True)


def known_picture() -> HeapPicture:
    """Main heap: 195 MiB pinned by a 4 KiB chunk, 40 MiB by a 1 KiB one above it; arena 1's
    heap: 30 MiB pinned by a 64 KiB chunk."""
    main = _heap(
        [
            (ChunkState.BOOKKEEPING, 0x290),
            (ChunkState.LIVE, 0x10000 - 0x290),
            (ChunkState.FREE, 195 * MIB),
            (ChunkState.LIVE, 0x1010),
            (ChunkState.FREE, 40 * MIB),
            (ChunkState.LIVE, 0x400),
            (ChunkState.TOP, 20 * MIB),
        ],
        0,
        MAIN_START,
    )
    thread = _heap(
        [
            (ChunkState.BOOKKEEPING, 0x8B0),
            (ChunkState.FREE, 30 * MIB - 0x8B0),
            (ChunkState.LIVE, 0x10010),
            (ChunkState.TOP, 33 * MIB),
        ],
        1,
        THREAD_START,
    )
    return picture_of(ProcessChunks(1, 4096, (main, thread), ()), StandInMemory())  # type: ignore[arg-type]
