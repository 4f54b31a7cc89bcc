"""Private copies of a target's heap mappings, and the loop that follows a free list in them.

A copy is filled page run by page run (glibc_walk decides when); copy buffers are pooled
from arena to arena. The copy and the list loop exist twice, in Python here and in C in
memforensics.sources.glibc._chunkwalk (optional, built where ``pip install`` finds a compiler):
both copy the same bytes and measure the same figures. The C copy reads with
process_vm_readv (one call for many runs of pages, 1.4-1.8x the speed of /proc/PID/mem
measured on a 518 MiB heap) and falls back to preadv of /proc/PID/mem wherever that is
refused; the Python copy reads /proc/PID/mem.
"""

from __future__ import annotations

import bisect
import contextlib
import importlib
import math
import mmap
import os
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from memforensics.model import glibc
from memforensics.sources.proc.procmem import PageMap, ProcessMemoryReader

POOL_MAX_BYTES = 256 << 20  # copy buffers kept for the next arena
# An arena is copied whole when its resident bytes fit this budget (a few hundred MiB: ~0.1 s
# of copying), and at most half of MemAvailable, so a copy never pushes the machine into
# reclaim; a bigger arena is copied block by block where its lists lead.
COPY_MAX_BYTES = 512 << 20
_READ_MAX_PAGES = 1024  # the Python copy reads at most 4 MiB per preadv
MEMINFO = Path("/proc/meminfo")
_CLOCK_EVERY_CHUNKS = 0xFFFF  # a list walked in a copy looks at the clock this often (~10 ms)


class OutOfTime(Exception):
    """The walk's time budget ran out in the middle of a list (the C loop says so too)."""


_native: ModuleType | None = None
# The optional C code (setup.py builds it where a compiler exists); MEMFORENSICS_PURE_PYTHON=1
# keeps the Python code even where it was built (to compare, or to rule it out).
if not os.environ.get("MEMFORENSICS_PURE_PYTHON"):
    with contextlib.suppress(ImportError):
        _native = importlib.import_module("memforensics.sources.glibc._chunkwalk")
    if not all(hasattr(_native, name) for name in ("copy", "walk_segments")):
        _native = None  # a stale build of an older version: the Python code is right, if slower


def native_loop() -> ModuleType | None:
    """The C module when it is built and in use, else None (the Python code runs)."""
    return _native


def native_walk_available() -> bool:
    """True when the C copy and loop are built and in use."""
    return _native is not None


