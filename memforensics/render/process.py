"""Process header, RSS waterfall and residency as rich renderables and JSON-able dicts."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from memforensics.model.process import (
    ProcessFacts,
    ProcessMemory,
    Waterfall,
)
from memforensics.units import format_bytes, format_duration

_BAR_WIDTH = 10


def _command(facts: ProcessFacts, limit: int = 70) -> str:
    text = " ".join(facts.cmdline) or f"[{facts.name}]"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_process_header(
    facts: ProcessFacts, memory: ProcessMemory, *, pause_seconds: float | None
) -> RenderableType:
    """Two lines: who the process is, then its memory (RSS, anonymous, USS, PSS, swap)."""
    who = Text()
    who.append(f"PID {facts.pid}", style="bold")
    who.append(f" {facts.name}", style="bold cyan")
    who.append(f"  {_command(facts)}", style="dim")
    facts_line = Text()
    facts_line.append(f"state {facts.state}")
    if facts.threads is not None:
        facts_line.append(f"  threads {facts.threads}")
    if facts.uid is not None:
        facts_line.append(f"  uid {facts.uid}")
    version = facts.glibc_version or "?"
    facts_line.append(f"  glibc {version}")
    if pause_seconds is not None:
        facts_line.append(f"  paused {format_duration(pause_seconds)}", style="bold")
    mem = Text()
    for label, value in (
        ("RSS", memory.rss_bytes),
        ("anon", memory.anon_bytes),
        ("USS", memory.uss_bytes),
        ("PSS", memory.pss_bytes),
        ("swap", memory.swap_bytes),
    ):
        if mem:
            mem.append("  ")
        mem.append(f"{label} ")
        mem.append(format_bytes(value), style="bold" if label == "RSS" else "")
    return Group(who, facts_line, mem)


def _bar(value: int | None, whole: int | None) -> str:
    if value is None or not whole or value <= 0:
        return ""
    cells = round(min(value / whole, 1.0) * _BAR_WIDTH)
    return "█" * cells


def render_waterfall(wf: Waterfall) -> RenderableType:
    """The RSS waterfall: each share indented under its parent, with a bar against RSS."""
    rss = wf.get("rss")
    table = Table(
        title="Where the RSS went", title_justify="left", box=None, pad_edge=False, padding=(0, 1)
    )
    table.add_column("", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("of RSS", justify="right", no_wrap=True)
    table.add_column("", no_wrap=True, min_width=_BAR_WIDTH)
    # Notes are a gloss (the JSON and docs/residency.md have them whole): on a narrow
    # terminal this column gives up its width first and wraps at word boundaries.
    table.add_column("", ratio=1)
    outside_started = False
    for line in wf.lines:
        if not line.in_rss and not outside_started:
            table.add_row(Text("not in RSS", style="dim italic"), "", "", "", "")
            outside_started = True
        label = "  " * (line.depth + (0 if line.in_rss else 1)) + line.label
        share = ""
        if line.in_rss and rss and line.bytes is not None:
            share = f"{line.bytes / rss:.0%}"
        amount = format_bytes(line.bytes)
        if line.estimate and line.bytes is not None:
            amount = "~" + amount
        style = "bold" if line.depth == 0 and line.in_rss else ""
        table.add_row(
            Text(label, style=style),
            Text(amount, style=style),
            share,
            _bar(line.bytes, rss) if line.in_rss else "",
            Text(line.note, style="dim"),
        )
    parts: list[RenderableType] = [table]
    if any(line.estimate for line in wf.lines):
        parts.append(Text("~ marks an estimate (see docs/residency.md)", style="dim"))
    parts.extend(Text(f"note: {note}", style="dim") for note in wf.notes)
    return Group(*parts)
