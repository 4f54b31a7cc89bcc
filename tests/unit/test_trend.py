"""The trend maths: least-squares growth tests and the verdict, on series with known answers."""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta, timezone

import pytest

from memforensics.analysis.timeline import min_max_buckets, release_marks, representative_buckets
from memforensics.analysis.trend import GROWTH_MIN_BYTES, compute_trend, fit_line
from memforensics.model.series import Sample

MiB = 1 << 20
T0 = datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)


def heap(seconds: float, in_use: float, free: float, rss: float | None = None) -> Sample:
    return Sample(
        kind="heap",
        time=T0 + timedelta(seconds=seconds),
        pid=42,
        process="svc",
        rss_bytes=None if rss is None else int(rss),
        totals={
            "in_use_bytes": int(in_use),
            "free_bytes": int(free),
            "system_bytes": int(in_use + free),
        },
    )


def test_a_perfect_line_is_growing_with_the_exact_rate() -> None:
    fit = fit_line([0, 3600, 7200], [10 * MiB, 20 * MiB, 30 * MiB], timed=True)
    assert fit is not None
    assert fit.per_hour == pytest.approx(10 * MiB)
    assert fit.change_bytes == pytest.approx(20 * MiB)
    assert math.isinf(fit.t_stat)
    assert fit.growing


def test_fewer_than_three_points_give_no_fit() -> None:
    assert fit_line([0, 1], [0, MiB], timed=True) is None


def test_small_growth_below_the_floor_is_flat() -> None:
    """Half a MiB over the window is below GROWTH_MIN_BYTES however clean the line."""
    fit = fit_line([0, 1, 2, 3], [0, MiB / 6, MiB / 3, MiB / 2], timed=True)
    assert fit is not None and fit.change_bytes < GROWTH_MIN_BYTES
    assert not fit.growing


def test_growth_small_against_the_level_is_flat() -> None:
    """+2 MiB on a 1 GiB figure is under 5 % of the level: not a trend worth a verdict."""
    base = 1024 * MiB
    fit = fit_line(
        [0, 1, 2, 3], [base, base + MiB * 2 / 3, base + MiB * 4 / 3, base + 2 * MiB], timed=True
    )
    assert fit is not None and not fit.growing


def test_noise_without_trend_is_stable() -> None:
    """Big random swings (±20 MiB) around a flat level must not read as growth."""
    rng = random.Random(7)
    samples = [heap(i * 60, 200 * MiB + rng.uniform(-20, 20) * MiB, 50 * MiB) for i in range(60)]
    trend = compute_trend(samples)
    assert trend.verdict == "stable"
    assert trend.in_use is not None and not trend.in_use.growing


def test_a_trend_under_noise_is_found() -> None:
    """+1 MiB a minute under ±5 MiB of noise: an hour of samples shows the leak."""
    rng = random.Random(11)
    samples = [
        heap(i * 60, 100 * MiB + i * MiB + rng.uniform(-5, 5) * MiB, 10 * MiB) for i in range(60)
    ]
    trend = compute_trend(samples)
    assert trend.verdict == "in-use-growing"
    assert trend.in_use is not None and trend.in_use.per_hour == pytest.approx(60 * MiB, rel=0.15)


def test_one_jump_in_few_samples_is_not_significant() -> None:
    """Flat, then a single step at the end: too few points to call it a trend."""
    samples = [heap(i, v, MiB) for i, v in enumerate([50 * MiB, 50 * MiB, 50 * MiB, 60 * MiB])]
    trend = compute_trend(samples)
    assert trend.in_use is not None
    assert trend.in_use.t_stat < 3
    assert trend.verdict == "stable"


@pytest.mark.parametrize(
    ("in_use_step", "free_step", "verdict"),
    [
        (2 * MiB, 0, "in-use-growing"),
        (2 * MiB, 8 * MiB, "in-use-growing"),  # both grow: the leak is the news
        (16 * 1024, 8 * MiB, "free-growing"),
        (0, 0, "stable"),
        (0, -4 * MiB, "stable"),  # free shrinking is not fragmentation
    ],
)
def test_verdicts(in_use_step: int, free_step: int, verdict: str) -> None:
    samples = [heap(i, 10 * MiB + i * in_use_step, 40 * MiB + i * free_step) for i in range(6)]
    assert compute_trend(samples).verdict == verdict


def test_unknown_with_too_few_heap_samples_whatever_rss_does() -> None:
    samples = [heap(0, MiB, MiB)] + [
        Sample(kind="rss", time=T0 + timedelta(seconds=i), pid=42, process="svc", rss_bytes=i * MiB)
        for i in range(1, 50)
    ]
    trend = compute_trend(samples)
    assert trend.verdict == "unknown"
    assert trend.rss is not None and trend.rss.growing
    assert "at least 3" in trend.evidence[0]


def test_untimed_series_fit_per_sample_without_hourly_rates() -> None:
    samples = [
        Sample(
            kind="heap",
            time=None,
            pid=None,
            process="dumps.xml",
            rss_bytes=None,
            totals={"in_use_bytes": MiB, "free_bytes": (i + 1) * 10 * MiB},
            sequence=i,
        )
        for i in range(5)
    ]
    trend = compute_trend(samples)
    assert trend.verdict == "free-growing"
    assert trend.free is not None and trend.free.per_hour is None
    assert trend.free.slope_per_unit == pytest.approx(10 * MiB)


def test_release_marks_find_the_trim() -> None:
    rss = [100, 101, 102, 40, 41]
    samples = [
        Sample(kind="rss", time=T0 + timedelta(seconds=i), pid=1, process="p", rss_bytes=v * MiB)
        for i, v in enumerate(rss)
    ]
    marks = release_marks(samples)
    assert [m.time for m in marks] == [T0 + timedelta(seconds=3)]
    assert marks[0].detail["released_bytes"] == 62 * MiB


def test_min_max_buckets_keep_the_extremes() -> None:
    values = [float(i % 100) for i in range(100_000)]
    values[54_321] = 10_000.0  # one spike: it must survive decimation
    kept = min_max_buckets(list(range(len(values))), float, lambda i: values[i], 500)
    assert len(kept) <= 1002
    assert 54_321 in kept and kept[0] == 0 and kept[-1] == len(values) - 1
    assert kept == sorted(kept)


def test_representative_buckets_bound_the_count() -> None:
    kept = representative_buckets(list(range(10_000)), float, float, 300)
    assert len(kept) <= 300 and kept == sorted(kept)
