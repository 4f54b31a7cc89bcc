"""Walks of one glibc arena's free lists in a running process, consistent or retried.

Everything goes through /proc/PID/mem while the target runs, so any structure can change
between two reads. Each free list is therefore walked with a consistency check (every chunk
aligned and inside the arena's heaps, its size fitting the bin, its ``bk`` naming the chunk
before it, the list returning to the bin's head with the head's ``bk`` naming the last
chunk); a list caught moving is read again from a fresh copy, a bounded number of times, and
only a bin that still fails is left for the caller to estimate. Memory is copied in blocks of
whole resident pages, once per block, so dense free lists cost one read per run of pages,
not one per chunk. Layout constants: memforensics.model.glibc.
"""

from __future__ import annotations

import mmap
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from memforensics.model import glibc
from memforensics.sources.glibc_arenas import ArenaState, Heap
from memforensics.sources.procmem import PageMap, ProcessMemoryReader

BIN_RETRIES = 4
# Copy unit: 64 KiB of whole pages; dense heaps read each block once.
_BLOCK_SHIFT = 16
_CHUNK_WORDS = struct.Struct("<4Q")  # prev_size, size, fd, bk
_TWO_WORDS = struct.Struct("<2Q")
_FASTBIN = 0  # pseudo bin number of the fastbins in ``unmeasured_bins``
# A retry copies the whole arena at once up to this size (one read per run of pages).
PREFETCH_MAX_BYTES = 256 << 20
_PREFETCH_PAGES = 1024  # at most 4 MiB per read


def _bin_head(state: ArenaState, index: int) -> int:
    """Address glibc's bin_at() gives bin ``index``: its fd/bk slots posing as a chunk's."""
    return state.address + glibc.OFF_BINS + 16 * (index - 1) - 16


def _nonempty_bins(state: ArenaState, first: int) -> list[int]:
    return [i for i in range(first, glibc.NBINS) if state.bins[2 * (i - 1)] != _bin_head(state, i)]


@dataclass
class ArenaWalk:
    """What a walk of one arena measured, and which bins it left unmeasured."""

    free_bytes: int = 0  # chunk bytes of the bins read consistently, plus the top
    resident_bytes: int = 0  # of those, bytes on resident pages
    trimmable_bytes: int = 0  # resident whole pages malloc_trim would release from them
    chunks: int = 0
    retries: int = 0
    unmeasured_bins: list[int] = field(default_factory=list)
    budget_reached: bool = False
    top_bytes: int | None = None
    top_resident_bytes: int | None = None


class _Segment:
    """A lazily filled private copy of one heap mapping: blocks are read on first use."""

    __slots__ = ("buffer", "end", "filled", "length", "pages", "start", "view")

    def __init__(self, start: int, end: int, pages: PageMap) -> None:
        self.start = start
        self.end = end
        self.length = end - start
        self.pages = pages
        # Anonymous and untouched until written: a copy costs only the blocks it reads.
        self.buffer = mmap.mmap(-1, max(self.length, 1))
        self.view = memoryview(self.buffer)
        self.filled = bytearray((self.length >> _BLOCK_SHIFT) + 2)

    def close(self) -> None:
        self.view.release()
        self.buffer.close()


