"""Library entry point for `watch`: sample live processes over time, never printing.

Heap samples (an attach at a safe point, as `inspect` does) come every ``interval_seconds``;
RSS samples (a read of /proc, no attach) every ``rss_interval_seconds``. Each sample and
event is handed to a callback as it is taken, so a caller can record it at once. A heap
sample that cannot reach a safe point in time is skipped and the gap becomes an event; a
process that exits ends its series, with the OOM kill that took it when the kernel log has one.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from memforensics.analysis.oom_select import scan
from memforensics.analysis.residency import residency_figures
from memforensics.analysis.samples import heap_sample, rss_sample
from memforensics.analysis.trend import compute_trend
from memforensics.entry.common import now_utc
from memforensics.entry.inspect import inspect_live, sample_method
from memforensics.errors import (
    DeadlineError,
    MemforensicsError,
    NoSuchProcessError,
    TargetStoppedError,
)
from memforensics.model.census import CensusSample, CensusType
from memforensics.model.inspection import Inspection
from memforensics.model.oom import OomEvent
from memforensics.model.series import Sample, SeriesEvent
from memforensics.model.watch import WatchedProcess
from memforensics.sources.logs.journal import JournalReader
from memforensics.sources.logs.kmsg import KmsgReader
from memforensics.sources.proc import memory_figures, process_facts, procfs
from memforensics.sources.proc.runtime import detect_runtime
from memforensics.units import format_bytes, format_duration

# A heap sample failing this many times in a row for a reason other than a deadline ends
# the watch with that error.
MAX_FAILURES = 5
# An OOM kill logged this long before the watch noticed the exit still belongs to it.
_OOM_SLACK = timedelta(minutes=1)


@dataclass(frozen=True)
class WatchSettings:
    """How to watch: the options of `memforensics watch`, as the library wants them."""

    interval_seconds: float = 60.0
    rss_interval_seconds: float = 1.0
    count: int | None = None  # heap samples per process; None: until stopped
    duration_seconds: float | None = None
    timeout_seconds: float = 10.0
    gdb_path: str | None = None
    log: Any = None
    read_only: bool = False  # kept for callers: samples are read from memory unless gdb_path
    # watch --census: a census every this many seconds (None: none), within its own pause
    # budget: skipped (a gap) while the censuses' stops exceed this share of the time watched.
    census_interval_seconds: float | None = None
    census_pause_share: float = 0.01
    census_top: int = 50  # types a census sample keeps (and one "other" line)


Record = Sample | SeriesEvent | CensusSample
OnRecord = Callable[[Record, WatchedProcess], None]


def find_oom_kill(pid: int, since: datetime) -> OomEvent | None:
    """The kernel's OOM kill of ``pid`` at or after ``since``, if the kernel log has one.

    Reads /dev/kmsg (this boot's ring buffer), then the journal when kmsg is not readable;
    any failure means "not known", never an error: the exit is reported either way.
    """
    for reader in (KmsgReader(), JournalReader(boot="0", since=since - _OOM_SLACK)):
        try:
            events = list(scan([(reader.source, reader.records())]).events)
        except (MemforensicsError, OSError):
            continue
        for event in reversed(events):
            if event.pid == pid and (event.time is None or event.time >= since - _OOM_SLACK):
                return event
        return None
    return None


def _oom_event(proc: WatchedProcess, kill: OomEvent) -> SeriesEvent:
    scope = f" ({kill.scope})" if kill.scope else ""
    anon = f", anon-rss {format_bytes(kill.anon_rss_bytes)}" if kill.anon_rss_bytes else ""
    return SeriesEvent(
        kind="oom-kill",
        time=kill.time or now_utc(),
        pid=proc.pid,
        process=proc.process,
        message=f"killed by the {kill.killer} OOM killer{scope}{anon}",
        rss_bytes=proc.last_rss_bytes,
        detail={
            "killer": kill.killer,
            "scope": kill.scope,
            "anon_rss_bytes": kill.anon_rss_bytes,
            "cgroup": kill.cgroup,
            "constraint": kill.constraint,
        },
    )


def _foreign_free_resident(result: Inspection) -> int | None:
    """A foreign allocator's free bytes still resident: its waterfall line (no residency)."""
    if result.foreign is None or result.waterfall is None:
        return None
    return result.waterfall.get("arena_free_resident")


class Watch:
    """Samples some processes until the count or duration is reached, all exit, or stop."""

    def __init__(
        self,
        pids: Sequence[int],
        settings: WatchSettings,
        *,
        on_record: OnRecord,
        stop: threading.Event | None = None,
        oom_lookup: Callable[[int, datetime], OomEvent | None] = find_oom_kill,
        inspect: Callable[..., Inspection] | None = None,
    ) -> None:
        self.settings = settings
        self.on_record = on_record
        self.stop = stop or threading.Event()
        self.oom_lookup = oom_lookup
        if inspect is None:
            # `inspect`'s own policy (entry.inspect): the settings say which way, nothing else.
            method = sample_method(gdb_path=settings.gdb_path)
            inspect = functools.partial(inspect_live, method=method)
        self.inspect = inspect
        started = now_utc()
        # Raises NoSuchProcessError (exit 3) for a PID that is not there at the start.
        self.processes = [
            WatchedProcess(
                pid=pid,
                process=process_facts.read_process(pid).name,
                started=started,
                runtime=detect_runtime(pid),
            )
            for pid in pids
        ]
        self.started_monotonic = time.monotonic()

    def _done(self, proc: WatchedProcess) -> bool:
        count = self.settings.count
        return proc.ended is not None or (count is not None and len(proc.heap) >= count)

    def _emit(self, record: Record, proc: WatchedProcess) -> None:
        self.on_record(record, proc)

    def _end(self, proc: WatchedProcess, why: str) -> None:
        ended = SeriesEvent(
            kind="exit",
            time=now_utc(),
            pid=proc.pid,
            process=proc.process,
            message=why,
            rss_bytes=proc.last_rss_bytes,
        )
        proc.ended = ended
        self._emit(ended, proc)
        kill = self.oom_lookup(proc.pid, proc.started)
        if kill is not None:
            proc.oom_kill = _oom_event(proc, kill)
            self._emit(proc.oom_kill, proc)

    def _rss(self, proc: WatchedProcess) -> None:
        taken = now_utc()
        try:
            memory = memory_figures.read_memory(proc.pid)
        except NoSuchProcessError:
            self._end(proc, "the process exited")
            return
        if memory.rss_bytes is None:
            self._end(proc, "the process exited (zombie: no memory left)")
            return
        sample = rss_sample(memory, time=taken, pid=proc.pid, process=proc.process)
        proc.rss.append(sample)
        proc.rss_samples += 1
        self._emit(sample, proc)

    def _heap(self, proc: WatchedProcess) -> None:
        taken = now_utc()
        settings = self.settings
        try:
            result = self.inspect(
                proc.pid,
                timeout_seconds=settings.timeout_seconds,
                gdb_path=settings.gdb_path,
                allow_stopped=False,
                log=settings.log,
            )
        except NoSuchProcessError:
            self._end(proc, "the process exited")
            return
        except MemforensicsError as exc:
            if _gone(proc.pid):
                # An exit racing the attach surfaces as whatever step failed first (gdb
                # cannot open /proc/PID/exe of a zombie): the exit is the news.
                self._end(proc, "the process exited")
                return
            proc.failures += 1
            # Busy beyond the deadline or stopped by someone: always a gap. Anything else
            # (another tracer holding the target a moment, a gdb hiccup) is a gap once the
            # watch has worked, until it fails MAX_FAILURES times in a row: one bad attach
            # must not end a watch of hours, a broken setup must not go on for ever.
            transient = isinstance(exc, (DeadlineError, TargetStoppedError)) or _traced(proc.pid)
            if not transient and (not proc.heap or proc.failures >= MAX_FAILURES):
                raise
            self._gap(proc, taken, f"heap sample skipped: {exc.message}")
            return
        proc.failures = 0
        residency = result.residency
        sample = heap_sample(
            result.analysis,
            time=taken,
            pid=proc.pid,
            process=proc.process,
            memory=result.memory,
            pause_seconds=result.capture.pause_seconds,
            free_resident_bytes=(
                residency_figures(result.analysis.dump, residency).free_resident_bytes
                if residency
                else _foreign_free_resident(result)
            ),
            waterfall=result.waterfall,
            extra_advice=result.extra_advice,
            runtime=proc.runtime,
        )
        proc.heap.append(sample)
        proc.pause_seconds += result.capture.pause_seconds
        proc.trend = compute_trend([*proc.heap, *proc.rss])
        self._emit(sample, proc)

    def _gap(self, proc: WatchedProcess, taken: datetime, message: str) -> None:
        """A sample of ``proc`` skipped at ``taken``: recorded as a gap event and emitted."""
        gap = SeriesEvent(
            kind="gap",
            time=taken,
            pid=proc.pid,
            process=proc.process,
            message=message,
            rss_bytes=proc.last_rss_bytes,
        )
        proc.gaps.append(gap)
        self._emit(gap, proc)

    def _census(self, proc: WatchedProcess) -> None:
        """One census sample of ``proc`` (watch --census), or a gap when its pause budget
        is spent or the census failed."""
        from memforensics.entry.census import census_live

        settings = self.settings
        elapsed = max(self.elapsed_seconds(), settings.census_interval_seconds or 0.0)
        reason = None
        if proc.census_pause_seconds > settings.census_pause_share * elapsed:
            reason = (
                f"census skipped: its stops took {proc.census_pause_seconds:.3f} s, over "
                f"{settings.census_pause_share:.1%} of the {elapsed:.0f} s watched"
            )
        else:
            try:
                census = census_live(proc.pid, timeout_seconds=settings.timeout_seconds)
            except NoSuchProcessError:
                self._end(proc, "the process exited")
                return
            except MemforensicsError as exc:
                if _gone(proc.pid):
                    self._end(proc, "the process exited")
                    return
                reason = f"census skipped: {exc.message}"
        if reason is not None:
            self._gap(proc, now_utc(), reason)
            return
        kept = census.types[: settings.census_top]
        rest = census.types[settings.census_top :]
        if rest:
            other = CensusType(
                "other", "other", sum(t.count for t in rest), sum(t.total_bytes for t in rest)
            )
            kept = (*kept, other)
        sample = CensusSample(
            time=census.time,
            pid=proc.pid,
            process=proc.process,
            types=kept,
            live_chunks=census.live_chunks,
            live_bytes=census.live_bytes,
            pause_seconds=census.read.total_stop_seconds,
        )
        proc.censuses.append(sample)
        proc.census_pause_seconds += census.read.total_stop_seconds
        self._emit(sample, proc)

    def run(self) -> list[WatchedProcess]:
        """Sample until done; returns every process's final state."""
        settings = self.settings
        start = self.started_monotonic
        end = None if settings.duration_seconds is None else start + settings.duration_seconds
        next_heap = {p.pid: start for p in self.processes}
        next_rss = {p.pid: start + settings.rss_interval_seconds for p in self.processes}
        census_every = settings.census_interval_seconds
        never = float("inf")
        next_census = {p.pid: start if census_every else never for p in self.processes}
        while not self.stop.is_set():
            active = [p for p in self.processes if not self._done(p)]
            if not active:
                break
            due = min(min(next_heap[p.pid], next_rss[p.pid], next_census[p.pid]) for p in active)
            if end is not None and due > end:
                self.stop.wait(max(end - time.monotonic(), 0.0))
                break
            if self.stop.wait(max(due - time.monotonic(), 0.0)):
                break
            now = time.monotonic()
            for proc in active:
                if proc.ended is None and next_heap[proc.pid] <= now:
                    self._heap(proc)
                    next_heap[proc.pid] = _next(next_heap[proc.pid], settings.interval_seconds)
                if census_every and proc.ended is None and next_census[proc.pid] <= now:
                    self._census(proc)
                    next_census[proc.pid] = _next(next_census[proc.pid], census_every)
                if proc.ended is None and not self._done(proc) and next_rss[proc.pid] <= now:
                    self._rss(proc)
                    next_rss[proc.pid] = _next(next_rss[proc.pid], settings.rss_interval_seconds)
        return self.processes

    def elapsed_seconds(self) -> float:
        return time.monotonic() - self.started_monotonic


def _traced(pid: int) -> bool:
    """True when another tracer (a debugger, another memforensics) holds ``pid`` now."""
    try:
        return process_facts.read_process(pid).tracer_pid != 0
    except MemforensicsError:
        return False


def _gone(pid: int) -> bool:
    """True when ``pid`` has exited (no such process, or a zombie waiting to be reaped)."""
    try:
        return procfs.process_state(pid) in ("Z", "X")
    except NoSuchProcessError:
        return True
    except MemforensicsError:
        return False


def _next(previous: float, interval: float) -> float:
    """The next start on the grid; missed slots are dropped rather than bunched up."""
    upcoming = previous + interval
    now = time.monotonic()
    if upcoming <= now:
        missed = int((now - upcoming) / interval) + 1
        upcoming += missed * interval
    return upcoming


def overhead_words(proc: WatchedProcess, elapsed_seconds: float) -> str:
    """What the watch cost the target: pause per heap sample and share of wall time."""
    if not proc.heap:
        return "no heap sample taken"
    per = proc.pause_seconds / len(proc.heap)
    share = proc.pause_seconds / elapsed_seconds if elapsed_seconds > 0 else 0.0
    return (
        f"paused {format_duration(proc.pause_seconds)} in {len(proc.heap)} heap samples "
        f"({format_duration(per)} each, {share:.2%} of wall time)"
    )
