"""Trend of one process over time: is in-use growing (a leak), free growing (fragmentation)?

Each figure (in use, free, free resident, RSS) gets a least-squares line over its samples.
A figure counts as *growing* only when all three hold over the observed window:

1. the fitted change (slope × window) is at least ``GROWTH_MIN_BYTES`` (1 MiB) and at least
   ``GROWTH_MIN_SHARE`` (5 %) of the figure's level at the start of the window (its fitted
   value there, at least 1 MiB) — small heaps and small drifts are not worth a verdict;
2. the slope is at least ``SIGNIFICANCE_T`` (3) standard errors above zero — the rise is
   not an accident of a few noisy samples;
3. the fitted change is at least ``NOISE_MULTIPLE`` (2) times the residual standard
   deviation — the rise stands above the sample-to-sample noise.

The verdict: ``in-use-growing`` when in use grows (a leak, or a cache that grows);
otherwise ``free-growing`` when free grows (fragmentation: free chunks pile up while in use
stays flat); otherwise ``stable``. ``unknown`` when there are fewer than ``MIN_POINTS`` (3)
heap samples. The figures are per hour when the samples carry times; a malloc_info series
without times is fitted against its sample number and its per-hour figures are None.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from memforensics.model.series import Sample
from memforensics.units import format_bytes

Verdict = Literal["in-use-growing", "free-growing", "stable", "unknown"]
VERDICTS: tuple[Verdict, ...] = ("in-use-growing", "free-growing", "stable", "unknown")

MiB = 1 << 20
MIN_POINTS = 3
GROWTH_MIN_BYTES = MiB
GROWTH_MIN_SHARE = 0.05
SIGNIFICANCE_T = 3.0
NOISE_MULTIPLE = 2.0
SECONDS_PER_HOUR = 3600.0


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

    @property
    def per_hour(self) -> float | None:
        """Bytes per hour, when the samples carry times."""
        return self.slope_per_unit * SECONDS_PER_HOUR if self.timed else None


def fit_line(xs: Sequence[float], ys: Sequence[float], *, timed: bool) -> Fit | None:
    """Fit ``ys`` against ``xs`` and apply the growth tests; None with fewer than 3 points."""
    n = len(xs)
    if n < MIN_POINTS or n != len(ys):
        return None
    mean_x = math.fsum(xs) / n
    mean_y = math.fsum(ys) / n
    sxx = math.fsum((x - mean_x) ** 2 for x in xs)
    if sxx <= 0:
        return None
    sxy = math.fsum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=False))
    slope = sxy / sxx
    intercept = mean_y - slope * mean_x
    residual = math.fsum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys, strict=False))
    noise = math.sqrt(residual / (n - 2)) if n > 2 else 0.0
    stderr = noise / math.sqrt(sxx)
    if stderr > 0:
        t_stat = slope / stderr
    else:
        t_stat = math.inf if slope > 0 else (-math.inf if slope < 0 else 0.0)
    span = max(xs) - min(xs)
    start = intercept + slope * min(xs)
    change = slope * span
    growing = (
        change >= GROWTH_MIN_BYTES
        and change >= GROWTH_MIN_SHARE * max(start, GROWTH_MIN_BYTES)
        and t_stat >= SIGNIFICANCE_T
        and change >= NOISE_MULTIPLE * noise
    )
    return Fit(n, slope, start, change, noise, t_stat, growing, timed)


@dataclass(frozen=True, slots=True)
class Trend:
    """The per-process trend a report shows: fits, the verdict and the evidence in words."""

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

    @property
    def span_seconds(self) -> float | None:
        if self.first_time is None or self.last_time is None:
            return None
        return (self.last_time - self.first_time).total_seconds()


def _axis(samples: Sequence[Sample]) -> tuple[list[float], bool]:
    """Seconds since the first sample when every sample has a time, else sample numbers."""
    if samples and all(s.time is not None for s in samples):
        first = samples[0].time
        assert first is not None
        return [(s.time - first).total_seconds() for s in samples if s.time is not None], True
    return [float(i) for i in range(len(samples))], False


def _fit(samples: Sequence[Sample], values: Sequence[int | None]) -> Fit | None:
    pairs = [(s, v) for s, v in zip(samples, values, strict=False) if v is not None]
    if len(pairs) < MIN_POINTS:
        return None
    xs, timed = _axis([s for s, _ in pairs])
    return fit_line(xs, [float(v) for _, v in pairs], timed=timed)


def _rate(fit: Fit) -> str:
    if fit.per_hour is not None:
        return f"{format_bytes(fit.per_hour, signed=True)}/h"
    return f"{format_bytes(fit.slope_per_unit, signed=True)} per sample"


def _describe(name: str, fit: Fit | None) -> str | None:
    if fit is None:
        return None
    change = format_bytes(fit.change_bytes, signed=True)
    base = f"{name} {change} over the window ({_rate(fit)}, from {format_bytes(fit.start_bytes)})"
    if fit.growing:
        noise = format_bytes(fit.noise_bytes)
        return f"{base}: growing (t = {min(fit.t_stat, 999):.1f}, noise ±{noise})"
    if fit.change_bytes <= -GROWTH_MIN_BYTES and fit.t_stat <= -SIGNIFICANCE_T:
        return f"{base}: falling"
    return f"{base}: flat within the thresholds (noise ±{format_bytes(fit.noise_bytes)})"


def _by_time(samples: Sequence[Sample]) -> list[Sample]:
    if all(s.time is not None for s in samples):
        return sorted(samples, key=lambda s: (s.time, s.sequence))
    return sorted(samples, key=lambda s: s.sequence)


def compute_trend(samples: Sequence[Sample]) -> Trend:
    """The trend of one process from its samples (heap and RSS, any order)."""
    ordered = _by_time(samples)
    heap = [s for s in ordered if s.kind == "heap"]
    with_rss = [s for s in ordered if s.rss_bytes is not None]
    in_use = _fit(heap, [s.in_use_bytes for s in heap])
    free = _fit(heap, [s.free_bytes for s in heap])
    free_resident = _fit(heap, [s.free_resident_bytes for s in heap])
    rss = _fit(with_rss, [s.rss_bytes for s in with_rss])
    evidence: list[str] = []
    verdict: Verdict
    if in_use is None or free is None:
        verdict = "unknown"
        evidence.append(
            f"{len(heap)} heap sample(s): at least {MIN_POINTS} are needed to tell a leak "
            "from fragmentation"
        )
    elif in_use.growing:
        verdict = "in-use-growing"
        evidence.append(
            "memory in use grows: a leak, or a cache or queue that keeps growing; "
            "trimming cannot help, find what holds the memory"
        )
    elif free.growing:
        verdict = "free-growing"
        evidence.append(
            "free chunks pile up while in use stays flat: fragmentation; fewer arenas "
            "(MALLOC_ARENA_MAX=2) or a periodic malloc_trim may help"
        )
    else:
        verdict = "stable"
        evidence.append("neither in use nor free memory grows beyond the noise")
    for name, fit in (
        ("in use", in_use),
        ("free", free),
        ("free resident", free_resident),
        ("RSS", rss),
    ):
        line = _describe(name, fit)
        if line is not None:
            evidence.append(line)
    times = [s.time for s in ordered if s.time is not None]
    return Trend(
        verdict=verdict,
        in_use=in_use,
        free=free,
        free_resident=free_resident,
        rss=rss,
        heap_samples=len(heap),
        rss_samples=len(with_rss),
        first_time=min(times) if times else None,
        last_time=max(times) if times else None,
        evidence=tuple(evidence),
    )
