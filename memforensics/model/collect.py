"""Frozen dataclasses for one `collect` run: each target's figures, OOM kill counts, timing."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from memforensics.model.census import CensusType


@dataclass(frozen=True, slots=True)
class ContainerIdentity:
    """Which container a process runs in, read from its cgroup path (no API lookup).

    ``pod_uid`` is the Kubernetes pod UID (dashes, as the API shows it); ``container_id`` the
    runtime's 64-hex container ID. Both are None for a process outside any container.
    """

    pod_uid: str | None = None
    container_id: str | None = None

    @property
    def is_container(self) -> bool:
        return self.pod_uid is not None or self.container_id is not None


@dataclass(frozen=True, slots=True)
class TargetFigures:
    """Heap and process figures of one inspected target, in bytes and seconds."""

    heap_free_bytes: int
    heap_in_use_bytes: int
    heap_system_bytes: int
    heap_free_resident_bytes: int | None  # None: residency could not be read
    heap_arenas: int
    process_resident_bytes: int | None
    pause_seconds: float
    # Measured: what malloc_trim(0) would release now; None where residency is unknown.
    heap_trimmable_bytes: int | None = None
    heap_measured_ratio: float | None = None  # measured free bytes / the dump's free bytes


@dataclass(frozen=True, slots=True)
class TargetResult:
    """One selected process: its identity, and its figures or why it has none.

    ``reason`` is one of a small fixed set (see ``collect.REASONS``) so that it can be a
    metric label; ``detail`` is the full message for people.
    """

    pid: int
    process: str
    container: ContainerIdentity
    figures: TargetFigures | None
    reason: str | None = None
    detail: str | None = None
    elapsed_seconds: float = 0.0
    allocator: str = ""  # what serves malloc (glibc, jemalloc …); "" when not inspected
    # collect --census-top N: the N biggest types of a census and one "other" line.
    census_types: tuple[CensusType, ...] = ()
    # Of that census: the heap bytes it did not read, its pause budget spent (counted in no
    # type; None: no census).
    census_unread_bytes: int | None = None

    @property
    def up(self) -> bool:
        return self.figures is not None


@dataclass(frozen=True, slots=True)
class OomKillKey:
    """The labels one OOM kill counter is kept under."""

    process: str
    scope: str  # "global", "memcg", or the userspace killer ("systemd-oomd", "earlyoom")
    pod_uid: str = ""
    container_id: str = ""


@dataclass(frozen=True, slots=True)
class OomKillCount:
    """Kills counted under one key since the state was created, and the last one's time."""

    key: OomKillKey
    count: int
    last_time: datetime | None = None


@dataclass(frozen=True, slots=True)
class OomReading:
    """What this run learned from the kernel log: cumulative counts and new kills."""

    counts: tuple[OomKillCount, ...]
    new_kills: int
    sources: tuple[str, ...]
    ok: bool  # False: the log could not be read; counts are the previous run's
    baseline: bool = False  # True: first run; kills before it are history, not counted
    error: str | None = None


@dataclass(frozen=True, slots=True)
class CollectRun:
    """Everything one `collect` run produced, for the Prometheus renderer and --json."""

    started: datetime
    finished: datetime
    duration_seconds: float
    max_pause_seconds: float
    pause_used_seconds: float
    targets: tuple[TargetResult, ...]
    oom: OomReading | None
    notes: tuple[str, ...] = field(default=())
