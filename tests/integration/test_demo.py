"""`memforensics demo` and its ctypes child, end to end with real gdb."""

from __future__ import annotations

import json
import re
import sys

import pytest
from click.testing import CliRunner

from memforensics.cli import cli
from memforensics.sources.proc import memory_figures
from memforensics.units import parse_size
from tests.support.targets import needs_live, running

pytestmark = pytest.mark.integration

MIB = 1024 * 1024


def test_child_keeps_its_freed_memory_resident() -> None:
    # 40,000 x 1 KiB freed but the last: glibc keeps it all, RSS holds ~40 MiB more than idle.
    argv = [sys.executable, "-m", "memforensics.entry.demo_target", "--buffers", "40000",
            "--max-seconds", "60", "--no-progress"]  # fmt: skip
    with running(argv) as child:
        assert "allocated_bytes=40960000" in child.ready_line and "kept=1" in child.ready_line
        memory = memory_figures.read_memory(child.pid)
        assert memory.anon_bytes is not None and memory.anon_bytes > 40 * MIB
        assert child.state() in ("S", "R")  # idle in sleep (a safe point), not stopped


def test_child_rejects_nonsense_arguments() -> None:
    argv = [sys.executable, "-m", "memforensics.entry.demo_target", "--buffers", "0"]
    with pytest.raises(RuntimeError, match="before saying ready"), running(argv):
        pass


@needs_live
def test_demo_json_shows_the_drop_beside_the_forecast() -> None:
    result = CliRunner().invoke(cli, ["demo", "--buffers", "50000", "--json"])
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "memforensics/trim/1"
    assert document["demo"]["allocated_bytes"] == 50000 * 1024
    # Called without gdb, malloc_trim's return value is not kept; the drop is measured.
    assert document["trimmed"] and document["trim_called"]
    released = document["released_bytes"]
    assert released > 40 * MIB  # of ~50 MiB written and freed
    assert document["rss_after_bytes"] < document["rss_before_bytes"] - 40 * MIB
    # Forecast and measurement agree on this clean case (one big free run per arena).
    assert abs(released - document["forecast_bytes"]) <= 0.1 * released
    assert "allocating" in result.stderr or "child" in result.stderr  # progress on stderr


@needs_live
def test_demo_threads_spread_over_arenas_and_report_in_words() -> None:
    """The words carry this run's measured figures: RSS fell by what it says was released."""
    result = CliRunner().invoke(cli, ["demo", "--buffers", "30000", "--threads", "3"])
    assert result.exit_code == 0, result.stderr
    out = " ".join(result.stdout.split())
    story = re.search(
        r"RSS (?P<before>[\d.]+ \w?i?B) -> (?P<after>[\d.]+ \w?i?B) "
        r"\(released (?P<released>[\d.]+ \w?i?B); forecast (?P<forecast>[\d.]+ \w?i?B)\)",
        out,
    )
    assert story, out
    before, after, released, forecast = (
        parse_size(story[name]) for name in ("before", "after", "released", "forecast")
    )
    # 30,000 x 1 KiB were written and freed in 3 threads: most of it comes back.
    assert released >= 20 * MIB
    assert abs((before - after) - released) <= 0.1 * MIB + 0.001 * before  # rounding of "x.y MiB"
    assert abs(forecast - released) <= 0.25 * released
    arenas = int(out.split("malloc_info: ")[1].split(" arena")[0])
    assert arenas >= 4  # main + one per worker thread
