"""The stand-in call's guard (rule 8): before malloc_info is called into arenas no read
could follow (lists too long, locked at every stop, busy), each is proved, in the call's own
hold of every thread, to let malloc_info's loops end; a heap that fails is named corrupt and
nothing is called. Nothing is kept per chunk, whatever the lists' length.

Contract:
- The arena is held still for the whole proof (every thread stopped, no arena locked, no
  thread in the allocator: the call's moment); a check that fails is corruption.
- Nodes: the arena's 127 bin heads and its free chunks, a free chunk being one whose next
  chunk's PREV_INUSE bit is clear (the top apart), found by walking the arena's heaps header
  by header with every header validated (heap_window.HeapWalk). Over the nodes, the set of
  pairs (c, c->fd) equals the set of pairs (d->bk, d) exactly when every fd leads to a node
  whose bk names it back. fd is then a one-to-one map of the nodes onto themselves, so
  following fd from any bin's head, as malloc_info's loop does, comes back to that head
  through nodes only: the loop ends, reading only the arena's heaps and malloc_state.
- The two sets are compared by their sums (mod 2**64) under a keyed 64-bit hash whose keys
  are drawn from os.urandom for each proof: equal sets give equal sums; a difference the
  keys do not know gives equal sums with a chance of about 2**-64. Where the sums differ,
  the sums per stretch of the heaps (by each pair's first address) say where; the free
  chunks of the first stretch that differs are looked at again one by one, and the first
  whose links do not name it back is the finding (else the stretch itself is named).
- The fastbins (singly linked: malloc_info follows each to NULL, and aborts the target on a
  misaligned chunk) and the top are read by the ordinary walk of an arena, with its checks.
- A thread arena's heaps are found from its top through heap_info's prev links, as
  malloc_info sums them; a chain that comes back to a heap, or leaves the arena, is corrupt.
- What the proof cannot look at (a header, or a free chunk's links, on a page not in RAM; a
  main arena that fell back to mmap; its time run out) leaves the arena unproved
  (``Proof.unproved``): no call. A page not in RAM is never read (it would be brought back
  from swap), and its zeros are never taken for words.
- Our memory: the window buffer and 16 bytes per stretch (at most _MAX_STRETCHES); time:
  one read of the arena's heaps (a second one only on a heap found corrupt).
- The hold is bounded as a sweep in one stop is (bin_relay.one_stop_seconds: at most
  ONE_STOP_MAX_SECONDS, less under a CPU quota): arenas whose heaps' bytes in RAM, at
  PROOF_BYTES_PER_SECOND, come to more are not walked (``hold_refusal``, before the hold
  and again in it), and a walk that runs past the bound is cut there; either leaves them
  unproved, and nothing is called.
"""

from __future__ import annotations

import os
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from memforensics.model import corruption as words
from memforensics.model.chunks import ChunkState
from memforensics.model.corruption import HeapCorruption, bin_name
from memforensics.model.glibc import SIZE_FLAGS, bin_index
from memforensics.model.heapscan import HeapScan
from memforensics.sources import optional_native
from memforensics.sources.glibc.bin_relay import (
    fastbins_and_top,
    one_stop_seconds,
    past_one_stop,
)
from memforensics.sources.glibc.glibc_arenas import ArenaState, Heap, heaps_from_top, read_state
from memforensics.sources.glibc.heap_checks import bin_head, list_check
from memforensics.sources.glibc.heap_lists import Tcache
from memforensics.sources.glibc.heap_window import (
    ChunkRef,
    HeapWalk,
    held_window_buffer,
    window_max_bytes_of,
)
from memforensics.sources.glibc.list_sweep import first_chunk
from memforensics.sources.proc.own_cgroup import memory_headroom_bytes
from memforensics.sources.proc.procmem import MemoryReader, PageMap

_FREE = int(ChunkState.FREE)
# Optional C (the numpy below the fallback, tested against it): a window's link sums.
_native = optional_native("memforensics.sources.glibc._heapwindow")
_NBINS = 128
# Stretches the sums are kept for: two arrays of 8 bytes each, 256 KiB at most (they stay in
# the CPU's cache: each free chunk adds to one at a random place).
_MAX_STRETCHES = 1 << 14
_STRETCH_MIN_SHIFT = 12  # a stretch is a page at least
_MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))  # splitmix64's
# What the proof's hold is judged to walk a second (its heaps' bytes in RAM): about half what
# it walks on a 2-CPU VM (1.2 GiB of heap, 3.1 million free chunks, in 0.26-0.48 s).
PROOF_BYTES_PER_SECOND = 2 << 30


