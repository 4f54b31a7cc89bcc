"""Private copies of a target's heap mappings, and the two loops that follow glibc's free
lists through them.

A copy is filled whole or block by block (glibc_walk decides which and when); copy buffers
are pooled from arena to arena. follow_list (a circular free list) and follow_fastbin (a
NULL-terminated fastbin) are the Python loops over chunks, for whole copies and for copies
filled block by block alike (through their ``fill``). memforensics.sources.glibc._chunkwalk
(optional, built where ``pip install`` finds a compiler) holds their C twins and the copy's:
the same checks in the same order, the same bytes and figures; walk_copies,
walk_fastbin_copies and copy_into use C where it is built. Both copies read /proc/PID/mem.
The C copy of a target held still may read the pages it alone maps with process_vm_readv,
many scattered pages a call; never another page: that call pins what it reads, and the
kernel (5.19 and later) gives the target a private copy of each page it shares copy-on-write
with another process before a read-only pin of it, so a read of a forked server's heap would
grow the target's memory by the pages read (_procmem_read.h).
"""

from __future__ import annotations

import bisect
import contextlib
import math
import mmap
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from memforensics.model import glibc
from memforensics.sources import optional_native
from memforensics.sources.proc.own_cgroup import memory_headroom_bytes
from memforensics.sources.proc.procmem import MemoryReader, PageMap, ProcessMemoryReader

POOL_MAX_BYTES = 192 << 20  # copy buffers kept for the next arena
# An arena is copied whole when its resident bytes fit this budget (~40 ms of copying; with
# the copies waiting for their walks, heapmaps' _PENDING_MAX_BYTES, our memory stays under
# 256 MiB), and at most half of MemAvailable, so a copy never pushes the machine into
# reclaim; a bigger arena is copied block by block where its lists lead, as much at most.
COPY_MAX_BYTES = 192 << 20
# Under a memory limit, the budget is this fraction of what the limit leaves us: the copies
# kept for their walks, a scout's pages beyond the budget and our own objects come on top.
_HEADROOM_SHARES = 2
_READ_MAX_PAGES = 1024  # the Python copy reads at most 4 MiB per preadv
_CORE_SLICE_BYTES = 8 << 20  # a core file's copy is made this many bytes at a time
_MADV_POPULATE_WRITE = 23  # linux/mman.h (5.14+): fault pages in, writable, without writing
# linux/mman.h (x86-64, arm64): room reserved, not charged to the commit (Python 3.11's mmap
# module does not name it).
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
_MADV_NOHUGEPAGE = getattr(mmap, "MADV_NOHUGEPAGE", 15)  # linux/mman.h
MEMINFO = Path("/proc/meminfo")
# A list loop looks at the clock when its chunk count is a multiple of CLOCK_EVERY_CHUNKS + 1
# (65,536 chunks: ~10 ms in C, ~40 ms in Python): the one constant of both loops, the same
# as _chunkwalk.c's CLOCK_EVERY_CHUNKS (tests check that they agree).
CLOCK_EVERY_CHUNKS = 0xFFFF
TALLY_FIELDS = 7  # the length of a Tally: _chunkwalk.c's TALLY_FIELDS


class OutOfTime(Exception):
    """The walk's time budget ran out in the middle of a list (the C loop says so too)."""


class OutOfPages(OutOfTime):
    """A scout's lists lead to more pages than it may copy (its page budget, not its time).
    ``inconsistent_lists``: of the bins' lists followed, those failing glibc's bk check as
    far as followed (-1: not known)."""

    def __init__(self, inconsistent_lists: int = -1) -> None:
        super().__init__(inconsistent_lists)
        self.inconsistent_lists = inconsistent_lists


_native = optional_native("memforensics.sources.glibc._chunkwalk")
if (
    getattr(_native, "CLOCK_EVERY_CHUNKS", None) != CLOCK_EVERY_CHUNKS
    or getattr(_native, "TALLY_FIELDS", None) != TALLY_FIELDS
    or not hasattr(_native, "rings")
):
    _native = None  # a stale build of an older version: the Python code is right, if slower


def native_loop() -> ModuleType | None:
    """The C module when it is built and in use, else None (the Python code runs)."""
    return _native


def native_walk_available() -> bool:
    """True when the C copy and loop are built and in use."""
    return _native is not None


