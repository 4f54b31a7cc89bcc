"""The whole suite's setting: `gdb` on PATH is the one the test extra installs (pyproject.toml
says why), its own binary rather than the package's Python wrapper (which adds a Python
start to every gdb start), whether the suite runs through nox or straight through pytest;
and under CI a skipped test is a failure."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest


def _test_gdb_directory() -> str:
    """The folder of the test extra's gdb binary; this interpreter's scripts where the
    package is not there (not x86-64)."""
    spec = importlib.util.find_spec("gdb_for_pwndbg")
    if spec is not None and spec.origin is not None:
        vendored = os.path.join(os.path.dirname(spec.origin), "_vendor", "bin")
        if os.path.isfile(os.path.join(vendored, "gdb")):
            return vendored
    return os.path.dirname(sys.executable)


_BIN = _test_gdb_directory()
if os.environ.get("PATH", "").split(os.pathsep)[:1] != [_BIN]:
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI (``CI`` set, as .ci/run and CI's runner set it) a skipped test is a failure:
    every tool, package and service the suite needs is installed there, so a skip means a
    missing install step, not a test that does not apply."""
    if not os.environ.get("CI"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped:
        reporter.ensure_newline()
        for report in skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
            reporter.write_line(f"CI: skipped is a failure here: {report.nodeid}: {reason}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
