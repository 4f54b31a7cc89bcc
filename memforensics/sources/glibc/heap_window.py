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
from memforensics.sources import optional_native
from memforensics.sources.glibc.heap_lists import TCACHE_LAYOUTS, Tcache, learn_key, tcache_struct
from memforensics.sources.glibc.heapcopy import native_loop
from memforensics.sources.proc.procmem import MemoryReader, PageMap, ProcessMemoryReader

WINDOW_BYTES = 1 << 20  # one stop reads this much of a heap (plus the tail): ~1 ms
WINDOW_MAX_BYTES = 16 << 20  # a stop reads at most this much (memforensics' memory bound)
WINDOW_SECONDS = 0.003  # a stop reads more pieces while it has lasted less than this
WINDOW_TAIL_BYTES = 4096  # read past a window's end, so a chunk near it shows its first bytes
_PREV_INUSE = 0x1
_FENCEPOST_BYTES = 16  # CHUNK_HDR_SZ: sysmalloc closes a sub-heap it leaves with two
_TCACHE_MAX_CHUNK = 0x410  # the largest chunk tcache holds (64 bins of 16 bytes from 32)
_native = optional_native("memforensics.sources.glibc._heapwindow")
_LIVE, _FREE, _FAST, _TCACHE = (
    int(s) for s in (ChunkState.LIVE, ChunkState.FREE, ChunkState.FAST, ChunkState.TCACHE)
)


@dataclass(frozen=True)
class ChunkRef:
    """Which heap a visited batch of chunks belongs to."""

    arena: int  # malloc_info's arena index; MMAPPED_ARENA for mmapped chunks
    heap: int
    pages: PageMap | None  # the heap's residency (None: every byte given was read)


