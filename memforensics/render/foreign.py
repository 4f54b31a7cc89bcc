"""The heap report of a process on jemalloc, tcmalloc or mimalloc: the allocator named, its
figures in the one vocabulary (in use, free, releasable, fragmentation), its arenas, its
own figures by their own names, the advice and what the figures mean."""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table

from memforensics.model.advice import Advice
from memforensics.model.allocator import ForeignHeap
from memforensics.model.heap_analysis import HeapAnalysis
from memforensics.render.heap import advice_and_notes, arena_table
from memforensics.render.heap_sort import SortKey
from memforensics.units import format_bytes

_OWN_FIGURES_SHOWN = 24  # the rest are in --json


def _size(count: int | None) -> str:
    return "unknown" if count is None else format_bytes(count)


def _totals(heap: ForeignHeap, title: str | None) -> Panel:
    name = heap.kind
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(justify="right", no_wrap=True)
    grid.add_column(style="dim")
    library = heap.library.path + (f" ({heap.library.prefix}…)" if heap.library.prefix else "")
    grid.add_row("allocator", f"{name} {heap.version or ''}".strip(), library)
    grid.add_row("in use", _size(heap.in_use_bytes), "what the application holds")
    grid.add_row("free", _size(heap.free_bytes), f"what {name} keeps for reuse")
    grid.add_row("  releasable", _size(heap.releasable_bytes), f"free pages {name}'s purge returns")
    grid.add_row(
        "  fragmentation",
        _size(heap.fragmentation_bytes),
        "free room beside live objects: no purge returns it",
    )
    grid.add_row("metadata", _size(heap.metadata_bytes), f"{name}'s own bookkeeping")
    grid.add_row("resident", _size(heap.resident_bytes), f"{name}'s own count of its RSS")
    grid.add_row("mapped", _size(heap.mapped_bytes), "backed by memory (committed)")
    grid.add_row("retained", _size(heap.retained_bytes), "address space kept, not backed")
    return Panel(grid, title=title or f"{name} heap", title_align="left", box=box.ROUNDED)


def _own_figures(heap: ForeignHeap) -> Table:
    figures = heap.figures
    table = Table(
        title=f"{heap.kind}'s own figures"
        + (
            f" (first {_OWN_FIGURES_SHOWN} of {len(figures)}; all in --json)"
            if len(figures) > _OWN_FIGURES_SHOWN
            else ""
        ),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("name")
    table.add_column("value", justify="right")
    for name, value in figures[:_OWN_FIGURES_SHOWN]:
        shown = f"{value:,}" if isinstance(value, int) else value
        table.add_row(name, shown)
    return table


def render_foreign(
    heap: ForeignHeap,
    analysis: HeapAnalysis,
    *,
    top: int | None = 20,
    sort: SortKey = "free",
    title: str | None = None,
    extra_advice: tuple[Advice, ...] = (),
) -> RenderableType:
    """The whole report of a foreign allocator's heap (see the module)."""
    parts: list[RenderableType] = [_totals(heap, title)]
    if heap.arenas:
        parts.append(arena_table(analysis, top=top, sort=sort))
    parts.append(_own_figures(heap))
    parts.extend(advice_and_notes(analysis, extra_advice))
    return Group(*parts)
