"""glibc malloc's 64-bit layout and trim arithmetic, defined once for the walk and the forecast.

Facts from glibc malloc/malloc.c and malloc/arena.c (2.27 … 2.39, x86-64 and aarch64):
- a chunk starts with ``prev_size`` and ``size`` (SIZE_SZ = 8 each); a free chunk then holds
  ``fd`` and ``bk`` (and ``fd_nextsize``/``bk_nextsize`` in large bins): sizeof(struct
  malloc_chunk) = 48; MINSIZE = 32; MALLOC_ALIGNMENT = 16; the low 3 bits of ``size`` are flags;
- a non-main arena lives in sub-heaps of HEAP_MAX_SIZE = 2 * DEFAULT_MMAP_THRESHOLD_MAX
  = 64 MiB, aligned to 64 MiB, each starting with ``heap_info {ar_ptr, prev, size,
  mprotect_size, pagesize}``; the arena's ``malloc_state`` follows the first heap_info;
- ``malloc_state`` = mutex, flags, have_fastchunks (3 ints + pad), fastbinsY[10], top,
  last_remainder, bins[254], binmap[4 ints], next, next_free, attached_threads,
  system_mem, max_system_mem;
- malloc_trim(0) (mtrim) madvises, in every free chunk of the normal bins, the whole pages
  from align_up(chunk + sizeof(struct malloc_chunk)) to the chunk's end; then systrim gives
  back the main arena's top beyond MINSIZE, rounded down to pages.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

HEAP_MAX_BYTES = 64 << 20  # HEAP_MAX_SIZE on 64-bit
# sizeof(heap_info) by struct malloc_par's layout (both changed in glibc 2.35: heap_info gained
# ``pagesize`` and is padded to MALLOC_ALIGNMENT): a thread arena's malloc_state follows it.
HEAP_INFO_BYTES_BY_LAYOUT = {"2.26": 32, "2.35": 48}
# sizeof(tcache_perthread_struct) as a chunk: char counts (2.26 … 2.29), uint16_t counts (2.30
# on), and the larger tables of later releases.
TCACHE_CHUNK_BYTES = (0x250, 0x290, 0x300)
CHUNK_HEADER_BYTES = 16  # prev_size + size
MALLOC_CHUNK_BYTES = 48  # sizeof(struct malloc_chunk): what mtrim keeps of each free chunk
MINSIZE = 32
MALLOC_ALIGNMENT = 16
SIZE_FLAGS = 0x7
IS_MMAPPED = 0x2
NBINS = 128  # bin 1 is the unsorted bin, 2 … 63 small bins, 64 … 126 large bins
NFASTBINS = 10
MAX_FAST_CHUNK_BYTES = 128  # default global_max_fast (64 * SIZE_SZ / 4 rounded): 0x80
MIN_LARGE_CHUNK_BYTES = 1024  # (NSMALLBINS - SMALLBIN_CORRECTION) * MALLOC_ALIGNMENT

# Offsets inside struct malloc_state (checked at run time: system_mem must equal the heaps).
STATE_BYTES = 2200
OFF_FASTBINS = 16
OFF_TOP = 96
OFF_BINS = 112
OFF_NEXT = 2160
OFF_SYSTEM_MEM = 2184
OFF_MAX_SYSTEM_MEM = 2192
# The fd pointer of a chunk sits after prev_size and size.
OFF_FD = 16


def page_floor(address: int, page_bytes: int) -> int:
    """``address`` rounded down to a page boundary."""
    return address // page_bytes * page_bytes


def page_ceil(address: int, page_bytes: int) -> int:
    """``address`` rounded up to a page boundary."""
    return -(-address // page_bytes) * page_bytes


def mtrim_span(chunk: int, size_bytes: int, page_bytes: int) -> tuple[int, int]:
    """The [start, end) mtrim madvises in a free chunk: whole pages after its first 48 bytes
    (empty, start >= end, when the chunk holds no such page)."""
    return page_ceil(chunk + MALLOC_CHUNK_BYTES, page_bytes), page_floor(
        chunk + size_bytes, page_bytes
    )


def mtrim_whole_pages_bytes(chunk: int, size_bytes: int, page_bytes: int) -> int:
    """The length of mtrim_span (0 when it is empty): what mtrim releases from a free chunk
    whose pages are all resident. A chunk smaller than page_bytes + 48 never holds such a
    page. _chunkwalk.c's mtrim_pages does the same arithmetic in C."""
    whole = (chunk + size_bytes) // page_bytes - (
        chunk + MALLOC_CHUNK_BYTES + page_bytes - 1
    ) // page_bytes
    return whole * page_bytes if whole > 0 else 0


