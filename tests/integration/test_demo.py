"""`memforensics demo` and its ctypes child, end to end with real gdb."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from click.testing import CliRunner

from memforensics.cli import cli
from memforensics.sources import procfs
from tests.support.targets import running

pytestmark = pytest.mark.integration
needs_gdb = pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed")

MIB = 1024 * 1024


def test_child_keeps_its_freed_memory_resident() -> None:
    # 40,000 x 1 KiB freed but the last: glibc keeps it all, RSS holds ~40 MiB more than idle.
    argv = [sys.executable, "-m", "memforensics.demo_target", "--buffers", "40000",
            "--max-seconds", "60", "--no-progress"]  # fmt: skip
    with running(argv) as child:
        assert "allocated_bytes=40960000" in child.ready_line and "kept=1" in child.ready_line
        memory = procfs.read_memory(child.pid)
        assert memory.anon_bytes is not None and memory.anon_bytes > 40 * MIB
        assert child.state() in ("S", "R")  # idle in sleep (a safe point), not stopped


def test_child_rejects_nonsense_arguments() -> None:
    argv = [sys.executable, "-m", "memforensics.demo_target", "--buffers", "0"]
    with pytest.raises(RuntimeError, match="before saying ready"), running(argv):
        pass


@needs_gdb
def test_demo_json_shows_the_drop_beside_the_forecast() -> None:
    result = CliRunner().invoke(cli, ["demo", "--buffers", "50000", "--json"])
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "memforensics/trim/1"
    assert document["demo"]["allocated_bytes"] == 50000 * 1024
    assert document["trim_returned"] == 1
    released = document["released_bytes"]
    assert released > 40 * MIB  # of ~50 MiB written and freed
    assert document["rss_after_bytes"] < document["rss_before_bytes"] - 40 * MIB
    # Forecast and measurement agree on this clean case (one big free run per arena).
    assert abs(released - document["forecast_bytes"]) <= 0.1 * released
    assert "allocating" in result.stderr or "child" in result.stderr  # progress on stderr


@needs_gdb
def test_demo_threads_spread_over_arenas_and_report_in_words() -> None:
    result = CliRunner().invoke(cli, ["demo", "--buffers", "30000", "--threads", "3"])
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "After malloc_trim(0): RSS" in out
    assert "forecast" in out and "released" in out
    arenas = int(out.split("malloc_info: ")[1].split(" arena")[0])
    assert arenas >= 4  # main + one per worker thread
