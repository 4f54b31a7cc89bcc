"""The whole suite's setting: the test interpreter's scripts come first on PATH, as in a nox
session, so that `gdb` is the one the test extra installs (pyproject.toml says why) whether
the suite runs through nox or straight through this interpreter's pytest."""

from __future__ import annotations

import os
import sys

import pytest

_BIN = os.path.dirname(sys.executable)
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
