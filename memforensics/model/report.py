"""What `report` shows, as entry.reporting builds it: one process's series, trend and marks,
and the whole report over every input."""

from __future__ import annotations

from dataclasses import dataclass

from memforensics.model.census import TypeGrowth
from memforensics.model.oom import HeapAtKill
from memforensics.model.series import Series, SeriesEvent
from memforensics.model.trend import Trend


@dataclass(frozen=True, slots=True)
class ProcessReport:
    """One process over time: its series, its trend, and the marks on its time line."""

    series: Series
    trend: Trend
    marks: tuple[SeriesEvent, ...]  # recorded events plus detected releases, in time order
    # Each recorded OOM kill with the last heap sample before it (None when none fits).
    kills: tuple[tuple[SeriesEvent, HeapAtKill | None], ...] = ()
    # watch --census: the types that grow over the recorded census samples, fastest first.
    growing_types: tuple[TypeGrowth, ...] = ()


@dataclass(frozen=True, slots=True)
class Report:
    """Everything `report` shows: one ProcessReport per process, and what the reader noticed."""

    processes: tuple[ProcessReport, ...]
    inputs: tuple[str, ...]
    notes: tuple[str, ...]
