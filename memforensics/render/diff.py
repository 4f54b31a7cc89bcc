"""Renderers for a heap diff: a rich table for people, ``memforensics/heap-diff/1`` for scripts."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from memforensics.analysis.diff import ArenaDelta, Figures, HeapDiff
from memforensics.render.jsondoc import record
from memforensics.units import format_bytes

DIFF_SCHEMA = "memforensics/heap-diff/1"
_FIGURES = ("system_bytes", "in_use_bytes", "free_bytes")


def _signed(delta: int) -> Text:
    style = "red" if delta > 0 else "green" if delta < 0 else "dim"
    return Text(format_bytes(delta, signed=True) if delta else "·", style=style)


def _cell(figures: Figures | None, name: str) -> str:
    return "—" if figures is None else format_bytes(getattr(figures, name))


def render_diff(
    diff: HeapDiff, *, old_name: str, new_name: str, show_unchanged: bool
) -> RenderableType:
    """Totals then one row per arena (its old and new number), growth in red, shrinkage in
    green."""
    totals = Table(title=f"{old_name} → {new_name}", title_justify="left", box=box.ROUNDED)
    totals.add_column("", style="bold")
    totals.add_column("old", justify="right")
    totals.add_column("new", justify="right")
    totals.add_column("change", justify="right")
    totals.add_row(
        "arenas",
        str(len(diff.old.arenas)),
        str(len(diff.new.arenas)),
        f"{len(diff.new.arenas) - len(diff.old.arenas):+d}",
    )
    for name, label in zip(_FIGURES, ("system", "in use", "free"), strict=True):
        totals.add_row(
            label,
            _cell(diff.total_old, name),
            _cell(diff.total_new, name),
            _signed(diff.total_delta(name)),
        )
    totals.add_row(
        "free ratio",
        f"{diff.total_old.free_ratio:.0%}",
        f"{diff.total_new.free_ratio:.0%}",
        f"{(diff.total_new.free_ratio - diff.total_old.free_ratio) * 100:+.0f} pt",
    )
    totals.add_row(
        "mmap",
        format_bytes(diff.old.mmap_bytes),
        format_bytes(diff.new.mmap_bytes),
        _signed(diff.mmap_delta_bytes) if diff.mmap_delta_bytes is not None else "n/a",
    )
    arenas = Table(
        title="arenas, old → new number (a new arena is 1; older ones move up)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    arenas.add_column("arena", justify="right", no_wrap=True, min_width=5)
    arenas.add_column("", no_wrap=True)
    for label in ("system", "Δ system", "Δ in use", "Δ free"):
        arenas.add_column(label, justify="right", no_wrap=True)
    hidden = 0
    for delta in diff.arenas:
        if delta.change == "unchanged" and not show_unchanged:
            hidden += 1
            continue
        arenas.add_row(_numbers(delta), _change_label(delta), *_delta_cells(delta))
    if hidden:
        arenas.caption = f"{hidden} unchanged arenas hidden (--all shows them)"
    notes = [Text(f"· {note}", style="dim") for note in diff.notes]
    return Group(totals, arenas, *notes)


def _numbers(delta: ArenaDelta) -> str:
    """The arena's number in OLD and NEW: ``3``, ``1 → 2``, ``— → 1``, ``2 → —``."""
    if delta.old_index == delta.new_index:
        return str(delta.index)
    old = "—" if delta.old_index is None else str(delta.old_index)
    new = "—" if delta.new_index is None else str(delta.new_index)
    return f"{old} → {new}"


def _change_label(delta: ArenaDelta) -> Text:
    styles = {"appeared": "bold red", "vanished": "bold green", "changed": "", "unchanged": "dim"}
    return Text(delta.change, style=styles[delta.change])


def _delta_cells(delta: ArenaDelta) -> list[str | Text]:
    return [
        _cell(delta.new or delta.old, "system_bytes"),
        *(_signed(delta.delta(name)) for name in _FIGURES),
    ]


def _figures_json(figures: Figures | None) -> dict[str, Any] | None:
    return None if figures is None else record(figures)


def diff_json(diff: HeapDiff, *, old_name: str, new_name: str) -> dict[str, Any]:
    """The ``memforensics/heap-diff/1`` document (docs/json.md)."""
    return {
        "schema": DIFF_SCHEMA,
        "old": old_name,
        "new": new_name,
        "totals": {
            "old": {
                **(_figures_json(diff.total_old) or {}),
                "arenas": len(diff.old.arenas),
                "mmap_bytes": diff.old.mmap_bytes,
            },
            "new": {
                **(_figures_json(diff.total_new) or {}),
                "arenas": len(diff.new.arenas),
                "mmap_bytes": diff.new.mmap_bytes,
            },
            "system_delta_bytes": diff.total_delta("system_bytes"),
            "in_use_delta_bytes": diff.total_delta("in_use_bytes"),
            "free_delta_bytes": diff.total_delta("free_bytes"),
            "mmap_delta_bytes": diff.mmap_delta_bytes,
            "arenas_delta": len(diff.new.arenas) - len(diff.old.arenas),
        },
        "arenas": [
            {
                "index": d.index,
                "old_index": d.old_index,
                "new_index": d.new_index,
                "change": d.change,
                "old": _figures_json(d.old),
                "new": _figures_json(d.new),
                "system_delta_bytes": d.delta("system_bytes"),
                "in_use_delta_bytes": d.delta("in_use_bytes"),
                "free_delta_bytes": d.delta("free_bytes"),
            }
            for d in diff.arenas
        ],
        "notes": list(diff.notes),
    }
