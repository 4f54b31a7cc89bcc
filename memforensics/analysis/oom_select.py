"""Whole scans: run the parser over every source, merge a kill seen in two sources, filter by
time and name, and group by process."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from datetime import datetime
from fnmatch import fnmatchcase

from memforensics.analysis.oom import OomLogParser
from memforensics.analysis.oom_incident import evolve
from memforensics.model.logrecord import LogRecord
from memforensics.model.oom import OomEvent, OomScan, ProcessSummary


def select_events(
    events: Iterable[OomEvent],
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    process: str | None = None,
) -> Iterator[OomEvent]:
    """Events within [since, until] whose victim name matches ``process`` (a glob).

    An event without a wall-clock time cannot be placed and is left out when a time bound
    is given (the scan notes how many).
    """
    for event in events:
        if since is not None or until is not None:
            if event.time is None:
                continue
            if since is not None and event.time < since:
                continue
            if until is not None and event.time > until:
                continue
        if process is not None and not fnmatchcase(event.process or "", process):
            continue
        yield event


def scan(
    streams: Iterable[tuple[str, Iterable[LogRecord]]],
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    process: str | None = None,
    notes: Iterable[str] = (),
) -> OomScan:
    """Parse every stream (name, records), merge kills seen in several, filter, and return
    one OomScan naming every stream read."""
    events: list[OomEvent] = []
    names: list[str] = []
    next_incident = 1
    for name, records in streams:
        names.append(name)
        parser = OomLogParser(next_incident)
        for record in records:
            parser.feed(record)
        events.extend(parser.finish())
        next_incident = parser.next_incident
    all_notes = list(notes)
    merged, duplicates = merge_duplicates(events)
    if duplicates:
        all_notes.append(f"{duplicates} kill(s) found in more than one source, reported once")
    selected = list(select_events(merged, since=since, until=until, process=process))
    if since is not None or until is not None:
        untimed = sum(1 for event in merged if event.time is None)
        if untimed:
            all_notes.append(
                f"{untimed} kill(s) without a wall-clock time in the log were left out by "
                "the time range"
            )
    return OomScan(events=tuple(selected), sources=tuple(names), notes=tuple(all_notes))


# A kill seen in two sources (kern.log and /dev/kmsg, syslog and kern.log) carries the same
# kernel timestamp; wall-clock stamps differ by the sources' clocks (dmesg -T drifts after
# suspend), so they only need to be close.
_SAME_UPTIME_SECONDS = 0.001
_SAME_TIME_SECONDS = 90.0


def _same_kill(first: OomEvent, second: OomEvent) -> bool:
    if first.source == second.source or first.killer != second.killer:
        return False
    if first.pid != second.pid or first.process != second.process:
        return False
    if first.boot_id and second.boot_id and first.boot_id != second.boot_id:
        return False
    if first.uptime_seconds is not None and second.uptime_seconds is not None:
        return abs(first.uptime_seconds - second.uptime_seconds) <= _SAME_UPTIME_SECONDS
    if first.time is not None and second.time is not None:
        return abs((first.time - second.time).total_seconds()) <= _SAME_TIME_SECONDS
    return False


def _fill(kept: OomEvent, other: OomEvent) -> OomEvent:
    """``kept`` with what only ``other`` knew (a field is never overwritten)."""
    updates: dict[str, object] = {}
    for name in OomEvent.__dataclass_fields__:
        value = getattr(kept, name)
        if value is None or value == ():
            extra = getattr(other, name)
            if extra is not None and extra != ():
                updates[name] = extra
    if other.confirmed and not kept.confirmed:
        updates["confirmed"] = True
    return replace(kept, **updates) if updates else kept  # type: ignore[arg-type]


def merge_duplicates(events: Iterable[OomEvent]) -> tuple[list[OomEvent], int]:
    """One event per kill across sources, incidents renumbered in order; and how many merged."""
    kept: list[OomEvent] = []
    by_key: dict[tuple[str, int | None, str | None], list[int]] = {}
    duplicates = 0
    for event in events:
        key = (event.killer, event.pid, event.process)
        for index in by_key.get(key, ()):
            if _same_kill(kept[index], event):
                kept[index] = _fill(kept[index], event)
                duplicates += 1
                break
        else:
            by_key.setdefault(key, []).append(len(kept))
            kept.append(event)
    numbers: dict[tuple[str, int], int] = {}
    renumbered = []
    for event in kept:
        number = numbers.setdefault((event.source, event.incident), len(numbers) + 1)
        renumbered.append(event if number == event.incident else evolve(event, incident=number))
    return renumbered, duplicates


def summarize(events: Iterable[OomEvent]) -> list[ProcessSummary]:
    """Kills per process name: count, largest anon-rss, last time; most kills first."""
    groups: dict[str, list[OomEvent]] = {}
    for event in events:
        groups.setdefault(event.process or "?", []).append(event)
    summaries = []
    for name, group in groups.items():
        sizes = [e.anon_rss_bytes for e in group if e.anon_rss_bytes is not None]
        times = [e.time for e in group if e.time is not None]
        summaries.append(
            ProcessSummary(
                process=name,
                kills=len(group),
                largest_anon_rss_bytes=max(sizes) if sizes else None,
                last_time=max(times) if times else None,
            )
        )
    summaries.sort(key=lambda s: (-s.kills, s.process))
    return summaries
