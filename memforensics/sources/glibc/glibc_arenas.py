"""glibc's arenas located in a running process: sub-heaps, arena states, main_arena (the
searches of anonymous memory, for mmapped chunks and the main arena's mmapped segments, are
in heap_search).

Read through /proc/PID/mem while the target runs, only from pages that are present in RAM
(procmem's invariant); every header is checked for plausibility before it is trusted.
Layout constants: memforensics.model.glibc.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from memforensics.model import glibc
from memforensics.sources.proc.procmaps import Mapping
from memforensics.sources.proc.procmem import MemoryReader, PageMap


@dataclass
class Heap:
    """One heap mapping: a 64 MiB-aligned sub-heap of a non-main arena, the [heap]
    (``ar_ptr`` 0), or a segment a main arena mmapped when sbrk failed (``ar_ptr``
    main_arena)."""

    start: int
    ar_ptr: int
    size_bytes: int
    mprotect_bytes: int
    pages: PageMap | None = None


@dataclass
class ArenaState:
    """The words of one ``malloc_state`` that the walk needs."""

    address: int
    top: int
    next_arena: int
    system_bytes: int
    bins: tuple[int, ...]  # fd, bk of bins 1 … 127, flattened
    fastbins: tuple[int, ...]
    flags: int = 0  # malloc_state.flags: NONCONTIGUOUS_BIT, FASTCHUNKS in old glibc
    max_system_bytes: int = 0  # max_system_mem: the high-water mark of system_mem
    mutex: int = 0  # 0 when no thread holds the arena's lock

    @property
    def noncontiguous(self) -> bool:
        """Its memory is not one brk region: every non-main arena, and a main arena whose
        sbrk failed once (glibc's sysmalloc then mmaps instead, and says so here)."""
        return bool(self.flags & NONCONTIGUOUS_BIT)


NONCONTIGUOUS_BIT = 0x2  # malloc_state.flags (glibc malloc/malloc.c)
_OFF_FLAGS = 4  # malloc_state.flags: an int after the mutex


def read_state(mem: MemoryReader, address: int) -> ArenaState | None:
    """The malloc_state at ``address`` in one read, or None where nothing is mapped."""
    data = mem.read(address, glibc.STATE_BYTES)
    return None if data is None else parse_state(address, data)


def parse_state(address: int, data: bytes | memoryview) -> ArenaState:
    """A malloc_state from its STATE_BYTES bytes (read alone or out of a heap's copy). A
    main_arena malloc never initialized (``pristine``) reads as malloc_init_state leaves it:
    every bin empty, the top the initial one (the unsorted bin's head, of size 0), which is
    what malloc_info reports of it, having initialized malloc first."""
    words = memoryview(data).cast("B").cast("Q")
    bins = glibc.OFF_BINS // 8
    fast = glibc.OFF_FASTBINS // 8
    if pristine(address, words):
        return ArenaState(
            address=address,
            top=glibc.bin_at(address, 1),
            next_arena=address,
            system_bytes=0,
            bins=_empty_bins(address),
            fastbins=(0,) * glibc.NFASTBINS,
        )
    return ArenaState(
        address=address,
        top=words[glibc.OFF_TOP // 8],
        next_arena=words[glibc.OFF_NEXT // 8],
        system_bytes=words[glibc.OFF_SYSTEM_MEM // 8],
        bins=tuple(words[bins : bins + 2 * (glibc.NBINS - 1)].tolist()),
        fastbins=tuple(words[fast : fast + glibc.NFASTBINS].tolist()),
        flags=int.from_bytes(bytes(memoryview(data)[_OFF_FLAGS : _OFF_FLAGS + 4]), "little"),
        max_system_bytes=words[glibc.OFF_MAX_SYSTEM_MEM // 8],
        mutex=words[0] & 0xFFFFFFFF,
    )


def pristine(address: int, words: memoryview) -> bool:
    """The malloc_state at ``address`` (its words) is main_arena's before malloc ever ran in
    the process: as the static initializer leaves it, ``next`` naming itself and every word
    the walk reads zero (malloc_init_state has not linked the bins to themselves)."""
    last = glibc.OFF_NEXT // 8
    return (
        words[last] == address and not any(words[:last]) and words[glibc.OFF_SYSTEM_MEM // 8] == 0
    )


def never_grew(state: ArenaState) -> bool:
    """A main arena malloc initialized (or never ran in: ``pristine``) that never took memory
    from the system: its top the initial one, every bin empty, no system bytes. Its figures
    are its state's alone (there is no heap to walk)."""
    return (
        state.system_bytes == 0
        and state.top == glibc.bin_at(state.address, 1)
        and not any(state.fastbins)
        and state.bins == _empty_bins(state.address)
    )


def _empty_bins(arena: int) -> tuple[int, ...]:
    """ArenaState.bins of the malloc_state at ``arena`` with every bin empty: each bin's fd
    and bk naming the bin itself, as malloc_init_state links them."""
    return tuple(glibc.bin_at(arena, index) for index in range(1, glibc.NBINS) for _ in (0, 1))


def _heap_info(mem: MemoryReader, address: int) -> tuple[int, int, int, int] | None:
    """(ar_ptr, prev, size, mprotect_size) of a plausible heap_info at ``address`` (read
    only where its page is present)."""
    data = mem.read(address, 32)
    if data is None:
        return None
    ar_ptr, prev, size, mprotect_size = struct.unpack("<4Q", data)
    if (
        0 < size <= glibc.HEAP_MAX_BYTES
        and size % mem.page_bytes == 0
        and size <= mprotect_size <= glibc.HEAP_MAX_BYTES
        and prev % glibc.HEAP_MAX_BYTES == 0
        and ar_ptr % 8 == 0
        and ar_ptr != 0
    ):
        return ar_ptr, prev, size, mprotect_size
    return None


def find_heaps(mappings: Sequence[Mapping], mem: MemoryReader) -> list[Heap]:
    """Sub-heaps of non-main arenas: 64 MiB-aligned anonymous RW memory holding a heap_info
    (a mapping smaps says holds no resident page is passed over; from /proc/PID/maps, whose
    residency is unknown, every one is looked at)."""
    heaps: list[Heap] = []
    for mapping in mappings:
        if not mapping.anonymous or not mapping.perms.startswith("rw") or mapping.rss_bytes == 0:
            continue
        # Adjacent anonymous mappings may merge, so look at every aligned address inside.
        address = glibc.page_ceil(mapping.start_address, glibc.HEAP_MAX_BYTES)
        while address < mapping.end_address:
            info = _heap_info(mem, address)
            if info is not None:
                heaps.append(Heap(address, info[0], info[2], info[3]))
            address += glibc.HEAP_MAX_BYTES
    # A first heap holds its own arena; later heaps of a chain point at an arena of a first heap.
    owners = {h.ar_ptr for h in heaps if h.start < h.ar_ptr < h.start + h.size_bytes}
    return [h for h in heaps if h.ar_ptr in owners]


def reread_heaps(mem: MemoryReader, heaps: list[Heap]) -> list[Heap]:
    """The same heaps with their ``size`` read again (a busy arena grows and shrinks)."""
    fresh: list[Heap] = []
    for heap in heaps:
        info = _heap_info(mem, heap.start)
        if info is not None and info[0] == heap.ar_ptr:
            fresh.append(Heap(heap.start, heap.ar_ptr, info[2], info[3]))
    return fresh


def heaps_from_top(mem: MemoryReader, state: ArenaState) -> list[Heap]:
    """An arena's sub-heaps found from its top chunk, as glibc does (heap_for_ptr, prev)."""
    heaps: list[Heap] = []
    address = glibc.page_floor(state.top, glibc.HEAP_MAX_BYTES)
    while address and len(heaps) < 1 << 16:
        info = _heap_info(mem, address)
        if info is None or info[0] != state.address:
            return []
        heaps.append(Heap(address, info[0], info[2], info[3]))
        address = info[1]
    return heaps[::-1]


def brk_extent(mappings: Sequence[Mapping]) -> tuple[int, int] | None:
    """[start, end) of the main arena's brk heap. The kernel may show it as several adjacent
    [heap] mappings (a forked child's inherited part and what it grew since, as in every
    PostgreSQL backend): one heap for the walk, whose chunks cross that boundary."""
    parts = [m for m in mappings if m.path == "[heap]"]
    if not parts:
        return None
    end = parts[0].end_address
    for part in parts[1:]:
        if part.start_address != end:
            break
        end = part.end_address
    return parts[0].start_address, end


def libc_data_regions(mappings: Sequence[Mapping], libc_path: str | None) -> list[Mapping]:
    """libc's writable data: its read-write file mapping (.data) and the anonymous mapping
    right after it (.bss), where main_arena and mp_ live."""
    regions: list[Mapping] = []
    for index, mapping in enumerate(mappings):
        is_libc = mapping.path == libc_path if libc_path else "libc.so" in mapping.path
        if is_libc and mapping.perms.startswith("rw"):
            regions.append(mapping)
            # .bss continues in the anonymous mapping right after the file-backed one.
            after = mappings[index + 1] if index + 1 < len(mappings) else None
            if after is not None and after.start_address == mapping.end_address:
                regions.append(after)
    return regions


def find_main_arena(
    mappings: Sequence[Mapping],
    mem: MemoryReader,
    libc_path: str | None,
    arenas: set[int],
) -> int | None:
    """Locate main_arena in libc's writable data: its ``next`` is itself or a known arena,
    and its empty bins point at themselves or into memory, so one scan of a few KiB finds it."""
    for region in libc_data_regions(mappings, libc_path):
        # Only its present pages: a swapped page of libc's data is not faulted back in (and
        # a main_arena on one is not found: the arenas are then matched by size).
        data = mem.read_present(region.start_address, region.size_bytes)
        words = memoryview(data).cast("Q")
        next_slot = glibc.OFF_NEXT // 8
        top_slot = glibc.OFF_TOP // 8
        for slot in range(len(words) - glibc.STATE_BYTES // 8 + 1):
            base = region.start_address + 8 * slot
            next_arena = words[slot + next_slot]
            if next_arena != base and next_arena not in arenas:
                continue
            top = words[slot + top_slot]
            unsorted_head = glibc.bin_at(base, 1)
            mutex = words[slot] & 0xFFFFFFFF
            if (
                mutex <= 2
                and (top == unsorted_head or top > 0x10000)
                and _bins_plausible(words, slot, base)
            ) or pristine(base, words[slot : slot + glibc.STATE_BYTES // 8]):
                return base
    return None


def _bins_plausible(words: memoryview, slot: int, base: int) -> bool:
    """Every bin of a malloc_state is empty (fd == bk == the bin itself) or holds pointers,
    and 127 bins are never all in use: rules out a stray pointer that happens to sit where
    ``next`` would be."""
    empty = 0
    for bin_index in range(1, glibc.NBINS):
        fd_slot = slot + (glibc.OFF_BINS // 8) + 2 * (bin_index - 1)
        bin_address = glibc.bin_at(base, bin_index)
        fd, bk = words[fd_slot], words[fd_slot + 1]
        if fd == bin_address and bk == bin_address:
            empty += 1
        elif fd < 0x10000 or bk < 0x10000 or fd % 16 or bk % 16:
            return False
    return empty > 0
