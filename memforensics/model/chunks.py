"""Frozen dataclasses for a walk of a heap's chunks one after the other: every chunk's place,
size and state, the shared input of the census (what is live) and the pins (what holds the
free memory in place).

Invariants a walk guarantees (tests check them against the target's own figures):
- ``addresses`` ascend, each is ``MALLOC_ALIGNMENT``-aligned, and ``addresses[i] +
  sizes[i] == addresses[i + 1]`` for every i below the last: the chunks tile the walked span
  without a gap; the walked span is [``start``, ``addresses[-1] + sizes[-1]``).
- ``states[i]`` is one of the ``ChunkState`` values; at most one chunk is ``TOP`` and it is
  the last one of the heap that holds the arena's top.
- When ``complete`` is False the walk stopped at ``stopped_at`` (a header it could not trust
  or read) and ``stop_reason`` says why in glibc's own words where glibc has them; the
  chunks before it stand.
- Arrays are ``array.array('Q')`` (addresses, sizes) and ``bytes`` (states): compact at
  millions of chunks, importable without numpy (analysis may view them through numpy).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from enum import IntEnum


class ChunkState(IntEnum):
    """What a chunk is, as the heap itself and the arena's lists say."""

    LIVE = 0  # in use by the program (the next chunk's PREV_INUSE set, in no free list)
    FREE = 1  # in a normal bin (unsorted, small, large): the next chunk's PREV_INUSE clear
    FAST = 2  # in a fastbin: looks in use in the heap, found on the arena's fastbin lists
    TCACHE = 3  # in a thread's tcache: looks in use in the heap, found on a tcache list
    TOP = 4  # the arena's top chunk
    BOOKKEEPING = 5  # glibc's own: a tcache_perthread_struct, a heap's closing fenceposts


@dataclass(frozen=True, slots=True)
class HeapChunks:
    """The chunks of one heap of one arena, in address order (see the module's invariants)."""

    arena: int  # malloc_info's arena index (0 = main arena)
    heap: int  # the heap's index in its arena: 0 = the first ([heap] or the first sub-heap)
    start: int  # the first chunk's address
    mapped_end: int  # the end of the heap's mapped (in use) memory
    addresses: array[int]  # 'Q': each chunk's address (its prev_size word)
    sizes: array[int]  # 'Q': each chunk's size without the flag bits
    states: bytes  # one ChunkState value per chunk
    complete: bool  # the walk reached the heap's end (or its top) with every header checked
    stopped_at: int | None = None  # the address of the header the walk could not trust
    stop_reason: str | None = None
    # Chunks walked (len(addresses), or the count alone when the walk kept no arrays).
    chunk_count: int = 0
    # Where the walk ended (the end of its last chunk) when it kept no arrays.
    walked_to: int = 0

    @property
    def walked_end(self) -> int:
        """The end of the last chunk walked (``start`` when none was)."""
        if self.addresses:
            return int(self.addresses[-1] + self.sizes[-1])
        return max(self.walked_to, self.start)


@dataclass(frozen=True, slots=True)
class ProcessChunks:
    """Every heap's chunks of one process (or core), with its mmapped chunks."""

    pid: int
    page_bytes: int
    heaps: tuple[HeapChunks, ...]
    # Chunks glibc served by their own mmap: (address, size) pairs, each a live allocation.
    mmapped: tuple[tuple[int, int], ...]
    notes: tuple[str, ...] = ()  # what the walk could not see, in words
    tcache_keys: int = 0  # tcache keys found (0: tcache chunks not told from live ones)
