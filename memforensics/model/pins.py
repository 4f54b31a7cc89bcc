"""Frozen dataclasses for what keeps a heap's free memory from going back: the live chunks
that pin it (a heap shrinks only from its top), and a page-aggregated map of each heap.

A pin is a live chunk with at least a threshold of free memory directly below it, down to
the next chunk that is not free (live, glibc's bookkeeping, or the heap's start): freeing
the pin, once everything above it is freed too, lets the heap shrink by that free memory;
while it lives, free() cannot return it and only malloc_trim cuts its pages (the address
space stays).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Pin:
    """One live chunk holding free memory below it in place (see the module)."""

    arena: int  # malloc_info's arena index (0 = main arena)
    heap: int  # the heap's index in its arena
    address: int  # the chunk's user pointer (chunk address + 16), as the program holds it
    chunk_bytes: int  # the chunk's size
    pinned_free_bytes: int  # free chunk bytes between the next non-free chunk below and it
    resident_bytes: int | None  # of those, the bytes on resident pages (None: unknown, a core)
    rank: int  # 1 = the topmost pin of its heap, 2 = the next one down …
    type: str | None = None  # the census's name for the chunk's type, where it names one
    kind: str | None = None  # what its first bytes look like: "text", "zeros", "binary"
    preview: str | None = None  # its first bytes as printable text, when kind is "text"


@dataclass(frozen=True, slots=True)
class ResidentPages:
    """Which pages from ``start`` (page-aligned) on are resident: one byte per page, 1 = in
    RAM (procmem.PageMap.present)."""

    start: int
    page_bytes: int
    present: bytes


@dataclass(frozen=True, slots=True)
class HeapPins:
    """The pins of one heap and the figures they are measured against."""

    arena: int
    heap: int
    start: int  # the heap's first chunk
    end: int  # the end of its mapped (in use) memory
    heap_bytes: int  # end - start
    live_bytes: int  # live chunks (the program's)
    free_bytes: int  # free chunks: binned, fastbin and tcache, top excluded
    top_bytes: int  # the top chunk, when this heap holds it
    held_free_bytes: int  # free bytes below the topmost live chunk: what free() cannot return
    threshold_bytes: int  # a live chunk pins at least this much to be listed
    pins: tuple[Pin, ...]  # from the top down
    pins_omitted: int  # pins past the listing's cap
    complete: bool  # the walk of this heap was complete


@dataclass(frozen=True, slots=True)
class HeapMap:
    """One heap drawn by cells of ``pages_per_cell`` pages: each cell's bytes by what they
    are. The arrays ('Q') have one entry per cell; a cell's entries add up to the bytes of
    the heap it covers (the last cell may cover less)."""

    arena: int
    heap: int
    start: int  # the first cell's address (page-aligned down from the heap's start)
    end: int  # the heap's mapped end
    page_bytes: int
    pages_per_cell: int
    live: array[int]  # live chunks' bytes
    free_resident: array[int]  # free chunks' bytes on resident pages (trim can cut those pages)
    free_released: array[int]  # free chunks' bytes on pages not resident (already given back)
    top: array[int]  # the top chunk's bytes
    other: array[int]  # glibc's bookkeeping, and bytes the walk did not reach

    @property
    def cell_bytes(self) -> int:
        return self.page_bytes * self.pages_per_cell

    @property
    def cells(self) -> int:
        return len(self.live)


@dataclass(frozen=True, slots=True)
class HeapPicture:
    """Every heap's pins and map, in the walk's order."""

    heaps: tuple[HeapPins, ...]
    maps: tuple[HeapMap, ...]
    resident_known: bool

    @property
    def pins(self) -> tuple[Pin, ...]:
        """Every heap's pins, heap by heap, each heap's from the top down."""
        return tuple(pin for heap in self.heaps for pin in heap.pins)
