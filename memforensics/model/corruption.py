"""A corrupt heap's finding: where a free list or the top chunk failed a check, in glibc's
words.

A heap read while every thread of its process is held still does not move, so a list that
fails a check there is corrupt, not caught changing (DESIGN rule 8). ``check`` is the
message glibc's malloc_printerr gives when its own check of the same invariant fails
("corrupted double-linked list", "malloc(): memory corruption (fast)" …), the words users
search for; where glibc has no check of its own (a list that loops, a pointer out of the
arena's heaps, which glibc would follow into a crash or a hang) it says so plainly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# The checks, one constant each: glibc's own malloc_printerr messages (malloc/malloc.c).
UNSORTED_LIST = "malloc(): unsorted double linked list corrupted"
SMALLBIN_LIST = "malloc(): smallbin double linked list corrupted"
LARGEBIN_LIST = "malloc(): largebin double linked list corrupted (bk)"
LARGEBIN_NEXTSIZE = "corrupted double-linked list (not small)"
DOUBLE_LINKED = "corrupted double-linked list"
UNSORTED_SIZE = "malloc(): invalid size (unsorted)"
SIZE_VS_PREV_SIZE = "corrupted size vs. prev_size"
UNSORTED_PREV_SIZE = "malloc(): mismatching next->prev_size (unsorted)"
FASTBIN_UNALIGNED = "malloc(): unaligned fastbin chunk detected"
FASTBIN_SIZE = "malloc(): memory corruption (fast)"
TOP_SIZE = "malloc(): corrupted top size"
# Checks glibc does not make (it would follow the pointer: a hang or a crash).
LIST_LOOPS = "free list loops (a cycle)"
OUTSIDE_HEAPS = "pointer outside the arena's heaps"
UNNAMED = "free list inconsistent while held (check not named in time)"


@dataclass(frozen=True, slots=True)
class HeapCorruption:
    """One check that failed: in which arena and bin, at which chunk, and what was read."""

    arena_address: int  # the arena's malloc_state
    # "fastbin 2", "unsorted", "small bin 17", "large bin 68", "top"; "heap": a header met
    # walking the heap chunk by chunk (list_sweep), on no list
    bin: str
    chunk_address: int  # the chunk whose header or link failed (a bin's own head: its address)
    check: str  # glibc's words for the check (the constants above)
    detail: str  # what was read, with addresses
    arena: int | None = None  # the arena's number in malloc_info's order (0: main), once known

    def numbered(self, arena: int) -> HeapCorruption:
        """This finding with its arena's number in malloc_info's order."""
        return replace(self, arena=arena)


def bin_name(index: int, fastbin: int | None = None) -> str:
    """The bin's name as findings give it: 0 with ``fastbin`` (its index), 1 unsorted, 2 … 63
    small, 64 … 126 large."""
    if index == 0:
        return f"fastbin {fastbin}" if fastbin is not None else "fastbins"
    if index == 1:
        return "unsorted"
    return f"small bin {index}" if index < 64 else f"large bin {index}"