def copy_budget_bytes(meminfo: Path = MEMINFO, headroom_bytes: int | None = None) -> int:
    """Resident bytes of one arena that may be copied whole: COPY_MAX_BYTES, at most half
    of MemAvailable (unknown MemAvailable: the fixed budget) and at most half of
    ``headroom_bytes``, what our memory cgroup's limit leaves us (own_cgroup; None: no
    limit), so that a container's memory limit does not have the kernel OOM-kill us."""
    budget = COPY_MAX_BYTES
    if headroom_bytes is not None:
        budget = min(budget, headroom_bytes // _HEADROOM_SHARES)
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return min(budget, int(line.split()[1]) * 1024 // 2)
    except (OSError, ValueError, IndexError):
        pass
    return budget


class _Unmapper:
    """Buffers unmapped by a thread beside the read: the munmap of a copy tears down its page
    tables and frees its pages (milliseconds for tens of MiB, with the GIL released), work
    the read need not wait for. At most one batch is being unmapped at a time: handing over
    the next waits for the one before, so our memory holds at most one batch beyond what
    the read keeps. Each batch's thread is a plain (not daemon) thread: an exit waits the
    milliseconds it takes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def unmap(self, buffers: Sequence[mmap.mmap], *, wait: bool = True) -> None:
        """Hand ``buffers`` over as one batch. Without ``wait``, where a batch is still under
        way they are unmapped in the caller instead (a pool's eviction, which may come in a
        stop: it then costs that stop its own munmap, never the rest of another batch's)."""
        if not buffers:
            return
        with self._lock:
            if self._thread is not None and self._thread.is_alive() and not wait:
                _close_all(list(buffers))
                return
            if self._thread is not None:
                self._thread.join()
            self._thread = threading.Thread(
                target=_close_all, args=(list(buffers),), name="unmap-copies"
            )
            self._thread.start()

    def wait(self) -> None:
        """Return once every buffer handed over is unmapped."""
        with self._lock:
            if self._thread is not None:
                self._thread.join()
                self._thread = None


def _close_all(buffers: list[mmap.mmap]) -> None:
    for buffer in buffers:
        # (BufferError: a view of it is still held, a caller's bug; the mapping then goes
        # when the last view does, as it would have without the close.)
        with contextlib.suppress(BufferError):
            buffer.close()


UNMAPPER = _Unmapper()


def copy_buffer(length: int, flags: int = 0) -> mmap.mmap:
    """A private anonymous buffer of at least ``length`` bytes (whole pages, one at least) for
    a copy, untouched until written and never backed by transparent huge pages: a copy is
    written a few pages in each 2 MiB of a heap (a scouted copy, a block-by-block one), and
    under THP ``always`` (RHEL's default) each first write would fault in 2 MiB, a GiB arena's
    few thousand scouted pages its whole GiB. Only the pages written cost memory, whatever
    the system's setting. ``flags``: more mmap flags (MAP_NORESERVE)."""
    buffer = mmap.mmap(
        -1,
        max(glibc.page_ceil(length, mmap.PAGESIZE), mmap.PAGESIZE),
        flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | flags,
    )
    with contextlib.suppress(OSError):  # (a kernel built without THP has none to refuse)
        buffer.madvise(_MADV_NOHUGEPAGE)
    return buffer


class BufferPool:
    """Copy buffers reused from arena to arena: 1,500 arenas cost a few mappings, not 1,500
    fresh ones each faulted in page by page and unmapped again."""

    def __init__(self, copy_max_bytes: int | None = None) -> None:
        self._free: list[mmap.mmap] = []
        # Resident bytes of one arena the walk may copy whole (copy_budget_bytes()).
        if copy_max_bytes is None:
            copy_max_bytes = copy_budget_bytes(headroom_bytes=memory_headroom_bytes())
        self.copy_max_bytes = copy_max_bytes

    @property
    def kept_bytes(self) -> int:
        """Bytes of the buffers kept for the next arenas (faulted in: our memory)."""
        return sum(len(buffer) for buffer in self._free)

    def take(self, length: int) -> mmap.mmap:
        fitting = [b for b in self._free if len(b) >= length]
        if fitting:
            buffer = min(fitting, key=len)
            self._free.remove(buffer)
            return buffer
        # Anonymous and untouched until written: a copy costs only the pages it reads.
        # Private, not mmap's default MAP_SHARED: a hole dropped with MADV_DONTNEED must
        # read back as zeros (a shared page would keep the previous arena's bytes).
        return copy_buffer(length)

    def prepare(self, lengths: Sequence[int]) -> None:
        """Buffers for copies of ``lengths`` bytes, their pages faulted in now: a copy made
        while the target is held still must not spend that time faulting in its buffer (a
        fresh 24 MiB buffer costs ~20 ms of page faults)."""
        taken = [self.take(length) for length in lengths]
        for buffer in taken:
            try:
                buffer.madvise(_MADV_POPULATE_WRITE)
            except OSError:  # before Linux 5.14: touch every page
                for offset in range(0, len(buffer), mmap.PAGESIZE):
                    buffer[offset] = 0
        for buffer in taken:
            self.give(buffer)

    def give_all(self, buffers: Sequence[mmap.mmap]) -> None:
        """give() each of ``buffers``."""
        for buffer in buffers:
            self.give(buffer)

    def give(self, buffer: mmap.mmap) -> None:
        self._free.append(buffer)
        evicted = []
        while sum(len(b) for b in self._free) > min(POOL_MAX_BYTES, self.copy_max_bytes):
            smallest = min(self._free, key=len)
            self._free.remove(smallest)
            evicted.append(smallest)
        UNMAPPER.unmap(evicted, wait=False)

    def shrink(self, max_kept_bytes: int) -> None:
        """Unmap kept buffers, the biggest first, until at most ``max_kept_bytes`` are kept."""
        self._free.sort(key=len)
        while self._free and self.kept_bytes > max_kept_bytes:
            self._free.pop().close()

    def close(self) -> None:
        """Give every kept buffer up, unmapped beside the caller (UNMAPPER)."""
        UNMAPPER.unmap(self._free)
        self._free = []


class FreshBuffers(BufferPool):
    """A buffer per copy, fresh (zeros until written) and unmapped when given back: for a
    copy made page by page whose unread pages must read as zeros (a scouted copy,
    glibc_walk.ArenaWalker.scout), where a pooled buffer would hold another arena's bytes.
    Only the pages written cost memory."""

    def __init__(self, copy_max_bytes: int | None = None) -> None:
        # (Nothing is pooled; the budget still says which arenas may be copied whole. A
        # read passes its own: one budget for all its arenas, and none worked out again,
        # reading /proc and cgroup files, when a relay makes one in a stop.)
        super().__init__(copy_max_bytes)

    def take(self, length: int) -> mmap.mmap:
        # (Untouched room costs nothing: a heap copied here may grow into it, Segment.grow.)
        return copy_buffer(length, _MAP_NORESERVE)

    def give(self, buffer: mmap.mmap) -> None:
        UNMAPPER.unmap([buffer])

    def give_all(self, buffers: Sequence[mmap.mmap]) -> None:
        UNMAPPER.unmap(buffers)  # (one batch: the next waits for it as a whole)


def both(first: bytes | bytearray, second: bytes | bytearray) -> bytes:
    """One byte per page set where both per-page flag strings are (as long as the shorter):
    each byte the bitwise AND of theirs (_chunkwalk.both where built, else both_python)."""
    if _native is not None:
        return _native.both(first, second)  # type: ignore[no-any-return]
    return both_python(first, second)


def both_python(first: bytes | bytearray, second: bytes | bytearray) -> bytes:
    """both() in Python."""
    length = min(len(first), len(second))
    joined = int.from_bytes(first[:length], "little") & int.from_bytes(second[:length], "little")
    return joined.to_bytes(length, "little")


class Segment:
    """A lazily filled private copy of one heap mapping: blocks are read on first use."""

    __slots__ = ("buffer", "end", "filled", "length", "pages", "start", "view", "whole", "words")

    def __init__(
        self, start: int, end: int, pages: PageMap, pool: BufferPool, room_bytes: int = 0
    ) -> None:
        self.start = start
        self.end = end
        self.length = end - start
        self.pages = pages
        # ``room_bytes``: the heap may grow to that many bytes and keep its copy (resize).
        self.buffer = pool.take(max(self.length, room_bytes))
        self.view = memoryview(self.buffer)[: self.length]
        self.words = self.view[: self.length // 8 * 8].cast("Q")
        self.filled = bytearray(self.length // pages.page_bytes + 2)  # one flag per page
        self.whole = False  # copied whole at one go (not block by block)

    def can_resize_to(self, end: int) -> bool:
        """The heap may end at ``end`` and keep this copy: within the buffer."""
        return self.start < end <= self.start + len(self.buffer)

    def resize(self, end: int, pages: PageMap) -> None:
        """The copy of the heap now ending at ``end`` (can_resize_to), with its residency
        ``pages``: the pages it grew by are not copied (zeros, flagged unread); those it
        shrank by (glibc gave them back past its top chunk, where no free chunk lies) are
        flagged unread, so that no copy reads them, and zeroed: a heap that grows back
        while this copy lives (between two parts of one arena's read) has its new pages
        read as zeros, never the bytes copied there before it shrank."""
        self.words.release()
        self.view.release()
        if end - self.start < self.length:
            self._forget(end - self.start, self.length)
        self.end, self.length, self.pages = end, end - self.start, pages
        self.view = memoryview(self.buffer)[: self.length]
        self.words = self.view[: self.length // 8 * 8].cast("Q")
        kept = -(-self.length // pages.page_bytes)  # the page the heap now ends in is kept
        self.filled[kept:] = bytes(max(0, len(self.filled) - kept))
        wanted = self.length // pages.page_bytes + 2
        self.filled.extend(bytes(max(0, wanted - len(self.filled))))

    def _forget(self, start: int, stop: int) -> None:
        """Bytes [start, stop) of the buffer read as zeros again: the part page cleared, the
        whole pages dropped (a private anonymous mapping's dropped page reads as zeros, and
        no longer costs our memory)."""
        page = mmap.PAGESIZE
        first_whole = min(glibc.page_ceil(start, page), stop)
        self.buffer[start:first_whole] = bytes(first_whole - start)
        if stop > first_whole:
            length = min(glibc.page_ceil(stop, page), len(self.buffer)) - first_whole
            self.buffer.madvise(mmap.MADV_DONTNEED, first_whole, length)

    def release(self) -> None:
        """The copy's views let go: its buffer may be given back (BufferPool.give_all)."""
        self.words.release()
        self.view.release()

    def close(self, pool: BufferPool) -> None:
        self.release()
        pool.give(self.buffer)


def copy_into(
    mem: MemoryReader,
    segment: Segment,
    begin: int,
    end: int,
    *,
    threads: int = 1,
    only: bytes | bytearray | None = None,
    recheck: bool = False,
    held: bool = False,
) -> bool:
    """Copy bytes [begin, end) of ``segment`` (offsets, ``begin`` page-aligned) out of the
    target: its readable pages (``PageMap.readable``: the present ones) are read, one read
    per run of them, the others read as zeros. A swapped-out page is never read (reading it
    would fault it back into the target): a chunk on it reads as zeros, so a list through
    it reads back inconsistent and its bin is left unmeasured. True when every readable
    byte was read (a page unmapped meanwhile reads as zeros). The C copy and this Python
    one fill the same bytes. ``threads`` (2): the C copy may read a big range's second half
    in a second thread, for a caller whose target is held still (its CPUs idle). ``only``:
    one byte per page of the segment, the pages to read (a subset of the readable ones);
    the others are left as they are, not zeroed (a copy made again of the pages a scout
    read, into a buffer that holds zeros elsewhere). ``recheck`` (with ``only``, a
    bytearray): those flags come from an earlier pagemap; a page is read only if the
    pagemap says it is in RAM now, and its flag is cleared where it is not. ``held``: every
    thread of the target is held still: the C copy reads the pages its pagemap, read as it
    copies, says the target alone maps with process_vm_readv (the same bytes, sooner)."""
    page = mem.page_bytes
    if not isinstance(mem, ProcessMemoryReader):  # a core file's: it does not move
        # (A slice at a time: no second copy of a whole heap held at once.)
        for at in range(begin, end, _CORE_SLICE_BYTES):
            stop = min(at + _CORE_SLICE_BYTES, end)
            segment.view[at:stop] = mem.read_present(segment.start + at, stop - at)
        return True
    if recheck and isinstance(only, bytearray) and _native is None:
        # (The pages of [begin, end) alone: a caller filling a block of a big heap must not
        # read the whole heap's pagemap.)
        first, last = begin // page, min((end + page - 1) // page, len(only))
        now = mem.pagemap(segment.start + first * page, segment.start + last * page).readable
        only[first:last] = both(only[first:last], now).ljust(last - first, b"\x00")
    mask = segment.pages.readable if only is None else only
    readable = memoryview(mask)[begin // page : (end + page - 1) // page]
    if _native is not None:
        rechecked = recheck and isinstance(only, bytearray)
        return bool(
            _native.copy(
                mem.mem_fd,
                segment.view[begin:end],
                segment.start + begin,
                readable,
                page,
                True,
                threads,
                only is None,
                mem.pagemap_fd if rechecked or held else -1,
                rechecked,
                mem.pid if held else 0,
            )
        )
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
        elif only is None:
            _zero_hole(segment, start, stop, page)
        index = run
    return complete


def copy_again(
    mem: MemoryReader,
    items: Sequence[tuple[Segment, bytearray]],
    *,
    recheck: bool,
    held: bool,
) -> bool:
    """copy_into(mem, segment, 0, segment.length, threads=2, only=only, recheck=recheck,
    held=held) for each (segment, only) of ``items``: the same bytes and flags, the pages
    of all of them split between two threads as one copy (_chunkwalk's copy_each) where C
    is built and ``mem`` is a live process's. True when every byte read was read whole."""
    if _native is None or not isinstance(mem, ProcessMemoryReader) or len(items) < 2:
        complete = True
        for segment, only in items:
            complete &= copy_into(
                mem,
                segment,
                0,
                segment.length,
                threads=2,
                only=only,
                recheck=recheck,
                held=held,
            )
        return complete
    page = mem.page_bytes
    return bool(
        _native.copy_each(
            mem.mem_fd,
            [
                (segment.view, segment.start, memoryview(only)[: -(-segment.length // page)])
                for segment, only in items
            ],
            page,
            2,
            mem.pagemap_fd if recheck or held else -1,
            recheck,
            mem.pid if held else 0,
        )
    )


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


def resident_runs(
    pages: PageMap, start: int, end: int, max_runs: int
) -> tuple[tuple[int, int], ...] | None:
    """The resident pages wholly inside [start, end) as sorted [start, end) address runs;
    None when there are more than ``max_runs`` of them."""
    size = pages.page_bytes
    first = max((max(start, pages.start) - pages.start + size - 1) // size, 0)
    last = (min(end, pages.end) - pages.start) // size
    present = pages.present
    runs: list[tuple[int, int]] = []
    index = first
    while index < last:
        begin = present.find(1, index, last)
        if begin < 0:
            break
        stop = present.find(0, begin, last)
        stop = last if stop < 0 else stop
        runs.append((pages.start + begin * size, pages.start + stop * size))
        if len(runs) > max_runs:
            return None
        index = stop
    return tuple(runs)


# What a list loop measured: (chunks, chunk bytes, bytes on resident pages, bytes mtrim
# would release from resident pages; fastbins release nothing to mtrim: 0, then the smallest
# and largest size word with its flag bits and their sum: glibc's chunksize_nomask, which
# malloc_info prints for each bin; all 0 for an empty list).
Tally = tuple[int, int, int, int, int, int, int]
EMPTY_TALLY: Tally = (0, 0, 0, 0, 0, 0, 0)
# Copies a block of a not yet copied segment before the loop reads it: (segment, index of
# its first page). The lazy walk of a big arena passes one (glibc_walk.ArenaWalker._fill).
Fill = Callable[[Segment, int], None]


def chunk_limit(segments: Sequence[Segment]) -> int:
    """The most chunks a list through ``segments`` can hold (MINSIZE bytes each): a list
    followed further is a cycle. The C loops count the same."""
    return sum(segment.length // glibc.MINSIZE for segment in segments)


def _native_copies(segments: Sequence[Segment]) -> list[tuple[object, int, object]]:
    """(buffer, start, present pages or None when all are) of each copy, as the C loops take."""
    return [(s.view, s.start, None if s.pages.all_resident else s.pages.present) for s in segments]


class CopiesForC:
    """``segments`` as the C loops take them, made once for many lists (a stop's walk follows
    some hundred through the same copies): valid while those segments' buffers and pages
    stay as they are; ``of(segments)`` is None for any other list of segments, or where C
    is not built."""

    def __init__(self, segments: Sequence[Segment]) -> None:
        self._segments = segments
        self._copies = None if _native is None else _native_copies(segments)

    def of(self, segments: Sequence[Segment]) -> list[tuple[object, int, object]] | None:
        return self._copies if segments is self._segments else None


def _native_or_python(
    native: str,
    python: Callable[..., Tally | None],
    *args: Any,
    copies: CopiesForC | None = None,
) -> Tally | None:
    """``_chunkwalk.<native>`` over the copies where built, else ``python``, same arguments
    (the segments first, as copies for C: ``copies``' where made for them). OutOfTime when
    the C loop's deadline passed."""
    if _native is None:
        return python(*args)
    segments, *rest = args
    made = copies.of(segments) if copies is not None else None
    try:
        result = getattr(_native, native)(
            made if made is not None else _native_copies(segments), *rest
        )
    except ValueError:  # heaps the C loop refuses (overlapping: read while they moved)
        return python(*args)
    if result is False:
        raise OutOfTime
    return result  # type: ignore[no-any-return]


def walk_copies(
    segments: Sequence[Segment],
    head: int,
    fd: int,
    bk: int,
    low: int,
    high: int,
    page: int,
    deadline: float = math.inf,
    copies: CopiesForC | None = None,
) -> Tally | None:
    """One free list followed through whole copies of an arena's heaps (``segments``, sorted
    by start): _chunkwalk.walk_segments where built, else follow_list. OutOfTime when
    time.monotonic() passes ``deadline`` first (a list of millions of chunks). ``copies``:
    the segments as C takes them, where made already."""
    return _native_or_python(
        "walk_segments",
        follow_list,
        segments,
        head,
        fd,
        bk,
        low,
        high,
        page,
        deadline,
        copies=copies,
    )


def walk_fastbin_copies(
    segments: Sequence[Segment],
    head: int,
    size_bytes: int,
    page: int,
    mangled: bool,
    deadline: float = math.inf,
    copies: CopiesForC | None = None,
) -> Tally | None:
    """One fastbin followed through whole copies of an arena's heaps: _chunkwalk.walk_fastbin
    where built, else follow_fastbin. OutOfTime and ``copies`` as walk_copies."""
    return _native_or_python(
        "walk_fastbin",
        follow_fastbin,
        segments,
        head,
        size_bytes,
        page,
        mangled,
        deadline,
        copies=copies,
    )


def unchanged_in_target(
    mem: MemoryReader,
    segments: Sequence[Segment],
    lists: Sequence[tuple[int, int, int, int, int, int, int]],
    extra: Sequence[tuple[int, int]],
    page: int,
    deadline: float = math.inf,
) -> int | None:
    """In a stop, every thread of the target held: the bytes read from the target when the
    copies (``segments``) hold what it holds at every word the walk and heap_checks read of
    ``lists`` (_chunkwalk.unchanged: (0, head, fd, bk, low, high, header bytes) per circular
    list, (1, first chunk, size, 0, 0, 0, 0) per fastbin) and of the ``extra`` (address,
    length) ranges; None when one differs, lies on a page not in RAM now or outside the
    copies, when a list does not read back consistently from the copies, or without the C
    module (the caller then copies the pages again)."""
    if _native is None or not hasattr(_native, "unchanged"):
        return None
    if not isinstance(mem, ProcessMemoryReader):
        return None
    try:
        same, read_bytes = _native.unchanged(
            _native_copies(segments),
            [s.filled for s in segments],
            list(lists),
            list(extra),
            page,
            mem.pid,
            mem.mem_fd,
            mem.pagemap_fd,
            deadline,
        )
    except (ValueError, OSError):  # heaps the C loops refuse; no pagemap
        return None
    return int(read_bytes) if same else None


def rings_hold(
    segments: Sequence[Segment],
    rings: Sequence[tuple[int, int]],
    page: int,
    *,
    filled: bool = False,
) -> bytes | None:
    """One byte per (bin head, first chunk) of ``rings``, large bins whose lists read back
    consistently from the copies (``segments``): 1 where the bin's nextsize ring passes
    heap_checks' checks over them, 0 where one fails, 2 where ``filled`` (the copies are
    made block by block: their ``filled`` flags say which pages they hold) and the ring leads
    to a page not held. heap_checks follows each ring not 1 itself (to name what fails, and
    to fill what it reads). None without the C module, or where it refuses the segments:
    each ring is then checked in Python."""
    if _native is None:
        return None
    flags = [s.filled for s in segments] if filled else None
    try:
        return bytes(_native.rings(_native_copies(segments), list(rings), page, flags))
    except ValueError:  # heaps the C loops refuse (overlapping: read while they moved)
        return None


def unchanged_plan(
    segments: Sequence[Segment],
    lists: Sequence[tuple[int, int, int, int, int, int, int]],
    extra: Sequence[tuple[int, int]],
    page: int,
    deadline: float = math.inf,
) -> bytes | None:
    """unchanged_in_target's first half, from the copies alone, while the target runs: the
    reads and comparisons it would make (_chunkwalk.plan), for plan_holds in a stop. None
    where unchanged_in_target would be None before reading (or without the C module). The
    plan stands for these ``lists`` and ``extra`` over the copies as they are now: it must
    not be used once a copy or its flags changed."""
    if _native is None or not hasattr(_native, "plan"):
        return None
    try:
        made = _native.plan(
            _native_copies(segments),
            [s.filled for s in segments],
            list(lists),
            list(extra),
            page,
            deadline,
        )
    except ValueError:  # heaps the C loops refuse
        return None
    return None if made is None else bytes(made)


def plan_holds(mem: MemoryReader, plan: bytes) -> int | None:
    """In a stop, every thread of the target held: unchanged_in_target's second half, the
    reads and comparisons of ``plan`` (unchanged_plan's): the bytes read when the target holds
    every planned byte, None when one differs or lies on a page not in RAM now."""
    if _native is None or not hasattr(_native, "same") or not isinstance(mem, ProcessMemoryReader):
        return None
    try:
        same, read_bytes = _native.same(plan, mem.pid, mem.mem_fd, mem.pagemap_fd)
    except (ValueError, OSError):
        return None
    return int(read_bytes) if same else None


def _segment_holding(segments: Sequence[Segment], starts: list[int], chunk: int) -> Segment | None:
    """The segment whose copy holds ``chunk``'s 32-byte header, or None."""
    position = bisect.bisect_right(starts, chunk) - 1
    if position < 0:
        return None
    segment = segments[position]
    return segment if 0 <= chunk - segment.start <= segment.length - 32 else None


def _next_checkpoint(count: int, limit: int, deadline: float, clock: Callable[[], float]) -> int:
    """The count of chunks at which a list's walk looks again at its limit and the clock;
    -1 when ``count`` is past the limit (a cycle). OutOfTime past ``deadline``."""
    if count > limit:
        return -1
    if not count & CLOCK_EVERY_CHUNKS and clock() > deadline:
        raise OutOfTime
    return min(limit + 1, (count | CLOCK_EVERY_CHUNKS) + 1)


def _fill_header(segment: Segment, offset: int, shift: int, fill: Fill) -> None:
    """The pages of the 32-byte chunk header at ``offset`` copied: a header may straddle two
    pages, and the second may not be copied where the first is (a scouted copy flags only
    the pages its lists led to)."""
    filled = segment.filled
    first, last = offset >> shift, (offset + 31) >> shift
    if not filled[first]:
        fill(segment, first)
    if last != first and not filled[last]:
        fill(segment, last)


def _foot_matches(segment: Segment, offset: int, size: int, shift: int, fill: Fill | None) -> bool:
    """glibc's set_foot: the next chunk's prev_size repeats a binned chunk's size. Checked
    where that word is in the copy, on a page in RAM (else it passes)."""
    foot = offset + size
    pages = segment.pages
    if foot + 8 > segment.length or not (pages.all_resident or pages.present[foot >> shift]):
        return True
    # (On the header's page, the fill that copied the header copied it too.)
    if fill is not None and foot >> shift != offset >> shift and not segment.filled[foot >> shift]:
        fill(segment, foot >> shift)
    return bool(segment.words[foot >> 3] == size)


def follow_list(
    segments: Sequence[Segment],
    head: int,
    fd: int,
    bk: int,
    low: int,
    high: int,
    page: int,
    deadline: float = math.inf,
    *,
    fill: Fill | None = None,
    max_chunks: int | None = None,
) -> Tally | None:
    """One circular free list of bin ``head`` (its ``fd`` and ``bk``) followed through
    copies of an arena's heaps (``segments``, sorted by start), or None when it does not
    read back consistently. The Python twin of _chunkwalk.c's follow_list: the same checks
    in the same order, the same figures. Per chunk: its 32-byte header inside a segment;
    16-byte aligned; its ``bk`` naming the chunk before (the head, for the first); at most
    chunk_limit() chunks (or ``max_chunks``) followed, more is a cycle; its size within
    [low, high] and the chunk within its segment; the next chunk's prev_size equal to the
    size (glibc's set_foot), where that word is in the copy on a page in RAM. At the end:
    ``bk`` names the last chunk.

    ``fill``: called before a chunk header is read from a page whose ``filled`` flag is 0
    (a copy made block by block); without it every copy is taken as whole. OutOfTime when
    time.monotonic() has passed ``deadline`` at a count of chunks that is a multiple of
    CLOCK_EVERY_CHUNKS + 1 (and whenever ``fill`` says so)."""
    if not segments:
        return EMPTY_TALLY if fd == head == bk else None
    starts = [s.start for s in segments]
    limit = chunk_limit(segments) if max_chunks is None else min(chunk_limit(segments), max_chunks)
    # One comparison per chunk: the limit and the clock are looked at when count reaches it.
    checkpoint = min(limit, CLOCK_EVERY_CHUNKS) + 1
    shift = page.bit_length() - 1
    min_trim = page + glibc.MALLOC_CHUNK_BYTES  # smaller chunks hold no page mtrim releases
    whole_pages = glibc.mtrim_whole_pages_bytes
    clock = time.monotonic
    segment = segments[0]
    start, length, pages = segment.start, segment.length, segment.pages
    words = segment.words
    prefix, all_resident = pages.prefix, pages.all_resident
    count = total = resident = trimmable = raw_min = raw_max = raw_total = 0
    previous = head
    chunk = fd
    while chunk != head:
        offset = chunk - start
        if not 0 <= offset <= length - 32:
            found = _segment_holding(segments, starts, chunk)
            if found is None:
                return None
            segment = found
            start, length, pages = segment.start, segment.length, segment.pages
            words = segment.words
            prefix, all_resident = pages.prefix, pages.all_resident
            offset = chunk - start
        if chunk & 15:
            return None
        if fill is not None:
            _fill_header(segment, offset, shift, fill)
        slot = offset >> 3
        if words[slot + 3] != previous:
            return None
        count += 1
        if (
            count >= checkpoint
            and (checkpoint := _next_checkpoint(count, limit, deadline, clock)) < 0
        ):
            return None  # more chunks than the heaps can hold: a cycle
        raw = words[slot + 1]
        size = raw & ~7
        if (
            not low <= size <= high
            or offset + size > length
            or not _foot_matches(segment, offset, size, shift, fill)
        ):
            return None
        total += size
        raw_total += raw
        raw_min = raw if count == 1 else min(raw_min, raw)
        raw_max = max(raw_max, raw)
        # Every page of the chunk resident (the segment's, or the prefix sums say so)?
        if (
            all_resident
            or prefix[(last := (offset + size - 1) >> shift) + 1]
            - prefix[(first := offset >> shift)]
            > last - first
        ):
            resident += size
            trimmable += whole_pages(chunk, size, page) if size >= min_trim else 0
        else:
            resident += pages.resident_bytes(chunk, chunk + size)
            trimmable += pages.whole_pages_resident_bytes(*glibc.mtrim_span(chunk, size, page))
        previous = chunk
        chunk = words[slot + 2]
    if bk != previous:
        return None
    return count, total, resident, trimmable, raw_min, raw_max, raw_total


def follow_fastbin(
    segments: Sequence[Segment],
    head: int,
    size_bytes: int,
    page: int,
    mangled: bool,
    deadline: float = math.inf,
    *,
    fill: Fill | None = None,
) -> Tally | None:
    """One fastbin (a NULL-terminated list through ``fd`` from ``head``) followed through
    copies of an arena's heaps, or None when it does not read back consistently. The Python
    twin of _chunkwalk.c's follow_fastbin. Per chunk: follow_list's checks without ``bk``,
    and its size equal to the bin's ``size_bytes``; then the next chunk must not be the one
    Brent's check marked (a loop ends within about twice its start and length, not at
    chunk_limit). ``mangled``: every ``fd`` is stored
    safe-linked, as (its own address >> 12) ^ pointer (glibc >= 2.32), which the caller
    decided (glibc_walk.ArenaWalker, once per arena). ``fill`` and OutOfTime as in
    follow_list."""
    starts = [s.start for s in segments]
    limit = chunk_limit(segments)
    shift = page.bit_length() - 1
    count = total = resident = raw_min = raw_max = raw_total = 0
    chunk = head
    mark, power, steps = head, 1, 0
    while chunk:
        position = bisect.bisect_right(starts, chunk) - 1
        if position < 0:
            return None
        segment = segments[position]
        offset = chunk - segment.start
        if offset > segment.length - 32 or chunk & 15:
            return None
        if fill is not None:
            _fill_header(segment, offset, shift, fill)
        count += 1
        if count > limit:
            return None
        if not count & CLOCK_EVERY_CHUNKS and time.monotonic() > deadline:
            raise OutOfTime
        slot = offset >> 3
        raw = segment.words[slot + 1]
        if raw & ~7 != size_bytes or offset + size_bytes > segment.length:
            return None
        total += size_bytes
        raw_total += raw
        if count == 1 or raw < raw_min:
            raw_min = raw
        raw_max = max(raw_max, raw)
        pages = segment.pages
        if pages.all_resident:
            resident += size_bytes
        else:
            resident += pages.resident_bytes(chunk, chunk + size_bytes)
        stored = segment.words[slot + 2]
        chunk = ((chunk + glibc.OFF_FD) >> 12) ^ stored if mangled else stored
        if chunk == mark:
            return None
        steps += 1
        if steps == power:
            mark, power, steps = chunk, power * 2, 0
    return count, total, resident, 0, raw_min, raw_max, raw_total
