"""Is one figure growing? A least-squares line, its growth tests, and the step check.

A figure counts as *growing* only when all four hold over the observed window:

1. the fitted change (slope × window) is at least ``GROWTH_MIN_BYTES`` (1 MiB) and at least
   ``GROWTH_MIN_SHARE`` (5 %) of the figure's level at the start of the window (its fitted
   value there, at least 1 MiB) — small heaps and small drifts are not worth a verdict;
2. the slope is at least ``SIGNIFICANCE_T`` (3) standard errors above zero — the rise is
   not an accident of a few noisy samples;
3. the fitted change is at least ``NOISE_MULTIPLE`` (2) times the residual standard
   deviation — the rise stands above the sample-to-sample noise;
4. the rise is not one step: the best single step (the samples split in two at one point,
   each part at its own mean; or in two parts with one sample between them, taken while
   the jump was under way, anywhere between the two levels) leaves at least
   ``STEP_RESIDUAL_RATIO`` (half) of the squared residual the line leaves. A level that
   jumps once and stays (glibc moving blocks between mmap and the heap, a cache filled
   once) fits a step far better than a line, whatever its t; a leak's steady rise fits the
   line better than any step.

A figure that passes 1–3 but fails 4 is a *step* (``Fit.step``): reported, never a trend.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import accumulate

from memforensics.model.trend import GROWTH_MIN_BYTES, SIGNIFICANCE_T, Fit

MIN_POINTS = 3
GROWTH_MIN_SHARE = 0.05
NOISE_MULTIPLE = 2.0
STEP_RESIDUAL_RATIO = 0.5


def best_step(ys: Sequence[float]) -> tuple[float, float]:
    """The single step that fits ``ys`` best: (its squared residual, its height).

    Every split point is tried (at least one sample on each side), each side at its mean;
    so is every split with one sample left between the sides (at least two on each), which
    costs nothing when it lies between the two means: a jump that took a moment, caught
    once on its way. Prefix sums make it one pass, so a week of 1 s readings costs no more
    than the line.
    """
    n = len(ys)
    if n < 2:
        return 0.0, 0.0
    shift = ys[0]  # sums of squares of values near zero lose no precision
    values = [y - shift for y in ys]
    sums = [0.0, *accumulate(values)]
    squares = [0.0, *accumulate(v * v for v in values)]

    def part(start: int, end: int) -> tuple[float, float]:
        """(squared residual around the mean, mean) of values[start:end]."""
        total, total_sq = sums[end] - sums[start], squares[end] - squares[start]
        count = end - start
        return total_sq - total * total / count, total / count

    best, height = math.inf, 0.0
    for k in range(1, n):
        (left_res, left_mean), (right_res, right_mean) = part(0, k), part(k, n)
        if left_res + right_res < best:
            best, height = left_res + right_res, right_mean - left_mean
    for k in range(2, n - 2):  # values[k] caught mid-jump
        (left_res, left_mean), (right_res, right_mean) = part(0, k), part(k + 1, n)
        between = min(left_mean, right_mean) <= values[k] <= max(left_mean, right_mean)
        if between and left_res + right_res < best:
            best, height = left_res + right_res, right_mean - left_mean
    return max(best, 0.0), height


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
    rising = (
        change >= GROWTH_MIN_BYTES
        and change >= GROWTH_MIN_SHARE * max(start, GROWTH_MIN_BYTES)
        and t_stat >= SIGNIFICANCE_T
        and change >= NOISE_MULTIPLE * noise
    )
    step = False
    height = 0.0
    if rising:
        step_residual, height = best_step(ys)
        step = step_residual < STEP_RESIDUAL_RATIO * residual
    return Fit(n, slope, start, change, noise, t_stat, rising and not step, timed, step, height)
