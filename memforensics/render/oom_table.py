"""The default `oom` table laid out by hand: it fits the terminal (80 columns), one kill in two
or three lines, and renders thousands of kills in milliseconds where a rich Table, which
measures and wraps every cell, takes seconds.

Every cell is a few known lines (date over time, name over pid, pod over container), so the
layout is simple: natural widths, the cgroup column gives way first, overlong lines end in
an ellipsis.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text

HEADERS = ("time (UTC)", "victim", "anon-rss", "by", "cgroup", "trigger")
_RIGHT = frozenset({2})
# Widest a column may be (a comm is at most 15 bytes, plus a pid in parentheses).
_CAPS = {1: 16, 5: 15}
_MIN_WIDTH = 8
# The cgroup column keeps a 12-character container id whole.
_MIN_WIDTHS = {4: 12}
# Which columns give way, in order, when the terminal is narrow.
_SHRINK_ORDER = (4, 1, 5)
_GAP = "  "


def _fit(line: str, width: int, right: bool) -> str:
    if len(line) > width:
        line = line[: max(width - 1, 0)] + "…"
    return line.rjust(width) if right else line.ljust(width)


def _widths(rows: Sequence[Sequence[Sequence[str]]], total_width: int) -> list[int]:
    natural = [len(header) for header in HEADERS]
    for row in rows:
        for index, cell in enumerate(row):
            for line in cell:
                natural[index] = max(natural[index], len(line))
    widths = [min(width, _CAPS.get(index, width)) for index, width in enumerate(natural)]
    excess = 1 + sum(widths) + len(_GAP) * (len(widths) - 1) - total_width
    for index in _SHRINK_ORDER:
        if excess <= 0:
            break
        give = min(excess, widths[index] - _MIN_WIDTHS.get(index, _MIN_WIDTH))
        if give > 0:
            widths[index] -= give
            excess -= give
    return widths


def render_rows(
    title: str, rows: Sequence[Sequence[Sequence[str]]], notes: Sequence[str], width: int
) -> Text:
    """The table: title, header, rule, each row's lines, a blank line, then ``notes``
    (wrapped to ``width``). ``rows`` holds six cells per row, each a list of lines."""
    import textwrap

    from rich.text import Text

    widths = _widths(rows, width)
    text = Text(no_wrap=True, overflow="ignore")
    text.append(title + "\n\n")
    header = " " + _GAP.join(
        _fit(name, widths[index], index in _RIGHT) for index, name in enumerate(HEADERS)
    )
    text.append(header.rstrip() + "\n", style="bold")
    text.append(" " + "─" * (len(header) - 1) + "\n")
    lines = []
    for row in rows:
        height = max(len(cell) for cell in row)
        for number in range(height):
            parts = [
                _fit(cell[number] if number < len(cell) else "", widths[index], index in _RIGHT)
                for index, cell in enumerate(row)
            ]
            lines.append((" " + _GAP.join(parts)).rstrip())
    text.append("\n".join(lines) + "\n\n")
    for note in notes:
        text.append("\n".join(textwrap.wrap(note, width=max(width, 20))) + "\n")
    text.rstrip()
    return text
