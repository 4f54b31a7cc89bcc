"""The live terminal view of `watch` (rich) and its plain progress lines for non-TTY output."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from memforensics.analysis.trend import Trend
from memforensics.model.series import Sample, SeriesEvent
from memforensics.units import format_bytes, format_duration

if TYPE_CHECKING:  # the live state is the library's; this module only reads it
    from memforensics.model.watch import WatchedProcess

SPARK_GLYPHS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 40
VERDICT_STYLE = {
    "in-use-growing": "bold red",
    "mmap-growing": "bold red",
    "outside-malloc-growing": "bold red",
    "rss-growing": "bold red",
    "free-growing": "bold yellow",
    "stable": "bold green",
    "unknown": "dim",
}


def sparkline(values: Sequence[int | None], width: int = SPARK_WIDTH) -> str:
    """The last ``width`` values as block glyphs scaled between their min and max."""
    known = [v for v in values if v is not None][-width:]
    if not known:
        return ""
    low, high = min(known), max(known)
    if high == low:
        return SPARK_GLYPHS[0] * len(known)
    top = len(SPARK_GLYPHS) - 1
    return "".join(SPARK_GLYPHS[round((v - low) / (high - low) * top)] for v in known)


def _rate(trend: Trend | None, name: str) -> str:
    fit = None if trend is None else getattr(trend, name)
    if fit is None or fit.per_hour is None:
        return ""
    return f"{format_bytes(fit.per_hour, signed=True)}/h"


def trend_text(trend: Trend | None) -> Text:
    """``verdict`` and the first line of its evidence."""
    if trend is None:
        return Text("trend: waiting for heap samples", style="dim")
    text = Text("trend so far: ")
    text.append(trend.verdict, style=VERDICT_STYLE[trend.verdict])
    text.append(f"  {trend.evidence[0]}", style="dim")
    return text


def _event_text(event: SeriesEvent) -> Text:
    style = {"oom-kill": "bold red", "exit": "bold", "gap": "yellow"}.get(event.kind, "")
    stamp = event.time.strftime("%H:%M:%S") if event.time else "--:--:--"
    text = Text(f"{stamp} ", style="dim")
    text.append(f"{event.kind}: ", style=style)
    text.append(event.message)
    if event.rss_bytes is not None:
        text.append(f"  (last RSS {format_bytes(event.rss_bytes)})", style="dim")
    return text


def process_panel(proc: WatchedProcess, elapsed_seconds: float) -> Panel:
    """One process: latest figures with sparklines, the pause paid, the trend, its events."""
    heap = proc.heap
    readings = sorted([*heap, *proc.rss], key=lambda s: s.time or proc.started)
    rss_values = [s.rss_bytes for s in readings]
    latest = proc.latest_heap
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(justify="right", no_wrap=True)
    grid.add_column(no_wrap=True, style="cyan")
    grid.add_column(justify="right", no_wrap=True, style="dim")
    grid.add_row(
        "RSS", format_bytes(proc.last_rss_bytes), sparkline(rss_values), _rate(proc.trend, "rss")
    )
    grid.add_row(
        "in use",
        format_bytes(latest.in_use_bytes if latest else None),
        sparkline([s.in_use_bytes for s in heap]),
        _rate(proc.trend, "in_use"),
    )
    grid.add_row(
        "free",
        format_bytes(latest.free_bytes if latest else None),
        sparkline([s.free_bytes for s in heap]),
        _rate(proc.trend, "free"),
    )
    grid.add_row(
        "free resident",
        format_bytes(latest.free_resident_bytes if latest else None),
        sparkline([s.free_resident_bytes for s in heap]),
        _rate(proc.trend, "free_resident"),
    )
    share = proc.pause_seconds / elapsed_seconds if elapsed_seconds > 0 else 0.0
    status = Text(
        f"{len(heap)} heap samples, {proc.rss_samples} RSS samples, "
        f"{len(proc.gaps)} skipped; paused {format_duration(proc.pause_seconds)} in all "
        f"({share:.2%} of wall time)",
        style="dim",
    )
    parts: list[RenderableType] = [grid, status, trend_text(proc.trend)]
    parts.extend(_event_text(e) for e in proc.gaps[-3:])
    for event in (proc.ended, proc.oom_kill):
        if event is not None:
            parts.append(_event_text(event))
    return Panel(
        Group(*parts),
        title=f"PID {proc.pid} {proc.process}",
        title_align="left",
        box=box.ROUNDED,
    )


def render_watch(
    processes: Sequence[WatchedProcess], elapsed_seconds: float, *, footer: str = ""
) -> RenderableType:
    """Every watched process, then a footer (how to stop, where it records)."""
    parts: list[RenderableType] = [process_panel(p, elapsed_seconds) for p in processes]
    if footer:
        parts.append(Text(footer, style="dim"))
    return Group(*parts)


def progress_line(record: Sample | SeriesEvent, proc: WatchedProcess) -> str | None:
    """One plain line per heap sample or event (RSS samples are too many to print)."""
    if isinstance(record, SeriesEvent):
        stamp = record.time.strftime("%H:%M:%S") if record.time else "--:--:--"
        return f"{stamp} PID {proc.pid} {record.kind}: {record.message}"
    if record.kind != "heap":
        return None
    stamp = record.time.strftime("%H:%M:%S") if record.time else "--:--:--"
    verdict = proc.trend.verdict if proc.trend else "unknown"
    pause = format_duration(record.pause_seconds or 0.0)
    return (
        f"{stamp} PID {proc.pid} heap #{len(proc.heap)}: RSS {format_bytes(record.rss_bytes)}, "
        f"in use {format_bytes(record.in_use_bytes)}, free {format_bytes(record.free_bytes)}, "
        f"free resident {format_bytes(record.free_resident_bytes)}, paused {pause}; "
        f"trend {verdict}"
    )
