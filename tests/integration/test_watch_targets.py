"""`watch` on real processes with real gdb, then `report`: each heap pattern gets its verdict.

The targets (tests/targets/watch_pattern.c) leak, fragment (free grows, in use flat) or idle;
`watch PID --interval 1s --count 6 --record F` then `report F --json` must say
in-use-growing, free-growing and stable. A process that exits ends its series with its last
sample kept; one the OOM killer takes (in a 64 MiB memory cgroup) has the kill beside it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from memforensics.cli import cli
from memforensics.entry.readers.gdb import inspect_process
from memforensics.entry.watching import MAX_FAILURES, Watch, WatchSettings
from memforensics.errors import DeadlineError, ToolingError
from memforensics.model.inspection import Inspection
from memforensics.model.series import SeriesEvent
from memforensics.model.watch import WatchedProcess
from memforensics.sources.files.recording import read_recording
from tests.support.oom_hog import watch_until_oom_killed
from tests.support.schema import missing_keys
from tests.support.targets import c_target, live_skip_reason

pytestmark = [pytest.mark.integration, pytest.mark.slow]

_SKIP = live_skip_reason()
if _SKIP:
    pytest.skip(_SKIP, allow_module_level=True)


def watch_and_report(pid: int, record: Path, *extra: str) -> dict[str, object]:
    watched = CliRunner().invoke(
        cli,
        ["watch", str(pid), "--interval", "1s", "--count", "6", "--record", str(record), *extra],
    )
    assert watched.exit_code == 0, watched.output
    reported = CliRunner().invoke(cli, ["report", str(record), "--json"])
    assert reported.exit_code == 0, reported.output
    document: dict[str, object] = json.loads(reported.stdout)
    return document


@pytest.mark.parametrize(
    ("mode", "verdict"),
    [("leak", "in-use-growing"), ("fragment", "free-growing"), ("idle", "stable")],
)
def test_each_heap_pattern_gets_its_verdict(tmp_path: Path, mode: str, verdict: str) -> None:
    record = tmp_path / f"{mode}.jsonl"
    with c_target("watch_pattern", mode, "500", "60") as target:
        document = watch_and_report(target.pid, record)
        assert target.alive() and target.state() != "T", "the target must be left running"
    trend = document["trend"]
    assert isinstance(trend, dict)
    assert trend["verdict"] == verdict, trend["evidence"]
    assert missing_keys(document, "memforensics/report/1#one-process") == []
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    heap_lines = [line for line in lines if line["kind"] == "heap"]
    assert len(heap_lines) == 6
    for line in lines:
        assert missing_keys(line, "memforensics/sample/1") == []
    for line in heap_lines:
        assert missing_keys(line, "memforensics/sample/1#heap") == []
        assert 0 < line["pause_seconds"] < 5
    assert any(line["kind"] == "rss" for line in lines)
    if mode == "leak":
        assert isinstance(trend["in_use_bytes_per_hour"], int)
        assert trend["in_use_bytes_per_hour"] > 1 << 30  # 2 MiB per 0.5 s is 14 GiB/h
    if mode == "fragment":
        assert trend["in_use_growing"] is False and trend["free_growing"] is True


def test_resuming_a_recording_appends(tmp_path: Path) -> None:
    """A second watch on the same file continues it: one series, twice the heap samples."""
    record = tmp_path / "resumed.jsonl"
    with c_target("watch_pattern", "leak", "500", "60") as target:
        for _ in range(2):
            result = CliRunner().invoke(
                cli,
                [
                    "watch",
                    str(target.pid),
                    "--interval",
                    "0.5s",
                    "--count",
                    "3",
                    "--record",
                    str(record),
                ],
            )
            assert result.exit_code == 0, result.output
    recording = read_recording(record)
    assert sum(1 for s in recording.samples if s.kind == "heap") == 6
    assert recording.torn_lines == 0


def test_a_process_that_exits_ends_its_series(tmp_path: Path) -> None:
    record = tmp_path / "exits.jsonl"
    # Ticks of 200 ms, exit after 12 ticks (~2.4 s): fewer heap samples than --count asks.
    with c_target("watch_pattern", "leak", "200", "60", "12") as target:
        result = CliRunner().invoke(
            cli,
            [
                "watch",
                str(target.pid),
                "--interval",
                "0.5s",
                "--count",
                "30",
                "--record",
                str(record),
                "--json",
            ],
        )
        target.proc.wait(timeout=10)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["marks"][-1]["kind"] == "exit"
    recording = read_recording(record)
    heap = [s for s in recording.samples if s.kind == "heap"]
    assert 1 <= len(heap) < 30
    assert recording.events[-1].kind == "exit"
    assert heap[-1].time is not None and recording.events[-1].time is not None
    assert heap[-1].time <= recording.events[-1].time
    assert "exit: the process exited" in result.stderr or "exit" in result.stderr


def test_an_oom_kill_is_shown_beside_the_last_sample(tmp_path: Path) -> None:
    """A real kernel OOM kill in a 64 MiB memory cgroup while `watch` records the victim."""
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg is not readable here: the kill cannot be looked up")
    record = tmp_path / "oom.jsonl"
    killed = watch_until_oom_killed(
        record,
        interval="0.4s",
        rss_interval="0.1s",
        duration="40s",
        grow_pause_seconds=0.05,
        first_sample_poll_seconds=0.02,
    )
    assert killed.watch_returncode == 0, killed.watch_stderr
    out = killed.watch_stdout
    recording = read_recording(record)
    kinds = [e.kind for e in recording.events]
    assert kinds[-2:] == ["exit", "oom-kill"], kinds
    kill = recording.events[-1]
    assert kill.detail["scope"] == "memcg"
    assert "oom-kill" in out
    heap = [s for s in recording.samples if s.kind == "heap"]
    assert heap and heap[-1].time is not None and kill.time is not None
    report = CliRunner().invoke(cli, ["report", str(record), "--json"])
    marks = json.loads(report.stdout)["marks"]
    # In time order: the kernel's kill comes before the watch noticed the exit.
    assert [m["kind"] for m in marks if m["kind"] in ("exit", "oom-kill")] == ["oom-kill", "exit"]


def test_ctrl_c_stops_cleanly(tmp_path: Path) -> None:
    """SIGINT after the first heap sample: exit 0, the recording whole, the target running."""
    record = tmp_path / "interrupted.jsonl"
    with c_target("watch_pattern", "idle", "500", "60") as target:
        watcher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "memforensics",
                "watch",
                str(target.pid),
                "--interval",
                "0.5s",
                "--record",
                str(record),
                "--json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 30
            while not record.exists() or record.read_text().count('"kind": "heap"') < 2:
                assert watcher.poll() is None, watcher.communicate()
                assert time.monotonic() < deadline, "no heap samples within 30 s"
                time.sleep(0.02)
            watcher.send_signal(signal.SIGINT)
            out, err = watcher.communicate(timeout=30)
        finally:
            if watcher.poll() is None:
                watcher.kill()
                watcher.wait(timeout=10)
        assert watcher.returncode == 0, err
        assert target.alive() and target.state() in ("S", "R"), "target left stopped or dead"
    document = json.loads(out)
    assert document["watch"]["interrupted"] is True
    assert document["trend"]["verdict"] in ("unknown", "stable")
    recording = read_recording(record)
    assert recording.torn_lines == 0 and len(recording.samples) >= 2


def test_a_target_busy_beyond_the_deadline_leaves_gaps(tmp_path: Path) -> None:
    """A target that never leaves the allocator: each heap sample is skipped and noted; with
    not one heap sample taken the watch exits 6 (timeout), the target left running."""
    record = tmp_path / "busy.jsonl"
    with c_target("stuck_in_malloc_stats") as target:
        result = CliRunner().invoke(
            cli,
            [
                "watch",
                str(target.pid),
                "--timeout",
                "0.5s",
                "--interval",
                "1s",
                "--duration",
                "2.5s",
                "--record",
                str(record),
            ],
        )
        # Running or asleep in its write (a seize's interrupt restarts it): never stopped.
        assert target.alive() and target.state() in ("S", "R"), "left stopped or killed"
    assert result.exit_code == 6, result.output
    assert "heap sample skipped" in result.stdout
    recording = read_recording(record)
    gaps = [e for e in recording.events if e.kind == "gap"]
    assert len(gaps) >= 2 and all("heap sample skipped" in e.message for e in gaps)
    assert not [s for s in recording.samples if s.kind == "heap"]
    assert any(s.kind == "rss" for s in recording.samples)


class Flaky:
    """The real inspect, with chosen failures first: what a gdb hiccup or another tracer
    holding the target looks like to the watch (these cannot be provoked on demand)."""

    def __init__(self, *failures: Exception | None) -> None:
        self.failures = list(failures)

    def __call__(self, pid: int, **kwargs: object) -> Inspection:
        failure = self.failures.pop(0) if self.failures else None
        if failure is not None:
            raise failure
        return inspect_process(pid, **kwargs)  # type: ignore[arg-type]


def _watch(pid: int, inspect: Flaky, count: int) -> tuple[list[WatchedProcess], list[object]]:
    records: list[object] = []
    watch = Watch(
        [pid],
        WatchSettings(interval_seconds=0.2, rss_interval_seconds=0.1, count=count),
        on_record=lambda record, _proc: records.append(record),
        inspect=inspect,
    )
    return watch.run(), records


def test_a_hiccup_after_the_first_sample_is_a_gap() -> None:
    with c_target("watch_pattern", "idle", "500", "60") as target:
        hiccup = ToolingError("gdb said something odd")
        (proc,), records = _watch(target.pid, Flaky(None, hiccup, hiccup), count=3)
    assert len(proc.heap) == 3
    assert [g.message for g in proc.gaps] == ["heap sample skipped: gdb said something odd"] * 2
    assert sum(isinstance(r, SeriesEvent) and r.kind == "gap" for r in records) == 2


def test_a_failure_on_the_first_sample_ends_the_watch() -> None:
    """A setup that does not work (gdb unusable) is reported at once, not as endless gaps."""
    with c_target("watch_pattern", "idle", "500", "60") as target, pytest.raises(ToolingError):
        _watch(target.pid, Flaky(ToolingError("gdb is broken")), count=3)


def test_five_failures_in_a_row_end_the_watch() -> None:
    failures = [ToolingError(f"failure {i}") for i in range(MAX_FAILURES)]
    with c_target("watch_pattern", "idle", "500", "60") as target:
        with pytest.raises(ToolingError, match=f"failure {MAX_FAILURES - 1}"):
            _watch(target.pid, Flaky(None, *failures), count=10)
        assert target.alive()


def test_a_deadline_is_a_gap_even_first() -> None:
    with c_target("watch_pattern", "idle", "500", "60") as target:
        (proc,), _ = _watch(target.pid, Flaky(DeadlineError("no safe point in time")), count=2)
    assert len(proc.heap) == 2 and len(proc.gaps) == 1
