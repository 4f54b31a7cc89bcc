"""Frozen dataclasses for a process's memory over time: samples, events and series."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from memforensics.model.advice import Advice
from memforensics.model.pins import HeapPicture
from memforensics.model.process import Waterfall

SampleKind = Literal["heap", "rss"]
# gap: a heap sample was skipped (the target was busy beyond the deadline);
# exit: the process ended; oom-kill: the kernel OOM killer took it; trim: RSS fell sharply
# while in-use did not (malloc_trim ran, inside or outside the process).
EventKind = Literal["gap", "exit", "oom-kill", "trim"]


@dataclass(frozen=True, slots=True)
class ArenaPoint:
    """One arena's figures in a heap sample (no bucket lines: a recording stays small)."""

    index: int
    system_bytes: int
    in_use_bytes: int
    free_bytes: int
    free_ratio: float
    top_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class SizeClassPoint:
    """Free chunks of one size class, merged across arenas (the heap report's histogram)."""

    from_bytes: int
    to_bytes: int | None
    chunks: int
    bytes: int


@dataclass(frozen=True, slots=True)
class Sample:
    """One line of a recording: an RSS reading, or a heap sample with malloc_info's totals.

    ``time`` is None for dumps that carry no time (a malloc_info series); ``totals`` holds
    the ``memforensics/heap/1`` totals keys as read (heap samples only).
    """

    kind: SampleKind
    time: datetime | None
    pid: int | None
    process: str
    rss_bytes: int | None
    anon_bytes: int | None = None
    totals: Mapping[str, Any] | None = None
    pause_seconds: float | None = None
    free_resident_bytes: int | None = None
    arenas: tuple[ArenaPoint, ...] = ()
    histogram: tuple[SizeClassPoint, ...] = ()
    waterfall: Waterfall | None = None
    advice: tuple[Advice, ...] = ()
    sequence: int = 0  # position in its input, to order samples that have no time
    # The runtime the process runs on, when it can be told from the process itself
    # ("cpython", "jvm", "go", "node"); None when unknown or not recorded.
    runtime: str | None = None
    # Each heap's pins and map, when the input carried them (`inspect --json --pins`).
    picture: HeapPicture | None = None

    def total(self, key: str) -> int | None:
        """An integer from ``totals`` (None when absent, null or not a heap sample)."""
        if self.totals is None:
            return None
        value = self.totals.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def in_use_bytes(self) -> int | None:
        return self.total("in_use_bytes")

    @property
    def free_bytes(self) -> int | None:
        return self.total("free_bytes")

    @property
    def free_released_bytes(self) -> int | None:
        """Free bytes whose pages are no longer in RAM (free − free resident), when measured."""
        free = self.free_bytes
        if free is None or self.free_resident_bytes is None:
            return None
        return max(free - self.free_resident_bytes, 0)


@dataclass(frozen=True, slots=True)
class SeriesEvent:
    """Something that happened to a watched process, placed on its time line."""

    kind: EventKind
    time: datetime | None
    pid: int | None
    process: str
    message: str
    rss_bytes: int | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Series:
    """Every sample and event of one process, in time order, from one or more inputs."""

    pid: int | None
    process: str
    samples: tuple[Sample, ...]
    events: tuple[SeriesEvent, ...] = ()
    sources: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def heap_samples(self) -> tuple[Sample, ...]:
        return tuple(s for s in self.samples if s.kind == "heap")

    @property
    def latest_heap(self) -> Sample | None:
        heap = self.heap_samples
        return heap[-1] if heap else None
