"""Where output goes: data on stdout (rich or JSON), status and gate lines on stderr."""

from __future__ import annotations

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


def stderr_console(*, soft_wrap: bool = False, highlight: bool = False) -> Console:
    """Console for status, spinners and progress (never data)."""
    from rich.console import Console

    return Console(file=sys.stderr, highlight=highlight, soft_wrap=soft_wrap)


def emit_json(document: Any) -> None:
    """One JSON document on stdout, written as it is produced, so `| jq` always works."""
    write_json(document, sys.stdout.write)
    sys.stdout.flush()
