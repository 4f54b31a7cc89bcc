"""The whole suite's setting: `gdb` on PATH is the one the test extra installs (pyproject.toml
says why), its own binary rather than the package's Python wrapper (which adds a Python
start to every gdb start), whether the suite runs through nox or straight through pytest;
SIGINT is delivered even where the suite was started with it ignored; and under CI a
skipped test is a failure."""

from __future__ import annotations

import os
import signal

import pytest

from tests.support.gdb_binary import use_test_gdb

use_test_gdb()

# A suite started with SIGINT ignored (a background job of a non-interactive shell: nohup,
# `cmd &` in a script, a CI runner) would keep it ignored in itself and in every process it
# starts, and the tests that press Ctrl-C (on a hold, on memforensics) would wait out their
# deadlines. Python installs its handler only where SIGINT was not ignored; do it here.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
