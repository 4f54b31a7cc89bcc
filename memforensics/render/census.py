"""The census for people, like ``jmap -histo``: one line per type (rank, count, bytes, share
of what is in use, kind, name), a total line, and what could not be seen; and the diff of two
censuses, biggest growth first."""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from memforensics.analysis.census_diff import CensusDiff
from memforensics.model.census import Census
from memforensics.units import format_bytes


def render_census(census: Census, *, source: str, top: int | None = None) -> RenderableType:
    """The histogram of ``census`` (its ``top`` biggest types, then one "other" line)."""
    read = census.read
    title = f"heap census of {source} ({census.process_name}), {census.time}"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for name, justify in (
        ("#", "right"),
        ("count", "right"),
        ("bytes", "right"),
        ("share", "right"),
        ("kind", "left"),
        ("type", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    total = census.live_bytes or 1
    shown = census.types if top is None else census.types[:top]
    for rank, row in enumerate(shown, start=1):
        table.add_row(
            str(rank),
            f"{row.count:,}",
            format_bytes(row.total_bytes),
            f"{100 * row.total_bytes / total:.1f}%",
            row.kind,
            row.name,
        )
    rest = census.types[len(shown) :]
    if rest:
        rest_bytes = sum(r.total_bytes for r in rest)
        table.add_row(
            "",
            f"{sum(r.count for r in rest):,}",
            format_bytes(rest_bytes),
            f"{100 * rest_bytes / total:.1f}%",
            "",
            f"other ({len(rest):,} types)",
        )
    table.add_row(
        "",
        f"{census.live_chunks:,}",
        format_bytes(census.live_bytes),
        "100%",
        "",
        Text("total in use", style="bold"),
    )
    lines = [
        f"classified: {format_bytes(census.classified_bytes)} of {format_bytes(census.live_bytes)}"
        f" ({100 * census.classified_bytes / total:.1f}%)",
    ]
    if census.unread_chunks:
        lines.append(
            f"unread: {census.unread_chunks:,} chunks, {format_bytes(census.unread_bytes)} "
            "(on pages not in memory, or pools that changed while read)"
        )
    if read.python_layout:
        lines.append(f"python layout: {read.python_layout}")
    if read.source == "live":
        lines.append(
            f"read in {read.read_seconds:.2f} s: {read.stops} stops of every thread, longest "
            f"{read.longest_stop_seconds * 1000:.1f} ms; no gdb, nothing run in the target"
        )
    else:
        lines.append(f"read from a core in {read.read_seconds:.2f} s")
    lines.extend(f"note: {note}" for note in read.notes)
    return Group(table, Text("\n".join(lines), style="dim"))


def _signed(value: int, text: str) -> Text:
    style = "red" if value > 0 else "green" if value < 0 else "dim"
    return Text(text if value else "·", style=style)


def render_census_diff(
    diff: CensusDiff, *, old_name: str, new_name: str, top: int | None = 20
) -> RenderableType:
    """The types whose count or bytes changed, biggest growth first."""
    table = Table(title=f"{old_name} → {new_name}", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("count Δ", "bytes Δ", "count", "bytes", "kind", "type"):
        table.add_column(name, justify="left" if name in ("kind", "type") else "right")
    changed = [r for r in diff.types if r.count_delta or r.bytes_delta]
    for row in changed if top is None else changed[:top]:
        rate = ""
        if row.count_per_hour is not None and row.bytes_per_hour is not None:
            rate = (
                f"  ({row.count_per_hour:+,.0f}/h, "
                f"{format_bytes(round(row.bytes_per_hour), signed=True)}/h)"
            )
        table.add_row(
            _signed(row.count_delta, f"{row.count_delta:+,}"),
            _signed(row.bytes_delta, format_bytes(row.bytes_delta, signed=True)),
            f"{row.new_count:,}",
            format_bytes(row.new_bytes),
            row.kind,
            row.name + rate,
        )
    footer = (
        f"total: {diff.live_chunks_delta:+,} chunks, "
        f"{format_bytes(diff.live_bytes_delta, signed=True)}"
    )
    if diff.seconds is not None:
        footer += f" in {diff.seconds:,.0f} s"
    if not changed:
        footer = "no type changed; " + footer
    return Group(table, Text(footer, style="dim"))
