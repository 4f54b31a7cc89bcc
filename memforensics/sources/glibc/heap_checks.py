"""What is wrong with a free list that did not read back consistently in a stop: glibc's own
checks made again over the private copy, the first that fails named in glibc's words.

heapcopy's loops (and their C twins) only say whether a list reads back consistently; they
run on every read and stay lean. When a list fails while every thread of the target is held
(the copy cannot have moved), glibc_walk asks here which check failed and where: the
finding a corrupt heap is reported with (model.corruption). The large bins' nextsize ring
and the top chunk, which the loops do not look at, are checked here too.

Everything read is hostile: no allocation, loop or recursion is sized by a value read from
the copy. A list is followed for at most heapcopy.chunk_limit() chunks (what the heaps can
hold), the clock is looked at as the loops do, and a cycle in a fastbin is found with
constant memory (Brent's algorithm).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence

from memforensics.model import corruption as words
from memforensics.model import glibc
from memforensics.model.corruption import HeapCorruption, bin_name
from memforensics.sources.glibc.glibc_arenas import ArenaState
from memforensics.sources.glibc.heapcopy import (
    CLOCK_EVERY_CHUNKS,
    Fill,
    OutOfTime,
    Segment,
    chunk_limit,
    rings_hold,
)

_CHUNK_BYTES = 48  # a free chunk's words read here: prev_size … bk_nextsize


def bin_head(state: ArenaState, index: int) -> int:
    """Address glibc's bin_at() gives bin ``index``: its fd/bk slots posing as a chunk's."""
    return glibc.bin_at(state.address, index)


class OutOfCopy(Exception):
    """An address outside every segment's copy (the caller names the pointer that led there)."""


class _Copy:
    """Words of the arena's copies by address; filled through ``fill`` where a copy is made
    block by block."""

    def __init__(self, segments: Sequence[Segment], page: int, fill: Fill | None) -> None:
        self._segments = segments
        self._starts = [s.start for s in segments]
        self._shift = page.bit_length() - 1
        self._fill = fill
        # The span of addresses the last lookup's bisect gave (from its segment's start to
        # the next one's) and its position there: the checks read words near each other.
        self._last_span = (0, 0)
        self._last_position = -1

    def holds(self, chunk: int, length: int = 32) -> bool:
        """``length`` bytes at ``chunk`` lie inside one segment."""
        return self._segment(chunk, length) is not None

    def _segment(self, address: int, length: int) -> Segment | None:
        low, high = self._last_span
        if low <= address < high:
            position = self._last_position
        else:
            position = bisect.bisect_right(self._starts, address) - 1
            if position < 0:
                return None
            following = position + 1
            high = self._starts[following] if following < len(self._starts) else 1 << 64
            self._last_span, self._last_position = (self._starts[position], high), position
        segment = self._segments[position]
        offset = address - segment.start
        return segment if 0 <= offset <= segment.length - length else None

    def word(self, address: int) -> int:
        """The 8-byte word at ``address`` (8-aligned); OutOfCopy outside the copies."""
        segment = self._segment(address, 8)
        if segment is None or address & 7:
            raise OutOfCopy
        offset = address - segment.start
        if self._fill is not None and not segment.filled[offset >> self._shift]:
            self._fill(segment, offset >> self._shift)
        return int(segment.words[offset >> 3])

    def in_ram(self, address: int) -> bool:
        """The page of ``address`` was read from RAM (not swapped out, not unknown)."""
        segment = self._segment(address, 1)
        if segment is None:
            return False
        pages = segment.pages
        return pages.all_resident or bool(pages.present[(address - segment.start) >> self._shift])

    def words_in_ram(self, chunk: int) -> bool:
        """The size word, fd and bk of ``chunk`` were read from RAM: a chunk on a page that
        was not (swapped out) reads as zeros, which no check may take for its words."""
        return self.in_ram(chunk + 8) and self.in_ram(chunk + 31)

    def end_of(self, address: int) -> int:
        """The end of the segment holding ``address`` (0 when none does)."""
        segment = self._segment(address, 1)
        return segment.end if segment is not None else 0


def list_check(index: int) -> str:
    """glibc's words for a list bin's double-link check (unsorted, small or large bin)."""
    if index == 1:
        return words.UNSORTED_LIST
    return words.SMALLBIN_LIST if index < 64 else words.LARGEBIN_LIST


