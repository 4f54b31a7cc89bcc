"""Library entry point of `memforensics collect`: one run for a timer.

Inspects the selected processes within a total pause budget, counts OOM kills since the
previous run with a cursor kept on disk, and returns a CollectRun model; rendering it as
Prometheus textfile metrics is the render layer's job. A target that fails or vanishes is
recorded as down with a reason, never fatal: a timer run must always produce its file.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from memforensics.analysis.oom_select import scan
from memforensics.analysis.residency import residency_figures
from memforensics.entry.collect_heap import update_heap_samples
from memforensics.entry.collect_state import (
    CollectState,
    count_new_kills,
    load_state,
    save_state,
    state_lock,
)
from memforensics.entry.oomscan import scan_default
from memforensics.errors import (
    DeadlineError,
    HeapCorruptionError,
    MemforensicsError,
    NoSuchProcessError,
    NotGlibcMallocError,
    TargetError,
    TargetPermissionError,
    TargetStoppedError,
    ToolingError,
)
from memforensics.model.census import CensusType
from memforensics.model.collect import (
    CollectRun,
    OomReading,
    TargetFigures,
    TargetResult,
)
from memforensics.model.logrecord import LogRecord
from memforensics.model.oom import OomScan
from memforensics.sources.logs.journal import JournalReader
from memforensics.sources.logs.kmsg import KmsgReader
from memforensics.sources.logs.logfile import read_text_log
from memforensics.sources.proc import process_search
from memforensics.sources.proc.cgroup import read_container_identity

Log = Callable[[str], None]

# Why a target is down; a fixed set, because it becomes the `reason` label of target_up.
REASONS = (
    "pause_budget",  # not inspected: earlier targets used up the pause budget
    "gone",  # exited before or while it was inspected
    "permission",  # ptrace not allowed
    "timeout",  # no safe point, a call or a read not done in time (left running)
    "not_glibc",  # another allocator or libc: malloc_info says nothing
    "stopped",  # stopped by someone else (state T): left alone
    "corrupt",  # its heap failed glibc's own checks: a finding, nothing called into it
    "target",  # another refusal: zombie, kernel thread, already traced
    "tooling",  # gdb missing or failing
    "internal",  # a bug in memforensics: the message says which
)
# Errors raised before gdb attaches: they stopped nothing, so they spend no pause budget.
_REFUSED_BEFORE_ATTACH = (
    NoSuchProcessError,
    NotGlibcMallocError,
    TargetPermissionError,
    TargetStoppedError,
)


@dataclass(frozen=True)
class OomSources:
    """Where to read OOM kills: a journal directory, saved text logs, /dev/kmsg, or (all
    unset) the system's own log: the journal, else /dev/kmsg, else kern.log."""

    journal_directory: str | None = None
    files: tuple[str, ...] = ()
    kmsg: bool = False


def read_oom_scan(sources: OomSources, *, since: datetime | None) -> OomScan:
    """Every OOM kill at or after ``since`` in ``sources``: collect's one read of the log."""
    if not (sources.journal_directory or sources.files or sources.kmsg):
        # The system's own log, wherever the host keeps it (journal, else kmsg + syslog).
        return scan_default(since=since)
    streams: list[tuple[str, Iterable[LogRecord]]] = []
    journal: JournalReader | None = None
    if sources.journal_directory is not None:
        journal = JournalReader(directory=sources.journal_directory, since=since)
    elif sources.files:
        streams.extend((path, read_text_log(path)) for path in sources.files)
    else:
        streams.append(("kmsg", KmsgReader().records()))
    if journal is not None:
        streams.append((journal.source, journal.records()))
    found = scan(streams, since=since)
    if journal is not None and journal.notes:
        # The reader's notes (no journal files yet, no --grep support) are only known now.
        found = OomScan(found.events, found.sources, (*journal.notes, *found.notes))
    return found


def _reason(exc: BaseException) -> str:
    if isinstance(exc, NoSuchProcessError):
        return "gone"
    if isinstance(exc, TargetPermissionError):
        return "permission"
    if isinstance(exc, DeadlineError):
        return "timeout"
    if isinstance(exc, NotGlibcMallocError):
        return "not_glibc"
    if isinstance(exc, TargetStoppedError):
        return "stopped"
    if isinstance(exc, HeapCorruptionError):
        return "corrupt"
    if isinstance(exc, TargetError):
        return "target"
    if isinstance(exc, ToolingError):
        return "tooling"
    return "internal"


