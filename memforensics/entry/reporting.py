"""Library entry point for `report`: read recordings and dumps, group them per process, and
compute each process's trend and marks. Never prints; renderers turn the result into pages."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

from memforensics.analysis.census_growth import growing_types
from memforensics.analysis.oom_join import join_kill
from memforensics.analysis.samples import sample_from_dump
from memforensics.analysis.timeline import release_marks
from memforensics.analysis.trend import compute_trend
from memforensics.model.census import CensusSample
from memforensics.model.oom import HeapAtKill
from memforensics.model.report import ProcessReport, Report
from memforensics.model.series import Sample, Series, SeriesEvent
from memforensics.sources.files.census_doc import census_samples
from memforensics.sources.files.recording import read_recording
from memforensics.sources.files.report_inputs import file_time, read_heap_json, sniff
from memforensics.sources.malloc_info.malloc_xml import iter_dumps


@dataclass
class _Pile:
    samples: list[Sample]
    events: list[SeriesEvent]
    sources: list[str]


def _xml_samples(
    path: str | os.PathLike[str], dump_interval_seconds: float | None
) -> tuple[list[Sample], list[str]]:
    """Heap samples from a dump or a series of dumps; times only where they can be known."""
    dumps = list(iter_dumps(path))
    name = Path(path).name
    notes: list[str] = []
    end = file_time(path)
    samples = []
    for position, dump in enumerate(dumps):
        if len(dumps) == 1:
            when = end
        elif dump_interval_seconds is not None:
            when = end - timedelta(seconds=dump_interval_seconds * (len(dumps) - 1 - position))
        else:
            when = None
        samples.append(sample_from_dump(dump, time=when, process=name, sequence=position))
    if len(dumps) > 1 and dump_interval_seconds is None:
        notes.append(
            f"{name}: {len(dumps)} dumps without times: the trend is per dump, not per hour "
            "(give the spacing of the dumps to get rates per hour)"
        )
    return samples, notes


def load(
    paths: Sequence[str | os.PathLike[str]], *, dump_interval_seconds: float | None = None
) -> tuple[list[Series], list[str]]:
    """Read every input and group samples and events per process (pid and name)."""
    piles: dict[tuple[int | None, str], _Pile] = {}
    notes: list[str] = []

    def pile(pid: int | None, process: str) -> _Pile:
        return piles.setdefault((pid, process), _Pile([], [], []))

    def add(samples: Iterable[Sample], events: Iterable[SeriesEvent], source: str) -> None:
        key: tuple[int | None, str] | None = None
        target = _Pile([], [], [])
        for sample in samples:
            if key != (sample.pid, sample.process):  # runs of one process: look up once
                key = (sample.pid, sample.process)
                target = pile(*key)
                if source not in target.sources:
                    target.sources.append(source)
            target.samples.append(sample)
        for event in events:
            pile(event.pid, event.process).events.append(event)

    for path in paths:
        kind = sniff(path)
        if kind == "recording":
            recording = read_recording(path)
            add(recording.samples, recording.events, str(path))
            notes.extend(recording.notes)
        elif kind == "heap-json":
            add(read_heap_json(path), (), str(path))
        else:
            samples, xml_notes = _xml_samples(path, dump_interval_seconds)
            add(samples, (), str(path))
            notes.extend(xml_notes)
    series = [
        Series(
            pid=pid,
            process=process,
            samples=tuple(p.samples),
            events=tuple(p.events),
            sources=tuple(p.sources),
        )
        for (pid, process), p in piles.items()
        if p.samples or p.events
    ]
    return series, notes


def _ordered(samples: Sequence[Sample]) -> list[Sample]:
    if all(s.time is not None for s in samples):
        return sorted(samples, key=lambda s: (s.time, s.sequence))
    return list(samples)


def process_report(series: Series) -> ProcessReport:
    """Trend and marks for one process."""
    ordered = tuple(_ordered(series.samples))
    series = Series(
        pid=series.pid,
        process=series.process,
        samples=ordered,
        events=series.events,
        sources=series.sources,
        notes=series.notes,
    )
    marks = [*series.events, *release_marks(ordered)]
    never = datetime.min.replace(tzinfo=timezone.utc)
    marks.sort(key=lambda e: e.time or never)
    kills = tuple((event, _join(event, series)) for event in marks if event.kind == "oom-kill")
    return ProcessReport(
        series=series, trend=compute_trend(ordered), marks=tuple(marks), kills=kills
    )


def _join(kill: SeriesEvent, series: Series) -> HeapAtKill | None:
    """The recorded kill beside the process's last heap sample before it."""
    anon = kill.detail.get("anon_rss_bytes")
    return join_kill(
        series.samples,
        pid=kill.pid,
        process=kill.process,
        killed=kill.time,
        anon_rss_bytes=anon if isinstance(anon, int) else None,
        source=", ".join(series.sources),
        events=series.events,
    )


def build_report(
    paths: Sequence[str | os.PathLike[str]], *, dump_interval_seconds: float | None = None
) -> Report:
    """Read ``paths`` and compute every process's trend (raises InputDataError on bad input)."""
    series, notes = load(paths, dump_interval_seconds=dump_interval_seconds)
    censuses: dict[tuple[int | None, str], list[CensusSample]] = {}
    for path in paths:
        if sniff(path) == "recording":
            for sample in census_samples(str(path)):
                censuses.setdefault((sample.pid, sample.process), []).append(sample)
    processes = []
    for one in series:
        report = process_report(one)
        samples = censuses.get((one.pid, one.process), [])
        if samples:
            report = replace(report, growing_types=growing_types(samples))
        processes.append(report)
    return Report(
        processes=tuple(processes),
        inputs=tuple(str(p) for p in paths),
        notes=tuple(notes),
    )
