"""One heap's chunks walked window by window, each window a copy read at one moment (in a
stop of the target, or from a core), with every header validated and each chunk's state
decided from the next chunk's PREV_INUSE bit and the free lists (sources.glibc.heap_chunks
drives it; the module there describes the walk).
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from memforensics.model import corruption as words
from memforensics.model import glibc
from memforensics.model.chunks import ChunkState, HeapChunks
from memforensics.sources import optional_native
from memforensics.sources.glibc.heap_lists import TCACHE_LAYOUTS, Tcache, learn_key, tcache_struct
from memforensics.sources.glibc.heapcopy import native_loop
from memforensics.sources.proc.cpu_quota import stop_reading_seconds
from memforensics.sources.proc.procmem import MemoryReader, PageMap, ProcessMemoryReader

WINDOW_BYTES = 1 << 20  # one stop reads this much of a heap (plus the tail): ~1 ms
WINDOW_MAX_BYTES = 16 << 20  # a stop reads at most this much (memforensics' memory bound)
WINDOW_SECONDS = 0.003  # a stop reads more pieces while it has lasted less than this
WINDOW_TAIL_BYTES = 4096  # read past a window's end, so a chunk near it shows its first bytes
# A held walk's window (every thread held for the whole walk: the proof's, a sweep in one
# stop): copied by two threads, walked and summed while it is in the CPU's cache (windows of
# 16 MiB were slower: each chunk's words fetched from RAM twice).
HELD_WINDOW_BYTES = 4 << 20
_PREV_INUSE = 0x1
_FENCEPOST_BYTES = 16  # CHUNK_HDR_SZ: sysmalloc closes a sub-heap it leaves with two
_TCACHE_MAX_CHUNK = 0x410  # the largest chunk tcache holds (64 bins of 16 bytes from 32)
_native = optional_native("memforensics.sources.glibc._heapwindow")
_LIVE, _FREE, _FAST, _TCACHE = (
    int(s) for s in (ChunkState.LIVE, ChunkState.FREE, ChunkState.FAST, ChunkState.TCACHE)
)
# Why a header loop stopped: native.headers' codes, and one of the Python loop's own.
_DONE, _RARE, _PENDING, _FULL = 0, 1, 2, 3  # the window's headers walked; a rare chunk at
# `at` (the top, fenceposts, a header that fails); a chunk ending past the window; output full
_ABSENT = 4  # a header on a page not present (only the Python loop walks such a heap)


@dataclass(frozen=True)
class ChunkRef:
    """Which heap a visited batch of chunks belongs to."""

    arena: int  # malloc_info's arena index; MMAPPED_ARENA for mmapped chunks
    heap: int
    pages: PageMap | None  # the heap's residency (None: every byte given was read)


def window_buffer(max_bytes: int = WINDOW_MAX_BYTES) -> bytearray:
    """A buffer that holds any window read_window makes (of walks whose windows are at most
    ``max_bytes``) but a walk gone back far: to be made once, before the first stop, and
    handed to every HeapWalk of a read in turn."""
    return bytearray(max_bytes + WINDOW_BYTES + WINDOW_TAIL_BYTES)


def held_window_buffer(headroom_bytes: int | None) -> bytearray:
    """A held walk's window buffer (windows of HELD_WINDOW_BYTES, fewer within
    ``headroom_bytes``: window_bytes_within), to be made before the hold."""
    return window_buffer(min(HELD_WINDOW_BYTES, window_bytes_within(headroom_bytes)))


def window_max_bytes_of(buffer: bytearray) -> int:
    """The most one window of a walk given window_buffer()'s ``buffer`` may read."""
    return len(buffer) - WINDOW_BYTES - WINDOW_TAIL_BYTES


# Of what our memory cgroup's limit leaves us, the share one window may take: the window's
# buffer, the small heaps' copies waiting for their walk (as much again) and the walk's
# arrays and picture must fit in it with room to spare.
_HEADROOM_SHARES = 8


