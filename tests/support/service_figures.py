"""The issue's two figures for a service report, and a record of them for the session summary.

*Measured share*: the part of malloc_info's own free bytes (``fast`` + ``rest``, the dump's
totals, not anything the residency computed) that the walk measured page by page, capped at
1. The residency's own ``measured_share`` is a claim under test, never the figure here.

*Forecast error*: |forecast - released| / released, with ``released`` the RSS the trim really
gave back.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass
from typing import Any

from memforensics.model.heap import HeapDump
from memforensics.model.inspection import Inspection
from memforensics.model.process import HeapResidency
from memforensics.model.trim import TrimResult

# The thresholds ("Done when").
MEASURED_SHARE_MIN = 0.90  # of the free bytes measured, not estimated ...
MOST_REPORTS = 0.5  # ... in most reports: more than half of them
FORECAST_TOLERANCE = 0.25  # forecast within 25 % of the release at steady state
# Free memory counts as steady when malloc_info's free bytes, over the inspections just
# before a trim, stay within this share of their mean.
STEADY_SPREAD = 0.15

FIGURES_ENV = "MEMFORENSICS_SERVICE_FIGURES"  # a path: every figure is appended as JSON Lines


def measured_share(residency: HeapResidency | None, dump: HeapDump) -> float:
    """0..1: measured free bytes / malloc_info's free bytes; 1.0 when nothing is free."""
    if dump.free_bytes <= 0:
        return 1.0
    measured = residency.measured_free_bytes if residency is not None else 0
    return min(measured, dump.free_bytes) / dump.free_bytes


def json_measured_share(document: dict[str, Any]) -> float:
    """The same from an `inspect --json` document: residency.measured_free_bytes over the
    dump's own totals.free_bytes."""
    free = int(document["totals"]["free_bytes"])
    if free <= 0:
        return 1.0
    residency = document.get("residency")
    measured = int(residency["measured_free_bytes"]) if residency else 0
    return min(measured, free) / free


def forecast_error(result: TrimResult) -> float | None:
    """|forecast - released| / released; None when nothing was released (or measured)."""
    released = result.released_bytes
    if released is None or released <= 0:
        return None
    return abs(result.forecast_bytes - released) / released


def is_steady(free_bytes: list[int]) -> bool:
    """True when the free bytes seen in a row stay within STEADY_SPREAD of their mean."""
    if len(free_bytes) < 2:
        return False
    mean = sum(free_bytes) / len(free_bytes)
    return mean > 0 and (max(free_bytes) - min(free_bytes)) <= STEADY_SPREAD * mean


def most_reports_measured(shares: list[float]) -> bool:
    """The issue's bar: more than half of the reports measured >= 90 % of their free bytes."""
    good = sum(1 for share in shares if share >= MEASURED_SHARE_MIN)
    return bool(shares) and good > MOST_REPORTS * len(shares)


@dataclass(frozen=True)
class Figure:
    """One report or trim of one service, as the session summary shows it."""

    service: str
    kind: str  # "inspect", "trim", or "load" (the load tool's own summary in ``note``)
    pid: int
    free_bytes: int = 0
    measured_share: float | None = None
    method: str | None = None  # how arenas were matched: arena-chain, system-mem, totals
    forecast_bytes: int | None = None
    released_bytes: int | None = None
    forecast_error: float | None = None
    forecast_measured: bool | None = None
    steady: bool | None = None
    note: str = ""


def inspection_figure(service: str, inspection: Inspection) -> Figure:
    """Record one library inspection: free bytes, measured share, how arenas were matched."""
    dump = inspection.analysis.dump
    residency = inspection.residency
    return record(
        Figure(
            service=service,
            kind="inspect",
            pid=inspection.facts.pid,
            free_bytes=dump.free_bytes,
            measured_share=measured_share(residency, dump),
            method=residency.method if residency else None,
            note="; ".join(residency.notes) if residency else str(inspection.residency_error),
        )
    )


def trim_figure(service: str, result: TrimResult, *, steady: bool, note: str = "") -> Figure:
    """Record one trim: forecast, measured release and the error between them."""
    return record(
        Figure(
            service=service,
            kind="trim",
            pid=result.pid,
            free_bytes=result.free_bytes,
            forecast_bytes=result.forecast_bytes,
            released_bytes=result.released_bytes,
            forecast_error=forecast_error(result),
            forecast_measured=result.forecast.measured,
            steady=steady,
            note=note,
        )
    )


_lock = threading.Lock()
FIGURES: list[Figure] = []


def record(figure: Figure) -> Figure:
    """Keep ``figure`` for the summary (and append it to $MEMFORENSICS_SERVICE_FIGURES)."""
    with _lock:
        FIGURES.append(figure)
        path = os.environ.get(FIGURES_ENV)
        if path:
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(asdict(figure)) + "\n")
    return figure


def summary_lines() -> list[str]:
    """Per service: reports with >= 90 % measured, the mean share, each trim's error."""
    lines: list[str] = []
    services = list(dict.fromkeys(f.service for f in FIGURES))
    for service in services:
        inspects = [f for f in FIGURES if f.service == service and f.kind == "inspect"]
        trims = [f for f in FIGURES if f.service == service and f.kind == "trim"]
        shares = [f.measured_share for f in inspects if f.measured_share is not None]
        if shares:
            good = sum(1 for s in shares if s >= MEASURED_SHARE_MIN)
            lines.append(
                f"{service}: {good}/{len(shares)} reports >= 90 % measured, "
                f"mean measured share {100 * sum(shares) / len(shares):.0f} %"
            )
        lines.extend(
            f"{service}: {f.note}" for f in FIGURES if f.service == service and f.kind == "load"
        )
        for trim in trims:
            error = "-" if trim.forecast_error is None else f"{100 * trim.forecast_error:.0f} %"
            lines.append(
                f"{service}: trim pid {trim.pid}: forecast {trim.forecast_bytes} B, released "
                f"{trim.released_bytes} B, error {error}, forecast "
                f"{'measured' if trim.forecast_measured else 'estimated'}, "
                f"{'steady' if trim.steady else 'not steady'}"
                + (f", {trim.note}" if trim.note else "")
            )
    return lines
