"""Private copies of a target's heap mappings, and the loop that follows a free list in one.

A copy is filled page run by page run (glibc_walk decides when); copy buffers are pooled
from arena to arena. The list loop exists twice, in Python here and in C in
memforensics.sources._chunkwalk (optional, built where ``pip install`` finds a compiler):
both measure the same bytes.
"""

from __future__ import annotations

import contextlib
import importlib
import mmap
import os
from types import ModuleType

from memforensics.model import glibc
from memforensics.sources.procmem import PageMap

POOL_MAX_BYTES = 128 << 20  # copy buffers kept for the next arena

_native: ModuleType | None = None
# The optional C loop (setup.py builds it where a compiler exists); MEMFORENSICS_PURE_PYTHON=1
# keeps the Python loop even where it was built (to compare, or to rule it out).
if not os.environ.get("MEMFORENSICS_PURE_PYTHON"):
    with contextlib.suppress(ImportError):
        _native = importlib.import_module("memforensics.sources._chunkwalk")


def native_loop() -> ModuleType | None:
    """The C loop's module when it is built and in use, else None (the Python loop runs)."""
    return _native


def native_walk_available() -> bool:
    """True when the C loop is built and in use."""
    return _native is not None


def walk_resident_copy_py(
    buffer: memoryview, start: int, head: int, fd: int, bk: int, low: int, high: int, page: int
) -> tuple[int, ...] | None:
    """(chunks, bytes, resident bytes, trimmable bytes) of one free list followed through
    ``buffer``, a static copy of a wholly resident heap starting at ``start``; None when the
    list does not read back consistently. The hottest loop: nothing but the checks in it.
    Misaligned pointers need no test of their own (they read words whose ``bk`` does not
    name the previous chunk), and a static copy cannot cycle without returning to the head
    (a chunk seen twice would need two predecessors), so no visits are counted.
    memforensics.sources._chunkwalk.walk is the same loop in C, built where a compiler
    exists (and used, also for partly resident heaps, when it was)."""
    min_trim = page + glibc.MALLOC_CHUNK_BYTES
    align_in = glibc.MALLOC_CHUNK_BYTES + page - 1
    words = buffer if buffer.format == "Q" else buffer.cast("Q")
    last_slot = (len(words) * 8 - 32) >> 3
    end_slot = len(words)
    count = total = trimmable = 0
    previous = head
    chunk = fd
    while chunk != head:
        slot = (chunk - start) >> 3
        if not 0 <= slot <= last_slot or words[slot + 3] != previous:
            return None
        size = words[slot + 1] & ~7
        if not low <= size <= high or slot + (size >> 3) > end_slot:
            return None
        count += 1
        total += size
        if size >= min_trim:
            whole = ((chunk + size) // page - (chunk + align_in) // page) * page
            if whole > 0:
                trimmable += whole
        previous = chunk
        chunk = words[slot + 2]
    if bk != previous:
        return None
    return count, total, total, trimmable


class BufferPool:
    """Copy buffers reused from arena to arena: 1,500 arenas cost a few mappings, not 1,500
    fresh ones each faulted in page by page and unmapped again."""

    def __init__(self) -> None:
        self._free: list[mmap.mmap] = []

    def take(self, length: int) -> mmap.mmap:
        fitting = [b for b in self._free if len(b) >= length]
        if fitting:
            buffer = min(fitting, key=len)
            self._free.remove(buffer)
            return buffer
        # Anonymous and untouched until written: a copy costs only the pages it reads.
        return mmap.mmap(-1, max(glibc.page_ceil(length, mmap.PAGESIZE), mmap.PAGESIZE))

    def give(self, buffer: mmap.mmap) -> None:
        self._free.append(buffer)
        if sum(len(b) for b in self._free) > POOL_MAX_BYTES:
            smallest = min(self._free, key=len)
            self._free.remove(smallest)
            smallest.close()

    def close(self) -> None:
        for buffer in self._free:
            buffer.close()
        self._free.clear()


class Segment:
    """A lazily filled private copy of one heap mapping: blocks are read on first use."""

    __slots__ = ("buffer", "end", "filled", "length", "pages", "start", "view", "whole", "words")

    def __init__(self, start: int, end: int, pages: PageMap, pool: BufferPool) -> None:
        self.start = start
        self.end = end
        self.length = end - start
        self.pages = pages
        self.buffer = pool.take(self.length)
        self.view = memoryview(self.buffer)[: self.length]
        self.words = self.view[: self.length // 8 * 8].cast("Q")
        self.filled = bytearray(self.length // pages.page_bytes + 2)  # one flag per page
        self.whole = False  # copied whole at one go (not block by block)

    def close(self, pool: BufferPool) -> None:
        self.words.release()
        self.view.release()
        pool.give(self.buffer)