def copy_budget_bytes(meminfo: Path = MEMINFO) -> int:
    """Resident bytes of one arena that may be copied whole: COPY_MAX_BYTES, at most half
    of MemAvailable (unknown MemAvailable: the fixed budget)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return min(COPY_MAX_BYTES, int(line.split()[1]) * 1024 // 2)
    except (OSError, ValueError, IndexError):
        pass
    return COPY_MAX_BYTES


def walk_resident_copy_py(
    buffer: memoryview,
    start: int,
    head: int,
    fd: int,
    bk: int,
    low: int,
    high: int,
    page: int,
    deadline: float = math.inf,
) -> tuple[int, ...] | None:
    """(chunks, bytes, resident bytes, trimmable bytes) of one free list followed through
    ``buffer``, a static copy of a wholly resident heap starting at ``start``; None when the
    list does not read back consistently. The hottest loop: nothing but the checks in it.
    A static copy cannot cycle without returning to the head (a chunk seen twice would
    need two predecessors), so no visits are counted. memforensics.sources.glibc._chunkwalk.walk
    is the same loop in C, built where a compiler exists (and used, also for partly
    resident heaps and for several heaps, when it was)."""
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
        if not 0 <= slot <= last_slot or chunk & 15 or words[slot + 3] != previous:
            return None
        size = words[slot + 1] & ~7
        if not low <= size <= high or slot + (size >> 3) > end_slot:
            return None
        count += 1
        if not count & _CLOCK_EVERY_CHUNKS and time.monotonic() > deadline:
            raise OutOfTime
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

    def __init__(self, copy_max_bytes: int | None = None) -> None:
        self._free: list[mmap.mmap] = []
        # Resident bytes of one arena the walk may copy whole (copy_budget_bytes()).
        self.copy_max_bytes = copy_budget_bytes() if copy_max_bytes is None else copy_max_bytes

    def take(self, length: int) -> mmap.mmap:
        fitting = [b for b in self._free if len(b) >= length]
        if fitting:
            buffer = min(fitting, key=len)
            self._free.remove(buffer)
            return buffer
        # Anonymous and untouched until written: a copy costs only the pages it reads.
        # Private, not mmap's default MAP_SHARED: a hole dropped with MADV_DONTNEED must
        # read back as zeros (a shared page would keep the previous arena's bytes).
        return mmap.mmap(
            -1,
            max(glibc.page_ceil(length, mmap.PAGESIZE), mmap.PAGESIZE),
            flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
        )

    def give(self, buffer: mmap.mmap) -> None:
        self._free.append(buffer)
        while sum(len(b) for b in self._free) > POOL_MAX_BYTES:
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


def copy_into(mem: ProcessMemoryReader, segment: Segment, begin: int, end: int) -> bool:
    """Copy bytes [begin, end) of ``segment`` (offsets, ``begin`` page-aligned) out of the
    target: its readable pages (``PageMap.readable``: the present ones) are read, one read
    per run of them, the others read as zeros. A swapped-out page is never read (reading it
    would fault it back into the target): a chunk on it reads as zeros, so a list through
    it reads back inconsistent and its bin is left unmeasured. True when every readable
    byte was read (a page unmapped meanwhile reads as zeros). The C copy and this Python
    one fill the same bytes."""
    page = mem.page_bytes
    readable = memoryview(segment.pages.readable)[begin // page : (end + page - 1) // page]
    if _native is not None:
        complete, usable = _native.copy(
            mem.pid,
            mem.mem_fd,
            segment.view[begin:end],
            segment.start + begin,
            readable,
            page,
            mem.vm_readv_usable,
            True,
        )
        if not usable:
            mem.vm_readv_usable = False  # refused once (seccomp, no syscall): preadv from now
        return bool(complete)
    complete = True
    known = len(readable)
    index, pages = 0, (end - begin + page - 1) // page
    while index < pages:
        flag = index < known and bool(readable[index])
        run = index
        while run < pages and (run < known and bool(readable[run])) == flag:
            run += 1
        start, stop = begin + index * page, min(begin + run * page, end)
        if flag:
            complete &= _read_run(mem, segment.view, start, stop, segment.start)
        else:
            _zero_hole(segment, start, stop, page)
        index = run
    return complete


def _read_run(mem: ProcessMemoryReader, view: memoryview, start: int, stop: int, base: int) -> bool:
    """preadv of /proc/PID/mem into view[start:stop] until done; the unread rest is zeros."""
    done = start
    while done < stop:
        piece = min(stop, done + _READ_MAX_PAGES * mem.page_bytes)
        try:
            got = os.preadv(mem.mem_fd, [view[done:piece]], base + done)
        except OSError:
            got = 0
        if got <= 0:
            view[done:stop] = bytes(stop - done)
            return False
        done += got
    return True


def _zero_hole(segment: Segment, start: int, stop: int, page: int) -> None:
    """Zeros in [start, stop) of the copy: whole pages dropped (MADV_DONTNEED on the private
    buffer: they read as zeros and cost no memory), the rest written."""
    whole = (stop - start) // page * page
    if whole and start % page == 0:
        segment.buffer.madvise(mmap.MADV_DONTNEED, start, whole)
        start += whole
    if stop > start:
        segment.view[start:stop] = bytes(stop - start)


def _native_copies(segments: Sequence[Segment]) -> list[tuple[object, int, object]]:
    """(buffer, start, present pages or None when all are) of each copy, as the C loops take."""
    return [(s.view, s.start, None if s.pages.all_resident else s.pages.present) for s in segments]


def walk_copies(
    segments: Sequence[Segment],
    head: int,
    fd: int,
    bk: int,
    low: int,
    high: int,
    page: int,
    deadline: float = math.inf,
) -> tuple[int, ...] | None:
    """(chunks, bytes, resident bytes, trimmable bytes) of one free list followed through
    whole copies of an arena's heaps (``segments``, sorted by start), or None when it does
    not read back consistently: in C where built, else walk_copies_py. OutOfTime when
    time.monotonic() passes ``deadline`` first (a list of millions of chunks)."""
    if _native is not None:
        try:
            result = _native.walk_segments(
                _native_copies(segments), head, fd, bk, low, high, page, deadline
            )
        except ValueError:  # heaps the C loop refuses (overlapping: read while they moved)
            return walk_copies_py(segments, head, fd, bk, low, high, page, deadline)
        if result is False:
            raise OutOfTime
        return result  # type: ignore[no-any-return]
    return walk_copies_py(segments, head, fd, bk, low, high, page, deadline)


def walk_fastbin_copies(
    segments: Sequence[Segment], head: int, size_bytes: int, page: int, mangled: bool
) -> tuple[int, ...] | None:
    """(chunks, bytes, resident bytes, 0) of one fastbin followed through whole copies of an
    arena's heaps, or None when it does not read back consistently: in C where built, else
    walk_fastbin_copies_py. ``mangled``: fd pointers are safe-linked (glibc >= 2.32)."""
    if _native is not None:
        with contextlib.suppress(ValueError):  # heaps the C loop refuses: Python below
            return _native.walk_fastbin(  # type: ignore[no-any-return]
                _native_copies(segments), head, size_bytes, page, mangled
            )
    return walk_fastbin_copies_py(segments, head, size_bytes, page, mangled)


def walk_fastbin_copies_py(
    segments: Sequence[Segment], head: int, size_bytes: int, page: int, mangled: bool
) -> tuple[int, ...] | None:
    """The Python twin of _chunkwalk.walk_fastbin: every chunk 16-byte aligned, inside one
    of the copies and of the bin's size, every next pointer NULL or such a chunk."""
    del page  # the page map knows it
    starts = [s.start for s in segments]
    limit = sum(s.length for s in segments) // glibc.MINSIZE

    def segment_for(chunk: int) -> Segment | None:
        position = bisect.bisect_right(starts, chunk) - 1
        if position < 0:
            return None
        segment = segments[position]
        return segment if chunk - segment.start <= segment.length - 32 else None

    count = total = resident = 0
    chunk = head
    while chunk:
        segment = segment_for(chunk)
        if segment is None or chunk & 15:
            return None
        slot = (chunk - segment.start) >> 3
        if segment.words[slot + 1] & ~7 != size_bytes:
            return None
        count += 1
        if count > limit:
            return None
        total += size_bytes
        end = min(chunk + size_bytes, segment.start + segment.length)
        pages = segment.pages
        resident += end - chunk if pages.all_resident else pages.resident_bytes(chunk, end)
        stored = segment.words[slot + 2]
        chunk = ((chunk + 16) >> 12) ^ stored if mangled else stored
        if chunk and (chunk & 15 or segment_for(chunk) is None):
            return None
    return count, total, resident, 0


