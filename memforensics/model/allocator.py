"""The heap of a process served by another allocator than glibc's (jemalloc, tcmalloc,
mimalloc), in that allocator's own figures and in the project's one vocabulary.

The vocabulary is glibc's report's (docs/json.md, docs/allocators.md): in use is what the
application holds, free what the allocator keeps for reuse; of the free bytes, releasable is
what the allocator's own purge gives back to the kernel, and fragmentation what it keeps
inside pages that also hold live objects (no purge gives that back). ``figures`` keeps the
allocator's own names and values, as read, so that every derived figure can be checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ForeignKind = Literal["jemalloc", "tcmalloc", "mimalloc"]
FOREIGN_KINDS: tuple[ForeignKind, ...] = ("jemalloc", "tcmalloc", "mimalloc")


@dataclass(frozen=True, slots=True)
class ForeignLibrary:
    """Where a foreign allocator's functions are: a shared library, or the executable that
    links it in (``prefix``: its functions' name prefix, "je_" in Redis's bundled build)."""

    kind: ForeignKind
    path: str
    prefix: str = ""
    serves_malloc: bool = True  # False: a prefixed copy beside glibc's malloc


@dataclass(frozen=True, slots=True)
class ForeignArena:
    """One arena (jemalloc) or the whole heap (tcmalloc, mimalloc) in the one vocabulary."""

    index: int
    in_use_bytes: int
    free_bytes: int
    releasable_bytes: int  # part of free_bytes the allocator's purge gives back
    system_bytes: int  # in_use + free: what the allocator holds for objects


@dataclass(frozen=True, slots=True)
class ForeignHeap:
    """One reading of a foreign allocator's statistics (see the module). A figure the
    allocator does not keep is None; ``arenas`` add up to the in-use, free and releasable
    totals."""

    library: ForeignLibrary
    version: str | None
    in_use_bytes: int | None
    free_bytes: int | None
    releasable_bytes: int | None
    fragmentation_bytes: int | None
    metadata_bytes: int | None
    resident_bytes: int | None  # the allocator's own count of its resident pages
    mapped_bytes: int | None
    retained_bytes: int | None  # address space kept but not backed (not in RSS)
    arenas: tuple[ForeignArena, ...]
    figures: tuple[tuple[str, int | str], ...]  # the allocator's own names, as read
    notes: tuple[str, ...] = ()
    stop_seconds: float = 0.0  # how long the target was held for the calls, in all
    longest_stop_seconds: float = 0.0  # the longest of those holds
    holds: int = 0  # how many holds the calls took

    @property
    def kind(self) -> ForeignKind:
        return self.library.kind

    def figure(self, name: str) -> int | str | None:
        """One of the allocator's own figures by its own name (None when not read)."""
        return next((value for key, value in self.figures if key == name), None)
