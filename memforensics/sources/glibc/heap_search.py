"""Searches of a process's anonymous memory for what glibc mmapped outside its sub-heaps:
chunks mmapped on their own, and the segments a main arena mmapped when sbrk failed; and
where to search (anonymous spans no sub-heap holds), and which mappings are thread stacks.

Read through /proc/PID/mem while the target runs, only from pages that are present in RAM
(procmem's invariant); every header is checked for plausibility before it is trusted.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections.abc import Callable, Sequence

from memforensics.model import glibc
from memforensics.sources.glibc.glibc_arenas import ArenaState, Heap
from memforensics.sources.proc.procmaps import Mapping
from memforensics.sources.proc.procmem import MemoryReader

_PREV_INUSE = 0x1
_NON_MAIN_ARENA = 0x4
_FENCEPOST_BYTES = 16  # CHUNK_HDR_SZ: sysmalloc closes a segment it leaves with two of these
_WINDOW_BYTES = 1 << 20  # memory searched for headers is read this much at a time
_PAGEMAP_BLOCK_BYTES = 1 << 30  # and its pagemap this much (2 MiB of entries)
_CLOCK_EVERY = 0xFFF  # a chain of chunks looks at the clock this often


def subtract_spans(
    spans: Sequence[tuple[int, int]], holes: Sequence[tuple[int, int]]
) -> list[tuple[int, int]]:
    """The parts of the [start, end) ``spans`` that no [start, end) of ``holes`` covers
    (each span looks only at the holes that can reach it: thousands of sub-heaps against
    thousands of mappings stay a sorted sweep, not a product)."""
    cuts = sorted(holes)
    los = [lo for lo, _ in cuts]
    reach = list(itertools.accumulate((hi for _, hi in cuts), max))  # max end so far
    parts: list[tuple[int, int]] = []
    for start, end in spans:
        at = start
        # The first hole that may end after ``start``: holes before it all end at or before.
        first = bisect.bisect_right(reach, start)
        for lo, hi in cuts[first : bisect.bisect_left(los, end)]:
            if hi <= at:
                continue
            if lo > at:
                parts.append((at, lo))
            at = max(at, hi)
        if at < end:
            parts.append((at, end))
    return parts


class HeaderReader:
    """Chunk headers (prev_size, size) of a target, read a window of _WINDOW_BYTES at a time
    (one read per run of present pages in it, ProcessMemoryReader.read_present). A header
    on a page that is not present reads as (0, 0), which no chunk has."""

    def __init__(self, mem: MemoryReader) -> None:
        self.mem = mem
        self.page_bytes = mem.page_bytes
        self._low = self._high = 0
        self._words = memoryview(b"").cast("Q")

    def header(self, address: int, limit: int) -> tuple[int, int]:
        """(prev_size, size) at the 16-byte aligned ``address``; nothing at or beyond
        ``limit`` (the end of the memory searched) is read."""
        if not self._low <= address <= self._high - 16:
            low = glibc.page_floor(address, self.page_bytes)
            high = max(min(low + _WINDOW_BYTES, limit), address + 16)
            self._words = memoryview(self.mem.read_present(low, high - low)).cast("Q")
            self._low, self._high = low, low + len(self._words) * 8
        slot = (address - self._low) >> 3
        return self._words[slot], self._words[slot + 1]


def page_heads(
    mem: MemoryReader, low: int, high: int, present: bytes | None = None
) -> list[tuple[int, int, int]]:
    """(address, first word, second word) at each page start of [low, high) (page-aligned),
    in one read per run of present pages (``present``: their flags, if known); a page that
    is not present reads as zeros."""
    page = mem.page_bytes
    words = memoryview(mem.read_present(low, high - low, present)).cast("Q")
    step = page // 8
    return [
        (low + index * page, first, second)
        for index, (first, second) in enumerate(
            zip(words[0::step].tolist(), words[1::step].tolist(), strict=True)
        )
    ]


def find_mmapped_chunks(
    mem: MemoryReader,
    spans: Sequence[tuple[int, int]],
    deadline: float,
    pause: Callable[[], object] = lambda: None,
) -> tuple[list[tuple[int, int]], bool]:
    """((start, size) of each chunk glibc served with its own mmap, whether all ``spans``
    were searched before ``deadline``), in the [start, end) ``spans``: page-aligned anonymous
    read-write memory that is no arena's.

    Each such chunk is its own mmap, but the kernel merges adjacent anonymous mappings with
    the same flags into one (a Python process mmaps obmalloc's arenas between its big
    objects'), so a chunk may begin at any page of a span, behind memory that is no chunk.
    At every present page its header is looked for (a chunk's header page is written, so
    present unless swapped out): prev_size 0 (sysmalloc's mmap path; memalign keeps that
    header at the mapping's start), size whole pages within the span and flags exactly
    IS_MMAPPED. A chunk found is skipped whole (its pages are not read) and the search goes
    on at its end, where the next chunk may start inside the same mapping. The pagemap is
    read _PAGEMAP_BLOCK_BYTES at a time, so memory that is not present costs no reads.
    """
    page = mem.page_bytes
    chunks: list[tuple[int, int]] = []
    for start, end in spans:
        at = start
        while at < end:
            block_end = min(end, at + _PAGEMAP_BLOCK_BYTES)
            present = mem.pagemap(at, block_end).present
            found = None
            index = present.find(1)
            while found is None and index >= 0:
                if time.monotonic() > deadline:
                    return chunks, False
                pause()
                low = at + index * page
                high = min(block_end, low + _WINDOW_BYTES)
                window = present[index : index + (high - low) // page]
                found = next(
                    (
                        (chunk, size_field & ~glibc.SIZE_FLAGS)
                        for chunk, prev_size, size_field in page_heads(mem, low, high, window)
                        if _mmapped_header(chunk, prev_size, size_field, end, page)
                    ),
                    None,
                )
                index = present.find(1, index + len(window))
            if found is None:
                at = block_end
            else:
                chunks.append(found)
                at = found[0] + found[1]
    return chunks, True


def _mmapped_header(chunk: int, prev_size: int, size_field: int, end: int, page: int) -> bool:
    """The header of a chunk sysmalloc mmapped, at the page ``chunk`` below ``end``."""
    size = size_field & ~glibc.SIZE_FLAGS
    return (
        prev_size == 0
        and size_field & glibc.SIZE_FLAGS == glibc.IS_MMAPPED
        and size >= page
        and size % page == 0
        and chunk + size <= end
    )


def _chain_end(
    reader: HeaderReader, at: int, limit: int, top: int, top_end: int | None, deadline: float
) -> int | None:
    """The end of the main-arena segment whose first chunk is at ``at``, or None when the
    chunks from there do not chain like one: each chunk's size leads to the next (none
    flagged IS_MMAPPED or NON_MAIN_ARENA), up to the top chunk's end, or up to the two
    16-byte fenceposts with which sysmalloc closes a segment it leaves, ending at a page
    boundary. A segment's first chunk has prev_size 0 and PREV_INUSE set."""
    if not _first_chunk_shape(*reader.header(at, limit)):
        return None
    steps = 0
    while at + glibc.CHUNK_HEADER_BYTES <= limit:
        if at == top:
            return top_end if top_end is not None and top_end <= limit else None
        size_field = reader.header(at, limit)[1]
        size = size_field & ~glibc.SIZE_FLAGS
        if size_field & (glibc.IS_MMAPPED | _NON_MAIN_ARENA) or size % glibc.MALLOC_ALIGNMENT:
            return None
        if size == _FENCEPOST_BYTES:
            return _fenceposts_end(reader, at, limit)
        if size < glibc.MINSIZE or at + size > limit:
            return None
        at += size
        steps += 1
        if not steps & _CLOCK_EVERY and time.monotonic() > deadline:
            return None
    return None


def _fenceposts_end(reader: HeaderReader, at: int, limit: int) -> int | None:
    """The page-aligned end of the 16-byte chunks from ``at`` that close a segment, or None.
    sysmalloc shrinks the old top to ``(size - 16) & ~15`` bytes and writes two 16-byte
    fenceposts after it (glibc malloc/malloc.c): an old top left with 16 bytes is a third
    16-byte chunk before them, so a segment ends with two or three of them."""
    end = at
    for count in range(1, 4):
        if end + _FENCEPOST_BYTES > limit:
            return None
        if reader.header(end, limit)[1] & ~glibc.SIZE_FLAGS != _FENCEPOST_BYTES:
            return None
        end += _FENCEPOST_BYTES
        if count >= 2 and end % reader.page_bytes == 0:
            return end
    return None


def _first_chunk_shape(prev_size: int, size_field: int) -> bool:
    """A header a segment may start with: prev_size 0, PREV_INUSE, not IS_MMAPPED nor
    NON_MAIN_ARENA. Chunks inside a segment may look the same (an in-use chunk below that
    never wrote its last word): a start is only taken once nothing lower chains to it."""
    flags = size_field & (_PREV_INUSE | glibc.IS_MMAPPED | _NON_MAIN_ARENA)
    return prev_size == 0 and flags == _PREV_INUSE


def _reaches(reader: HeaderReader, at: int, target: int, limit: int, deadline: float) -> bool:
    """The chunks from ``at`` chain by their sizes exactly to ``target`` (a chunk boundary),
    none flagged IS_MMAPPED or NON_MAIN_ARENA and no fencepost (a segment's end) between."""
    steps = 0
    while at < target:
        size_field = reader.header(at, limit)[1]
        size = size_field & ~glibc.SIZE_FLAGS
        if size_field & (glibc.IS_MMAPPED | _NON_MAIN_ARENA) or size < glibc.MINSIZE:
            return False
        if size % glibc.MALLOC_ALIGNMENT:
            return False
        at += size
        steps += 1
        if not steps & _CLOCK_EVERY and time.monotonic() > deadline:
            return False
    return at == target


def _lowest_start(
    mem: MemoryReader,
    reader: HeaderReader,
    floor: int,
    start: int,
    limit: int,
    deadline: float,
) -> int:
    """The lowest page in [floor, start] whose chunks chain to the chunk at ``start``: the
    segment's real first chunk when ``start`` is a chunk inside it. Pages are looked at
    downwards, a window at a time, each candidate only as far as the lowest found so far."""
    best = start
    high = start
    while high > floor and time.monotonic() <= deadline:
        low = max(floor, high - _WINDOW_BYTES)
        for at, prev_size, size_field in reversed(page_heads(mem, low, high)):
            if _first_chunk_shape(prev_size, size_field) and _reaches(
                reader, at, best, limit, deadline
            ):
                best = at
        high = low
    return best


def main_arena_segments(
    mem: MemoryReader,
    spans: Sequence[tuple[int, int]],
    state: ArenaState,
    deadline: float,
) -> list[tuple[int, int]]:
    """[start, end) of the main arena's memory beyond [heap], in ``spans`` (anonymous
    read-write memory that is no sub-heap and no mmapped chunk): sorted, not overlapping.

    When sbrk fails (a mapping right after [heap], RLIMIT_DATA), glibc's sysmalloc mmaps
    segments for the main arena instead (1 MiB the first time, then what each growth needs)
    and marks it NONCONTIGUOUS. Each begins with a chunk and chains by chunk sizes to its
    end (see _chain_end). The kernel merges adjacent mappings (other segments, a thread
    stack, the program's own memory), so a segment is looked for at each span's start,
    right after each segment found, and, for the top chunk and each bin's first and last
    chunk (the arena's own pointers) still outside every segment, below that pointer: the
    nearest page that chains past it, then lower while a lower page still chains to it (a
    chunk inside a segment can look like a first one). Memory no segment chains through is
    left out, however near.
    """
    reader = HeaderReader(mem)
    top_span = next(((lo, hi) for lo, hi in spans if lo <= state.top < hi), None)
    top_end = None
    if top_span is not None:
        top_end = state.top + (reader.header(state.top, top_span[1])[1] & ~glibc.SIZE_FLAGS)
    found: list[tuple[int, int]] = []

    def follow(span: tuple[int, int], at: int) -> None:
        while at < span[1] and time.monotonic() <= deadline:
            end = _chain_end(reader, at, span[1], state.top, top_end, deadline)
            if end is None:
                return
            found.append((at, end))
            at = end

    for span in spans:
        follow(span, span[0])
    for seed in (state.top, *state.bins, *state.fastbins):
        holder = next(((lo, hi) for lo, hi in spans if lo <= seed < hi), None)
        if holder is None or any(lo <= seed < hi for lo, hi in found):
            continue
        span = holder
        floor = max([span[0], *(hi for _, hi in found if span[0] < hi <= seed)])
        start = _start_below(mem, reader, (floor, span[1]), seed, state.top, top_end, deadline)
        if start is not None:
            follow(span, _lowest_start(mem, reader, floor, start, span[1], deadline))
    # A segment no pointer of the arena leads into (bins whose first and last chunks lie
    # elsewhere) is found by trying every page left, lowest first.
    for span in spans:
        for gap in subtract_spans([span], found):
            _sweep(mem, reader, gap, span[1], (state.top, top_end), follow, deadline)
    segments: list[tuple[int, int]] = []
    for low, high in sorted(set(found)):
        if not segments or low >= segments[-1][1]:
            segments.append((low, high))  # a lower start of the same segment wins
    return segments


def _start_below(
    mem: MemoryReader,
    reader: HeaderReader,
    span: tuple[int, int],
    seed: int,
    top: int,
    top_end: int | None,
    deadline: float,
) -> int | None:
    """The nearest page at or below ``seed`` in ``span`` whose chunks chain like a segment
    holding ``seed`` (to an end beyond it); None when there is none."""
    high = glibc.page_floor(seed, mem.page_bytes) + mem.page_bytes
    while high > span[0] and time.monotonic() <= deadline:
        low = max(span[0], high - _WINDOW_BYTES)
        for at, prev_size, size_field in reversed(page_heads(mem, low, high)):
            if not _first_chunk_shape(prev_size, size_field):
                continue
            end = _chain_end(reader, at, span[1], top, top_end, deadline)
            if end is not None and end > seed:
                return at
        high = low
    return None


def _sweep(
    mem: MemoryReader,
    reader: HeaderReader,
    gap: tuple[int, int],
    span_end: int,
    top: tuple[int, int | None],
    follow: Callable[[tuple[int, int], int], None],
    deadline: float,
) -> None:
    """Every page of ``gap`` (memory no segment found yet covers), lowest first, tried as a
    segment's start; a start that chains is followed (``follow``), and the sweep goes on
    past the segments it found."""
    page = mem.page_bytes
    at = glibc.page_ceil(gap[0], page)
    while at < gap[1] and time.monotonic() <= deadline:
        high = min(at + _WINDOW_BYTES, glibc.page_ceil(gap[1], page))
        resume = high
        for head, prev_size, size_field in page_heads(mem, at, high):
            if not _first_chunk_shape(prev_size, size_field):
                continue
            end = _chain_end(reader, head, span_end, top[0], top[1], deadline)
            if end is not None:
                follow((head, span_end), head)
                resume = max(high, end)
                break
        at = resume


def stack_mappings(mappings: Sequence[Mapping]) -> list[Mapping]:
    """Anonymous RW mappings directly above an inaccessible guard page, and [stack]: the
    thread stacks (a mapping merged with one counts whole, less what is found in it)."""
    stacks = [m for m in mappings if m.path == "[stack]"]
    for below, mapping in itertools.pairwise(mappings):
        if (
            mapping.anonymous
            and mapping.perms.startswith("rw")
            and below.end_address == mapping.start_address
            and below.perms.startswith("---")
            and below.anonymous
            and below.size_bytes < glibc.HEAP_MAX_BYTES // 16
        ):
            stacks.append(mapping)
    return stacks


def anonymous_spans(mappings: Sequence[Mapping], heaps: Sequence[Heap]) -> list[tuple[int, int]]:
    """[start, end) of anonymous read-write memory with pages in RAM that no sub-heap
    reserves (each reserves HEAP_MAX_BYTES): where mmapped chunks and a main arena's mmapped
    segments lie. Adjacent mappings are one span (a chunk may cross a split the kernel made)."""
    spans: list[tuple[int, int]] = []
    for m in mappings:
        if m.anonymous and m.perms.startswith("rw") and m.rss_bytes:
            if spans and spans[-1][1] == m.start_address:
                spans[-1] = (spans[-1][0], m.end_address)
            else:
                spans.append((m.start_address, m.end_address))
    return subtract_spans(spans, [(h.start, h.start + glibc.HEAP_MAX_BYTES) for h in heaps])