def first_words(view: memoryview, base: int, addresses: Sequence[int]) -> array[int]:
    """Each chunk's first data word (at its address + 16) out of ``view`` (the window copy
    starting at ``base``), 0 where it lies outside: one C pass where built."""
    wanted = addresses if isinstance(addresses, array) else array("Q", addresses)
    out: array[int] = array("Q", bytes(8 * len(wanted)))
    if _native is not None:
        _native.first_words(view, base, wanted, out)
        return out
    size = len(view)
    for i, address in enumerate(wanted):
        offset = address + 16 - base
        if offset >= 0 and offset + 8 <= size:
            out[i] = int.from_bytes(view[offset : offset + 8], "little")
    return out


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
        self._buffer = bytearray(0)  # the window's copy, reused from window to window
        self._out: tuple[array[int], array[int], bytearray] | None = None

    def _stop(self, reason: str) -> None:
        self.done, self.complete, self.stopped_at, self.stop_reason = True, False, self.at, reason

    def _read(self, into: memoryview, base: int, end: int) -> None:
        """[base, end) into ``into`` (``base`` page-aligned): its present pages read, the
        others zeros; with process_vm_readv through the optional C copy where it is built
        (six times /proc/PID/mem's speed here: the stop is that much shorter)."""
        pages = self.ref.pages
        if pages is None:
            into[:] = self.mem.read_present(base, end - base)
            return
        page = pages.page_bytes
        first = (base - pages.start) // page
        last = (end - 1 - pages.start) // page + 1
        present = pages.present[first:last]
        mem = self.mem
        native = native_loop()
        if native is not None and isinstance(mem, ProcessMemoryReader) and base % page == 0:
            _, usable = native.copy(
                mem.pid,
                mem.mem_fd,
                into,
                base,
                memoryview(present),
                page,
                mem.vm_readv_usable,
                True,
                1,
            )
            if not usable:
                mem.vm_readv_usable = False
            return
        into[:] = mem.read_present(base, end - base, present)

    def read_window(self) -> tuple[int, memoryview, int | None] | None:
        """The next window's bytes (inside a stop) and the arena's top at that moment: a
        WINDOW_BYTES piece, then more while the stop has lasted less than WINDOW_SECONDS (a
        stop of many threads costs more to make than a piece's read), up to WINDOW_MAX_BYTES.
        The bytes are a view of this walk's one buffer: valid until the next window."""
        if self.done:
            return None
        began = time.monotonic()
        page = self.mem.page_bytes
        # From a page boundary (the C copy reads whole pages), not before the heap's pages.
        floor = self.ref.pages.start if self.ref.pages is not None else self.start
        base = max(self.at // page * page, floor)
        end = min(self.limit, base + WINDOW_BYTES)
        if self.resync is not None:
            base = max(self.resync[0] // page * page, floor)
            end = min(self.limit, self.resync[1] + WINDOW_BYTES)
        need = max(end - base, WINDOW_MAX_BYTES) + WINDOW_BYTES + WINDOW_TAIL_BYTES
        if len(self._buffer) < need:
            self._buffer = bytearray(need)
        view = memoryview(self._buffer)
        self._read(view[: end - base], base, end)
        while (
            end < self.limit
            and end - base < WINDOW_MAX_BYTES
            and time.monotonic() - began < WINDOW_SECONDS
        ):
            more = min(self.limit, end + WINDOW_BYTES)
            self._read(view[end - base : more - base], end, more)
            end = more
        tail = min(self.limit, end + WINDOW_TAIL_BYTES)
        if tail > end:
            self._read(view[end - base : tail - base], end, tail)
        return base, view[: tail - base], self.top()

    def _present(self, address: int) -> bool:
        pages = self.ref.pages
        if pages is None:
            return True
        index = (address - pages.start) // pages.page_bytes
        return 0 <= index < len(pages.present) and pages.present[index] == 1

    def walk_window(self, base: int, data: bytes | memoryview, top: int | None) -> None:
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
        addresses: array[int] = array("Q")
        sizes: array[int] = array("Q")
        states = bytearray()
        fast, keys, structs = self.fast, self.tcache.keys, self.tcache.structs
        pages = self.ref.pages
        all_present = pages is None or pages.all_resident
        top_at = -1 if top is None else top
        limit = self.limit
        add_address, add_size, add_state = addresses.append, sizes.append, states.append
        at = self.at
        # The chunk the window before left: its state is this first header's PREV_INUSE.
        if (
            self.pending is not None
            and at + 16 <= window_end
            and (all_present or self._present(at + 8))
        ):
            p_at, p_size, p_bytes = self.pending
            self.pending = None
            seen = ChunkState.LIVE if words[(at - base) // 8 + 1] & 1 else ChunkState.FREE
            seen = self._refine(p_at, p_size, seen, p_bytes, fast, keys, structs)
            self._emit_one(p_at, p_size, seen, p_bytes)
        high = min(stop_at, window_end - 15)  # at < high: the header lies in the window
        last_header = window_end - 16
        native = _native if all_present and len(data) >= 64 else None
        if native is not None:
            out = self._native_out(len(data))
            fast_arg = fast if fast else None
            keys_arg = tuple(keys)
            top_arg = top_at if top_at >= 0 else (1 << 64) - 1
        while at < high:
            if native is not None:
                # The common chunks in C; the rare one it stops at is the Python code's.
                at, count, stopped = native.headers(
                    data,
                    base,
                    at,
                    high,
                    last_header,
                    limit,
                    top_arg,
                    skip_until,
                    fast_arg,
                    keys_arg,
                    *out,
                )
                if count:
                    found = out[2][:count]
                    if 255 in found:  # a tcache_perthread_struct candidate: checked here
                        for i in range(count):
                            if found[i] == 255:
                                chunk, size = out[0][i], out[1][i]
                                found[i] = self._refine(
                                    chunk,
                                    size,
                                    ChunkState.LIVE,
                                    view[chunk - base :],
                                    fast,
                                    keys,
                                    structs,
                                )
                    addresses.extend(out[0][:count])
                    sizes.extend(out[1][:count])
                    states.extend(found)
                if stopped == 0 or at >= high:
                    break
                if stopped == 3:
                    continue
            if not all_present and not self._present(at + 8):
                self.at = at
                self._stop("chunk header on a page not in memory (swapped out or not saved)")
                break
            index = (at - base) >> 3
            size = words[index + 1] & ~7
            following = at + size
            if size < 32 or size & 15 or following > limit or at == top_at:
                # The rare cases: the top, a sub-heap's fenceposts, a header that fails.
                if at == top_at:
                    self._record(addresses, sizes, states, at, size, ChunkState.TOP)
                    at += size
                    self.done = True
                    break
                if size == _FENCEPOST_BYTES and at + 32 <= window_end and not words[index + 3] & ~7:
                    # sysmalloc's closing fenceposts of a sub-heap it left
                    self._record(addresses, sizes, states, at, 16, ChunkState.BOOKKEEPING)
                    self._record(addresses, sizes, states, at + 16, 16, ChunkState.BOOKKEEPING)
                    at += 32
                    self.done = True
                    break
                if resync is None and self.retry and self.window_start is not None:
                    self.resync = (self.window_start, entry_at)
                    self.resyncs += 1
                    return
                self.at = at
                if size < glibc.MINSIZE or size % glibc.MALLOC_ALIGNMENT:
                    field = words[index + 1]
                    self._stop(
                        f"malloc(): invalid size (unsorted) at {at:#x}: size field {field:#x}"
                    )
                else:
                    self._stop(
                        f"corrupted size vs. prev_size: chunk at {at:#x} of {size:#x} bytes "
                        f"runs past the heap's end {self.limit:#x}"
                    )
                break
            if following < skip_until:  # emitted before the walk went back
                at = following
                continue
            if following <= last_header:
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

    def _native_out(self, window_bytes: int) -> tuple[array[int], array[int], bytearray]:
        """The C walk's output buffers, big enough for a window of ``window_bytes``."""
        need = window_bytes // glibc.MINSIZE + 1
        if self._out is None or len(self._out[2]) < need:
            self._out = (array("Q", bytes(8 * need)), array("Q", bytes(8 * need)), bytearray(need))
        return self._out

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
        addresses: array[int],
        sizes: array[int],
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
        addresses: Sequence[int],
        sizes: Sequence[int],
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
