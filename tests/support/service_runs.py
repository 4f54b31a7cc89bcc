"""What every service test does: inspect under load, trim at steady state, through the public
library API (memforensics.entry.inspect.inspect_live, memforensics.entry.trim.trim_process)
or the CLI as a user runs it, recording the issue's figures; and the default read's document
set against the kernel's maps while the service is stopped."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memforensics.entry.inspect import InspectMethod, inspect_live
from memforensics.entry.readers.memory import inspect_read_only
from memforensics.entry.trim import TrimSettings, trim_process
from memforensics.errors import MemforensicsError, TargetError
from memforensics.model.inspection import Inspection
from memforensics.model.trim import TrimResult
from memforensics.sources.proc import memory_figures
from tests.support.kernel_heaps import KernelHeaps, kernel_heaps, stopped
from tests.support.service_figures import (
    FORECAST_TOLERANCE,
    MEASURED_SHARE_MIN,
    Figure,
    forecast_error,
    inspection_figure,
    is_steady,
    json_measured_share,
    measured_share,
    most_reports_measured,
    record,
    trim_figure,
)

# Generous: the machine is shared and the services are busy; a stuck call still ends here.
CALL_TIMEOUT_SECONDS = 20.0
CLI_TIMEOUT_SECONDS = 90.0
MIB = 1024 * 1024


def inspect(
    service: str,
    pid: int,
    *,
    health: Callable[[], str] | None = None,
    method: InspectMethod = "auto",
) -> Inspection:
    """One library inspection (``memforensics.entry.inspect.inspect_live``), recorded; by
    default as `inspect PID` does it, which must read the service's memory (no gdb fallback).

    When it fails and ``health`` is given, the failure says how the service is doing after it
    (did the inspection hurt it?)."""
    try:
        inspection = inspect_live(pid, method=method, timeout_seconds=CALL_TIMEOUT_SECONDS)
    except MemforensicsError as exc:
        if health is None:
            raise
        raise AssertionError(
            f"inspect failed: {type(exc).__name__}: {exc}; afterwards {health()}"
        ) from exc
    inspection_figure(service, inspection)
    assert inspection.fallback is None, f"{service}: read refused: {inspection.fallback}"
    assert (inspection.read_only is None) is (method == "gdb")
    return inspection


def assert_heaps_agree_with_kernel(service: str, pid: int, *, attempts: int = 30) -> KernelHeaps:
    """The service stopped by SIGSTOP (nothing moves), the default read's document against
    the kernel (tests/support/kernel_heaps.py): the thread arenas' mprotect bytes are their
    heaps' read-write bytes, their system bytes the heaps' heap_info sizes, their sub-heap
    count the heaps the kernel maps; the main arena's system bytes the program break's span.
    A thread stopped inside malloc keeps its arena locked: the service runs a moment and is
    stopped again."""
    for attempt in range(attempts):
        with stopped(pid):
            try:
                inspection = inspect_read_only(
                    pid, timeout_seconds=CALL_TIMEOUT_SECONDS, allow_stopped=True
                )
            except TargetError as exc:
                if "stays held" not in exc.message:
                    raise
                heaps = None
            else:
                heaps = kernel_heaps(pid)
        if heaps is not None:
            break
        time.sleep(0.01 * (attempt % 7 + 1))
    else:
        raise AssertionError(f"{service}: stopped {attempts} times, always inside malloc")
    arenas = inspection.analysis.dump.arenas
    threads = [arena for arena in arenas if arena.index != 0]
    mprotect = sum(arena.aspace_mprotect_bytes or 0 for arena in threads)
    assert mprotect == heaps.thread_heap_rw_bytes, (
        f"{service}: thread arenas' mprotect bytes {mprotect}, the kernel's read-write heaps "
        f"{heaps.thread_heap_rw_bytes} ({heaps.thread_heaps} heaps)"
    )
    system = sum(arena.system_bytes for arena in threads)
    assert system == heaps.thread_heap_size_bytes, (system, heaps)
    assert sum(arena.aspace_total_bytes or 0 for arena in threads) == system
    assert sum(arena.subheaps or 0 for arena in threads) == heaps.thread_heaps
    if heaps.brk_heap_bytes is not None and arenas:
        assert arenas[0].system_bytes == heaps.brk_heap_bytes, (
            f"{service}: main arena's system bytes {arenas[0].system_bytes}, [heap] "
            f"{heaps.brk_heap_bytes}"
        )
    return heaps


def share_of(inspection: Inspection) -> float:
    """The measured share of one library inspection."""
    return measured_share(inspection.residency, inspection.analysis.dump)


def cli_json(command: str, pid: int, *, health: Callable[[], str] | None = None) -> dict[str, Any]:
    """``memforensics COMMAND PID --json`` in a subprocess, as a user runs it; exit code 0."""
    done = subprocess.run(
        [sys.executable, "-m", "memforensics", command, str(pid), "--json"],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_SECONDS,
        check=False,
    )
    if done.returncode != 0:
        after = f"; afterwards {health()}" if health is not None else ""
        raise AssertionError(f"{command} exited {done.returncode}: {done.stderr.strip()}{after}")
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def cli_inspect(
    service: str, pid: int, *, health: Callable[[], str] | None = None
) -> dict[str, Any]:
    """``memforensics inspect PID --json``, recorded like a library inspection."""
    document = cli_json("inspect", pid, health=health)
    assert document["schema"] == "memforensics/heap/1"
    assert document["process"]["pid"] == pid
    residency = document.get("residency") or {}
    record(
        Figure(
            service=service,
            kind="inspect",
            pid=pid,
            free_bytes=int(document["totals"]["free_bytes"]),
            measured_share=json_measured_share(document),
            method=residency.get("method"),
            note="cli; " + "; ".join(residency.get("notes", [])),
        )
    )
    return document


def assert_most_measured(
    shares: list[float], service: str, *, at_least: float | None = None
) -> None:
    """The bar: >= 90 % of the dump's free bytes measured in most (> half) of the reports,
    or in at least the share ``at_least`` of them where the issue sets one."""
    good = sum(1 for share in shares if share >= MEASURED_SHARE_MIN)
    enough = (
        most_reports_measured(shares)
        if at_least is None
        else bool(shares) and good >= at_least * len(shares)
    )
    assert enough, (
        f"{service}: only {good} of {len(shares)} reports measured >= 90 % of their free "
        f"bytes (shares: {', '.join(f'{100 * s:.0f} %' for s in shares)})"
    )


@dataclass(frozen=True)
class SteadyTrim:
    """A trim preceded by inspections that show whether the free memory was steady."""

    result: TrimResult
    free_before: tuple[int, ...]  # malloc_info's free bytes, inspections then the trim's dump
    steady: bool

    @property
    def error(self) -> float | None:
        return forecast_error(self.result)

    @property
    def released_within_free(self) -> bool:
        """The kernel's release is at most the heap's free bytes as read before: more proves
        the target freed memory of its own between the read and the measurement after the
        call (a busy backend ending a sort), which no forecast can foresee."""
        released = self.result.released_bytes
        return released is not None and released <= max(self.free_before)


def await_steady_anon(
    pid: int,
    *,
    step_seconds: float = 0.5,
    window: int = 4,
    spread: float = 0.02,
    timeout_seconds: float = 60.0,
) -> None:
    """Wait until the anonymous RSS of ``pid`` stays within ``spread`` of its mean over
    ``window`` reads ``step_seconds`` apart: a service still warming up (a cache filling)
    allocates between a trim's "before" and "after", which would count against its release."""
    deadline = time.monotonic() + timeout_seconds
    reads: list[int] = []
    while True:
        reads.append(memory_figures.read_memory(pid).anon_bytes or 0)
        recent = reads[-window:]
        if len(recent) == window:
            mean = sum(recent) / window
            if mean and max(abs(r - mean) for r in recent) <= spread * mean:
                return
        assert time.monotonic() < deadline, f"anonymous RSS never settled: {reads[-window:]}"
        time.sleep(step_seconds)


