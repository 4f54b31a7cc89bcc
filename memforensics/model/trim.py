"""Frozen records of what one `malloc_trim` did to one process, and of periodic trim rounds."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal, TypedDict

from memforensics.model.process import ProcessMemory, TrimForecast

# Why a trim was not attempted; scripts match on these stable codes.
SkipReason = Literal["dry-run", "below-min-free", "not-glibc"]


class MemoryBeforeAfter(TypedDict):
    """TrimResult's RSS and anonymous figures, before and after (None: not measured)."""

    rss_before_bytes: int
    anon_before_bytes: int | None
    rss_after_bytes: int | None
    anon_after_bytes: int | None


def before_after(before: ProcessMemory, after: ProcessMemory | None) -> MemoryBeforeAfter:
    """The memory fields of a TrimResult; ``before`` must have an RSS (callers refuse a
    target without one before anything else)."""
    if before.rss_bytes is None:
        raise ValueError("a trim's 'before' has no RSS")
    return {
        "rss_before_bytes": before.rss_bytes,
        "anon_before_bytes": before.anon_bytes,
        "rss_after_bytes": after.rss_bytes if after else None,
        "anon_after_bytes": after.anon_bytes if after else None,
    }


@dataclass(frozen=True, slots=True)
class TrimResult:
    """One target, one attach: RSS before, the forecast, the trim (unless skipped), RSS after.

    Byte counts that were not measured are ``None`` (unknown), never 0: a dry run has no
    "after", and ``trim_returned`` is ``None`` when ``malloc_trim`` was not called, or was
    called without gdb (``trim_called``), which keeps no return value.
    ``released_bytes`` is RSS before minus RSS after, so it is negative when the target grew
    meanwhile; it is measured, not derived from the forecast.
    """

    pid: int
    name: str | None
    time: datetime  # UTC, when the measurement began
    rss_before_bytes: int
    anon_before_bytes: int | None
    rss_after_bytes: int | None
    anon_after_bytes: int | None
    forecast: TrimForecast  # whole resident pages inside free chunks: what a trim can release
    free_bytes: int  # malloc_info's free (fast + rest), resident or not
    heap_bytes: int  # malloc_info's system current: arena memory obtained from the OS
    arenas: int
    pad_bytes: int
    dry_run: bool
    trim_returned: int | None  # malloc_trim's return: 1 if it released memory, else 0
    pause_seconds: float  # how long the target was stopped in total (dump + trim)
    skipped: SkipReason | None = None
    # malloc_trim was called without gdb (entry.trimmers.direct): it ran, and its return value
    # was not kept (``trim_returned`` is then None).
    trim_called: bool = False
    skipped_detail: str | None = None
    notes: tuple[str, ...] = ()  # what the forecast cannot see (tcache, top chunk, ...)
    # A foreign allocator's purge made instead of malloc_trim (entry.trimmers.allocator): the
    # call, as "jemalloc: mallctl(\"arena.4096.purge\")"; None for glibc's malloc_trim.
    purge: str | None = None

    @property
    def forecast_bytes(self) -> int:
        """Bytes the forecast says ``malloc_trim`` can give back (made before trimming)."""
        return self.forecast.releasable_bytes

    @property
    def trimmed(self) -> bool:
        """True when ``malloc_trim`` was actually called in the target."""
        return self.trim_called or self.trim_returned is not None

    @property
    def released_bytes(self) -> int | None:
        """RSS before minus RSS after; ``None`` when nothing was measured after."""
        if self.rss_after_bytes is None:
            return None
        return self.rss_before_bytes - self.rss_after_bytes

    @property
    def anon_released_bytes(self) -> int | None:
        """Anonymous RSS before minus after; ``None`` when either side is unknown."""
        if self.anon_after_bytes is None or self.anon_before_bytes is None:
            return None
        return self.anon_before_bytes - self.anon_after_bytes


@dataclass(frozen=True, slots=True)
class TrimFailure:
    """A target that could not be trimmed this time: the error's message and exit code."""

    pid: int
    time: datetime
    message: str
    hint: str | None
    exit_code: int


TrimOutcome = TrimResult | TrimFailure


@dataclass(frozen=True, slots=True)
class TrimRound:
    """One round of periodic trimming: one outcome per target, in the order given."""

    index: int  # 1-based
    time: datetime  # UTC, when the round began
    outcomes: tuple[TrimOutcome, ...]

    @property
    def released_bytes(self) -> int:
        """Sum of measured releases over the targets trimmed in this round."""
        return sum(
            o.released_bytes
            for o in self.outcomes
            if isinstance(o, TrimResult) and o.released_bytes is not None
        )
