"""Where the figures come from: /proc, gdb, glibc's memory, other allocators, logs, files."""

from __future__ import annotations

import contextlib
import importlib
import os
from types import ModuleType


def optional_native(name: str) -> ModuleType | None:
    """The optional C module ``name`` (setup.py builds it where a compiler exists), or None
    when it is not built or MEMFORENSICS_PURE_PYTHON=1 keeps the Python code (to compare, or
    to rule the C code out)."""
    if os.environ.get("MEMFORENSICS_PURE_PYTHON"):
        return None
    with contextlib.suppress(ImportError):
        return importlib.import_module(name)
    return None