def _process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def select_targets(pids: Sequence[int], names: Sequence[str]) -> tuple[list[int], list[str]]:
    """PIDs given plus those matching each name regex, without repeats; and notes for names
    that match nothing (not an error for a timer: the service may be restarting)."""
    found = list(pids)
    notes = []
    for name in names:
        matches = process_search.find_pids_by_name(name)
        if not matches:
            notes.append(f"no process matches the pattern {name!r}")
        found.extend(matches)
    return list(dict.fromkeys(found)), notes


def inspect_target(
    pid: int,
    *,
    timeout_seconds: float,
    gdb_path: str | None,
    log: Log | None,
    read_only: bool = False,
) -> tuple[TargetResult, float]:
    """Inspect one target (entry.inspect.sample_method: through ``gdb_path`` where given,
    else from its memory, never falling back to gdb; ``read_only`` is that default);
    returns its result and the pause budget it spent (a read-only inspection's: its stops)."""
    name = _process_name(pid)
    identity = read_container_identity(pid)
    started = time.monotonic()
    try:
        from memforensics.entry.inspect import inspect_live, sample_method

        inspection = inspect_live(
            pid,
            method=sample_method(gdb_path=gdb_path),
            timeout_seconds=timeout_seconds,
            gdb_path=gdb_path,
            log=log,
        )
    except Exception as exc:
        elapsed = time.monotonic() - started
        # A failure after attaching does not say how long the target was stopped: count the
        # whole attempt, an upper bound, so that the budget is never overspent silently.
        spent = 0.0 if isinstance(exc, _REFUSED_BEFORE_ATTACH) else elapsed
        message = exc.message if isinstance(exc, MemforensicsError) else f"{exc!r}"
        down = TargetResult(
            pid=pid,
            process=name,
            container=identity,
            figures=None,
            reason=_reason(exc),
            detail=message,
            elapsed_seconds=elapsed,
        )
        return down, spent
    dump = inspection.analysis.dump
    headline = (
        residency_figures(dump, inspection.residency) if inspection.residency is not None else None
    )
    free_resident = headline.free_resident_bytes if headline else None
    trimmable = headline.trimmable_bytes if headline else None
    foreign = inspection.foreign
    if foreign is not None:  # the allocator's own figures: what its purge returns
        trimmable = foreign.releasable_bytes
        if inspection.waterfall is not None:
            free_resident = inspection.waterfall.get("arena_free_resident")
    figures = TargetFigures(
        heap_free_bytes=dump.free_bytes,
        heap_in_use_bytes=dump.in_use_bytes,
        heap_system_bytes=dump.system_bytes,
        heap_free_resident_bytes=free_resident,
        heap_arenas=len(dump.arenas),
        process_resident_bytes=inspection.memory.rss_bytes,
        pause_seconds=inspection.capture.pause_seconds,
        heap_trimmable_bytes=trimmable,
        heap_measured_ratio=headline.measured_share if headline else None,
    )
    up = TargetResult(
        pid=pid,
        process=inspection.facts.name or name,
        container=identity,
        figures=figures,
        detail=inspection.residency_error,
        elapsed_seconds=time.monotonic() - started,
        allocator=inspection.facts.allocator.kind,
    )
    return up, figures.pause_seconds


def _with_census(
    result: TargetResult, top: int, timeout_seconds: float, pause_left_seconds: float
) -> tuple[TargetResult, float]:
    """``result`` with the census's ``top`` biggest types and one "other" line (bounded
    series), and the pause it cost (at most ``pause_left_seconds`` and one window's stop:
    what the budget left unread is ``census_unread_bytes``); unchanged (a note in
    ``detail``) when the census fails."""
    from memforensics.entry.census import census_live

    try:
        census = census_live(
            result.pid, timeout_seconds=timeout_seconds, pause_budget_seconds=pause_left_seconds
        )
    except MemforensicsError as exc:
        detail = f"census: {exc.message}"
        return replace(
            result, detail=f"{result.detail}; {detail}" if result.detail else detail
        ), 0.0
    kept = census.types[:top]
    rest = census.types[top:]
    other = CensusType(
        "other", "other", sum(t.count for t in rest), sum(t.total_bytes for t in rest)
    )
    return (
        replace(
            result,
            census_types=(*kept, other),
            census_unread_bytes=census.read.unwalked_bytes,
        ),
        census.read.total_stop_seconds,
    )