def trim_at_steady_state(
    service: str, pid: int, *, samples: int = 3, health: Callable[[], str] | None = None
) -> SteadyTrim:
    """Inspect ``samples`` times, then trim (``memforensics.entry.trim.trim_process``), recorded.

    Steady means both malloc_info's free bytes and the anonymous RSS, over the inspections
    and the trim's own "before", stay within STEADY_SPREAD of their mean: a service that frees
    memory of its own between "before" and "after" would otherwise count as released.
    """
    free: list[int] = []
    anon: list[int] = []
    for _ in range(samples):
        inspection = inspect(service, pid, health=health)
        free.append(inspection.analysis.dump.free_bytes)
        anon.append(inspection.memory.anon_bytes or 0)
    try:
        result = trim_process(pid, TrimSettings(timeout_seconds=CALL_TIMEOUT_SECONDS))
    except MemforensicsError as exc:
        if health is None:
            raise
        raise AssertionError(
            f"trim failed: {type(exc).__name__}: {exc}; afterwards {health()}"
        ) from exc
    free.append(result.free_bytes)
    anon.append(result.anon_before_bytes or 0)
    steady = is_steady(free) and is_steady(anon)
    trim_figure(service, result, steady=steady, note=f"free bytes {free}, anon bytes {anon}")
    return SteadyTrim(result=result, free_before=tuple(free), steady=steady)


def assert_forecast_close(trim: SteadyTrim, service: str) -> None:
    """The issue's bar: forecast within 25 % of the measured release."""
    result = trim.result
    assert result.trimmed, f"{service}: the trim was skipped: {result.skipped_detail}"
    released = result.released_bytes
    assert released is not None and released > 0, f"{service}: released {released} bytes"
    assert abs(result.forecast_bytes - released) <= FORECAST_TOLERANCE * released, (
        f"{service}: forecast {result.forecast_bytes / MIB:.1f} MiB vs released "
        f"{released / MIB:.1f} MiB ({100 * (trim.error or 0):.0f} % off; forecast "
        f"{'measured' if result.forecast.measured else 'estimated'})"
    )
