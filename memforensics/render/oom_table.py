"""The default `oom` table laid out by hand: it fits the terminal (80 columns), one kill in two
or three lines, and renders thousands of kills in milliseconds where a rich Table, which
measures and wraps every cell, takes seconds.

Every cell is a few known lines (date over time, name over pid, pod over container), so the
layout is simple: natural widths, the cgroup column gives way first, overlong lines end in
an ellipsis. One layout, two forms: rich Text (the header bold) for a terminal, and the
same characters as a plain string for where no styles are printed, without importing rich.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

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


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[: max(width - 1, 0)] + "…"


def _fit(line: str, width: int, right: bool) -> str:
    line = _cut(line, width)
    return line.rjust(width) if right else line.ljust(width)


def _widths(
    rows: Sequence[Sequence[Sequence[str]]], total_width: int
) -> tuple[list[int], list[int]]:
    """(natural, fitted) width of each column."""
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
    return natural, widths


class TableLines(NamedTuple):
    """The table as text: ``before`` the header line, the ``header`` line (shown bold on a
    terminal), and the rest, ``after``, which ends in the notes."""

    before: str
    header: str
    after: str


def layout_rows(
    title: str, rows: Sequence[Sequence[Sequence[str]]], notes: Sequence[str], width: int
) -> TableLines:
    """The table laid out for ``width`` columns: title, header, rule, each row's lines, a
    blank line, then ``notes`` (wrapped to ``width``). ``rows`` holds six cells per row, each
    a list of lines."""
    import textwrap

    natural, widths = _widths(rows, width)
    header = " " + _GAP.join(
        _fit(name, widths[index], index in _RIGHT) for index, name in enumerate(HEADERS)
    )
    rule = " " + "─" * (len(header) - 1) + "\n"
    # Every line of a row in one format: cells padded as _fit pads them, after _fit's cut
    # in the columns that gave way (no line of the others is wider than its column).
    line_format = " " + _GAP.join(
        f"{{{index}:{'>' if index in _RIGHT else '<'}{width}}}"
        for index, width in enumerate(widths)
    )
    cut = [index for index, width in enumerate(widths) if width < natural[index]]
    lines = []
    for row in rows:
        cells = list(row)
        for index in cut:
            cells[index] = [_cut(line, widths[index]) for line in cells[index]]
        height = max(len(cell) for cell in cells)
        for number in range(height):
            parts = [cell[number] if number < len(cell) else "" for cell in cells]
            lines.append(line_format.format(*parts).rstrip())
    after = rule + "\n".join(lines) + "\n\n"
    after += "".join("\n".join(textwrap.wrap(note, width=max(width, 20))) + "\n" for note in notes)
    return TableLines(title + "\n\n", header.rstrip() + "\n", after)


def render_rows(
    title: str, rows: Sequence[Sequence[Sequence[str]]], notes: Sequence[str], width: int
) -> Text:
    """The table of layout_rows as rich Text, its header bold."""
    from rich.text import Text

    table = layout_rows(title, rows, notes, width)
    text = Text(no_wrap=True, overflow="ignore")
    text.append(table.before)
    text.append(table.header, style="bold")
    text.append(table.after)
    text.rstrip()
    return text


# What rich's Text removes from the text it is given (rich.control.STRIP_CONTROL_CODES: BEL,
# BS, VT, FF, CR); a process name in a log may hold any of them.
_CONTROL_CODES = "\a\b\v\f\r"
_CONTROL_RE = re.compile(f"[{_CONTROL_CODES}]")


def plain_rows(
    title: str, rows: Sequence[Sequence[Sequence[str]]], notes: Sequence[str], width: int
) -> str:
    """The text of ``render_rows(…).plain`` without rich: the same characters, no styles."""
    table = layout_rows(title, rows, notes, width)
    text = table.before + table.header + table.after
    if _CONTROL_RE.search(text):
        text = text.translate(dict.fromkeys(map(ord, _CONTROL_CODES)))
    return text.rstrip()