@dataclass(frozen=True)
class ProofTarget:
    """An arena to prove: its number in malloc_info's order and its malloc_state."""

    number: int
    address: int
    is_main: bool


def unread_arenas(scan: HeapScan) -> tuple[tuple[ProofTarget, ...], int | None]:
    """The arenas a refused read left without malloc_info's figures (to be proved before a
    call), and mp_'s sbrk_base as that read found it (None: not found)."""
    targets = tuple(
        ProofTarget(number, arena.address, arena.is_main)
        for number, arena in enumerate(scan.arenas)
        if arena.figures is None and arena.address is not None
    )
    params = scan.malloc_params
    return targets, (params.sbrk_base or None) if params is not None else None


@dataclass
class Proof:
    """What proving the arenas found: a corruption (the first), or why an arena was left
    unproved; neither when every arena's lists close. ``heap_bytes``: the bytes walked."""

    corruption: HeapCorruption | None = None
    unproved: str | None = None
    out_of_time: bool = False  # (of unproved: the deadline came first)
    past_bound: bool = False  # (of unproved: the hold's bound, see the module)
    heap_bytes: int = 0
    seconds: float = 0.0

    @property
    def proved(self) -> bool:
        return self.corruption is None and self.unproved is None


def _mixed(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))
    x = x * _MIX[0]
    x = x ^ (x >> np.uint64(27))
    x = x * _MIX[1]
    mixed: np.ndarray = x ^ (x >> np.uint64(31))
    return mixed


class _Sums:
    """The keyed sums of the pairs (c, c->fd) (``left``) and (d->bk, d) (``right``), per
    stretch of the heaps by the pair's first address; stretch ``outside`` takes every
    address in no heap (the bin heads of main_arena, a wild pointer)."""

    def __init__(self, heaps: Sequence[Heap]) -> None:
        spans = sorted((h.start, h.start + h.size_bytes) for h in heaps)
        total = sum(end - start for start, end in spans)
        shift = _STRETCH_MIN_SHIFT
        while total >> shift > _MAX_STRETCHES - len(spans):
            shift += 1
        self.shift = shift
        self.starts = np.array([s for s, _ in spans], dtype=np.uint64)
        self.ends = np.array([e for _, e in spans], dtype=np.uint64)
        counts = [((end - start) >> shift) + 1 for start, end in spans]
        self.first = np.array(np.cumsum([0, *counts[:-1]]), dtype=np.int64)
        self.outside = int(sum(counts))
        self.keys = np.frombuffer(os.urandom(16), dtype=np.uint64)
        self.left = np.zeros(self.outside + 1, dtype=np.uint64)
        self.right = np.zeros(self.outside + 1, dtype=np.uint64)
        self.sides = (self.left, self.right)

    def stretch(self, addresses: np.ndarray) -> np.ndarray:
        """Each address's stretch (``outside`` where it lies in no heap)."""
        heap = np.searchsorted(self.starts, addresses, side="right").astype(np.int64) - 1
        found = np.full(len(addresses), self.outside, dtype=np.int64)
        inside = heap >= 0
        inside[inside] = addresses[inside] < self.ends[heap[inside]]
        h = heap[inside]
        offset = (addresses[inside] - self.starts[h]) >> np.uint64(self.shift)
        found[inside] = self.first[h] + offset.astype(np.int64)
        return found

    def span(self, stretch: int) -> tuple[int, int]:
        """[low, high) of a stretch (not ``outside``)."""
        heap = int(np.searchsorted(self.first, stretch, side="right")) - 1
        low = int(self.starts[heap]) + ((stretch - int(self.first[heap])) << self.shift)
        return low, min(low + (1 << self.shift), int(self.ends[heap]))

    def add(
        self, firsts: np.ndarray, seconds: np.ndarray, side: np.ndarray, by: np.ndarray
    ) -> None:
        """The pairs (firsts[i], seconds[i]) added to ``side``, each at the stretch of
        by[i] (its first address)."""
        hashed = _mixed(_mixed(firsts ^ self.keys[0]) + (seconds ^ self.keys[1]))
        np.add.at(side, self.stretch(by), hashed)

    def first_difference(self) -> int | None:
        differ = np.flatnonzero(self.left != self.right)
        return int(differ[0]) if len(differ) else None


