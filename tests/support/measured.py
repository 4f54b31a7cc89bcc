"""A memforensics command run as a child, with its wall time and the kernel's figure of its own
peak RSS (wait4's ru_maxrss, taken by a small parent of its own: one forked from the test
process would count that process's high-water mark too, which the kernel keeps across fork
and exec, and the suite's process grows large)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import pytest

MEMFORENSICS = [sys.executable, "-m", "memforensics"]

_MEASURE = (
    "import os, subprocess, sys\n"
    "child = subprocess.Popen(sys.argv[1:])\n"
    "_, status, usage = os.wait4(child.pid, 0)\n"
    "sys.stderr.write(f'\\n@peak-rss-kib {usage.ru_maxrss}\\n')\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


@dataclass
class Run:
    exit_code: int
    stdout: str
    stderr: str
    seconds: float
    peak_rss_kib: int


def run_measured(
    args: list[str], *, timeout_seconds: float, env: dict[str, str] | None = None
) -> Run:
    """``memforensics ARGS``; the test fails (its process group killed) past the timeout."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-c", _MEASURE, *MEMFORENSICS, *args],
            stdout=out,
            stderr=err,
            env=env,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"{args} still running after {timeout_seconds} s")
        seconds = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        stderr, _, peak = err.read().decode().rpartition("\n@peak-rss-kib ")
        return Run(proc.returncode, out.read().decode(), stderr, seconds, int(peak))
