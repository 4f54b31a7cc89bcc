"""Where a command's input files come from: a path, or ``-`` for standard input."""

from __future__ import annotations

import sys
from typing import BinaryIO

STDIN_NAME = "-"
STDIN_LABEL = "<stdin>"


def input_source(name: str) -> tuple[str | BinaryIO, str]:
    """(what to read, what errors call it) for a FILE argument; ``-`` is standard input."""
    if name == STDIN_NAME:
        return sys.stdin.buffer, STDIN_LABEL
    return name, name
