"""Which types grow over a process's census samples (``watch --census``), and how fast: the
names a leak verdict gives ("shop::Session +50,000/h, +6.1 MiB/h").

A type grows when its count rose from the first sample to the last, fell in no more than a
quarter of the steps between samples (a cache or a queue goes up and down), and rose by more
than GROWTH_MIN_SHARE of its first count (or from nothing). Rates are least-squares slopes over
the samples' times, per hour. Named types (C++, Python) come first, then by bytes per hour.
"""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Sequence

from memforensics.model.census import CensusSample, TypeGrowth

GROWTH_MIN_SHARE = 0.01
TOP_GROWING = 5
_NAMED = frozenset(("c++", "python"))


def _hours(sample: CensusSample) -> float | None:
    try:
        moment = datetime.datetime.fromisoformat(sample.time.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.timestamp() / 3600


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


def growing_types(
    samples: Sequence[CensusSample], top: int = TOP_GROWING
) -> tuple[TypeGrowth, ...]:
    """The types that grow across ``samples`` (one process's, any order), fastest first."""
    timed = [(h, s) for s in samples if (h := _hours(s)) is not None]
    timed.sort(key=lambda pair: pair[0])
    if len(timed) < 2 or timed[-1][0] <= timed[0][0]:
        return ()
    hours = [h for h, _ in timed]
    keys = {(t.name, t.kind) for _, s in timed for t in s.types if t.kind != "other"}
    rows: list[TypeGrowth] = []
    for name, kind in keys:
        counts: list[int] = []
        sizes: list[int] = []
        for _, sample in timed:
            line = next((t for t in sample.types if (t.name, t.kind) == (name, kind)), None)
            counts.append(line.count if line else 0)
            sizes.append(line.total_bytes if line else 0)
        rise = counts[-1] - counts[0]
        falls = sum(1 for a, b in itertools.pairwise(counts) if b < a)
        if rise <= 0 or falls * 4 > len(counts) - 1 or rise <= GROWTH_MIN_SHARE * counts[0]:
            continue
        rows.append(
            TypeGrowth(
                name=name,
                kind=kind,
                first_count=counts[0],
                last_count=counts[-1],
                count_per_hour=_slope(hours, counts),
                bytes_per_hour=_slope(hours, sizes),
                samples=len(counts),
            )
        )
    rows.sort(key=lambda r: (r.kind not in _NAMED, -r.bytes_per_hour, r.name))
    return tuple(rows[:top])


def growth_words(growth: TypeGrowth) -> str:
    """``shop::Session +50,000/h, +6.1 MiB/h``."""
    from memforensics.units import format_bytes

    return (
        f"{growth.name} {growth.count_per_hour:+,.0f}/h, "
        f"{format_bytes(round(growth.bytes_per_hour), signed=True)}/h"
    )


def growth_sentence(growths: Sequence[TypeGrowth]) -> str:
    """The report's line naming the growing types (empty when none grows)."""
    if not growths:
        return ""
    return "types that grow (census): " + "; ".join(growth_words(g) for g in growths)