class _FreeLinks:
    """The visitor of a proof's walk: each free chunk's pair added to the sums (``sums``),
    or, in a second walk, the free chunks of one stretch kept (``keep``: [low, high))."""

    def __init__(self, mem: MemoryReader, sums: _Sums, keep: tuple[int, int] | None = None):
        self.mem, self.sums, self.keep = mem, sums, keep
        self.kept: list[int] = []
        # A free chunk whose fd or bk lies on a page not in RAM (swapped out): its links were
        # not read (they read as zeros), so its arena cannot be proved. The first one.
        self.unread: int | None = None

    def visit(
        self,
        ref: ChunkRef,
        view: memoryview,
        base: int,
        addresses: Sequence[int],
        sizes: Sequence[int],
        states: bytes | bytearray,
    ) -> None:
        sums = self.sums
        pages = ref.pages
        whole = pages is None or pages.resident_bytes(base, base + len(view)) == len(view)
        if _native is not None and self.keep is None and whole:  # (the window's chunks in C)
            wanted = addresses if isinstance(addresses, array) else array("Q", addresses)
            keys = (int(sums.keys[0]), int(sums.keys[1]))
            fields = (sums.starts, sums.ends, sums.first, sums.shift, *keys)
            if not _native.link_sums(view, base, wanted, states, _FREE, *fields, *sums.sides):
                return  # (else those past the copy, below)
        free = np.frombuffer(states, dtype=np.uint8) == _FREE
        if not free.any():
            return
        at = np.asarray(addresses, dtype=np.uint64)[free]
        if self.keep is not None:
            low, high = self.keep
            self.kept += [int(a) for a in at if low <= int(a) < high]
            return
        if not whole and pages is not None:
            unread = _links_not_in_ram(at, pages)
            if len(unread):
                self.unread = int(unread[0]) if self.unread is None else self.unread
                return
        inside = (at >= np.uint64(base)) & (at - np.uint64(base) + np.uint64(32) <= len(view))
        if _native is not None and whole:
            at, inside = at[~inside], inside[~inside]
        memory = np.frombuffer(view[: len(view) // 8 * 8], dtype=np.uint64)
        slot = ((at[inside] - np.uint64(base)) // np.uint64(8)).astype(np.int64)
        fd = np.zeros(len(at), dtype=np.uint64)
        bk = np.zeros(len(at), dtype=np.uint64)
        fd[inside], bk[inside] = memory[slot + 2], memory[slot + 3]
        for i in np.flatnonzero(~inside):  # (past the copy: a chunk emitted alone)
            fd[i], bk[i] = _linked(self.mem, int(at[i])) or (0, 0)
        self.sums.add(at, fd, self.sums.left, at)
        self.sums.add(bk, at, self.sums.right, bk)


def proof_buffer() -> bytearray:
    """The proof's window buffer, within what our cgroup's limit leaves us, its pages faulted
    in: to be made before the hold (a fresh 5 MiB buffer faulted in costs it ~3-10 ms)."""
    return held_window_buffer(memory_headroom_bytes())


def prove_arenas(
    mem: MemoryReader,
    targets: Sequence[ProofTarget],
    *,
    brk: tuple[int, int] | None,
    sbrk_base: int | None,
    deadline: float,
    buffer: bytearray | None = None,
) -> Proof:
    """Each arena of ``targets`` proved (see the module), in memory held still; the first
    corruption found, or the first arena left unproved, ends it. ``brk``: the main heap's
    extent now; ``sbrk_base``: mp_'s, where the main arena's chunks begin. ``buffer``:
    proof_buffer(), made before the hold (None: made now)."""
    began = time.monotonic()
    proof = Proof()
    buffer = buffer if buffer is not None else proof_buffer()
    found = _arenas_now(mem, targets, brk, proof)
    if found is None:
        proof.seconds = time.monotonic() - began
        return proof
    bound = one_stop_seconds()
    proof.unproved = _too_long([heaps for _, _, heaps in found])
    proof.past_bound = proof.unproved is not None
    cut = began + bound
    for target, state, heaps in found if proof.unproved is None else ():
        _prove(mem, state, heaps, target, sbrk_base, min(deadline, cut), buffer, proof)
        if proof.unproved is not None and deadline > cut <= time.monotonic():
            # (Cut by the bound, not the deadline: whatever stopped there, the fastbins' walk
            # or the heaps', stopped for want of time.)
            proof.out_of_time, proof.past_bound = False, True
            proof.unproved = f"their walk was cut at {bound:g} s with every thread held"
        if not proof.proved:
            break
    proof.seconds = time.monotonic() - began
    return proof


def hold_refusal(
    mem: MemoryReader, targets: Sequence[ProofTarget], brk: tuple[int, int] | None
) -> str | None:
    """Before the hold, the target running: why ``targets`` would not be walked in it (their
    heaps' bytes in RAM past the hold's bound, see the module); None where they may be (the
    proof judges again, in the hold, from the heaps as they are then)."""
    found = _arenas_now(mem, targets, brk, Proof())
    if found is None:
        return None  # (the proof, in the hold, says what is wrong)
    return _too_long([heaps for _, _, heaps in found])


def _arenas_now(
    mem: MemoryReader,
    targets: Sequence[ProofTarget],
    brk: tuple[int, int] | None,
    proof: Proof,
) -> list[tuple[ProofTarget, ArenaState, list[Heap]]] | None:
    """Each target's malloc_state and heaps (with their residency) as they are now; None
    (``proof`` says why) where one cannot be read or its heaps found."""
    found = []
    for target in targets:
        state = read_state(mem, target.address)
        if state is None:
            proof.unproved = f"arena {target.number}'s malloc_state could not be read"
            return None
        heaps = _heaps(mem, state, target, brk, proof)
        if heaps is None:
            return None
        found.append((target, state, heaps))
    return found


def _too_long(arenas: Sequence[Sequence[Heap]]) -> str | None:
    """Why the heaps of ``arenas`` are not walked in the hold (bin_relay.past_one_stop, at
    PROOF_BYTES_PER_SECOND); None where they fit."""
    why = past_one_stop([h for heaps in arenas for h in heaps], PROOF_BYTES_PER_SECOND)
    return None if why is None else f"their {why}"


def _heaps(
    mem: MemoryReader,
    state: ArenaState,
    target: ProofTarget,
    brk: tuple[int, int] | None,
    proof: Proof,
) -> list[Heap] | None:
    """The arena's heaps now, with their pages in RAM; None (``proof`` says why) where they
    cannot be found or their chain is corrupt."""
    if target.is_main:
        if state.noncontiguous or brk is None:
            proof.unproved = "the main arena's heap is not one brk region (sbrk failed once)"
            return None
        heaps = [Heap(brk[0], 0, brk[1] - brk[0], brk[1] - brk[0])]
    else:
        heaps = heaps_from_top(mem, state)
        starts = {h.start for h in heaps}
        if not heaps or len(starts) != len(heaps):
            why = "its heap_info chain comes back to a heap" if heaps else "a heap_info is not its"
            proof.corruption = HeapCorruption(
                state.address, "heap", state.top, words.OUTSIDE_HEAPS, why
            )
            return None
    for heap in heaps:
        end = heap.start + (heap.size_bytes if target.is_main else heap.mprotect_bytes)
        heap.pages = mem.pagemap(heap.start, end)
    return heaps


_OUT_OF_TIME = "the time ran out before its heaps were walked"


def _walks(
    mem: MemoryReader,
    state: ArenaState,
    heaps: Sequence[Heap],
    target: ProofTarget,
    sbrk_base: int | None,
    visitor: _FreeLinks,
    buffer: bytearray,
    deadline: float,
) -> HeapWalk | str | None:
    """Every heap of the arena walked with ``visitor``: None when each walk was complete, the
    walk that failed a header, or why one could not go on (its time, a page not in RAM)."""
    for index, heap in enumerate(sorted(heaps, key=lambda h: h.start)):
        start = first_chunk(state, heap, heaps, target.is_main, sbrk_base)
        limit = heap.start + (heap.size_bytes if target.is_main else heap.mprotect_bytes)
        walk = HeapWalk(
            mem,
            ChunkRef(target.number, index, heap.pages),
            start,
            limit,
            lambda: state.top,
            set(),
            Tcache(keys=set(), structs=set()),
            visitor.visit,
            keep=False,
            buffer=buffer,
            window_max_bytes=window_max_bytes_of(buffer),
            held=True,
        )
        while not walk.done:
            if time.monotonic() > deadline:
                return _OUT_OF_TIME
            window = walk.read_window()
            if window is None:
                break
            walk.walk_window(*window)
        if not walk.complete:
            if walk.stop_check is None:
                return f"its walk stopped: {walk.stop_reason or 'a header on a page not in RAM'}"
            return walk
    return None


def _prove(
    mem: MemoryReader,
    state: ArenaState,
    heaps: list[Heap],
    target: ProofTarget,
    sbrk_base: int | None,
    deadline: float,
    buffer: bytearray,
    proof: Proof,
) -> None:
    fast = _fastbins(mem, state, heaps, target, deadline)
    if fast is not None:
        if isinstance(fast, HeapCorruption):
            proof.corruption = fast
        else:
            proof.unproved = f"arena {target.number}: {fast}"
        return
    sums = _Sums(heaps)
    heads = np.array([bin_head(state, i) for i in range(1, _NBINS)], dtype=np.uint64)
    head_fd = np.array(state.bins[0::2], dtype=np.uint64)
    head_bk = np.array(state.bins[1::2], dtype=np.uint64)
    sums.add(heads, head_fd, sums.left, heads)
    sums.add(head_bk, heads, sums.right, head_bk)
    links = _FreeLinks(mem, sums)
    walked = _walks(mem, state, heaps, target, sbrk_base, links, buffer, deadline)
    proof.heap_bytes += sum(h.size_bytes for h in heaps)
    if walked is None and links.unread is not None:
        walked = f"the links of the free chunk at {links.unread:#x} lie on a page not in RAM"
    if isinstance(walked, str):
        proof.unproved = f"arena {target.number}: {walked}"
        proof.out_of_time = walked is _OUT_OF_TIME
        return
    if walked is not None:
        assert walked.stop_check is not None and walked.stopped_at is not None
        proof.corruption = HeapCorruption(
            state.address, "heap", walked.stopped_at, walked.stop_check, walked.stop_reason or ""
        )
        return
    stretch = sums.first_difference()
    if stretch is None:
        return
    proof.corruption = _named(mem, state, heaps, target, sbrk_base, sums, stretch, buffer, deadline)


def _fastbins(
    mem: MemoryReader,
    state: ArenaState,
    heaps: list[Heap],
    target: ProofTarget,
    deadline: float,
) -> HeapCorruption | str | None:
    """The fastbins and the top read by the ordinary walk: its first corruption, or why they
    could not be followed; None when they read whole."""
    walk = fastbins_and_top(mem, heaps, state, target.is_main, deadline, None)
    if walk.corruption:
        return walk.corruption[0]
    if 0 in walk.unmeasured_bins or walk.fastbin_chunks is None:
        return "its fastbins could not be followed to their end"
    return None


def _named(
    mem: MemoryReader,
    state: ArenaState,
    heaps: list[Heap],
    target: ProofTarget,
    sbrk_base: int | None,
    sums: _Sums,
    stretch: int,
    buffer: bytearray,
    deadline: float,
) -> HeapCorruption:
    """The finding where the sums differ at ``stretch``: the first free chunk (or bin head)
    there whose neighbours do not name it back, found in a second walk; else the stretch
    (also where that walk could not finish, its time within the hold's bound gone: the heap
    is corrupt all the same, the chunk is then only known to lie in the stretch)."""
    if stretch == sums.outside:
        detail = "a bin head's or a free chunk's link leads outside the arena's heaps"
        return HeapCorruption(state.address, "a bin", state.address, words.OUTSIDE_HEAPS, detail)
    low, high = sums.span(stretch)
    keeper = _FreeLinks(mem, sums, keep=(low, high))
    walked = _walks(mem, state, heaps, target, sbrk_base, keeper, buffer, deadline)
    heads = [bin_head(state, i) for i in range(1, _NBINS)]
    empty = {i for i, head in enumerate(heads, 1) if state.bins[2 * (i - 1)] == head}
    for chunk in [*(h for h in heads if low <= h < high), *keeper.kept]:
        found = _unlinked(mem, chunk)
        if found is not None:
            where = _bin_of(mem, found[0], heads, empty)
            check = list_check(where) if where else words.DOUBLE_LINKED
            name = bin_name(where) if where else "a bin"
            return HeapCorruption(state.address, name, found[0], check, found[1])
    used = [i for i in range(1, _NBINS) if i not in empty]
    where = used[0] if len(used) == 1 else 0  # (one list alone: the link is on it)
    name = bin_name(where) if where else "a bin"
    check = list_check(where) if where else words.DOUBLE_LINKED
    detail = (
        f"the free lists do not close: a link from [{low:#x}, {high:#x}) leads to a chunk "
        "that is not free"
    )
    if isinstance(walked, str):
        detail += f" (the walk that would name the chunk did not finish: {walked})"
    return HeapCorruption(state.address, name, low, check, detail)


def _bin_of(mem: MemoryReader, chunk: int, heads: list[int], empty: set[int]) -> int:
    """The bin ``chunk`` is on, where that can be told without following its list (0: it
    cannot): a bin head itself, or a free chunk, which lies in the unsorted bin or in its
    size's bin, whichever is not empty where the other is."""
    if chunk in heads:
        return heads.index(chunk) + 1
    data = mem.read(chunk + 8, 8)
    if data is None:
        return 0
    own = bin_index(int.from_bytes(data, "little") & ~SIZE_FLAGS)
    possible = [i for i in (1, own) if 1 <= i < _NBINS and i not in empty]
    return possible[0] if len(possible) == 1 else 0


def _links_not_in_ram(at: np.ndarray, pages: PageMap) -> np.ndarray:
    """The free chunks of ``at`` whose fd or bk lies on a page ``pages`` has not in RAM."""
    present = np.frombuffer(pages.present, dtype=np.uint8)
    start, page = np.uint64(pages.start), np.uint64(pages.page_bytes)
    unread = np.zeros(len(at), dtype=bool)
    for offset in (16, 31):
        index = ((at + np.uint64(offset) - start) // page).astype(np.int64)
        known = (index >= 0) & (index < len(present))
        unread[known] |= present[index[known]] == 0
    return at[unread]


def _linked(mem: MemoryReader, chunk: int | None) -> tuple[int, int] | None:
    """The fd and bk of ``chunk`` (None: not a chunk's address, or nothing mapped there)."""
    data = mem.read(chunk + 16, 16) if chunk is not None and chunk % 16 == 0 else None
    if data is None or len(data) < 16:
        return None
    return int.from_bytes(data[:8], "little"), int.from_bytes(data[8:], "little")


def _unlinked(mem: MemoryReader, chunk: int) -> tuple[int, str] | None:
    """The chunk whose link is wrong near free chunk ``chunk``, and what was read: ``chunk``
    itself where its bk's fd does not name it; its fd where that one's bk is wrong in the
    same way; ``chunk`` where its fd leads to a chunk whose bk names another, itself named
    back (``chunk``'s fd is the word overwritten); None where both links agree."""
    links = _linked(mem, chunk)
    if links is None:
        return chunk, "its links could not be read"
    forward, back = links
    behind = _linked(mem, back)
    if behind is None or behind[0] != chunk:
        fd_there = f"{behind[0]:#x}" if behind is not None else "unreadable"
        return chunk, f"its bk is {back:#x}, whose fd is {fd_there}, not it"
    ahead = _linked(mem, forward)
    if ahead is not None and ahead[1] == chunk:
        return None
    if ahead is not None:
        before = _linked(mem, ahead[1])
        if before is None or before[0] != forward:
            return forward, (
                f"its bk is {ahead[1]:#x}, not the chunk before it ({chunk:#x}), and "
                f"{ahead[1]:#x}'s fd is not it"
            )
    bk_there = f"{ahead[1]:#x}" if ahead is not None else "unreadable"
    return chunk, f"its fd is {forward:#x}, whose bk is {bk_there}, not it"
