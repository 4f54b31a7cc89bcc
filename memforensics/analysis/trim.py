"""Pure decisions around a trim: whether to call malloc_trim, how good the forecast was, totals."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from memforensics.model.process import TrimForecast
from memforensics.model.trim import SkipReason, TrimFailure, TrimResult, TrimRound
from memforensics.units import format_bytes


def skip_reason(
    forecast: TrimForecast, *, min_free_bytes: int, dry_run: bool
) -> tuple[SkipReason | None, str | None]:
    """Why not to call malloc_trim now, as (code, words), or (None, None) to go ahead.

    ``--min-free`` is compared with the forecast (free memory still resident), not with
    malloc_info's free total: after a trim glibc still counts the released pages as free, so
    comparing with that total would trim again every round for nothing.
    """
    if dry_run:
        return "dry-run", "--dry-run: forecast only, malloc_trim not called"
    if forecast.releasable_bytes < min_free_bytes:
        return "below-min-free", (
            f"releasable {format_bytes(forecast.releasable_bytes)} is below "
            f"--min-free {format_bytes(min_free_bytes)}"
        )
    return None, None


def forecast_ratio(result: TrimResult) -> float | None:
    """Measured release divided by the forecast; ``None`` when not trimmed or nothing forecast."""
    released = result.released_bytes
    if not result.trimmed or released is None or result.forecast_bytes <= 0:
        return None
    return released / result.forecast_bytes


@dataclass(frozen=True, slots=True)
class RoundsSummary:
    """Totals over the rounds of a periodic run."""

    rounds: int
    trims: int  # malloc_trim calls made
    skips: int  # rounds x targets where the trim was skipped (dry run, below --min-free)
    failures: int
    released_bytes: int  # sum of measured releases
    pause_seconds: float  # total time targets spent stopped


def summarize(rounds: Iterable[TrimRound]) -> RoundsSummary:
    """Add up what a periodic run did."""
    count = trims = skips = failures = 0
    released_bytes = 0
    pause_seconds = 0.0
    for trim_round in rounds:
        count += 1
        for outcome in trim_round.outcomes:
            if isinstance(outcome, TrimFailure):
                failures += 1
                continue
            pause_seconds += outcome.pause_seconds
            if outcome.trimmed:
                trims += 1
                released_bytes += outcome.released_bytes or 0
            else:
                skips += 1
    return RoundsSummary(count, trims, skips, failures, released_bytes, pause_seconds)