def read_oom(
    state_dir: Path, sources: OomSources, *, now: datetime
) -> tuple[OomReading, list[str]]:
    """Count OOM kills since the previous run and persist the cursor. A log that cannot be
    read or a state that cannot be saved leaves the counts as they were: reported, not fatal
    (the heap metrics are still worth writing)."""
    state = CollectState()
    notes: list[str] = []
    try:
        with state_lock(state_dir):
            state, note = load_state(state_dir)
            notes.extend([note] if note else [])
            baseline = state.cursor is None
            found = read_oom_scan(sources, since=state.since)
            new_state, new_kills = count_new_kills(state, found.events, now=now)
            save_state(state_dir, new_state)
    except MemforensicsError as exc:
        counts = tuple(state.counts.values())
        return OomReading(counts, 0, (), ok=False, error=exc.message), notes
    notes.extend(found.notes)
    reading = OomReading(
        counts=tuple(new_state.counts.values()),
        new_kills=new_kills,
        sources=found.sources,
        ok=True,
        baseline=baseline,
    )
    return reading, notes


def collect(
    pids: Sequence[int],
    names: Sequence[str] = (),
    *,
    max_pause_seconds: float,
    timeout_seconds: float = 10.0,
    state_dir: Path | None = None,
    oom_sources: OomSources | None = OomSources(),
    gdb_path: str | None = None,
    log: Log | None = None,
    now: datetime | None = None,
    read_only: bool = False,
    census_top: int | None = None,
) -> CollectRun:
    """One collect run: inspect targets until the pauses reach ``max_pause_seconds``, then
    count OOM kills (when ``state_dir`` and ``oom_sources`` are given).

    The targets are inspected in order; once the measured pauses reach the budget the
    rest are recorded down with reason ``pause_budget``. One inspection can overshoot the
    budget by at most its own pause (bounded by ``timeout_seconds``).
    """
    started_wall = datetime.now(timezone.utc)
    started = time.monotonic()
    targets, notes = select_targets(pids, names)
    results: list[TargetResult] = []
    taken: list[tuple[TargetResult, datetime]] = []
    spent = 0.0
    for pid in targets:
        if spent >= max_pause_seconds:
            results.append(
                TargetResult(
                    pid=pid,
                    process=_process_name(pid),
                    container=read_container_identity(pid),
                    figures=None,
                    reason="pause_budget",
                    detail=f"pause budget of {max_pause_seconds:g} s used up by earlier targets",
                )
            )
            continue
        when = datetime.now(timezone.utc)
        result, cost = inspect_target(
            pid, timeout_seconds=timeout_seconds, gdb_path=gdb_path, log=log, read_only=read_only
        )
        spent += cost
        if census_top and result.up and spent < max_pause_seconds:
            result, census_cost = _with_census(
                result, census_top, timeout_seconds, max_pause_seconds - spent
            )
            spent += census_cost
        results.append(result)
        taken.append((result, when))
    if state_dir is not None and any(result.up for result, _ in taken):
        # The last heap samples per process, for `oom --state-dir` to join kills with.
        notes.extend(update_heap_samples(state_dir, taken, now=datetime.now(timezone.utc)))
    oom: OomReading | None = None
    if state_dir is not None and oom_sources is not None:
        oom, oom_notes = read_oom(state_dir, oom_sources, now=now or datetime.now(timezone.utc))
        notes.extend(oom_notes)
    elif oom_sources is not None:
        notes.append("no state directory: OOM kills are not counted")
    duration = time.monotonic() - started
    return CollectRun(
        started=started_wall,
        finished=datetime.now(timezone.utc),
        duration_seconds=duration,
        max_pause_seconds=max_pause_seconds,
        pause_used_seconds=spent,
        targets=tuple(results),
        oom=oom,
        notes=tuple(notes),
    )


__all__ = ["REASONS", "OomSources", "collect", "read_oom_scan", "select_targets"]
