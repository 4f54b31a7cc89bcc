"""Frozen dataclasses of a heap census: live chunks counted by type, like ``jmap -histo``."""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("c++", "python", "text", "zeros", "pointers", "unknown")


@dataclass(frozen=True, slots=True)
class CensusType:
    """One line of the census: the live chunks (or pymalloc blocks) of one type."""

    name: str
    kind: str  # one of KINDS
    count: int
    total_bytes: int  # their chunk sizes (headers included), or their blocks' sizes


@dataclass(frozen=True, slots=True)
class CensusRead:
    """How the census was read: from which memory, held how, what it could not see."""

    source: str  # "live" or "core"
    read_seconds: float
    stops: int
    longest_stop_seconds: float
    total_stop_seconds: float
    heaps: int
    heaps_incomplete: int
    unwalked_bytes: int  # heap bytes past a header the walk could not trust
    python_layout: str | None  # e.g. "cpython-3.11 (pymalloc pools 16 KiB)"; None: no CPython
    cxx_runtime: bool  # the C++ runtime's type_info vtables were found (C++ types nameable)
    notes: tuple[str, ...] = ()
    pymalloc_pools: int = 0  # CPython's pools found (0: none, or no CPython)
    pymalloc_blocks: int = 0  # their blocks in use, classified


@dataclass(frozen=True, slots=True)
class Census:
    """What fills one process's heap (live chunks of every arena, mmapped chunks, and the
    blocks in use in CPython's pymalloc pools), by type, biggest first."""

    pid: int
    process_name: str
    time: str  # ISO-8601 UTC
    types: tuple[CensusType, ...]
    live_chunks: int
    live_bytes: int
    classified_bytes: int  # every kind but unknown
    unread_chunks: int  # chunks whose first bytes were on pages not in memory
    unread_bytes: int
    read: CensusRead


@dataclass(frozen=True, slots=True)
class CensusSample:
    """One census taken by ``watch --census``, as a recording keeps it (its biggest types
    and one ``other`` line)."""

    time: str  # ISO-8601 UTC
    pid: int
    process: str
    types: tuple[CensusType, ...]
    live_chunks: int
    live_bytes: int
    pause_seconds: float  # the census's stops, summed


@dataclass(frozen=True, slots=True)
class TypeGrowth:
    """A type that grew over a process's census samples, and how fast."""

    name: str
    kind: str
    first_count: int
    last_count: int
    count_per_hour: float
    bytes_per_hour: float
    samples: int
