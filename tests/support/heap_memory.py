"""A heap's bytes as the walks' MemoryReader sees a target's (for the unit tests of
sources.glibc.heap_window): laid out by the test, every page readable; which pages are in RAM
is the walk's PageMap's to say."""

from __future__ import annotations


class HeapMemory:
    """``heap``'s bytes at ``start``, in pages of ``page_bytes``."""

    def __init__(self, heap: bytearray, start: int, page_bytes: int = 4096) -> None:
        self.heap, self.start, self.page_bytes = heap, start, page_bytes

    def read_present(self, address: int, length: int, present: bytes | None = None) -> bytes:
        offset = address - self.start
        return bytes(self.heap[offset : offset + length])