def diagnose_list(
    arena: int,
    segments: Sequence[Segment],
    index: int,
    head: int,
    fd: int,
    bk: int,
    page: int,
    deadline: float,
    *,
    fill: Fill | None = None,
) -> HeapCorruption | None:
    """The first of glibc's checks that bin ``index`` of the arena at ``arena`` (its head
    ``head``, whose fd and bk are ``fd`` and ``bk``) fails in the copies, or None when none
    does (then the list is consistent: heapcopy's loops gave up for another reason).
    OutOfTime once time.monotonic() passes ``deadline`` (looked at as the loops do)."""
    copy = _Copy(segments, page, fill)
    name = bin_name(index)
    limit = chunk_limit(segments)
    previous, chunk = head, fd

    def found(at: int, check: str, detail: str) -> HeapCorruption:
        return HeapCorruption(arena, name, at, check, detail)

    for count in range(limit + 1):
        if chunk == head:
            if bk != previous:
                return found(
                    head,
                    list_check(index),
                    f"the bin's bk is {bk:#x}, its last chunk {previous:#x}",
                )
            if index < 64:
                return None
            try:
                return _nextsize(arena, copy, index, head, fd, limit)
            except OutOfCopy:  # every chunk of the ring was checked to be in the copies
                return None
        if count and not count & CLOCK_EVERY_CHUNKS and time.monotonic() > deadline:
            raise OutOfTime
        whose = "the bin's fd" if previous == head else f"the fd of {previous:#x}"
        if not copy.holds(chunk, 32):
            return found(
                previous, words.OUTSIDE_HEAPS, f"{whose} is {chunk:#x}, outside the arena's heaps"
            )
        if chunk & 15:
            return found(previous, words.DOUBLE_LINKED, f"{whose} is {chunk:#x}, not aligned")
        if not copy.words_in_ram(chunk):
            return None  # (its words were never read: the bin is unmeasured, not corrupt)
        back = copy.word(chunk + 24)
        if back != previous:
            if _reached_before(copy, head, fd, chunk, count):
                return found(
                    previous, words.LIST_LOOPS, f"{whose} is {chunk:#x}, already in the list"
                )
            return found(
                chunk,
                list_check(index),
                f"its bk is {back:#x}, not the chunk before it ({previous:#x})",
            )
        fault = _size_fault(copy, index, chunk)
        if fault is not None:
            return found(chunk, *fault)
        previous, chunk = chunk, copy.word(chunk + 16)
    return found(previous, words.LIST_LOOPS, f"more than {limit} chunks: the list loops")


def _size_fault(copy: _Copy, index: int, chunk: int) -> tuple[str, str] | None:
    """(check, detail) of a chunk in bin ``index`` whose size does not fit its heap or its
    bin, or that its next chunk's prev_size does not repeat (glibc's set_foot); None when
    its size passes."""
    low, high = glibc.bin_size_range(index)
    raw = copy.word(chunk + 8)
    size = raw & ~glibc.SIZE_FLAGS
    if size < glibc.MINSIZE or chunk + size > copy.end_of(chunk):
        check = words.UNSORTED_SIZE if index == 1 else words.SIZE_VS_PREV_SIZE
        return check, f"size {raw:#x} runs past its heap"
    if not low <= size <= high:
        fits = f"{low:#x} … {min(high, 1 << 48):#x}"
        return words.SIZE_VS_PREV_SIZE, f"size {raw:#x} does not fit {bin_name(index)} ({fits})"
    foot = chunk + size
    if foot + 8 <= copy.end_of(chunk) and copy.in_ram(foot) and copy.word(foot) != size:
        check = words.UNSORTED_PREV_SIZE if index == 1 else words.SIZE_VS_PREV_SIZE
        return check, f"size {raw:#x}, but the next chunk's prev_size is {copy.word(foot):#x}"
    return None


def _reached_before(copy: _Copy, head: int, fd: int, chunk: int, steps: int) -> bool:
    """``chunk`` is among the first ``steps`` chunks from ``fd`` (the list was followed that
    far, so each of them is in the copies)."""
    at = fd
    for _ in range(steps):
        if at == chunk:
            return True
        if at == head or not copy.holds(at, 32):
            return False
        at = copy.word(at + 16)
    return False


