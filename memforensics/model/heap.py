"""Frozen dataclasses for one glibc ``malloc_info`` dump: arenas, bins and totals."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

BucketKind = Literal["fast", "bin", "unsorted"]


@dataclass(frozen=True, slots=True)
class SizeBucket:
    """One ``<size>`` or ``<unsorted>`` line: free chunks of one bin of one arena.

    ``from_bytes``/``to_bytes`` are printed as glibc prints them: regular bins carry the
    PREV_INUSE bit (odd values, ``total_bytes`` over by ``count``); ``chunk_bytes``
    removes that artefact.
    """

    kind: BucketKind
    from_bytes: int
    to_bytes: int
    total_bytes: int
    count: int
    line: int = 0
    suspect: bool = False

    @property
    def chunk_bytes(self) -> int:
        """Bytes of free chunks with glibc's PREV_INUSE artefact removed."""
        if self.kind == "fast" or self.to_bytes % 2 == 0:
            return self.total_bytes
        return max(self.total_bytes - self.count, 0)


@dataclass(frozen=True, slots=True)
class Arena:
    """One ``<heap nr=N>``: a malloc arena (0 is the main arena, 1 the newest)."""

    index: int
    sizes: tuple[SizeBucket, ...]
    fast_chunks: int | None  # None: glibc without fastbins (after 2.43) prints no line
    fast_bytes: int | None
    rest_chunks: int
    rest_bytes: int
    system_bytes: int
    system_max_bytes: int
    aspace_total_bytes: int | None = None
    aspace_mprotect_bytes: int | None = None
    subheaps: int | None = None  # glibc >= 2.27, non-main arenas only
    line: int = 0
    extra: tuple[tuple[str, str], ...] = ()  # unknown elements/attributes, kept verbatim

    @property
    def free_bytes(self) -> int:
        """Bytes in free chunks the arena holds in its bins (fast + rest)."""
        return (self.fast_bytes or 0) + self.rest_bytes

    @property
    def in_use_bytes(self) -> int:
        """Upper bound of bytes in use: system current minus free (DESIGN.md)."""
        return max(self.system_bytes - self.free_bytes, 0)

    @property
    def free_ratio(self) -> float:
        """Share of the arena's system memory that sits free in bins (0..1)."""
        if self.system_bytes <= 0:
            return 0.0
        return min(self.free_bytes / self.system_bytes, 1.0)

    @property
    def suspect(self) -> bool:
        """True when glibc printed implausible numbers (old uninitialised counters)."""
        return any(bucket.suspect for bucket in self.sizes)


@dataclass(frozen=True, slots=True)
class HeapDump:
    """One ``<malloc version="1">`` document: every arena plus the process totals."""

    version: str
    arenas: tuple[Arena, ...]
    fast_chunks: int | None
    fast_bytes: int | None
    rest_chunks: int
    rest_bytes: int
    mmap_chunks: int | None  # None: glibc before ~2.17 printed no mmap total
    mmap_bytes: int | None
    system_bytes: int
    system_max_bytes: int
    aspace_total_bytes: int | None = None
    aspace_mprotect_bytes: int | None = None
    source: str = "<memory>"
    line: int = 1
    sequence: int = 0  # position of this dump in a file holding a series
    extra: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = field(default=())  # what the parser noticed about the dialect

    @property
    def free_bytes(self) -> int:
        """Bytes in free chunks across all arenas (fast + rest)."""
        return (self.fast_bytes or 0) + self.rest_bytes

    @property
    def in_use_bytes(self) -> int:
        """Upper bound of bytes in use inside arenas: system current minus free."""
        return max(self.system_bytes - self.free_bytes, 0)

    @property
    def free_ratio(self) -> float:
        """Share of arena memory that sits free in bins (0..1)."""
        if self.system_bytes <= 0:
            return 0.0
        return min(self.free_bytes / self.system_bytes, 1.0)

    @property
    def all_zero(self) -> bool:
        """True when glibc malloc holds nothing: another allocator serves this process."""
        return (
            self.system_bytes == 0
            and self.free_bytes == 0
            and not self.mmap_bytes
            and all(a.system_bytes == 0 for a in self.arenas)
        )
