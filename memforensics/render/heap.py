"""Heap report renderers: rich renderables for people, ``memforensics/heap/1`` dicts for scripts."""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from memforensics.model.advice import Advice
from memforensics.model.heap_analysis import ArenaFigures, HeapAnalysis, HistogramRow
from memforensics.render.heap_sort import SortKey
from memforensics.units import format_bytes

BAR_WIDTH = 24
TABLE_BAR_WIDTH = 12
# Distinct glyphs, not only colours, so the bar reads the same with NO_COLOR or on paper.
IN_USE_GLYPH = "█"
FREE_GLYPH = "░"


def usage_bar(in_use_bytes: int, free_bytes: int, width: int = BAR_WIDTH) -> Text:
    """A bar of in-use (█) against free (░) bytes."""
    total = in_use_bytes + free_bytes
    if total <= 0:
        return Text("·" * width, style="dim")
    free_cells = round(width * free_bytes / total)
    bar = Text(IN_USE_GLYPH * (width - free_cells), style="cyan")
    bar.append(FREE_GLYPH * free_cells, style="yellow")
    return bar


def _sorted_arenas(arenas: tuple[ArenaFigures, ...], sort: SortKey) -> list[ArenaFigures]:
    keys = {
        "free": lambda a: (-a.free_bytes, a.index),
        "in-use": lambda a: (-a.in_use_bytes, a.index),
        "system": lambda a: (-a.system_bytes, a.index),
        "index": lambda a: (a.index,),
    }
    return sorted(arenas, key=keys[sort])


def _totals_panel(analysis: HeapAnalysis, title: str | None) -> Panel:
    dump = analysis.dump
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(justify="right", no_wrap=True)
    grid.add_column(style="dim")
    grid.add_row("arenas", str(len(dump.arenas)), "0 is the main arena, 1 the newest")
    grid.add_row(
        "system",
        format_bytes(dump.system_bytes),
        f"from the kernel for arenas (max {format_bytes(dump.system_max_bytes)})",
    )
    grid.add_row("in use", format_bytes(dump.in_use_bytes), "system − free (upper bound)")
    fast = "n/a" if dump.fast_bytes is None else format_bytes(dump.fast_bytes)
    grid.add_row(
        "free",
        format_bytes(dump.free_bytes),
        f"{dump.rest_chunks + (dump.fast_chunks or 0):,} chunks in bins (fast {fast})",
    )
    grid.add_row(
        "  ≥ 1 page",
        format_bytes(analysis.page_or_larger_free_bytes),
        "in chunks malloc_trim can cut pages from",
    )
    grid.add_row(
        "mmap",
        format_bytes(dump.mmap_bytes),
        f"{dump.mmap_chunks:,} live blocks outside arenas"
        if dump.mmap_chunks is not None
        else "not printed by this glibc",
    )
    grid.add_row(
        "free ratio",
        f"{dump.free_ratio:.0%}",
        usage_bar(dump.in_use_bytes, dump.free_bytes),
    )
    heading = title or "glibc heap"
    if analysis.suspect:
        heading += "  [suspect counters]"
    return Panel(grid, title=heading, title_align="left", box=box.ROUNDED)