def _nextsize(
    arena: int, copy: _Copy, index: int, head: int, first: int, limit: int
) -> HeapCorruption | None:
    """A large bin's nextsize ring, from its first (largest) chunk: each link's target in
    the copies, naming its source back, sizes falling, back to the first within ``limit``
    steps (glibc's unlink_chunk check, "corrupted double-linked list (not small)")."""
    name = bin_name(index)
    if first == head or not copy.holds(first, _CHUNK_BYTES):
        return None
    chunk = first
    size = copy.word(chunk + 8) & ~glibc.SIZE_FLAGS
    for _ in range(limit + 1):
        following = copy.word(chunk + 32)
        if not copy.holds(following, _CHUNK_BYTES) or following & 15:
            return HeapCorruption(
                arena,
                name,
                chunk,
                words.LARGEBIN_NEXTSIZE,
                f"its fd_nextsize is {following:#x}, outside the arena's heaps or unaligned",
            )
        if copy.word(following + 40) != chunk:
            return HeapCorruption(
                arena,
                name,
                following,
                words.LARGEBIN_NEXTSIZE,
                f"its bk_nextsize is {copy.word(following + 40):#x}, not {chunk:#x}",
            )
        if following == first:
            return None
        next_size = copy.word(following + 8) & ~glibc.SIZE_FLAGS
        if next_size >= size:
            return HeapCorruption(
                arena,
                name,
                chunk,
                words.LARGEBIN_NEXTSIZE,
                f"its fd_nextsize {following:#x} is not smaller ({next_size:#x} >= {size:#x})",
            )
        chunk, size = following, next_size
    return HeapCorruption(arena, name, first, words.LIST_LOOPS, "the nextsize ring loops")


def check_nextsize(
    arena: int,
    segments: Sequence[Segment],
    index: int,
    head: int,
    fd: int,
    page: int,
    *,
    fill: Fill | None = None,
) -> HeapCorruption | None:
    """A large bin read back consistently through fd and bk: its nextsize ring checked."""
    copy = _Copy(segments, page, fill)
    try:
        return _nextsize(arena, copy, index, head, fd, chunk_limit(segments))
    except OutOfCopy:  # the ring's chunks were checked in the copies: a bug, not the target
        return None


def diagnose_fastbin(
    arena: int,
    segments: Sequence[Segment],
    fast_index: int,
    head: int,
    page: int,
    mangled: bool,
    deadline: float,
    *,
    fill: Fill | None = None,
) -> tuple[int, HeapCorruption | None]:
    """(chunks followed, the first check fastbin ``fast_index`` fails or None) read with
    ``mangled`` pointers (safe-linking). OutOfTime as diagnose_list."""
    copy = _Copy(segments, page, fill)
    size_bytes = (fast_index + 2) * glibc.MALLOC_ALIGNMENT
    name = bin_name(0, fast_index)
    limit = chunk_limit(segments)
    previous: int | None = None
    chunk = head
    tortoise, power, steps = head, 1, 0  # Brent's cycle search
    for count in range(limit + 1):
        if not chunk:
            return count, None
        if count and not count & CLOCK_EVERY_CHUNKS and time.monotonic() > deadline:
            raise OutOfTime
        whose = "the fastbin's head" if previous is None else f"the fd of {previous:#x}"
        at = head if previous is None else previous
        if chunk & 15:
            return count, HeapCorruption(
                arena, name, at, words.FASTBIN_UNALIGNED, f"{whose} is {chunk:#x}, not aligned"
            )
        if not copy.holds(chunk, 32):
            return count, HeapCorruption(
                arena, name, at, words.OUTSIDE_HEAPS, f"{whose} is {chunk:#x}, outside the heaps"
            )
        if count and chunk == tortoise:
            return count, HeapCorruption(
                arena, name, at, words.LIST_LOOPS, f"{whose} is {chunk:#x}, already in the list"
            )
        steps += 1
        if steps == power:
            tortoise, power, steps = chunk, power * 2, 0
        if not copy.words_in_ram(chunk):
            return count, None  # (its words were never read: unmeasured, not corrupt)
        raw = copy.word(chunk + 8)
        if raw & ~glibc.SIZE_FLAGS != size_bytes:
            return count, HeapCorruption(
                arena,
                name,
                chunk,
                words.FASTBIN_SIZE,
                f"size {raw:#x} in the fastbin of {size_bytes}-byte chunks",
            )
        stored = copy.word(chunk + glibc.OFF_FD)
        previous = chunk
        chunk = ((chunk + glibc.OFF_FD) >> 12) ^ stored if mangled else stored
    return limit, HeapCorruption(
        arena, name, head, words.LIST_LOOPS, f"more than {limit} chunks: the fastbin loops"
    )