class ArenaWalker:
    """Walks one arena's free lists over copies of its heap mappings."""

    def __init__(self, mem: ProcessMemoryReader, heaps: Sequence[Heap], *, is_main: bool) -> None:
        self._mem = mem
        self._page = mem.page_bytes
        self._is_main = is_main
        self._segments = [
            _Segment(h.start, h.start + h.size_bytes, h.pages)
            for h in heaps
            if h.pages is not None and h.size_bytes > 0
        ]
        self._mangled: bool | None = None  # fastbin safe-linking (glibc >= 2.32)

    def close(self) -> None:
        for segment in self._segments:
            segment.close()

    def _segment_for(self, address: int) -> _Segment | None:
        for segment in self._segments:
            if segment.start <= address < segment.end:
                return segment
        return None

    def _fill(self, segment: _Segment, block: int) -> None:
        """Copy the readable pages of ``block`` and of the next block's first page."""
        page = self._page
        first = block << _BLOCK_SHIFT
        last = min(first + (1 << _BLOCK_SHIFT) + page, segment.length)
        readable = segment.pages.readable
        offset = first
        while offset < last:
            if not readable[offset // page]:
                offset += page
                continue
            run_end = offset + page
            while run_end < last and readable[run_end // page]:
                run_end += page
            self._mem.read_into(segment.view[offset:run_end], segment.start + offset)
            offset = run_end
        segment.filled[block] = 1

    def _retry_reads(self) -> None:
        """Before reading a moved list again: a fresh copy of the whole arena at once where it
        is small enough, else drop the copied blocks so the next reads see the heap as now."""
        if sum(s.length for s in self._segments) <= PREFETCH_MAX_BYTES:
            self._prefetch()
            return
        for segment in self._segments:
            segment.filled[:] = bytes(len(segment.filled))

    def _walk_list(
        self, head: int, fd: int, bk: int, low: int, high: int
    ) -> tuple[int, ...] | None:
        """(chunks, bytes, resident bytes, trimmable bytes) of one circular free list,
        or None when it does not read back consistently."""
        if not self._segments:
            return None
        page = self._page
        min_trim = page + glibc.MALLOC_CHUNK_BYTES
        align_in = glibc.MALLOC_CHUNK_BYTES + page - 1
        unpack = _CHUNK_WORDS.unpack_from
        segment = self._segments[0]
        start, length, buffer, filled = segment.start, segment.length, segment.view, segment.filled
        pages = segment.pages
        all_resident = pages.all_resident
        limit = length // glibc.MINSIZE + 1
        count = total = resident = trimmable = 0
        previous = head
        chunk = fd
        while chunk != head:
            offset = chunk - start
            if offset < 0 or offset > length - 32:
                found = self._segment_for(chunk)
                if found is None:
                    return None
                segment = found
                start, length, buffer = segment.start, segment.length, segment.view
                filled, pages, all_resident = (
                    segment.filled,
                    segment.pages,
                    segment.pages.all_resident,
                )
                limit += length // glibc.MINSIZE
                offset = chunk - start
                if offset > length - 32:
                    return None
            if offset & 15:
                return None
            block = offset >> _BLOCK_SHIFT
            if not filled[block]:
                self._fill(segment, block)
            _, size, next_chunk, back = unpack(buffer, offset)
            size &= ~7
            if back != previous or size < low or size > high or offset + size > length:
                return None
            count += 1
            if count > limit:
                return None  # a cycle that never comes back to the head
            total += size
            if all_resident:
                resident += size
                if size >= min_trim:
                    whole = ((chunk + size) // page - (chunk + align_in) // page) * page
                    if whole > 0:
                        trimmable += whole
            else:
                end = chunk + size
                resident += pages.resident_bytes(chunk, end)
                span_start, span_end = glibc.mtrim_span(chunk, size, page)
                trimmable += pages.whole_pages_resident_bytes(span_start, span_end)
            previous = chunk
            chunk = next_chunk
        if bk != previous:
            return None
        return count, total, resident, trimmable

    def _walk_fastbin(self, head: int, size_bytes: int) -> tuple[int, ...] | None:
        """(chunks, bytes, resident bytes, 0) of one fastbin (a NULL-terminated list)."""
        count = total = resident = 0
        chunk = head
        while chunk:
            segment = self._segment_for(chunk)
            if segment is None or chunk % 16:
                return None
            offset = chunk - segment.start
            if offset > segment.length - 32:
                return None
            block = offset >> _BLOCK_SHIFT
            if not segment.filled[block]:
                self._fill(segment, block)
            _, size, stored, _ = _CHUNK_WORDS.unpack_from(segment.view, offset)
            if size & ~7 != size_bytes:
                return None
            count += 1
            if count > segment.length // glibc.MINSIZE:
                return None
            total += size_bytes
            resident += segment.pages.resident_bytes(chunk, chunk + size_bytes)
            revealed = self._reveal(chunk + glibc.OFF_FD, stored)
            if revealed is None:
                return None
            chunk = revealed
        return count, total, resident, 0

    def _reveal(self, position: int, stored: int) -> int | None:
        """A fastbin ``fd`` as a pointer: glibc >= 2.32 stores it as (position >> 12) ^ fd."""
        revealed = (position >> 12) ^ stored

        def valid(pointer: int) -> bool:
            return pointer == 0 or (pointer % 16 == 0 and self._segment_for(pointer) is not None)

        if self._mangled is None:
            if valid(revealed) and not valid(stored):
                self._mangled = True
            elif valid(stored) and not valid(revealed):
                self._mangled = False
            else:
                return revealed if valid(revealed) else None  # undecided: assume modern glibc
        pointer = revealed if self._mangled else stored
        return pointer if valid(pointer) else None

    def _reread_bin(self, state: ArenaState, index: int) -> tuple[int, int] | None:
        address = state.address + glibc.OFF_BINS + 16 * (index - 1)
        data = self._mem.read(address, 16)
        return None if data is None else _TWO_WORDS.unpack(data)

    def _reread_fastbin(self, state: ArenaState, index: int) -> int | None:
        data = self._mem.read(state.address + glibc.OFF_FASTBINS + 8 * index, 8)
        return None if data is None else int.from_bytes(data, "little")

    def _prefetch(self) -> None:
        """Copy every readable page of the arena now, in runs: a list read from one copy
        taken within milliseconds is far likelier to be consistent than one read lazily."""
        page = self._page
        for segment in self._segments:
            readable = segment.pages.readable
            pages = segment.length // page
            index = 0
            while index < pages:
                if not readable[index]:
                    index += 1
                    continue
                run = index
                while run < pages and readable[run] and run - index < _PREFETCH_PAGES:
                    run += 1
                self._mem.read_into(
                    segment.view[index * page : run * page], segment.start + index * page
                )
                index = run
            segment.filled[:] = b"\x01" * len(segment.filled)

    def walk(self, state: ArenaState, *, deadline: float) -> ArenaWalk:
        """Measure every bin (fastbins, unsorted, small, large) and the top of the arena."""
        walk = ArenaWalk()
        clock = time.monotonic
        if clock() > deadline:
            walk.budget_reached = True
            walk.unmeasured_bins.extend([_FASTBIN, *_nonempty_bins(state, 1)])
            return walk
        self._measure_top(state, walk)
        # Fastbins (pseudo bin 0): measured as a whole or not at all.
        fast_result: list[tuple[int, ...]] = []
        for index, head in enumerate(state.fastbins):
            current: int | None = head
            result = None
            for attempt in range(BIN_RETRIES + 1):
                if current is None:
                    break
                result = self._walk_fastbin(current, (index + 2) * glibc.MALLOC_ALIGNMENT)
                if result is not None:
                    break
                walk.retries += attempt < BIN_RETRIES
                self._retry_reads()
                current = self._reread_fastbin(state, index)
            if result is None:
                fast_result = []
                walk.unmeasured_bins.append(_FASTBIN)
                break
            fast_result.append(result)
        for result in fast_result:
            self._add(walk, result)
        for index in range(1, glibc.NBINS):
            fd, bk = state.bins[2 * (index - 1)], state.bins[2 * (index - 1) + 1]
            head = _bin_head(state, index)
            if fd == head and bk == head:
                continue
            if clock() > deadline:
                walk.budget_reached = True
                walk.unmeasured_bins.extend(_nonempty_bins(state, index))
                break
            low, high = glibc.bin_size_range(index)
            result = None
            pair: tuple[int, int] | None = (fd, bk)
            for attempt in range(BIN_RETRIES + 1):
                if pair is None:
                    break
                if pair[0] == head and pair[1] == head:
                    result = (0, 0, 0, 0)  # emptied meanwhile: measured, nothing in it
                    break
                result = self._walk_list(head, pair[0], pair[1], low, high)
                if result is not None:
                    break
                walk.retries += attempt < BIN_RETRIES
                self._retry_reads()
                pair = self._reread_bin(state, index)
            if result is None:
                walk.unmeasured_bins.append(index)
            else:
                self._add(walk, result)
        return walk

    @staticmethod
    def _add(walk: ArenaWalk, result: tuple[int, ...]) -> None:
        chunks, total, resident, trimmable = result
        walk.chunks += chunks
        walk.free_bytes += total
        walk.resident_bytes += resident
        walk.trimmable_bytes += trimmable

    def _measure_top(self, state: ArenaState, walk: ArenaWalk) -> None:
        segment = self._segment_for(state.top)
        data = self._mem.read(state.top, 16) if segment is not None else None
        if segment is None or data is None:
            return
        top_bytes = _TWO_WORDS.unpack(data)[1] & ~glibc.SIZE_FLAGS
        if state.top + top_bytes > segment.end:
            return
        walk.top_bytes = top_bytes
        walk.top_resident_bytes = segment.pages.resident_bytes(state.top, state.top + top_bytes)
        walk.free_bytes += top_bytes
        walk.resident_bytes += walk.top_resident_bytes
        if self._is_main:
            extra = glibc.systrim_release_bytes(top_bytes, self._page)
            end = state.top + top_bytes
            walk.trimmable_bytes += segment.pages.whole_pages_resident_bytes(end - extra, end)