def systrim_release_bytes(top_bytes: int, page_bytes: int, pad_bytes: int = 0) -> int:
    """Bytes systrim() gives back from a main-arena top of ``top_bytes`` (glibc
    malloc/malloc.c: ``top_area = size - MINSIZE - 1``; nothing when ``top_area <= pad``,
    else ``ALIGN_DOWN (top_area - pad, pagesize)``). It shrinks the heap only when the top
    ends at the program break; the caller decides that."""
    top_area = top_bytes - MINSIZE - 1
    if top_area <= pad_bytes:
        return 0
    return (top_area - pad_bytes) // page_bytes * page_bytes


def runs_bytes_within(runs: Iterable[tuple[int, int]], start: int, end: int) -> int:
    """Bytes of the [start, end) address runs that lie inside [start, end)."""
    return sum(max(min(b, end) - max(a, start), 0) for a, b in runs)


def bin_at(arena: int, index: int) -> int:
    """Address glibc's bin_at() gives bin ``index`` (1 … 127) of the malloc_state at
    ``arena``: its fd/bk slots posing as a chunk's (bin 1, the unsorted bin's, is also the
    initial top)."""
    return arena + OFF_BINS + 16 * (index - 1) - 16


def bin_index(chunk_bytes: int) -> int:
    """The normal bin (2 … 126) that holds free chunks of ``chunk_bytes`` (64-bit layout)."""
    size = chunk_bytes & ~SIZE_FLAGS
    if size < MIN_LARGE_CHUNK_BYTES:
        return size >> 4
    if (size >> 6) <= 48:
        return 48 + (size >> 6)
    if (size >> 9) <= 20:
        return 91 + (size >> 9)
    if (size >> 12) <= 10:
        return 110 + (size >> 12)
    if (size >> 15) <= 4:
        return 119 + (size >> 15)
    if (size >> 18) <= 2:
        return 124 + (size >> 18)
    return 126


# bin_index's branches for large chunks, in order: (shift, index offset, the largest
# size >> shift the branch takes); sizes past the last are bin 126.
_LARGE_BRANCHES = ((6, 48, 48), (9, 91, 20), (12, 110, 10), (15, 119, 4), (18, 124, 2))


@functools.cache
def _large_bin_starts() -> dict[int, int]:
    """The smallest chunk size bin_index() maps to each large bin (64 … 126), worked out
    from its branches (a few dozen steps): each branch's sizes begin where the last one's
    end, and within a branch a bin begins at its size >> shift (a bin two branches share,
    120, begins in the first)."""
    starts: dict[int, int] = {}
    begin = MIN_LARGE_CHUNK_BYTES
    for shift, offset, last in _LARGE_BRANCHES:
        end = (last + 1) << shift
        size = begin
        while size < end:
            starts.setdefault(offset + (size >> shift), size)
            size = ((size >> shift) + 1) << shift
        begin = end
    return starts


@functools.cache
def bin_size_range(index: int) -> tuple[int, int]:
    """Smallest and largest chunk size bin ``index`` may hold (the unsorted bin: any)."""
    if index <= 1:
        return MINSIZE, 1 << 62
    if index < 64:
        return index << 4, index << 4
    starts = _large_bin_starts()
    if index >= 126:
        return starts[126], 1 << 62
    return starts[index], starts[index + 1] - 1
