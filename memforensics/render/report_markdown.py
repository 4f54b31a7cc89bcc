"""The report as GitHub-flavoured Markdown, for a CI job's step summary."""

from __future__ import annotations

from memforensics.analysis.census_growth import growth_sentence
from memforensics.analysis.trend import RUNTIME_NAMES, Fit
from memforensics.model.report import ProcessReport, Report
from memforensics.units import format_bytes, format_duration

VERDICT_ICON = {
    "in-use-growing": "🔴",
    "mmap-growing": "🔴",
    "outside-malloc-growing": "🔴",
    "rss-growing": "🔴",
    "free-growing": "🟠",
    "stable": "🟢",
    "unknown": "⚪",
}


def _rate(fit: Fit | None) -> str:
    if fit is None:
        return "–"
    if fit.per_hour is None:
        return f"{format_bytes(fit.slope_per_unit, signed=True)} per dump"
    return f"{format_bytes(fit.per_hour, signed=True)}/h"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _process(report: ProcessReport) -> list[str]:
    series, trend = report.series, report.trend
    title = f"PID {series.pid} {series.process}" if series.pid is not None else series.process
    icon = VERDICT_ICON[trend.verdict]
    lines = [f"### {title}: {icon} `{trend.verdict}`", ""]
    if report.growing_types:
        lines += [_cell(growth_sentence(report.growing_types)) + ".", ""]
    if trend.runtime is not None:
        lines += [f"Runtime: {RUNTIME_NAMES.get(trend.runtime, trend.runtime)}.", ""]
    span = trend.span_seconds
    lines.append(
        f"{trend.heap_samples} heap samples, {trend.rss_samples} RSS readings"
        + (f" over {format_duration(span)}" if span else "")
        + "."
    )
    lines += ["", "| figure | latest | change | rate |", "|---|---:|---:|---:|"]
    latest = series.latest_heap
    rows = (
        ("in use", trend.in_use, latest.in_use_bytes if latest else None),
        ("free", trend.free, latest.free_bytes if latest else None),
        ("free resident", trend.free_resident, latest.free_resident_bytes if latest else None),
        ("RSS", trend.rss, latest.rss_bytes if latest else None),
        *(
            (
                name,
                fit,
                None if latest is None or latest.waterfall is None else latest.waterfall.get(key),
            )
            for key, name, fit in trend.fits()
            if fit is not None and key in ("mmap_chunks", "other_anon", "stacks", "shmem", "file")
        ),
    )
    for name, fit, value in rows:
        change = "–" if fit is None else format_bytes(fit.change_bytes, signed=True)
        lines.append(f"| {name} | {format_bytes(value)} | {change} | {_rate(fit)} |")
    lines += ["", "**Evidence**", ""]
    lines += [f"- {_cell(item)}" for item in trend.evidence]
    pauses = [s.pause_seconds for s in series.heap_samples if s.pause_seconds is not None]
    if pauses:
        lines.append(
            f"- the target was paused {format_duration(sum(pauses))} in all, "
            f"{format_duration(sum(pauses) / len(pauses))} per heap sample"
        )
    if report.marks:
        lines += ["", "**Marks**", "", "| time | what | RSS |", "|---|---|---:|"]
        for mark in report.marks:
            when = mark.time.strftime("%Y-%m-%d %H:%M:%S") if mark.time else "–"
            lines.append(
                f"| {when} | {mark.kind}: {_cell(mark.message)} | {format_bytes(mark.rss_bytes)} |"
            )
    for kill, heap in report.kills:
        if heap is not None:
            when = kill.time.strftime("%Y-%m-%d %H:%M:%S") if kill.time else "–"
            lines += ["", f"**OOM kill** {when}: {_cell(heap.sentence)}"]
    if latest is not None and latest.advice:
        lines += ["", "**Advice** (latest heap sample)", ""]
        lines += [f"- {_cell(a.message)} `{a.code}`" for a in latest.advice]
    lines.append("")
    return lines


def report_markdown(report: Report) -> str:
    """The summary: one section per process with the verdict, the figures and the evidence."""
    lines = ["## memforensics report", ""]
    if not report.processes:
        lines.append("No samples in the inputs.")
    for process in report.processes:
        lines += _process(process)
    if report.notes:
        lines += ["**Notes**", ""] + [f"- {_cell(n)}" for n in report.notes] + [""]
    return "\n".join(lines)
