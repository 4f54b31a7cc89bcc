"""Time-line helpers for reports: marks where memory was given back, and downsampling.

A week of RSS readings at 1 s is 604,800 points: far more than a chart is wide. Each chart
keeps, per pixel-wide bucket, the lowest and the highest reading (min/max decimation), so a
spike or a sudden drop (an OOM kill, a trim) survives at any zoom the page starts with;
heap samples keep one representative per bucket (the one with the most arena memory), so the
stacked in-use/free parts of a bar still add up to what glibc printed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from memforensics.model.series import Sample, SeriesEvent
from memforensics.units import format_bytes

T = TypeVar("T")

# A drop in RSS between two readings counts as memory given back (a trim, or large blocks
# freed) when it is at least this large, in bytes and as a share of the RSS before it.
RELEASE_MIN_BYTES = 4 << 20
RELEASE_MIN_SHARE = 0.10


def release_marks(samples: Sequence[Sample]) -> list[SeriesEvent]:
    """A ``trim`` event wherever RSS fell sharply from one reading to the next."""
    marks: list[SeriesEvent] = []
    previous: Sample | None = None
    for sample in samples:
        if sample.rss_bytes is None or sample.time is None:
            continue
        if previous is not None and previous.rss_bytes is not None:
            drop = previous.rss_bytes - sample.rss_bytes
            if drop >= RELEASE_MIN_BYTES and drop >= RELEASE_MIN_SHARE * previous.rss_bytes:
                marks.append(
                    SeriesEvent(
                        kind="trim",
                        time=sample.time,
                        pid=sample.pid,
                        process=sample.process,
                        message=f"RSS fell by {format_bytes(drop)} (memory given back: "
                        "malloc_trim, or large blocks freed)",
                        rss_bytes=sample.rss_bytes,
                        detail={"released_bytes": drop},
                    )
                )
        previous = sample
    return marks


def min_max_buckets(
    items: Sequence[T], key_x: Callable[[T], float], key_y: Callable[[T], float], buckets: int
) -> list[T]:
    """At most ``2 × buckets`` items: the lowest and highest of each equal-width x bucket.

    ``items`` must be in x order; the first and last item are always kept.
    """
    if len(items) <= 2 * buckets or buckets <= 0:
        return list(items)
    low_x, high_x = key_x(items[0]), key_x(items[-1])
    width = (high_x - low_x) / buckets or 1.0
    kept: list[T] = [items[0]]
    start = 0
    while start < len(items):
        bucket = int((key_x(items[start]) - low_x) / width)
        end = start
        while end < len(items) and int((key_x(items[end]) - low_x) / width) == bucket:
            end += 1
        chunk = items[start:end]
        lowest = min(chunk, key=key_y)
        highest = max(chunk, key=key_y)
        for item in sorted({id(lowest): lowest, id(highest): highest}.values(), key=key_x):
            if item is not kept[-1]:
                kept.append(item)
        start = end
    if kept[-1] is not items[-1]:
        kept.append(items[-1])
    return kept


def representative_buckets(
    items: Sequence[T], key_x: Callable[[T], float], key_y: Callable[[T], float], buckets: int
) -> list[T]:
    """At most ``buckets`` items: the one with the highest ``key_y`` in each x bucket."""
    if len(items) <= buckets or buckets <= 0:
        return list(items)
    low_x, high_x = key_x(items[0]), key_x(items[-1])
    width = (high_x - low_x) / buckets or 1.0
    best: dict[int, T] = {}
    for item in items:
        bucket = min(int((key_x(item) - low_x) / width), buckets - 1)
        if bucket not in best or key_y(item) > key_y(best[bucket]):
            best[bucket] = item
    return [best[b] for b in sorted(best)]
