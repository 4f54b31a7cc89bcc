"""Where output goes: data on stdout (rich or JSON), status and gate lines on stderr."""

from __future__ import annotations

import builtins
import os
import sys
from typing import TYPE_CHECKING, Any

from memforensics.render.jsondoc import write_json

if TYPE_CHECKING:
    from rich.console import Console


def stdout_console(*, soft_wrap: bool = False, highlight: bool = False) -> Console:
    """Console for reports; rich drops colour on non-TTY and honours NO_COLOR itself.

    ``soft_wrap`` leaves long prose lines to the terminal instead of rich's own wrapping.
    rich is imported here, not above: ``--json`` output never needs it.
    """
    from rich.console import Console

    return Console(file=sys.stdout, highlight=highlight, soft_wrap=soft_wrap)


# Environment rich reads to decide that a file is (or is not) a terminal, or to size it as
# Jupyter's: with any of them set, only rich itself can say what it will print.
_RICH_TERMINAL_ENVIRON = ("TTY_COMPATIBLE", "FORCE_COLOR", "JUPYTER_COLUMNS", "JUPYTER_LINES")


def plain_stdout_width() -> int | None:
    """The width stdout_console() lays out for, when it is certain to print no styles and
    no control codes (stdout is not a terminal); None when it may (a terminal, or settings
    only rich interprets), and the caller is to print through rich.

    The same rules as rich's Console, without importing rich: a file that is not a terminal
    gets no colour system; its width is $COLUMNS, else the first of stdin, stdout and stderr
    that is a terminal, else 80.
    """
    if sys.platform == "win32" or hasattr(builtins, "get_ipython"):
        return None  # legacy consoles, notebooks: rich's own rules
    if any(name in os.environ for name in _RICH_TERMINAL_ENVIRON):
        return None
    isatty = getattr(sys.stdout, "isatty", None)
    try:
        if isatty is None or isatty():
            return None
    except ValueError:
        return None
    columns = os.environ.get("COLUMNS")
    if columns is not None and columns.isdigit():
        return int(columns) if columns.isascii() else None
    width = 0
    for descriptor in (0, 1, 2):
        try:
            width = os.get_terminal_size(descriptor).columns
        except (AttributeError, ValueError, OSError):
            continue
        break
    return width or 80


def stderr_console(*, soft_wrap: bool = False, highlight: bool = False) -> Console:
    """Console for status, spinners and progress (never data)."""
    from rich.console import Console

    return Console(file=sys.stderr, highlight=highlight, soft_wrap=soft_wrap)


def emit_json(document: Any) -> None:
    """One JSON document on stdout, written as it is produced, so `| jq` always works."""
    write_json(document, sys.stdout.write)
    sys.stdout.flush()