def check_top(
    arena: int,
    segments: Sequence[Segment],
    top: int,
    system_bytes: int,
    page: int,
    *,
    fill: Fill | None = None,
) -> HeapCorruption | None:
    """The top chunk's size against its heap and the arena's system_mem (glibc's "malloc():
    corrupted top size"); None when it fits, or the top lies outside the copies."""
    copy = _Copy(segments, page, fill)
    if not copy.holds(top, 16) or top & 15:
        return None
    raw = copy.word(top + 8)
    size = raw & ~glibc.SIZE_FLAGS
    if top + size <= copy.end_of(top) and size <= system_bytes:
        return None
    return HeapCorruption(
        arena,
        "top",
        top,
        words.TOP_SIZE,
        f"size {raw:#x} runs past its heap (ends {copy.end_of(top):#x}; system_mem "
        f"{system_bytes:#x})",
    )


def diagnose_bins(
    state: ArenaState,
    segments: Sequence[Segment],
    indexes: Sequence[int],
    page: int,
    deadline: float,
    mangled: bool | None,
    *,
    fill: Fill | None = None,
) -> dict[int, list[HeapCorruption]]:
    """Per bin of ``indexes`` (0: the fastbins) that fails a check, its findings. Fastbins
    are read the way the arena's others decided (``mangled``: safe-linked or not); when
    undecided, both ways, and the way that follows the list further names the fault (a
    pointer taken the wrong way fails at once). A bin whose check ran out of time or copy
    is left out (unmeasured, as before)."""
    found: dict[int, list[HeapCorruption]] = {}
    for index in indexes:
        try:
            if index == 0:
                findings = _diagnose_fastbins(state, segments, page, deadline, mangled, fill)
            else:
                finding = diagnose_list(
                    state.address,
                    segments,
                    index,
                    bin_head(state, index),
                    state.bins[2 * (index - 1)],
                    state.bins[2 * (index - 1) + 1],
                    page,
                    deadline,
                    fill=fill,
                )
                findings = [finding] if finding is not None else []
        except OutOfTime:
            # Read back inconsistently while held still: corrupt all the same (DESIGN rule
            # 8), only not named. Never a reason to fall back to a call into the heap.
            head = state.address + glibc.OFF_FASTBINS if index == 0 else bin_head(state, index)
            findings = [
                HeapCorruption(
                    state.address,
                    bin_name(index),
                    head,
                    words.UNNAMED,
                    "the list read back inconsistently while every thread was held; the "
                    "time budget ran out before the failing check was found",
                )
            ]
        except OutOfCopy:
            continue
        if findings:
            found[index] = findings
    return found


def _diagnose_fastbins(
    state: ArenaState,
    segments: Sequence[Segment],
    page: int,
    deadline: float,
    mangled: bool | None,
    fill: Fill | None,
) -> list[HeapCorruption]:
    findings: list[HeapCorruption] = []
    ways = (mangled,) if mangled is not None else (True, False)
    for fast_index, head in enumerate(state.fastbins):
        if not head:
            continue
        results = [
            diagnose_fastbin(
                state.address, segments, fast_index, head, page, way, deadline, fill=fill
            )
            for way in ways
        ]
        if any(finding is None for _count, finding in results):
            continue  # reads back one way: not this fastbin
        finding = max(results, key=lambda result: result[0])[1]
        if finding is not None:
            findings.append(finding)
    return findings


def check_unlisted(
    state: ArenaState,
    segments: Sequence[Segment],
    large_bins: Sequence[int],
    page: int,
    *,
    fill: Fill | None = None,
    top: bool = True,
) -> list[HeapCorruption]:
    """The top chunk's size (``top``) and the nextsize ring of each of ``large_bins`` (read
    back consistently through fd and bk): what the list loops do not look at."""
    findings: list[HeapCorruption] = []
    try:
        found = (
            check_top(state.address, segments, state.top, state.system_bytes, page, fill=fill)
            if top
            else None
        )
        if found is not None:
            findings.append(found)
        # (Every ring is checked in C first, the same steps over the pages the copies hold:
        # only one that fails, or leads to a page to be filled, is followed again here.)
        heads = [(bin_head(state, i), state.bins[2 * (i - 1)]) for i in large_bins]
        passed = rings_hold(segments, heads, page, filled=fill is not None)
        for position, index in enumerate(large_bins):
            if passed is not None and passed[position] == 1:
                continue
            ring = check_nextsize(
                state.address,
                segments,
                index,
                bin_head(state, index),
                state.bins[2 * (index - 1)],
                page,
                fill=fill,
            )
            if ring is not None:
                findings.append(ring)
    except (OutOfTime, OutOfCopy):
        pass
    return findings
