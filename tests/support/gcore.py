"""A core of a live test target written by gdb's gcore (the test's tool, not the code's)."""

from __future__ import annotations

import subprocess
from pathlib import Path

GCORE_TIMEOUT_SECONDS = 120


def gcore(pid: int, core: Path) -> None:
    """Write ``pid``'s core to ``core`` with gdb's gcore (the target is left running)."""
    result = subprocess.run(
        [
            "gdb",
            "--batch",
            "-nx",
            "-iex",
            "set debuginfod enabled off",
            "-p",
            str(pid),
            "-ex",
            f"gcore {core}",
        ],
        capture_output=True,
        text=True,
        timeout=GCORE_TIMEOUT_SECONDS,
        check=False,
    )
    assert core.is_file(), f"gcore wrote no core: {result.stdout}{result.stderr}"
