"""Per-arena heap residency of a live glibc process, read from /proc/PID/{smaps,mem,pagemap}.

Everything is read-only and never stops the target. One pass over smaps finds the mappings;
/proc/PID/mem gives each sub-heap's ``heap_info`` and each arena's ``malloc_state`` (to match
heaps to the dump's arena numbers and to walk the free chunks in the bins); /proc/PID/pagemap
says which of their pages are in RAM. On a running target the structures can change under
the reads, so every pointer is checked and anything implausible drops to an estimate.

Layout facts (glibc malloc/arena.c and malloc/malloc.c, 64-bit, glibc 2.27 … 2.39):
- a non-main arena lives in sub-heaps of HEAP_MAX_SIZE = 2 * DEFAULT_MMAP_THRESHOLD_MAX
  = 64 MiB, each aligned to 64 MiB and starting with ``heap_info {ar_ptr, prev, size,
  mprotect_size, pagesize}``; the arena's ``malloc_state`` follows the first heap_info;
- ``malloc_state`` = mutex, flags, have_fastchunks (3 ints + pad), fastbinsY[10], top,
  last_remainder, bins[254], binmap[4 ints], next, next_free, attached_threads,
  system_mem, max_system_mem: ``top`` at 96, ``bins`` at 112, ``next`` at 2160,
  ``system_mem`` at 2184 (checked at run time: system_mem must equal the heaps' sizes);
- ``main_arena`` is a static in libc's writable data, its ``next`` points at the newest
  arena (or at itself when there is only one); malloc_info numbers arenas along ``next``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from memforensics.errors import NoSuchProcessError, TargetPermissionError
from memforensics.model.heap import Arena, HeapDump
from memforensics.model.process import (
    ArenaResidency,
    FreeMethod,
    HeapResidency,
    HeapSegment,
    MatchMethod,
)

HEAP_MAX_BYTES = 64 << 20  # HEAP_MAX_SIZE on 64-bit
_HEAP_INFO_BYTES = 40  # ar_ptr, prev, size, mprotect_size, pagesize (pagesize since 2.35)
_STATE_BYTES = 2200
_OFF_TOP = 96
_OFF_BINS = 112
_NBINS = 128
_OFF_NEXT = 2160
_OFF_SYSTEM_MEM = 2184
_CHUNK_HEADER_BYTES = 16  # prev_size + size
_MALLOC_CHUNK_BYTES = 48  # sizeof(struct malloc_chunk): mtrim keeps this much of each chunk
_MINSIZE = 32
_SIZE_FLAGS = 0x7
_IS_MMAPPED = 0x2
# Bound on free chunks read one by one: beyond it the rest is estimated (keeps a stopped
# target's pause short; ~1 µs per chunk read).
MAX_WALKED_CHUNKS = 300_000


@dataclass
class _Vma:
    start: int
    end: int
    perms: str
    inode: int
    path: str
    rss_bytes: int = 0
    anon_bytes: int = 0

    @property
    def anonymous(self) -> bool:
        return self.inode == 0 and (not self.path or self.path.startswith("[anon"))


def _read_smaps(pid: int) -> list[_Vma]:
    """One pass over /proc/PID/smaps: every mapping with its Rss and Anonymous bytes."""
    try:
        with open(f"/proc/{pid}/smaps", "rb") as handle:
            text = handle.read().decode(errors="replace")
    except FileNotFoundError as exc:
        raise NoSuchProcessError(f"no process with PID {pid}") from exc
    except PermissionError as exc:
        raise TargetPermissionError(f"cannot read /proc/{pid}/smaps: permission denied") from exc
    vmas: list[_Vma] = []
    current: _Vma | None = None
    for line in text.splitlines():
        head = line.split(None, 5)
        if not head:
            continue
        if "-" in head[0] and not head[0].endswith(":"):
            lo, _, hi = head[0].partition("-")
            current = _Vma(
                start=int(lo, 16),
                end=int(hi, 16),
                perms=head[1],
                inode=int(head[4]) if len(head) > 4 else 0,
                path=head[5].strip() if len(head) > 5 else "",
            )
            vmas.append(current)
        elif current is not None and head[0] == "Rss:":
            current.rss_bytes = int(head[1]) * 1024
        elif current is not None and head[0] == "Anonymous:":
            current.anon_bytes = int(head[1]) * 1024
    return vmas


_BLOCK_BYTES = 64 * 1024
_BLOCK_CACHE_ENTRIES = 1024  # at most 64 MiB held while walking


class _Memory:
    """Reads of the target's memory through /proc/PID/mem (no ptrace stop needed as root)."""

    def __init__(self, pid: int) -> None:
        try:
            self._fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
        except FileNotFoundError as exc:
            raise NoSuchProcessError(f"no process with PID {pid}") from exc
        except PermissionError as exc:
            raise TargetPermissionError(f"cannot read /proc/{pid}/mem: permission denied") from exc

        try:
            self._pagemap_fd: int | None = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY)
        except OSError:
            self._pagemap_fd = None
        self._page_bytes = os.sysconf("SC_PAGE_SIZE")
        self._blocks: dict[int, bytes] = {}

    def close(self) -> None:
        os.close(self._fd)
        if self._pagemap_fd is not None:
            os.close(self._pagemap_fd)

    def in_ram(self, address: int) -> bool:
        """True when the page at ``address`` is present or swapped (bits 63/62 of pagemap).

        Probing reads only such pages: reading a never-touched page through /proc/PID/mem
        would map a page into the target, and one registered with userfaultfd would block.
        """
        if self._pagemap_fd is None:
            return True
        try:
            entry = os.pread(self._pagemap_fd, 8, 8 * (address // self._page_bytes))
        except OSError:
            return False
        return len(entry) == 8 and bool(int.from_bytes(entry, "little") >> 62)

    def read(self, address: int, length: int) -> bytes | None:
        """``length`` bytes at ``address``, or None where nothing readable is mapped."""
        try:
            data = os.pread(self._fd, length, address)
        except OSError:
            return None
        return data if len(data) == length else None

    def words(
        self, address: int, count: int, *, resident_block: bool = False
    ) -> tuple[int, ...] | None:
        """``count`` little-endian 64-bit words at ``address``, through a block cache.

        Free-chunk headers cluster: one read per block instead of one per chunk. A block
        is a whole 64 KiB only where the caller knows every page of it is resident
        (``resident_block``); otherwise just the page holding the words, so no page the
        target never touched is ever read.
        """
        block_bytes = _BLOCK_BYTES if resident_block else self._page_bytes
        offset = address % block_bytes
        if offset + 8 * count > block_bytes:  # straddles a block: read it directly
            data = self.read(address, 8 * count)
            return None if data is None else struct.unpack(f"<{count}Q", data)
        base = address - offset
        block = self._blocks.get(base)
        if block is None or len(block) < offset + 8 * count:
            block = self.read(base, block_bytes)
            if block is None:
                return None
            if len(self._blocks) >= _BLOCK_CACHE_ENTRIES:
                self._blocks.clear()
            self._blocks[base] = block
        return struct.unpack_from(f"<{count}Q", block, offset)


class _PageMap:
    """Which pages of one address range are resident, with prefix sums for fast counting."""

    def __init__(self, pid: int, start: int, end: int, page_bytes: int) -> None:
        self.start = start
        self.end = end
        self.page_bytes = page_bytes
        pages = (end - start) // page_bytes
        present: list[int] = [0] * pages
        with contextlib.suppress(OSError), open(f"/proc/{pid}/pagemap", "rb", buffering=0) as fh:
            data = os.pread(fh.fileno(), 8 * pages, 8 * (start // page_bytes))
            entries = memoryview(data).cast("Q")
            # Bit 63: page present in RAM (Documentation/admin-guide/mm/pagemap.rst).
            present = [entry >> 63 for entry in entries]
            present += [0] * (pages - len(present))
        self._prefix = [0, *itertools.accumulate(present)]
        # The common case (a heap nobody trimmed) lets the walk skip page arithmetic.
        self.all_resident = pages > 0 and self._prefix[-1] == pages

    def _pages(self, first: int, last: int) -> int:
        """Resident pages with index in [first, last)."""
        pages = len(self._prefix) - 1
        first, last = max(first, 0), min(last, pages)
        return self._prefix[last] - self._prefix[first] if last > first else 0

    def resident_bytes(self, start: int, end: int) -> int:
        """Bytes of [start, end) lying on resident pages (partial pages count their part)."""
        start, end = max(start, self.start), min(end, self.end)
        if end <= start:
            return 0
        ps = self.page_bytes
        first = (start - self.start) // ps
        last = (end - 1 - self.start) // ps
        if first == last:
            return (end - start) * self._pages(first, first + 1)
        total = self._pages(first + 1, last) * ps
        total += (ps - (start - self.start) % ps) * self._pages(first, first + 1)
        total += ((end - self.start - 1) % ps + 1) * self._pages(last, last + 1)
        return total

    def whole_pages_resident_bytes(self, start: int, end: int) -> int:
        """Bytes of the resident pages lying wholly inside [start, end)."""
        ps = self.page_bytes
        first = (max(start, self.start) - self.start + ps - 1) // ps
        last = (min(end, self.end) - self.start) // ps
        return self._pages(first, last) * ps

    @property
    def total_resident_bytes(self) -> int:
        return self._prefix[-1] * self.page_bytes


@dataclass
class _Heap:
    start: int
    ar_ptr: int
    size_bytes: int
    mprotect_bytes: int
    pages: _PageMap | None = None


@dataclass
class _ArenaState:
    address: int
    heaps: list[_Heap] = field(default_factory=list)
    top: int = 0
    next_arena: int = 0
    system_bytes: int = 0
    fd_heads: tuple[int, ...] = ()


@dataclass
class _Walk:
    free_resident_bytes: int = 0
    trimmable_bytes: int = 0
    chunks: int = 0
    top_bytes: int | None = None
    top_resident_bytes: int | None = None
    complete: bool = True


def _is_64bit(pid: int) -> bool:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/exe", "rb") as handle:
        header = handle.read(5)
        return header[:4] == b"\x7fELF" and header[4] == 2
    return True  # no readable exe (e.g. deleted): assume the machine's word size


def _find_heaps(vmas: list[_Vma], mem: _Memory, page_bytes: int) -> list[_Heap]:
    """Sub-heaps of non-main arenas: 64 MiB-aligned anonymous RW memory holding a heap_info."""
    heaps: list[_Heap] = []
    for vma in vmas:
        if not vma.anonymous or not vma.perms.startswith("rw") or vma.rss_bytes == 0:
            continue
        # Adjacent anonymous mappings may merge, so look at every aligned address inside.
        address = -(-vma.start // HEAP_MAX_BYTES) * HEAP_MAX_BYTES
        while address < vma.end:
            words = mem.words(address, 4) if mem.in_ram(address) else None
            if words is not None:
                ar_ptr, prev, size, mprotect_size = words
                if (
                    0 < size <= HEAP_MAX_BYTES
                    and size % page_bytes == 0
                    and size <= mprotect_size <= HEAP_MAX_BYTES
                    and prev % HEAP_MAX_BYTES == 0
                    and ar_ptr % 8 == 0
                    and ar_ptr != 0
                ):
                    heaps.append(_Heap(address, ar_ptr, size, mprotect_size))
            address += HEAP_MAX_BYTES
    # A first heap holds its own arena; later heaps of a chain point at an arena of a first heap.
    owners = {h.ar_ptr for h in heaps if h.start < h.ar_ptr < h.start + h.size_bytes}
    return [h for h in heaps if h.ar_ptr in owners]


def _read_state(mem: _Memory, address: int) -> _ArenaState | None:
    data = mem.read(address, _STATE_BYTES)
    if data is None:
        return None
    words = struct.unpack(f"<{_STATE_BYTES // 8}Q", data)
    bins = _OFF_BINS // 8
    return _ArenaState(
        address=address,
        top=words[_OFF_TOP // 8],
        next_arena=words[_OFF_NEXT // 8],
        system_bytes=words[_OFF_SYSTEM_MEM // 8],
        # fd of bin i (1 = unsorted … 127) sits at bins[2 * (i - 1)].
        fd_heads=tuple(words[bins + 2 * (i - 1)] for i in range(1, _NBINS)),
    )


def _find_main_arena(
    vmas: list[_Vma], mem: _Memory, libc_path: str | None, arenas: set[int]
) -> int | None:
    """Locate main_arena in libc's writable data: its ``next`` is itself or a known arena,
    and its empty bins point at themselves or into memory, so one scan of a few KiB finds it."""
    regions: list[_Vma] = []
    for index, vma in enumerate(vmas):
        is_libc = vma.path == libc_path if libc_path else "libc.so" in vma.path
        if is_libc and vma.perms.startswith("rw"):
            regions.append(vma)
            # .bss continues in the anonymous mapping right after the file-backed one.
            if index + 1 < len(vmas) and vmas[index + 1].start == vma.end:
                regions.append(vmas[index + 1])
    for region in regions:
        data = mem.read(region.start, region.end - region.start)
        if data is None:
            continue
        words = memoryview(data).cast("Q")
        next_slot = _OFF_NEXT // 8
        top_slot = _OFF_TOP // 8
        for slot in range(len(words) - _STATE_BYTES // 8 + 1):
            base = region.start + 8 * slot
            next_arena = words[slot + next_slot]
            if next_arena != base and next_arena not in arenas:
                continue
            top = words[slot + top_slot]
            unsorted_head = base + _OFF_BINS - 16
            mutex = words[slot] & 0xFFFFFFFF
            if (
                mutex <= 2
                and (top == unsorted_head or top > 0x10000)
                and _bins_plausible(words, slot, base)
            ):
                return base
    return None


def _bins_plausible(words: memoryview, slot: int, base: int) -> bool:
    """Every bin of a malloc_state is empty (fd == bk == the bin itself) or holds pointers,
    and 127 bins are never all in use: rules out a stray pointer that happens to sit where
    ``next`` would be."""
    empty = 0
    for bin_index in range(1, _NBINS):
        fd_slot = slot + (_OFF_BINS // 8) + 2 * (bin_index - 1)
        bin_address = base + _OFF_BINS + 16 * (bin_index - 1) - 16
        fd, bk = words[fd_slot], words[fd_slot + 1]
        if fd == bin_address and bk == bin_address:
            empty += 1
        elif fd < 0x10000 or bk < 0x10000 or fd % 16 or bk % 16:
            return False
    return empty > 0


def _walk_arena(
    state: _ArenaState,
    ranges: list[_PageMap],
    mem: _Memory,
    page_bytes: int,
    *,
    is_main: bool,
    budget: int,
) -> _Walk:
    """Follow every bin's list through /proc/PID/mem and measure the free chunks' pages.

    trimmable follows malloc_trim's mtrim(): in a free chunk p of size s it madvises the
    whole pages from align_up(p + sizeof(struct malloc_chunk)) to p + s; for the main arena
    systrim() then gives back the top beyond MINSIZE, rounded down to pages.
    """
    walk = _Walk()

    def pages_for(address: int) -> _PageMap | None:
        for pm in ranges:
            if pm.start <= address < pm.end:
                return pm
        return None

    seen: set[int] = set()
    pm: _PageMap | None = None
    for bin_index, head in enumerate(state.fd_heads, start=1):
        bin_address = state.address + _OFF_BINS + 16 * (bin_index - 1) - 16
        chunk = head
        while chunk != bin_address:
            if walk.chunks >= budget or chunk in seen:
                walk.complete = False
                break
            if pm is None or not pm.start <= chunk < pm.end:
                pm = pages_for(chunk)
            words = mem.words(chunk, 3, resident_block=pm.all_resident) if pm else None
            if pm is None or words is None:
                walk.complete = False  # pointer outside the heap: the list moved under us
                break
            size = words[1] & ~_SIZE_FLAGS
            end = chunk + size
            if size < _MINSIZE or end > pm.end:
                walk.complete = False
                break
            seen.add(chunk)
            walk.chunks += 1
            releasable_start = -(-(chunk + _MALLOC_CHUNK_BYTES) // page_bytes) * page_bytes
            if pm.all_resident:
                # Same figures as the page arithmetic below, for a wholly resident range
                # (mappings are page-aligned, so whole pages align with the range's pages).
                walk.free_resident_bytes += size
                whole = end // page_bytes * page_bytes - releasable_start
                walk.trimmable_bytes += whole if whole > 0 else 0
            else:
                walk.free_resident_bytes += pm.resident_bytes(chunk, end)
                walk.trimmable_bytes += pm.whole_pages_resident_bytes(releasable_start, end)
            chunk = words[2]
        if not walk.complete:
            break
    top_pm = pages_for(state.top)
    top_words = mem.words(state.top, 2) if top_pm is not None else None
    if top_pm is not None and top_words is not None:
        top_size = top_words[1] & ~_SIZE_FLAGS
        if state.top + top_size <= top_pm.end:
            walk.top_bytes = top_size
            walk.top_resident_bytes = top_pm.resident_bytes(state.top, state.top + top_size)
            walk.free_resident_bytes += walk.top_resident_bytes
            if is_main:
                extra = (top_size - _MINSIZE - 1) // page_bytes * page_bytes
                if extra > 0:
                    end = state.top + top_size
                    walk.trimmable_bytes += top_pm.whole_pages_resident_bytes(end - extra, end)
    return walk


def _estimate_free_resident(arena: Arena, resident_bytes: int) -> int:
    """Without a walk: whatever is resident beyond the in-use bytes is free, at most all free."""
    return min(max(resident_bytes - arena.in_use_bytes, 0), arena.free_bytes)


def _order_arenas(main: _ArenaState, states: dict[int, _ArenaState]) -> list[int] | None:
    """Addresses of the non-main arenas in malloc_info order (main.next first), or None."""
    order: list[int] = []
    address = main.next_arena
    while address != main.address:
        if address not in states or address in order:
            return None
        order.append(address)
        address = states[address].next_arena
    return order if len(order) == len(states) else None


def _match_by_system_mem(
    dump: HeapDump, states: dict[int, _ArenaState], heap_sizes: dict[int, int]
) -> dict[int, int] | None:
    """Pair dump arenas (index >= 1) with heap groups of equal size; None if any is left over."""
    free_addresses = sorted(states, key=lambda a: heap_sizes[a])
    pairs: dict[int, int] = {}
    for arena in dump.arenas:
        if arena.index == 0:
            continue
        match = next((a for a in free_addresses if heap_sizes[a] == arena.system_bytes), None)
        if match is None:
            return None
        free_addresses.remove(match)
        pairs[arena.index] = match
    return pairs if not free_addresses else None


def _stack_resident_bytes(vmas: list[_Vma], heap_starts: set[int]) -> int:
    """Anonymous RW mappings directly above an inaccessible guard page: thread stacks."""
    total = 0
    for below, vma in itertools.pairwise(vmas):
        if vma.path == "[stack]" or (
            vma.anonymous
            and vma.perms.startswith("rw")
            and vma.start not in heap_starts
            and below.end == vma.start
            and below.perms.startswith("---")
            and below.anonymous
            and below.end - below.start < HEAP_MAX_BYTES // 16
        ):
            total += vma.anon_bytes
    if vmas and vmas[0].path == "[stack]":
        total += vmas[0].anon_bytes
    return total


def _mmapped_chunks(
    vmas: Iterable[_Vma], mem: _Memory, page_bytes: int
) -> Iterator[tuple[_Vma, int, int]]:
    """(mapping, start, bytes) of chunks glibc served with mmap: a chunk header at a
    mapping's start whose size has IS_MMAPPED set and is whole pages; several may share a
    mapping when adjacent mmaps merged, so follow them one after the other."""
    for vma in vmas:
        address = vma.start
        while address + _CHUNK_HEADER_BYTES <= vma.end:
            words = mem.words(address, 2) if mem.in_ram(address) else None
            if words is None:
                break
            prev_size, size_field = words
            size = size_field & ~_SIZE_FLAGS
            if (
                prev_size != 0
                or not size_field & _IS_MMAPPED
                or size == 0
                or size % page_bytes
                or address + size > vma.end
            ):
                break
            yield vma, address, size
            address += size


def read_heap_residency(pid: int, dump: HeapDump, *, libc_path: str | None = None) -> HeapResidency:
    """Per arena of ``dump``: heap mapped and resident bytes, and free bytes still resident.

    Arenas are matched to the dump by following main_arena's ``next`` list ("arena-chain"),
    else by equal system_mem ("system-mem"), else only totals are given ("totals"). Free
    resident bytes are measured by walking the bins when the arena's lists read back
    consistently ("walked"), else estimated as resident heap minus in-use ("estimate").
    """
    page_bytes = os.sysconf("SC_PAGE_SIZE")
    vmas = _read_smaps(pid)
    notes: list[str] = []
    mem = _Memory(pid)
    try:
        return _residency(
            pid, dump, vmas=vmas, mem=mem, page_bytes=page_bytes, libc_path=libc_path, notes=notes
        )
    finally:
        mem.close()


def _residency(
    pid: int,
    dump: HeapDump,
    *,
    vmas: list[_Vma],
    mem: _Memory,
    page_bytes: int,
    libc_path: str | None,
    notes: list[str],
) -> HeapResidency:
    is_64 = _is_64bit(pid)
    heaps = _find_heaps(vmas, mem, page_bytes) if is_64 else []
    if not is_64:
        notes.append("32-bit target: arena heaps are not located (only 64-bit layouts known)")
    for heap in heaps:
        heap.pages = _PageMap(pid, heap.start, heap.start + heap.mprotect_bytes, page_bytes)
    brk = next((v for v in vmas if v.path == "[heap]"), None)
    brk_pages = _PageMap(pid, brk.start, brk.end, page_bytes) if brk is not None else None

    by_arena: dict[int, list[_Heap]] = {}
    for heap in heaps:
        by_arena.setdefault(heap.ar_ptr, []).append(heap)
    heap_sizes = {a: sum(h.size_bytes for h in hs) for a, hs in by_arena.items()}
    states: dict[int, _ArenaState] = {}
    layout_ok = bool(is_64)
    for address, arena_heaps in by_arena.items():
        state = _read_state(mem, address)
        if state is None:
            layout_ok = False
            continue
        state.heaps = arena_heaps
        states[address] = state
        # system_mem of a non-main arena is the sum of its heaps' sizes: checks the layout.
        if state.system_bytes != heap_sizes[address]:
            layout_ok = False
    main_state: _ArenaState | None = None
    if layout_ok:
        main_address = _find_main_arena(vmas, mem, libc_path, set(states))
        main_state = _read_state(mem, main_address) if main_address is not None else None
        if main_state is None:
            notes.append("main_arena not found in libc's data; arenas matched by size")

    method: MatchMethod = "totals"
    assignment: dict[int, int] = {}  # dump index -> arena address (non-main)
    order = _order_arenas(main_state, states) if main_state is not None else None
    if order is not None and len(order) + 1 == len(dump.arenas):
        method = "arena-chain"
        assignment = dict(enumerate(order, start=1))
    else:
        if order is not None:
            notes.append(
                f"the process has {len(order) + 1} arenas, the dump {len(dump.arenas)}: "
                "arenas were created or the dump is from another moment"
            )
        pairs = _match_by_system_mem(dump, states, heap_sizes)
        if pairs is not None:
            method = "system-mem"
            assignment = pairs
            notes.append("arenas matched by equal system_mem: equal-sized arenas may be swapped")

    arena_rows: list[ArenaResidency] = []
    budget = MAX_WALKED_CHUNKS
    if method != "totals":
        for arena in dump.arenas:
            arena_address = assignment.get(arena.index, -1)
            state = main_state if arena.index == 0 else states.get(arena_address)
            if arena.index == 0:
                pms = [brk_pages] if brk_pages is not None else []
                segments = tuple(
                    HeapSegment(pm.start, pm.end - pm.start, pm.total_resident_bytes) for pm in pms
                )
            else:
                arena_heaps = by_arena.get(arena_address, [])
                pms = [h.pages for h in arena_heaps if h.pages is not None]
                segments = tuple(
                    HeapSegment(h.start, h.size_bytes, h.pages.total_resident_bytes)
                    for h in arena_heaps
                    if h.pages is not None
                )
            resident = sum(s.resident_bytes for s in segments)
            walk: _Walk | None = None
            if state is not None and layout_ok:
                walk = _walk_arena(
                    state, pms, mem, page_bytes, is_main=arena.index == 0, budget=budget
                )
                budget -= walk.chunks
            free_method: FreeMethod
            if walk is not None and walk.complete:
                free_method = "walked"
                # Fastbin chunks are not walked (≤ 128 bytes each, recently used): resident.
                free_resident = walk.free_resident_bytes + (arena.fast_bytes or 0)
                trimmable: int | None = walk.trimmable_bytes
            else:
                free_method = "estimate"
                free_resident = _estimate_free_resident(arena, resident)
                trimmable = None
                if walk is not None:
                    notes.append(f"arena {arena.index}: free lists changed or too long; estimated")
            arena_rows.append(
                ArenaResidency(
                    index=arena.index,
                    address=state.address if state is not None else None,
                    segments=segments,
                    free_resident_bytes=free_resident,
                    free_method=free_method,
                    trimmable_bytes=trimmable,
                    walked_chunks=walk.chunks if walk is not None else 0,
                    top_bytes=walk.top_bytes if walk is not None else None,
                    top_resident_bytes=walk.top_resident_bytes if walk is not None else None,
                )
            )
    elif dump.arenas:
        notes.append("heaps could not be matched to the dump's arenas; totals only")

    heap_mapped = sum(h.size_bytes for h in heaps) + (brk.end - brk.start if brk else 0)
    heap_resident = sum(h.pages.total_resident_bytes for h in heaps if h.pages is not None)
    heap_resident += brk_pages.total_resident_bytes if brk_pages is not None else 0
    heap_starts = {h.start for h in heaps} | ({brk.start} if brk else set())

    candidates = [
        v
        for v in vmas
        if v.anonymous and v.perms.startswith("rw") and v.rss_bytes and v.start not in heap_starts
    ]
    chunk_bytes = 0
    chunk_resident = 0
    chunk_count = 0
    covered: dict[int, int] = {}
    for vma, start, size in _mmapped_chunks(candidates, mem, page_bytes):
        chunk_count += 1
        chunk_bytes += size
        covered[vma.start] = covered.get(vma.start, 0) + size
        if size == vma.end - vma.start:
            chunk_resident += vma.anon_bytes
        else:
            chunk_resident += _PageMap(pid, start, start + size, page_bytes).total_resident_bytes
    if dump.mmap_chunks is not None and chunk_count != dump.mmap_chunks:
        notes.append(
            f"found {chunk_count} mmapped chunks in the maps, the dump counts {dump.mmap_chunks}"
        )
    anon_total = sum(v.anon_bytes for v in vmas)
    stacks = _stack_resident_bytes(vmas, heap_starts)
    other = max(anon_total - heap_resident - chunk_resident - stacks, 0)
    return HeapResidency(
        pid=pid,
        page_bytes=page_bytes,
        method=method,
        arenas=tuple(arena_rows),
        heap_mapped_bytes=heap_mapped,
        heap_resident_bytes=heap_resident,
        mmap_chunk_bytes=chunk_bytes,
        mmap_chunk_resident_bytes=chunk_resident,
        stack_resident_bytes=stacks,
        other_anon_resident_bytes=other,
        anon_resident_bytes=anon_total,
        notes=tuple(notes),
    )
