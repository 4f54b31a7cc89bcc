"""CPython's pymalloc pools found in a target's anonymous memory, and their blocks in use
handed to the census's classifier: most of a Python heap's objects live there, outside
malloc's chunks.

Facts (Objects/obmalloc.c, Include/internal/pycore_obmalloc.h, 3.10-3.13, 64-bit; checked
by the tests against sys._debugmallocstats()): arenas are 1 MiB anonymous mmaps, pools are
POOL_SIZE-aligned inside them (16 KiB with the radix tree of 64-bit builds, 4 KiB before),
each starting with a 48-byte ``pool_header {ref.count (uint, in a word), freeblock,
nextpool, prevpool, arenaindex, szidx, nextoffset, maxnextoffset (uints)}``; block size =
(szidx + 1) * 16; maxnextoffset = POOL_SIZE - block size; the blocks in use are those below
``nextoffset`` that are not on the ``freeblock`` chain, and there are ``ref.count`` of them.
A pool whose header fails these checks is not a pool; one whose chain or count disagree
(it changed while read, or is corrupt) is read again (WINDOW_ATTEMPTS), then counted as
unread, never classified.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Protocol

from memforensics.model.chunks import ProcessChunks
from memforensics.sources.glibc.heap_search import subtract_spans
from memforensics.sources.proc.procmaps import Mapping
from memforensics.sources.proc.procmem import MemoryReader

POOL_OVERHEAD = 48
POOL_SIZES = (16 << 10, 4 << 10)
_WINDOW_BYTES = 1 << 20
WINDOW_ATTEMPTS = 3  # reads of a window whose pools changed while read
_HEADER = struct.Struct(
    "<IIQQQIIII"
)  # count, pad, freeblock, nextpool, prevpool, arenaindex, szidx, nextoffset, maxnextoffset


class BlockSink(Protocol):
    """What the blocks in use are handed to (entry.census.Classifier)."""

    def name(self, data: bytes | memoryview, size: int) -> tuple[str, str]: ...

    @property
    def tally(self) -> _Tally: ...


class _Tally(Protocol):
    def add(self, name: str, kind: str, size_bytes: int) -> None: ...

    def unread(self, size_bytes: int) -> None: ...


def _pool(view: memoryview, base: int, at: int) -> tuple[int, int, list[int]] | None:
    """(pool size, block size, offsets of the blocks in use) of a pool at ``at`` in the
    window ``view`` read from ``base``; None when no pool header is there. ([-1] as the
    offsets: a pool whose chain or count disagree.)"""
    offset = at - base
    if offset + POOL_OVERHEAD > len(view):
        return None
    count, _pad, freeblock, _next, _prev, _index, szidx, nextoffset, maxnext = _HEADER.unpack_from(
        view, offset
    )
    if szidx >= 32:
        return None
    size = (szidx + 1) * 16
    pool_size = maxnext + size
    if (
        pool_size not in POOL_SIZES
        or at % pool_size
        or nextoffset < POOL_OVERHEAD
        or nextoffset > maxnext + size
        or (nextoffset - POOL_OVERHEAD) % size
        or count == 0
        or offset + pool_size > len(view)
    ):
        return None
    below = (nextoffset - POOL_OVERHEAD) // size
    if count > below:
        return pool_size, size, [-1]
    free: set[int] = set()
    block = freeblock
    while block and len(free) <= below:
        inner = block - at
        if inner < POOL_OVERHEAD or inner >= nextoffset or (inner - POOL_OVERHEAD) % size:
            return pool_size, size, [-1]
        if inner in free:
            return pool_size, size, [-1]
        free.add(inner)
        block = int.from_bytes(view[offset + inner : offset + inner + 8], "little")
    used = [o for o in range(POOL_OVERHEAD, nextoffset, size) if o not in free]
    if len(used) != count:
        return pool_size, size, [-1]
    return pool_size, size, used


def _pools_in(view: memoryview, base: int, end: int) -> list[tuple[int, int, int, list[int]]]:
    """(address, pool size, block size, blocks in use or [-1]) of every pool in a window."""
    found_pools = []
    cursor = base - base % POOL_SIZES[1] + (POOL_SIZES[1] if base % POOL_SIZES[1] else 0)
    while cursor < end:
        found = _pool(view, base, cursor)
        if found is None:
            cursor += POOL_SIZES[1]
            continue
        found_pools.append((cursor, *found))
        cursor += found[0]
    return found_pools


def _spans(mappings: Sequence[Mapping], walked: ProcessChunks) -> list[tuple[int, int]]:
    """Anonymous read-write memory that is no glibc heap nor mmapped chunk."""
    spans = [
        (m.start_address, m.end_address)
        for m in mappings
        if m.anonymous and m.perms.startswith("rw") and (m.rss_bytes is None or m.rss_bytes)
    ]
    taken = [
        (h.start & ~((64 << 20) - 1), (h.start & ~((64 << 20) - 1)) + (64 << 20))
        for h in walked.heaps
        if h.arena
    ]
    taken += [(a, a + s) for a, s in walked.mmapped]
    return subtract_spans(spans, taken)


def scan_pools(
    mem: MemoryReader,
    mappings: Sequence[Mapping],
    walked: ProcessChunks,
    sink: BlockSink,
    hold: Callable[[Callable[[], bytes]], bytes] | None = None,
) -> tuple[str, int, int]:
    """Classify every block in use of every pymalloc pool; (a sentence saying what was
    found, pools, blocks in use classified).
    ``hold(read)`` runs a window's read in a stop of the target (None: read as it is)."""
    pools = blocks = inconsistent = 0
    tally = sink.tally
    for start, end in _spans(mappings, walked):
        at = start
        while at < end:
            window_end = min(end, (at // _WINDOW_BYTES + 1) * _WINDOW_BYTES)
            pages = mem.pagemap(at, window_end)
            if not pages.resident_pages:
                at = window_end
                continue

            def read(
                at: int = at, window_end: int = window_end, present: bytes = pages.present
            ) -> bytes:
                return mem.read_present(at, window_end - at, present)

            # A window whose pools disagree with themselves changed while read: read again
            # (in a new stop, after the target ran) a few times before counting them unread.
            for _attempt in range(WINDOW_ATTEMPTS):
                data = hold(read) if hold is not None else read()
                view = memoryview(data)
                found_pools = _pools_in(view, at, window_end)
                if all(used != [-1] for _, _, _, used in found_pools):
                    break
            for cursor, pool_size, size, used in found_pools:
                pools += 1
                if used == [-1]:
                    inconsistent += 1
                    tally.unread(pool_size)
                    continue
                offset = cursor - at
                for inner in used:
                    begin = offset + inner
                    name, kind = sink.name(view[begin : begin + size], size)
                    tally.add(name, kind, size)
                blocks += len(used)
            at = window_end
    note = f"pymalloc: {pools:,} pools, {blocks:,} blocks in use classified"
    if inconsistent:
        note += f"; {inconsistent:,} pools changed while read or are corrupt (counted unread)"
    return note, pools, blocks
