"""The report in the terminal (rich): per process the verdict, figures, evidence and marks."""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from memforensics.analysis.census_growth import growth_sentence
from memforensics.analysis.trend import RUNTIME_NAMES, Fit
from memforensics.model.report import ProcessReport, Report
from memforensics.model.series import Sample
from memforensics.render.watch_view import VERDICT_STYLE, sparkline
from memforensics.units import format_bytes, format_duration


def _rate(fit: Fit | None) -> str:
    if fit is None:
        return "–"
    if fit.per_hour is None:
        return f"{format_bytes(fit.slope_per_unit, signed=True)}/dump"
    return f"{format_bytes(fit.per_hour, signed=True)}/h"


def _line_values(heap: tuple[Sample, ...], key: str) -> list[int | None]:
    return [None if s.waterfall is None else s.waterfall.get(key) for s in heap]


def _waterfall_rows(
    report: ProcessReport,
) -> list[tuple[str, Fit | None, int | None, list[int | None]]]:
    """Rows for the verdict's other figures, where the recording has them."""
    trend, heap = report.trend, report.series.heap_samples
    rows: list[tuple[str, Fit | None, int | None, list[int | None]]] = []
    for key, name, fit in trend.fits():
        if key in ("in_use", "free", "free_resident", "rss", "live") or fit is None:
            continue
        values = _line_values(heap, key)
        if key == "arena_in_use" and trend.figures != "waterfall":
            continue  # the same figure as "in use" above
        rows.append((name, fit, values[-1] if values else None, values))
    return rows


def process_renderable(report: ProcessReport) -> RenderableType:
    """One process: figures with sparklines and rates, then the evidence and the marks."""
    series, trend = report.series, report.trend
    heap = series.heap_samples
    latest = series.latest_heap
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (("figure", "left"), ("latest", "right"), ("", "left")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    table.add_column("change", justify="right", no_wrap=True)
    table.add_column("rate", justify="right", no_wrap=True)
    rss_values = [s.rss_bytes for s in series.samples]
    for name, fit, value, values in (
        (
            "in use",
            trend.in_use,
            latest.in_use_bytes if latest else None,
            [s.in_use_bytes for s in heap],
        ),
        ("free", trend.free, latest.free_bytes if latest else None, [s.free_bytes for s in heap]),
        (
            "free resident",
            trend.free_resident,
            latest.free_resident_bytes if latest else None,
            [s.free_resident_bytes for s in heap],
        ),
        ("RSS", trend.rss, rss_values[-1] if rss_values else None, rss_values),
        *_waterfall_rows(report),
    ):
        table.add_row(
            name,
            format_bytes(value),
            Text(sparkline(values, 30), style="cyan"),
            "–" if fit is None else format_bytes(fit.change_bytes, signed=True),
            _rate(fit),
        )
    head = Text("verdict: ")
    head.append(trend.verdict, style=VERDICT_STYLE[trend.verdict])
    if trend.runtime is not None:
        head.append(f"   runtime: {RUNTIME_NAMES.get(trend.runtime, trend.runtime)}")
    span = trend.span_seconds
    head.append(
        f"   {trend.heap_samples} heap samples, {trend.rss_samples} RSS readings"
        + (f" over {format_duration(span)}" if span else ""),
        style="dim",
    )
    parts: list[RenderableType] = [head]
    if report.growing_types:
        parts.append(Text(growth_sentence(report.growing_types), style="bold"))
    parts.append(table)
    parts.extend(Text(f"· {line}") for line in trend.evidence)
    for mark in report.marks[:20]:
        when = mark.time.strftime("%Y-%m-%d %H:%M:%S") if mark.time else "–"
        parts.append(Text(f"{when} {mark.kind}: {mark.message}", style="dim"))
    for kill, joined in report.kills:
        if joined is not None:
            when = kill.time.strftime("%Y-%m-%d %H:%M:%S") if kill.time else "–"
            parts.append(Text(f"{when} OOM kill: {joined.sentence}", style="bold red"))
    title = f"PID {series.pid} {series.process}" if series.pid is not None else series.process
    return Panel(Group(*parts), title=title, title_align="left", box=box.ROUNDED)


def render_report(report: Report) -> RenderableType:
    """Every process of the report, then the reader's notes."""
    parts: list[RenderableType] = [process_renderable(p) for p in report.processes]
    if not parts:
        parts.append(Text("no samples in the inputs", style="dim"))
    parts.extend(Text(f"note: {note}", style="dim") for note in report.notes)
    return Group(*parts)
