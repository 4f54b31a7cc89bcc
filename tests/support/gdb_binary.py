"""The gdb the tests and benchmarks drive: the test extra's gdb 18 binary itself (pyproject.toml
says why Debian 12's gdb 13 cannot serve on a CPU with AMX), first on PATH for this process
and its children, so that `gdb`, `--gdb gdb` and the manual recipe all name the same one."""

from __future__ import annotations

import importlib.util
import os
import sys


def test_gdb_directory() -> str:
    """The folder of the test extra's gdb binary; this interpreter's scripts where the
    package is not there (not x86-64)."""
    spec = importlib.util.find_spec("gdb_for_pwndbg")
    if spec is not None and spec.origin is not None:
        vendored = os.path.join(os.path.dirname(spec.origin), "_vendor", "bin")
        if os.path.isfile(os.path.join(vendored, "gdb")):
            return vendored
    return os.path.dirname(sys.executable)


def use_test_gdb() -> None:
    """Put test_gdb_directory() first on PATH (once)."""
    folder = test_gdb_directory()
    if os.environ.get("PATH", "").split(os.pathsep)[:1] != [folder]:
        os.environ["PATH"] = folder + os.pathsep + os.environ.get("PATH", "")
