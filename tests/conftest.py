"""The whole suite's setting: the test interpreter's scripts come first on PATH, as in a nox
session, so that `gdb` is the one the test extra installs (pyproject.toml says why) whether
the suite runs through nox or straight through this interpreter's pytest."""

from __future__ import annotations

import os
import sys

_BIN = os.path.dirname(sys.executable)
if os.environ.get("PATH", "").split(os.pathsep)[:1] != [_BIN]:
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")
