"""The trend of one process over time, as analysis.fit and analysis.trend compute it: one
figure's fitted line (Fit) and the verdict with its evidence (Trend).

A figure grows (``Fit.growing``) when its fitted change is at least GROWTH_MIN_BYTES and the
slope at least SIGNIFICANCE_T standard errors above zero (analysis.fit states the tests);
these two thresholds are defined here, once, because ``Fit.falling`` uses them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from memforensics.units import MiB

GROWTH_MIN_BYTES = MiB
SIGNIFICANCE_T = 3.0
SECONDS_PER_HOUR = 3600.0

Verdict = Literal[
    "in-use-growing",
    "mmap-growing",
    "outside-malloc-growing",
    "free-growing",
    "rss-growing",
    "stable",
    "unknown",
]


@dataclass(frozen=True, slots=True)
class Fit:
    """A least-squares line through one figure's samples and what it says."""

    points: int
    slope_per_unit: float  # bytes per second (timed) or per sample (untimed)
    start_bytes: float  # fitted value at the window's start
    change_bytes: float  # fitted change over the window
    noise_bytes: float  # residual standard deviation
    t_stat: float  # slope / its standard error (inf for a perfect line)
    growing: bool
    timed: bool
    step: bool = False  # tests 1-3 passed, but one step explains the rise better than a line
    step_bytes: float = 0.0  # the best single step's height (right mean − left mean)

    @property
    def per_hour(self) -> float | None:
        """Bytes per hour, when the samples carry times."""
        return self.slope_per_unit * SECONDS_PER_HOUR if self.timed else None

    @property
    def falling(self) -> bool:
        return self.change_bytes <= -GROWTH_MIN_BYTES and self.t_stat <= -SIGNIFICANCE_T


@dataclass(frozen=True, slots=True)
class Trend:
    """The per-process trend a report shows: fits, the verdict and the evidence in words.

    ``in_use`` and ``free`` are malloc_info's figures (the arenas' system − free, and the
    bins' free bytes); the verdict reads ``live`` and the waterfall lines instead.
    """

    verdict: Verdict
    in_use: Fit | None
    free: Fit | None
    free_resident: Fit | None
    rss: Fit | None
    heap_samples: int
    rss_samples: int
    first_time: datetime | None
    last_time: datetime | None
    evidence: tuple[str, ...]
    live: Fit | None = None
    arena_in_use: Fit | None = None
    mmap_chunks: Fit | None = None
    other_anon: Fit | None = None
    stacks: Fit | None = None
    shmem: Fit | None = None
    file: Fit | None = None
    runtime: str | None = None
    growing_lines: tuple[str, ...] = ()  # keys of the lines that grow, largest first
    step_lines: tuple[str, ...] = ()  # keys of the lines that rose in one step
    figures: Literal["waterfall", "malloc_info"] = "malloc_info"

    @property
    def span_seconds(self) -> float | None:
        if self.first_time is None or self.last_time is None:
            return None
        return (self.last_time - self.first_time).total_seconds()

    def fits(self) -> tuple[tuple[str, str, Fit | None], ...]:
        """(key, words, fit) of every figure, in the order the evidence lists them."""
        return (
            ("live", "live (arena in use + mmapped chunks)", self.live),
            ("arena_in_use", "arena in use", self.arena_in_use),
            ("mmap_chunks", "mmapped chunks", self.mmap_chunks),
            ("free_resident", "free resident", self.free_resident),
            ("other_anon", "other anonymous", self.other_anon),
            ("stacks", "thread stacks", self.stacks),
            ("shmem", "shared memory", self.shmem),
            ("file", "file-backed", self.file),
            ("in_use", "malloc_info in use", self.in_use),
            ("free", "malloc_info free", self.free),
            ("rss", "RSS", self.rss),
        )