def walk_copies_py(
    segments: Sequence[Segment],
    head: int,
    fd: int,
    bk: int,
    low: int,
    high: int,
    page: int,
    deadline: float = math.inf,
) -> tuple[int, ...] | None:
    """The Python twin of _chunkwalk.walk_segments: the same checks (every chunk 16-byte
    aligned and inside one of the copies, its ``bk`` naming the chunk before, its size
    fitting the bin and its heap, the list returning to the head whose ``bk`` names the
    last chunk) and the same figures. A chunk whose pages are all resident (the prefix sums
    say so) counts whole; only others need page arithmetic."""
    if len(segments) == 1 and segments[0].pages.all_resident:
        only = segments[0]
        return walk_resident_copy_py(only.view, only.start, head, fd, bk, low, high, page, deadline)
    shift = page.bit_length() - 1
    min_trim = page + glibc.MALLOC_CHUNK_BYTES
    align_in = glibc.MALLOC_CHUNK_BYTES + page - 1
    starts = [s.start for s in segments]
    segment = segments[0]
    words, start, pages = segment.words, segment.start, segment.pages
    last_slot, end_slot, prefix = (segment.length - 32) >> 3, segment.length >> 3, pages.prefix
    count = total = resident = trimmable = 0
    previous = head
    chunk = fd
    while chunk != head:
        slot = (chunk - start) >> 3
        if not 0 <= slot <= last_slot:
            position = bisect.bisect_right(starts, chunk) - 1
            if position < 0:
                return None
            segment = segments[position]
            words, start, pages = segment.words, segment.start, segment.pages
            last_slot, end_slot = (segment.length - 32) >> 3, segment.length >> 3
            prefix = pages.prefix
            slot = (chunk - start) >> 3
            if not 0 <= slot <= last_slot:
                return None
        if chunk & 15 or words[slot + 3] != previous:
            return None
        size = words[slot + 1] & ~7
        if not low <= size <= high or slot + (size >> 3) > end_slot:
            return None
        count += 1
        if not count & _CLOCK_EVERY_CHUNKS and time.monotonic() > deadline:
            raise OutOfTime
        total += size
        first_page = (chunk - start) >> shift
        last_page = (chunk - start + size - 1) >> shift
        if prefix[last_page + 1] - prefix[first_page] == last_page - first_page + 1:
            resident += size
            if size >= min_trim:
                whole = ((chunk + size) // page - (chunk + align_in) // page) * page
                if whole > 0:
                    trimmable += whole
        else:
            resident += pages.resident_bytes(chunk, chunk + size)
            trimmable += pages.whole_pages_resident_bytes(*glibc.mtrim_span(chunk, size, page))
        previous = chunk
        chunk = words[slot + 2]
    if bk != previous:
        return None
    return count, total, resident, trimmable
