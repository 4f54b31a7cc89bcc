"""The ``memforensics/report/1`` document: per-process trend, verdict, marks, latest figures."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from memforensics.analysis import trend as trend_rules
from memforensics.analysis.trend import Fit, Trend
from memforensics.model.report import ProcessReport, Report
from memforensics.render.jsondoc import record
from memforensics.render.oom import heap_at_kill_json
from memforensics.render.sample_json import iso_time

REPORT_SCHEMA = "memforensics/report/1"


def _per_hour(fit: Fit | None) -> int | None:
    return None if fit is None or fit.per_hour is None else round(fit.per_hour)


def _change(fit: Fit | None) -> int | None:
    return None if fit is None else round(fit.change_bytes)


def thresholds_json() -> dict[str, Any]:
    """The growth tests of analysis/trend.py, so a reader can see what "growing" meant."""
    return {
        "min_points": trend_rules.MIN_POINTS,
        "growth_min_bytes": trend_rules.GROWTH_MIN_BYTES,
        "growth_min_share": trend_rules.GROWTH_MIN_SHARE,
        "significance_t": trend_rules.SIGNIFICANCE_T,
        "noise_multiple": trend_rules.NOISE_MULTIPLE,
        "step_residual_ratio": trend_rules.STEP_RESIDUAL_RATIO,
    }


def trend_json(trend: Trend) -> dict[str, Any]:
    """``trend``: the verdict, rates per hour (null without times), changes and evidence."""
    fits = {
        "in_use": trend.in_use,
        "free": trend.free,
        "free_resident": trend.free_resident,
        "rss": trend.rss,
        # Added with the whole-RSS verdicts: live = arena in use + mmapped chunks, and the
        # waterfall's lines (null when the recording has no waterfall).
        "live": trend.live,
        "arena_in_use": trend.arena_in_use,
        "mmap_chunks": trend.mmap_chunks,
        "other_anon": trend.other_anon,
        "stacks": trend.stacks,
        "shmem": trend.shmem,
        "file": trend.file,
    }
    document: dict[str, Any] = {"verdict": trend.verdict}
    for name, fit in fits.items():
        document[f"{name}_bytes_per_hour"] = _per_hour(fit)
    for name, fit in fits.items():
        document[f"{name}_change_bytes"] = _change(fit)
    for name, fit in fits.items():
        document[f"{name}_growing"] = None if fit is None else fit.growing
    document["growing_lines"] = list(trend.growing_lines)
    document["step_lines"] = list(trend.step_lines)
    document["figures"] = trend.figures
    document["runtime"] = trend.runtime
    document["evidence"] = list(trend.evidence)
    document["thresholds"] = thresholds_json()
    return document


def process_json(report: ProcessReport) -> dict[str, Any]:
    """One process of the report."""
    series = report.series
    trend = report.trend
    latest = series.latest_heap
    heap = series.heap_samples
    pauses = [s.pause_seconds for s in heap if s.pause_seconds is not None]
    return {
        "pid": series.pid,
        "process": series.process,
        "sources": list(series.sources),
        "runtime": trend.runtime,
        "heap_samples": trend.heap_samples,
        "rss_samples": trend.rss_samples,
        "first_time": iso_time(trend.first_time),
        "last_time": iso_time(trend.last_time),
        "span_seconds": trend.span_seconds,
        "trend": trend_json(trend),
        "growing_types": [record(g) for g in report.growing_types],
        "pause_seconds": round(sum(pauses), 6) if pauses else None,
        "pause_per_sample_seconds": round(sum(pauses) / len(pauses), 6) if pauses else None,
        "latest": None
        if latest is None
        else {
            "time": iso_time(latest.time),
            "rss_bytes": latest.rss_bytes,
            "totals": dict(latest.totals or {}),
            "free_resident_bytes": latest.free_resident_bytes,
            "free_released_bytes": latest.free_released_bytes,
        },
        "marks": [
            {
                "kind": mark.kind,
                "time": iso_time(mark.time),
                "message": mark.message,
                "rss_bytes": mark.rss_bytes,
                "detail": dict(mark.detail),
            }
            for mark in report.marks
        ],
        "oom_kills": [
            {
                "time": iso_time(kill.time),
                "message": kill.message,
                "anon_rss_bytes": kill.detail.get("anon_rss_bytes"),
                "scope": kill.detail.get("scope"),
                "heap_sample": heap_at_kill_json(heap),
            }
            for kill, heap in report.kills
        ],
        "advice": []
        if latest is None
        else [
            {"code": a.code, "severity": a.severity, "message": a.message} for a in latest.advice
        ],
    }


def report_json(report: Report, *, now: datetime | None = None) -> dict[str, Any]:
    """The whole document; with exactly one process its keys are also at the top level."""
    processes = [process_json(p) for p in report.processes]
    document: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "time": iso_time(now or datetime.now(timezone.utc)),
        "inputs": list(report.inputs),
        "notes": list(report.notes),
        "processes": processes,
    }
    if len(processes) == 1:
        for key, value in processes[0].items():
            document.setdefault(key, value)
    return document
