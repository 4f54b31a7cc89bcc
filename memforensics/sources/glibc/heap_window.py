"""One heap's chunks walked window by window, each window a copy read at one moment (in a
stop of the target, or from a core), with every header validated and each chunk's state
decided from the next chunk's PREV_INUSE bit and the free lists (sources.glibc.heap_chunks
drives it; the module there describes the walk).
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from memforensics.model import glibc
from memforensics.model.chunks import ChunkState, HeapChunks
from memforensics.sources.glibc.heap_lists import TCACHE_LAYOUTS, Tcache, learn_key, tcache_struct
from memforensics.sources.proc.procmem import MemoryReader, PageMap

WINDOW_BYTES = 1 << 20  # one stop reads this much of a heap (plus the tail): ~1 ms
WINDOW_MAX_BYTES = 16 << 20  # a stop reads at most this much (memforensics' memory bound)
WINDOW_SECONDS = 0.002  # a stop reads more pieces while it has lasted less than this
WINDOW_TAIL_BYTES = 4096  # read past a window's end, so a chunk near it shows its first bytes
_PREV_INUSE = 0x1
_FENCEPOST_BYTES = 16  # CHUNK_HDR_SZ: sysmalloc closes a sub-heap it leaves with two
_TCACHE_MAX_CHUNK = 0x410  # the largest chunk tcache holds (64 bins of 16 bytes from 32)
_LIVE, _FREE, _FAST, _TCACHE = (
    int(s) for s in (ChunkState.LIVE, ChunkState.FREE, ChunkState.FAST, ChunkState.TCACHE)
)


@dataclass(frozen=True)
class ChunkRef:
    """Which heap a visited batch of chunks belongs to."""

    arena: int  # malloc_info's arena index; MMAPPED_ARENA for mmapped chunks
    heap: int
    pages: PageMap | None  # the heap's residency (None: every byte given was read)


class Visit(Protocol):
    def __call__(
        self,
        ref: ChunkRef,
        view: memoryview,
        base: int,
        addresses: Sequence[int],
        sizes: Sequence[int],
        states: bytes | bytearray,
    ) -> None: ...


class HeapWalk:
    """One heap walked window by window (see the module)."""

    def __init__(
        self,
        mem: MemoryReader,
        ref: ChunkRef,
        start: int,
        limit: int,
        top: Callable[[], int | None],
        fast: set[int],
        tcache: Tcache,
        visit: Visit | None,
        keep: bool,
        retry: bool = False,
    ) -> None:
        self.mem, self.ref, self.start, self.limit = mem, ref, start, limit
        self.top, self.fast, self.tcache, self.visit, self.keep = top, fast, tcache, visit, keep
        self.addresses: array[int] = array("Q")
        self.sizes: array[int] = array("Q")
        self.states = bytearray()
        self.count = 0
        self.at = start  # the next header to read
        self.pending: tuple[int, int, bytes] | None = None  # a chunk waiting for its state
        self.done = False
        self.complete = True
        self.stop_reason: str | None = None
        self.stopped_at: int | None = None
        # A live walk whose window fails a header walks again once from the previous
        # window's first header (trusted in its own stop), in one stop: a chunk at a window's
        # edge may have been merged or reused between the two stops.
        self.retry = retry
        self.window_start: int | None = None
        self.resync: tuple[int, int] | None = None  # (walk again from, already emitted to)
        self.resyncs = 0

    def _stop(self, reason: str) -> None:
        self.done, self.complete, self.stopped_at, self.stop_reason = True, False, self.at, reason

    def _read(self, base: int, end: int) -> bytes:
        pages = self.ref.pages
        if pages is None:
            return self.mem.read_present(base, end - base)
        page = pages.page_bytes
        first = (base - pages.start) // page
        last = (end - 1 - pages.start) // page + 1
        return self.mem.read_present(base, end - base, pages.present[first:last])

    def read_window(self) -> tuple[int, bytes, int | None] | None:
        """The next window's bytes (inside a stop) and the arena's top at that moment: a
        WINDOW_BYTES piece, then more while the stop has lasted less than WINDOW_SECONDS (a
        stop of many threads costs more to make than a piece's read), up to WINDOW_MAX_BYTES."""
        if self.done:
            return None
        began = time.monotonic()
        base = self.at // glibc.MALLOC_ALIGNMENT * glibc.MALLOC_ALIGNMENT
        end = min(self.limit, base + WINDOW_BYTES)
        if self.resync is not None:
            base = self.resync[0]
            end = min(self.limit, self.resync[1] + WINDOW_BYTES)
        pieces = [self._read(base, end)]
        while (
            end < self.limit
            and end - base < WINDOW_MAX_BYTES
            and time.monotonic() - began < WINDOW_SECONDS
        ):
            more = min(self.limit, end + WINDOW_BYTES)
            pieces.append(self._read(end, more))
            end = more
        tail = min(self.limit, end + WINDOW_TAIL_BYTES)
        if tail > end:
            pieces.append(self._read(end, tail))
        return base, b"".join(pieces) if len(pieces) > 1 else pieces[0], self.top()

    def _present(self, address: int) -> bool:
        pages = self.ref.pages
        if pages is None:
            return True
        index = (address - pages.start) // pages.page_bytes
        return 0 <= index < len(pages.present) and pages.present[index] == 1

    def walk_window(self, base: int, data: bytes, top: int | None) -> None:
        """Walk the headers that lie in the window's first WINDOW_BYTES (after the stop)."""
        view = memoryview(data)
        words = view[: len(data) // 8 * 8].cast("Q")
        window_end = base + len(data)
        stop_at = window_end if window_end >= self.limit else window_end - WINDOW_TAIL_BYTES
        resync, self.resync = self.resync, None
        skip_until = 0
        if resync is not None:
            self.at, skip_until = resync
            self.pending = None
        entry_at = self.at
        addresses: list[int] = []
        sizes: list[int] = []
        states = bytearray()
        fast, keys, structs = self.fast, self.tcache.keys, self.tcache.structs
        pages = self.ref.pages
        all_present = pages is None or pages.all_resident
        top_at = -1 if top is None else top
        limit = self.limit
        add_address, add_size, add_state = addresses.append, sizes.append, states.append
        at = self.at
        while at < stop_at and at + 16 <= window_end:
            if not all_present and not self._present(at + 8):
                self.at = at
                self._stop("chunk header on a page not in memory (swapped out or not saved)")
                break
            index = (at - base) >> 3
            field = words[index + 1]
            size = field & ~7
            if self.pending is not None:
                p_at, p_size, p_bytes = self.pending
                self.pending = None
                seen = ChunkState.LIVE if field & _PREV_INUSE else ChunkState.FREE
                seen = self._refine(p_at, p_size, seen, p_bytes, fast, keys, structs)
                self._emit_one(p_at, p_size, seen, p_bytes)
            if at == top_at:
                self._record(addresses, sizes, states, at, size, ChunkState.TOP)
                at += size
                self.done = True
                break
            if size == _FENCEPOST_BYTES and at + 32 <= window_end:
                after = words[(at - base) // 8 + 3] & ~glibc.SIZE_FLAGS
                if after == 0:  # sysmalloc's closing fenceposts of a sub-heap it left
                    self._record(addresses, sizes, states, at, 16, ChunkState.BOOKKEEPING)
                    self._record(addresses, sizes, states, at + 16, 16, ChunkState.BOOKKEEPING)
                    at += 32
                    self.done = True
                    break
            following = at + size
            bad = size < 32 or size & 15 or following > limit
            if bad and resync is None and self.retry and self.window_start is not None:
                self.resync = (self.window_start, entry_at)
                self.resyncs += 1
                return
            if bad and (size < glibc.MINSIZE or size % glibc.MALLOC_ALIGNMENT):
                self.at = at
                self._stop(f"malloc(): invalid size (unsorted) at {at:#x}: size field {field:#x}")
                break
            if bad:
                self.at = at
                self._stop(
                    f"corrupted size vs. prev_size: chunk at {at:#x} of {size:#x} bytes "
                    f"runs past the heap's end {self.limit:#x}"
                )
                break
            if following <= skip_until:  # emitted before the walk went back
                at = following
                continue
            if following + 16 <= window_end:
                state: int
                if not words[index + (size >> 3) + 1] & _PREV_INUSE:
                    state = _FREE
                elif at in fast:
                    state = _FAST
                elif size <= _TCACHE_MAX_CHUNK and words[index + 3] in keys:
                    state = _TCACHE
                elif size in TCACHE_LAYOUTS:
                    state = self._refine(
                        at, size, ChunkState.LIVE, view[at - base :], fast, keys, structs
                    )
                else:
                    state = _LIVE
                add_address(at)
                add_size(size)
                add_state(state)
            else:
                # Its state is the next window's: keep its first bytes until then.
                self.pending = (at, size, bytes(view[at - base : at - base + WINDOW_TAIL_BYTES]))
            at = following
        if self.complete:  # a failed header left self.at at itself
            self.at = at
        if resync is not None and self.keep and addresses:
            # The chunks kept from the window before that this walk saw again.
            while self.addresses and self.addresses[-1] >= addresses[0]:
                self.addresses.pop()
                self.sizes.pop()
                self.states.pop()
                self.count -= 1
        if self.complete:
            self.window_start = entry_at
        if not self.done and at >= self.limit:
            self.done = True
            if self.pending is not None:  # the heap's last chunk: nothing follows
                p_at, p_size, p_bytes = self.pending
                self.pending = None
                self._emit_one(p_at, p_size, ChunkState.LIVE, p_bytes)
        self._emit(view, base, addresses, sizes, states)

    def _refine(
        self,
        at: int,
        size: int,
        state: ChunkState,
        body: bytes | memoryview,
        fast: set[int],
        keys: set[int],
        structs: set[int],
    ) -> ChunkState:
        if state != ChunkState.LIVE:
            return state
        if at in fast:
            return ChunkState.FAST
        if size <= _TCACHE_MAX_CHUNK and len(body) >= 32:
            if keys and int.from_bytes(body[24:32], "little") in keys:
                return ChunkState.TCACHE
            if size in TCACHE_LAYOUTS:
                if at in structs:
                    return ChunkState.BOOKKEEPING
                entries = tcache_struct(body, size)
                if entries is not None:
                    learn_key(self.mem, self.tcache, at, entries)
                    return ChunkState.BOOKKEEPING
        return state

    def _record(
        self,
        addresses: list[int],
        sizes: list[int],
        states: bytearray,
        at: int,
        size: int,
        state: ChunkState,
    ) -> None:
        addresses.append(at)
        sizes.append(size)
        states.append(state)

    def _emit_one(self, at: int, size: int, state: ChunkState, data: bytes) -> None:
        self._emit(memoryview(data), at, [at], [size], bytearray((state,)))

    def _emit(
        self,
        view: memoryview,
        base: int,
        addresses: list[int],
        sizes: list[int],
        states: bytearray,
    ) -> None:
        if not addresses:
            return
        self.count += len(addresses)
        if self.keep:
            self.addresses.extend(addresses)
            self.sizes.extend(sizes)
            self.states.extend(states)
        if self.visit is not None:
            self.visit(self.ref, view, base, addresses, sizes, states)

    def result(self, mapped_end: int) -> HeapChunks:
        if self.pending is not None:  # a walk cut short: its last chunk's state is unknown
            p_at, p_size, p_bytes = self.pending
            self.pending = None
            self._emit_one(p_at, p_size, ChunkState.LIVE, p_bytes)
        if not self.done:
            self._stop("walk not finished")
        return HeapChunks(
            arena=self.ref.arena,
            heap=self.ref.heap,
            start=self.start,
            mapped_end=mapped_end,
            addresses=self.addresses,
            sizes=self.sizes,
            states=bytes(self.states),
            complete=self.complete,
            stopped_at=self.stopped_at,
            stop_reason=self.stop_reason,
            chunk_count=self.count,
            walked_to=self.at,
        )