def arena_table(analysis: HeapAnalysis, *, top: int | None = 20, sort: SortKey = "free") -> Table:
    """The per-arena table, sorted and cut to ``top`` rows (None: all)."""
    rows = _sorted_arenas(analysis.arenas, sort)
    shown = rows if top is None or top <= 0 else rows[:top]
    table = Table(
        title=f"arenas (sorted by {sort}"
        + (f", top {len(shown)} of {len(rows)})" if len(shown) < len(rows) else ")"),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    cells = [
        (
            str(arena.index) + (" !" if arena.suspect else ""),
            format_bytes(arena.system_bytes),
            format_bytes(arena.in_use_bytes),
            format_bytes(arena.free_bytes),
            f"{arena.free_ratio:.0%}",
            format_bytes(arena.top_bytes),
            "" if arena.subheaps is None else str(arena.subheaps),
        )
        for arena in shown
    ]
    names = ("arena", "system", "in use", "free", "free%", "top", "heaps")
    # Numbers are never cut: each numeric column is as wide as its widest cell, and at 80
    # columns only the bar gives way.
    widths = [max([len(name)] + [len(row[i]) for row in cells]) for i, name in enumerate(names)]
    for name, width in zip(names[:5], widths[:5], strict=True):
        table.add_column(name, justify="right", no_wrap=True, min_width=width)
    table.add_column(f"{IN_USE_GLYPH}used {FREE_GLYPH}free", overflow="crop")  # may shrink
    for name, width in zip(names[5:], widths[5:], strict=True):
        table.add_column(name, justify="right", no_wrap=True, min_width=width)
    for arena, row in zip(shown, cells, strict=True):
        table.add_row(
            *row[:5], usage_bar(arena.in_use_bytes, arena.free_bytes, TABLE_BAR_WIDTH), *row[5:]
        )
    if len(shown) < len(rows):
        table.caption = f"… {len(rows) - len(shown)} more arenas (--top 0 shows all)"
    return table


def _class_label(row: HistogramRow) -> str:
    if row.to_bytes is None:
        return f"≥ {format_bytes(row.from_bytes)}"
    return f"{format_bytes(row.from_bytes)} – {format_bytes(row.to_bytes)}"


def histogram_table(analysis: HeapAnalysis) -> Table:
    """Free chunks by size class, merged across arenas."""
    table = Table(
        title="free chunks by size (all arenas)", title_justify="left", box=box.SIMPLE_HEAD
    )
    table.add_column("chunk size", no_wrap=True)
    table.add_column("chunks", justify="right")
    table.add_column("bytes", justify="right")
    table.add_column("share", justify="right")
    table.add_column("", no_wrap=True)
    total = sum(r.bytes for r in analysis.histogram) or 1
    for row in analysis.histogram:
        share = row.bytes / total
        cells = round(BAR_WIDTH * share)
        table.add_row(
            _class_label(row),
            f"{row.chunks:,}",
            format_bytes(row.bytes),
            f"{share:.0%}",
            Text(FREE_GLYPH * cells, style="yellow" if row.page_or_larger else "magenta"),
        )
    table.caption = "chunks of a page or more can be trimmed; smaller ones cannot"
    return table


def advice_renderable(advice: tuple[Advice, ...]) -> RenderableType:
    """Advice as a short list; warnings first."""
    if not advice:
        return Text("no advice: nothing stands out", style="dim")
    lines = Text()
    for item in sorted(advice, key=lambda a: a.severity != "warn"):
        marker = "▲ " if item.severity == "warn" else "• "
        lines.append(marker, style="bold yellow" if item.severity == "warn" else "bold")
        lines.append(item.message)
        lines.append(f"  [{item.code}]\n", style="dim")
    lines.rstrip()
    return Panel(lines, title="advice", title_align="left", box=box.ROUNDED)


def render_heap(
    analysis: HeapAnalysis,
    *,
    top: int | None = 20,
    sort: SortKey = "free",
    title: str | None = None,
    extra_advice: tuple[Advice, ...] = (),
) -> RenderableType:
    """The whole human report: totals, arenas, histogram, advice and what figures mean."""
    parts: list[RenderableType] = [_totals_panel(analysis, title)]
    if analysis.arenas:
        parts.append(arena_table(analysis, top=top, sort=sort))
    if analysis.histogram:
        parts.append(histogram_table(analysis))
    parts.extend(advice_and_notes(analysis, extra_advice))
    return Group(*parts)


def advice_and_notes(
    analysis: HeapAnalysis, extra_advice: tuple[Advice, ...] = ()
) -> list[RenderableType]:
    """The closing parts of every heap report: the advice, then what the figures mean."""
    return [
        advice_renderable(analysis.advice + extra_advice),
        Text("\n".join(f"· {note}" for note in analysis.notes), style="dim"),
    ]
