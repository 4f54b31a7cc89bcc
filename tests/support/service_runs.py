"""What every service test does: inspect under load, trim at steady state, through the public
library API (memforensics.entry.live) or the CLI as a user runs it, recording the issue's
figures."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memforensics.entry.live import Inspection, TrimSettings, inspect_process, trim_process
from memforensics.errors import MemforensicsError
from memforensics.model.trim import TrimResult
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


def inspect(service: str, pid: int, *, health: Callable[[], str] | None = None) -> Inspection:
    """One library inspection (``memforensics.entry.live.inspect_process``), recorded.

    When it fails and ``health`` is given, the failure says how the service is doing after it
    (did the inspection hurt it?)."""
    try:
        inspection = inspect_process(
            pid, timeout_seconds=CALL_TIMEOUT_SECONDS, gdb_path=None, allow_stopped=False
        )
    except MemforensicsError as exc:
        if health is None:
            raise
        raise AssertionError(
            f"inspect failed: {type(exc).__name__}: {exc}; afterwards {health()}"
        ) from exc
    inspection_figure(service, inspection)
    return inspection


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


def trim_at_steady_state(
    service: str, pid: int, *, samples: int = 3, health: Callable[[], str] | None = None
) -> SteadyTrim:
    """Inspect ``samples`` times, then trim (``memforensics.entry.live.trim_process``), recorded.

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
