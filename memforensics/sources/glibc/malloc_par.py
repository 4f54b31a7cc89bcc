"""glibc's ``mp_`` (struct malloc_par) found in libc's writable data without symbols.

``mp_`` holds the process-wide counters malloc_info prints at its end (``n_mmaps``,
``mmapped_mem``). It is a static of malloc.c, so a stripped libc gives no symbol for it; it is
found by its shape instead. Two layouts exist on 64-bit (glibc malloc/malloc.c):

- 2.26 … 2.34: trim_threshold, top_pad, mmap_threshold, arena_test, arena_max (size_t each),
  then n_mmaps, n_mmaps_max, max_n_mmaps, no_dyn_threshold (int each), mmapped_mem,
  max_mmapped_mem, sbrk_base, then the tcache fields;
- 2.35 and later: thp_pagesize, hp_pagesize (size_t) and hp_flags (int) after arena_max, so
  the ints start 20 bytes later and mmapped_mem 24 bytes later.

Both go on with the tcache's fields after sbrk_base: tcache_bins, tcache_max_bytes,
tcache_count, tcache_unsorted_limit (size_t each; glibc built with tcache, as every
distribution's is).

A candidate must satisfy every invariant glibc keeps (counts within their maxima, mmapped
bytes whole pages and zero exactly when no chunk is mmapped, the mmap threshold within what
mallopt accepts, a boolean that is a boolean, the tcache within the bounds its tunables
accept) and its ``sbrk_base`` must be where the main arena's memory began. Exactly one
candidate may remain; anything else is "not found". (The tcache's bounds matter in a small
heap: main_arena's bins then hold many words less than LOADER_SBRK_SLACK_BYTES past the
start of [heap], and one of them, read with the other layout, can pass every other test.)
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from memforensics.model import glibc
from memforensics.model.heapscan import MallocParams
from memforensics.sources.proc.procmaps import Mapping
from memforensics.sources.proc.procmem import MemoryReader

# The dynamic threshold stops at 32 MiB (DEFAULT_MMAP_THRESHOLD_MAX, 64-bit), as does
# mallopt (HEAP_MAX_SIZE / 2); a threshold set through the glibc.malloc.mmap_threshold tunable
# is held to no bound (and sets no_dyn_threshold): any below the user address space is real.
_MMAP_THRESHOLD_MAX_BYTES = 32 << 20
_SET_THRESHOLD_MAX_BYTES = 1 << 47
_COUNT_MAX = 1 << 31


@dataclass(frozen=True)
class _Layout:
    name: str
    ints: int  # offset of n_mmaps (then n_mmaps_max, max_n_mmaps, no_dyn_threshold)
    mmapped: int  # offset of mmapped_mem (then max_mmapped_mem, sbrk_base)
    huge_pages: int | None  # offset of thp_pagesize, hp_pagesize (2.35+)


LAYOUTS = (
    _Layout("2.35", ints=60, mmapped=80, huge_pages=40),
    _Layout("2.26", ints=40, mmapped=56, huge_pages=None),
)
# glibc < 2.34's ld.so copies GLIBC_TUNABLES with sbrk before malloc runs: malloc's
# sbrk_base then lies that far past the start of [heap], unaligned (the variable's text and
# its NUL: 43 bytes for GLIBC_TUNABLES=glibc.malloc.tcache_count=0 on 2.31).
LOADER_SBRK_SLACK_BYTES = 64 << 10
_STRUCT_BYTES = 136  # the longest prefix read (2.35: up to the tcache's four fields)
# The tcache's bounds (malloc.c, 2.26 ... 2.41, 64-bit): TCACHE_MAX_BINS, MAX_TCACHE_SIZE
# (the tcache_max tunable is refused above it), MAX_TCACHE_COUNT (UINT16_MAX since 2.30).
_TCACHE_MAX_BINS = 64
_TCACHE_MAX_BYTES = 1032
_TCACHE_MAX_COUNT = 65_535


def _tcache_bins_for(max_bytes: int) -> int:
    """tcache_bins as glibc sets it with tcache_max_bytes (its default, and the tcache_max
    tunable): csize2tidx(request2size(max_bytes)) + 1, 64-bit."""
    chunk = max(glibc.MINSIZE, (max_bytes + 8 + 15) & ~15)
    return (chunk - glibc.MINSIZE + 15) // 16 + 1


def _power_of_two_or_zero(value: int) -> bool:
    return value & (value - 1) == 0


def parse_malloc_par(
    address: int, data: bytes | memoryview, layout: _Layout, page_bytes: int
) -> MallocParams | None:
    """The ``mp_`` at ``address`` (its first _STRUCT_BYTES in ``data``) read with ``layout``,
    or None when any invariant glibc keeps does not hold."""
    trim, _top_pad, threshold, arena_test, arena_max = struct.unpack_from("<5Q", data, 0)
    n_mmaps, n_mmaps_max, max_n_mmaps, no_dyn = struct.unpack_from("<4i", data, layout.ints)
    mmapped, max_mmapped, sbrk_base = struct.unpack_from("<3Q", data, layout.mmapped)
    tcache_bins, tcache_bytes, tcache_count = struct.unpack_from("<3Q", data, layout.mmapped + 24)
    if layout.huge_pages is not None:
        thp, huge = struct.unpack_from("<2Q", data, layout.huge_pages)
        if not (_power_of_two_or_zero(thp) and _power_of_two_or_zero(huge)):
            return None
    plausible = (
        (
            threshold <= _MMAP_THRESHOLD_MAX_BYTES
            or (no_dyn == 1 and threshold < _SET_THRESHOLD_MAX_BYTES)
        )
        and 0 < arena_test < _COUNT_MAX
        and arena_max < _COUNT_MAX
        and 0 <= n_mmaps <= max_n_mmaps < _COUNT_MAX
        and n_mmaps_max >= 0
        and no_dyn in (0, 1)
        and mmapped % page_bytes == 0
        and max_mmapped % page_bytes == 0
        and mmapped <= max_mmapped
        and (n_mmaps == 0) == (mmapped == 0)
        and (max_n_mmaps == 0) == (max_mmapped == 0)
        and 1 <= tcache_bins <= _TCACHE_MAX_BINS
        and tcache_bytes <= _TCACHE_MAX_BYTES
        and tcache_bins == _tcache_bins_for(tcache_bytes)
        and tcache_count <= _TCACHE_MAX_COUNT
    )
    if not plausible:
        return None
    return MallocParams(
        address=address,
        layout=layout.name,
        mmap_chunks=n_mmaps,
        mmapped_bytes=mmapped,
        max_mmap_chunks=max_n_mmaps,
        max_mmapped_bytes=max_mmapped,
        mmap_threshold_bytes=threshold,
        trim_threshold_bytes=trim,
        sbrk_base=sbrk_base,
    )


def find_malloc_par(
    mem: MemoryReader,
    regions: Sequence[Mapping],
    *,
    sbrk_bases: Sequence[int],
    layouts: Sequence[_Layout] = LAYOUTS,
) -> MallocParams | None:
    """``mp_`` in libc's writable data (``regions``): the one place that reads as a
    plausible malloc_par under one of ``layouts`` and whose ``sbrk_base`` is one of
    ``sbrk_bases`` (the start of [heap], or of the first segment a main arena mmapped when
    sbrk failed; 0 when the main arena never grew), or lies less than LOADER_SBRK_SLACK_BYTES
    past one. None when no place, or more than one,
    qualifies."""
    found: list[MallocParams] = []
    page = mem.page_bytes
    for region in regions:
        data = mem.read_present(region.start_address, region.size_bytes)
        # The cheapest test first, over every word at once: most words of .data are no
        # sbrk_base, and only where one is can a malloc_par end there.
        hits = _sbrk_base_words(data, sbrk_bases)
        for layout in layouts:
            shift = layout.mmapped + 16  # sbrk_base's offset in the struct
            for at_word in hits:
                offset = at_word - shift
                if 0 <= offset <= len(data) - _STRUCT_BYTES:
                    at = region.start_address + offset
                    params = parse_malloc_par(at, data[offset:], layout, page)
                    if params is not None:
                        found.append(params)
    return found[0] if len(found) == 1 else None


def _sbrk_base_words(data: bytes, sbrk_bases: Sequence[int]) -> list[int]:
    """Byte offsets of the aligned words of ``data`` that read as one of ``sbrk_bases`` or
    lie less than LOADER_SBRK_SLACK_BYTES past a non-zero one, ascending."""
    words = memoryview(data)[: len(data) // 8 * 8].cast("Q")
    exact = set(sbrk_bases)
    spans = [(base, base + LOADER_SBRK_SLACK_BYTES) for base in exact if base]
    if len(spans) == 1:  # (the common case: one [heap]; a comparison, not a generator)
        low, high = spans[0]
        return [8 * i for i, word in enumerate(words) if word in exact or low < word < high]
    return [
        8 * index
        for index, word in enumerate(words)
        if word in exact or any(low < word < high for low, high in spans)
    ]


def read_malloc_par(mem: MemoryReader, found: MallocParams) -> MallocParams | None:
    """``mp_`` read again where ``found`` was (the counters move with every mmapped chunk)."""
    data = mem.read(found.address, _STRUCT_BYTES)
    layout = next(layout for layout in LAYOUTS if layout.name == found.layout)
    return None if data is None else parse_malloc_par(found.address, data, layout, mem.page_bytes)