def window_bytes_within(headroom_bytes: int | None) -> int:
    """The most one window may read: WINDOW_MAX_BYTES, at most 1/_HEADROOM_SHARES of
    ``headroom_bytes`` (own_cgroup.memory_headroom_bytes; None: no limit), at least
    WINDOW_BYTES."""
    if headroom_bytes is None:
        return WINDOW_MAX_BYTES
    return max(WINDOW_BYTES, min(WINDOW_MAX_BYTES, headroom_bytes // _HEADROOM_SHARES))


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


@dataclass
class _Window:
    """One window's state while HeapWalk.walk_window walks it (the walk's own state, carried
    from window to window, stays on HeapWalk): its bytes and bounds, and the chunks found in
    it, emitted when it is done."""

    data: bytes | memoryview  # the copy, as read (native.headers takes it)
    view: memoryview
    words: memoryview  # the copy as 8-byte words
    base: int  # the copy's first byte's address
    end: int  # the address after its last byte
    high: int  # the headers below this are this window's
    last_header: int  # a chunk whose next header lies above this waits for the next window
    top_at: int  # the arena's top (-1: unknown)
    all_present: bool  # every page of the heap is present (no header needs checking)
    # The first page of the window not in RAM (``end`` where there is none): the C loop walks
    # the headers before it, the Python loop (which checks each header's page) those after.
    present_until: int
    native: bool  # the common chunks are walked in C (those before present_until)
    skip_until: int  # a walk gone back: chunks ending at or below this were emitted before
    resync: tuple[int, int] | None  # this is a walk gone back (from, emitted to)
    entry_at: int  # the first header this window walks
    addresses: array[int] = field(default_factory=lambda: array("Q"))
    sizes: array[int] = field(default_factory=lambda: array("Q"))
    states: bytearray = field(default_factory=bytearray)

    def record(self, at: int, size: int, state: ChunkState) -> None:
        self.addresses.append(at)
        self.sizes.append(size)
        self.states.append(state)


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
        buffer: bytearray | None = None,
        window_max_bytes: int = WINDOW_MAX_BYTES,
        held: bool = False,
    ) -> None:
        self.mem, self.ref, self.start, self.limit = mem, ref, start, limit
        # ``held``: the caller holds every thread of the target for the whole walk (one
        # moment, not a stop per window): each window is read whole, by two threads of ours
        # (its CPUs are idle), through process_vm_readv where the target alone maps a page.
        self.held = held
        self.window_max_bytes = window_max_bytes  # what one window reads at most
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
        # glibc's words for the check a header failed (model.corruption's): None where the
        # walk stopped for another reason (a page not in RAM, not finished).
        self.stop_check: str | None = None
        # A live walk whose window fails a header walks again once from the previous
        # window's first header (trusted in its own stop), in one stop: a chunk at a window's
        # edge may have been merged or reused between the two stops.
        self.retry = retry
        self.window_start: int | None = None
        self.resync: tuple[int, int] | None = None  # (walk again from, already emitted to)
        self.resyncs = 0
        # The window's copy, reused from window to window (and from heap to heap when the
        # caller hands one in: window_buffer(), made outside any stop, where its pages are
        # faulted in: a first window that made its own spent ~10 ms of its stop doing so).
        self._buffer = buffer if buffer is not None else bytearray(0)
        self._out: tuple[array[int], array[int], bytearray] | None = None

    @property
    def buffer_bytes(self) -> int:
        """The bytes of this walk's copy buffer (its own, or the one handed in)."""
        return len(self._buffer)

    def _stop(self, reason: str) -> None:
        self.done, self.complete, self.stopped_at, self.stop_reason = True, False, self.at, reason

    def _read(self, into: memoryview, base: int, end: int) -> None:
        """[base, end) into ``into`` (``base`` page-aligned): its present pages read, the
        others zeros; through the optional C copy where it is built (one pread per run of
        present pages, in C)."""
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
            if self.held:
                held = (2, True, mem.pagemap_fd, False, mem.pid)
                native.copy(mem.mem_fd, into, base, memoryview(present), page, True, *held)
                return
            native.copy(mem.mem_fd, into, base, memoryview(present), page, True, 1)
            return
        into[:] = mem.read_present(base, end - base, present)

    def read_window(self) -> tuple[int, memoryview, int | None] | None:
        """The next window's bytes (inside a stop) and the arena's top at that moment: a
        WINDOW_BYTES piece, then more while the stop has lasted less than WINDOW_SECONDS (a
        stop of many threads costs more to make than a piece's read), up to window_max_bytes.
        The bytes are a view of this walk's one buffer: valid until the next window."""
        if self.done:
            return None
        began = time.monotonic()
        page = self.mem.page_bytes
        # From a page boundary (the C copy reads whole pages), not before the heap's pages.
        floor = self.ref.pages.start if self.ref.pages is not None else self.start
        base = max(self.at // page * page, floor)
        end = min(self.limit, base + WINDOW_BYTES)
        if self.held:
            end = self._held_end(base, end)
        if self.resync is not None:
            base = max(self.resync[0] // page * page, floor)
            end = min(self.limit, self.resync[1] + WINDOW_BYTES)
        # (Every read below ends at or before the heap's limit.)
        need = min(max(end - base, self.window_max_bytes) + WINDOW_BYTES, self.limit - base)
        need += WINDOW_TAIL_BYTES
        if len(self._buffer) < need:
            self._buffer = bytearray(need)
        view = memoryview(self._buffer)
        self._read(view[: end - base], base, end)
        while (
            not self.held  # (its window's end is _held_end's: all in RAM, or one piece)
            and end < self.limit
            and end - base < self.window_max_bytes
            and time.monotonic() - began < stop_reading_seconds(WINDOW_SECONDS)
        ):
            more = min(self.limit, end + WINDOW_BYTES)
            self._read(view[end - base : more - base], end, more)
            end = more
        tail = min(self.limit, end + WINDOW_TAIL_BYTES)
        if tail > end:
            self._read(view[end - base : tail - base], end, tail)
        return base, view[: tail - base], self.top()

    def _held_end(self, base: int, end: int) -> int:
        """A held walk's window end: grown from ``end`` a WINDOW_BYTES piece at a time, up to
        window_max_bytes, while the window's pages are all in RAM (a window with a page not
        in RAM is walked by the Python loop: it is kept to one piece)."""
        pages = self.ref.pages

        def whole(low: int, high: int) -> bool:
            return pages is None or pages.resident_bytes(low, high) == high - low

        if not whole(base, end):
            return end
        while end < self.limit and end - base < self.window_max_bytes:
            more = min(self.limit, end + WINDOW_BYTES)
            if not whole(end, more):
                break
            end = more
        return end

    def _present(self, address: int) -> bool:
        pages = self.ref.pages
        if pages is None:
            return True
        index = (address - pages.start) // pages.page_bytes
        return 0 <= index < len(pages.present) and pages.present[index] == 1

    def walk_window(self, base: int, data: bytes | memoryview, top: int | None) -> None:
        """Walk the headers that lie in the window's first WINDOW_BYTES (after the stop): the
        chunk the window before left, the common chunks in one loop (C where built), the rare
        one that loop stops at, then the window's chunks emitted."""
        window = self._open_window(base, data, top)
        self._carry_over(window)
        at = self._walk_headers(window)
        if at is None:  # a header failed: the window is read again from the one before
            return
        self._close_window(window, at)

    def _open_window(self, base: int, data: bytes | memoryview, top: int | None) -> _Window:
        """The window's fixed state; a walk gone back (resync) starts from where it went."""
        resync, self.resync = self.resync, None
        skip_until = 0
        if resync is not None:
            self.at, skip_until = resync
            self.pending = None
        view = memoryview(data)
        window_end = base + len(data)
        stop_at = window_end if window_end >= self.limit else window_end - WINDOW_TAIL_BYTES
        pages = self.ref.pages
        # (Per window, not per heap: one page not in RAM, often in a main heap's top, must
        # not send every window of the heap to the Python loop.)
        all_present = (
            pages is None
            or pages.all_resident
            or pages.resident_bytes(base, window_end) == window_end - base
        )
        present_until = window_end if all_present else _first_absent(pages, base, window_end)
        return _Window(
            data=data,
            view=view,
            words=view[: len(data) // 8 * 8].cast("Q"),
            base=base,
            end=window_end,
            high=min(stop_at, window_end - 15),  # at < high: the header lies in the window
            last_header=window_end - 16,
            top_at=-1 if top is None else top,
            all_present=all_present,
            present_until=present_until,
            native=present_until - base >= 64 and _native is not None,
            skip_until=skip_until,
            resync=resync,
            entry_at=self.at,
        )

    def _carry_over(self, w: _Window) -> None:
        """The chunk the window before left: its state is this first header's PREV_INUSE."""
        at = self.at
        if self.pending is None or at + 16 > w.end or not (w.all_present or self._present(at + 8)):
            return
        p_at, p_size, p_bytes = self.pending
        self.pending = None
        seen = ChunkState.LIVE if w.words[(at - w.base) // 8 + 1] & 1 else ChunkState.FREE
        seen = self._refine(
            p_at, p_size, seen, p_bytes, self.fast, self.tcache.keys, self.tcache.structs
        )
        self._emit_one(p_at, p_size, seen, p_bytes)

    def _walk_headers(self, w: _Window) -> int | None:
        """The window's headers from ``self.at``: the common chunks recorded in ``w`` by the
        loop (C or Python), the one it stopped at decided here. The address the walk got to;
        None when the window is to be read again (see _rare_header)."""
        if w.native:
            at, stop = self._native_headers(w, self.at)
            if not w.all_present and stop in (_DONE, _PENDING) and at < w.high:
                at, stop = self._python_headers(w, at)  # (from the first page not in RAM)
        else:
            at, stop = self._python_headers(w, self.at)
        if stop == _PENDING:
            # Its state is the next window's: keep its first bytes until then.
            offset = at - w.base
            size = w.words[(offset >> 3) + 1] & ~7
            self.pending = (at, size, bytes(w.view[offset : offset + WINDOW_TAIL_BYTES]))
            return at + size
        if stop == _ABSENT:
            self.at = at
            self._stop("chunk header on a page not in memory (swapped out or not saved)")
            return at
        if stop == _RARE:
            return self._rare_header(w, at)
        return at

    def _native_headers(self, w: _Window, at: int) -> tuple[int, int]:
        """The common chunks from ``at`` in C (native.headers), batch after batch while its
        output fills; a tcache_perthread_struct candidate it flags is checked here. (where
        it stopped, why): _DONE, _RARE or _PENDING."""
        assert _native is not None
        out = self._native_out(len(w.data))
        fast_arg = self.fast if self.fast else None
        keys_arg = tuple(self.tcache.keys)
        top_arg = w.top_at if w.top_at >= 0 else (1 << 64) - 1
        # (Before the first page not in RAM: a header there, or the next one a chunk's state
        # is read from, would read as zeros. The chunk whose next header lies past it comes
        # back as pending, for the Python loop.)
        high = min(w.high, w.present_until - 15)
        last_header = min(w.last_header, w.present_until - 16)
        while at < high:
            at, count, stop = _native.headers(
                w.data,
                w.base,
                at,
                high,
                last_header,
                self.limit,
                top_arg,
                w.skip_until,
                fast_arg,
                keys_arg,
                *out,
            )
            if count:
                self._take_batch(w, out, count)
            if stop == _DONE or at >= high:
                break
            if stop != _FULL:
                return at, stop
        return at, _DONE

    def _take_batch(
        self, w: _Window, out: tuple[array[int], array[int], bytearray], count: int
    ) -> None:
        """The C loop's ``count`` chunks into the window's arrays."""
        found = out[2][:count]
        if 255 in found:  # a tcache_perthread_struct candidate: checked here
            fast, keys, structs = self.fast, self.tcache.keys, self.tcache.structs
            for i in range(count):
                if found[i] == 255:
                    chunk, size = out[0][i], out[1][i]
                    found[i] = self._refine(
                        chunk, size, ChunkState.LIVE, w.view[chunk - w.base :], fast, keys, structs
                    )
        w.addresses.extend(out[0][:count])
        w.sizes.extend(out[1][:count])
        w.states.extend(found)

    def _python_headers(self, w: _Window, at: int) -> tuple[int, int]:
        """The common chunks from ``at`` in Python, as native.headers walks them (the tests
        compare the two), each with its state: (where it stopped, why): _DONE, _RARE,
        _PENDING, or _ABSENT (a header on a page not present: the C loop never sees one)."""
        words, base, view = w.words, w.base, w.view
        high, last_header, limit = w.high, w.last_header, self.limit
        top_at, skip_until = w.top_at, w.skip_until
        check_pages, present = not w.all_present, self._present
        fast, keys, structs = self.fast, self.tcache.keys, self.tcache.structs
        refine = self._refine
        add_address, add_size, add_state = w.addresses.append, w.sizes.append, w.states.append
        while at < high:
            if check_pages and not present(at + 8):
                return at, _ABSENT
            index = (at - base) >> 3
            size = words[index + 1] & ~7
            following = at + size
            if size < 32 or size & 15 or following > limit or at == top_at:
                return at, _RARE  # the top, a sub-heap's fenceposts, a header that fails
            if following <= skip_until:  # emitted before the walk went back
                at = following
                continue
            if following > last_header:
                return at, _PENDING
            state: int
            if not words[index + (size >> 3) + 1] & _PREV_INUSE:
                state = _FREE
            elif at in fast:
                state = _FAST
            elif size <= _TCACHE_MAX_CHUNK and words[index + 3] in keys:
                state = _TCACHE
            elif size in TCACHE_LAYOUTS:
                state = refine(at, size, ChunkState.LIVE, view[at - base :], fast, keys, structs)
            else:
                state = _LIVE
            add_address(at)
            add_size(size)
            add_state(state)
            at = following
        return at, _DONE

    def _rare_header(self, w: _Window, at: int) -> int | None:
        """The chunk at ``at`` the loop stopped at: the arena's top or a sub-heap's closing
        fenceposts (the heap's end: the address after them), else a header that fails. A
        live walk's window that fails one is read again once from the previous window's
        first header (None); else the failure ends the heap's walk (``at``)."""
        index = (at - w.base) >> 3
        size_field = w.words[index + 1]
        size = size_field & ~7
        if at == w.top_at:
            w.record(at, size, ChunkState.TOP)
            self.done = True
            return at + size
        if size == _FENCEPOST_BYTES and at + 32 <= w.end and not w.words[index + 3] & ~7:
            # sysmalloc's closing fenceposts of a sub-heap it left
            w.record(at, 16, ChunkState.BOOKKEEPING)
            w.record(at + 16, 16, ChunkState.BOOKKEEPING)
            self.done = True
            return at + 32
        if size_field == _PREV_INUSE and (at + 16) % self.mem.page_bytes == 0:
            # The same, where the old top kept 16 bytes: sysmalloc made it a 32-byte chunk in
            # use, so only the last fencepost (size 0, PREV_INUSE) follows, ending the heap.
            w.record(at, 16, ChunkState.BOOKKEEPING)
            self.done = True
            return at + 16
        if w.resync is None and self.retry and self.window_start is not None:
            self.resync = (self.window_start, w.entry_at)
            self.resyncs += 1
            return None
        self.at = at
        if size < glibc.MINSIZE or size % glibc.MALLOC_ALIGNMENT:
            self.stop_check = words.UNSORTED_SIZE
            self._stop(f"{words.UNSORTED_SIZE} at {at:#x}: size field {size_field:#x}")
        else:
            self.stop_check = words.SIZE_VS_PREV_SIZE
            self._stop(
                f"{words.SIZE_VS_PREV_SIZE}: chunk at {at:#x} of {size:#x} bytes "
                f"runs past the heap's end {self.limit:#x}"
            )
        return at

    def _close_window(self, w: _Window, at: int) -> None:
        """The walk's position after the window, and the window's chunks emitted."""
        if self.complete:  # a failed header left self.at at itself
            self.at = at
            self.window_start = w.entry_at
        if w.resync is not None and self.keep and w.addresses:
            # The chunks kept from the window before that this walk saw again.
            first = w.addresses[0]
            while self.addresses and self.addresses[-1] >= first:
                self.addresses.pop()
                self.sizes.pop()
                self.states.pop()
                self.count -= 1
        if not self.done and at >= self.limit:
            self.done = True
            self._flush_pending()  # the heap's last chunk: nothing follows
        self._emit(w.view, w.base, w.addresses, w.sizes, w.states)

    def _flush_pending(self) -> None:
        """The chunk waiting for its state emitted LIVE: no chunk follows it."""
        if self.pending is not None:
            p_at, p_size, p_bytes = self.pending
            self.pending = None
            self._emit_one(p_at, p_size, ChunkState.LIVE, p_bytes)

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

    def result(self, mapped_end: int, unfinished: str = "walk not finished") -> HeapChunks:
        """The chunks walked; a walk not done ends here, ``unfinished`` its stop_reason."""
        self._flush_pending()  # a walk cut short: its last chunk's state is unknown
        if not self.done:
            self._stop(unfinished)
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


def _first_absent(pages: PageMap | None, low: int, high: int) -> int:
    """The first address of [low, high) on a page ``pages`` has not in RAM (a page past its
    map counts as not in RAM, as HeapWalk._present has it); ``high`` where there is none."""
    if pages is None:
        return high
    size, present = pages.page_bytes, pages.present
    first = max((low - pages.start) // size, 0)
    last = (high - 1 - pages.start) // size + 1  # (the pages [low, high) touches)
    index = present.find(0, first, min(last, len(present)))
    if index < 0:
        if last <= len(present):
            return high
        index = len(present)
    return max(low, pages.start + index * size)
