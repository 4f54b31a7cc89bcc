"""`memforensics watch`: usage contract, and snapshots of the live view and progress lines."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from io import StringIO
from pathlib import Path

from click.testing import CliRunner
from rich.console import Console

from memforensics.analysis.trend import compute_trend
from memforensics.cli import cli
from memforensics.model.series import Sample, SeriesEvent
from memforensics.model.watch import WatchedProcess
from memforensics.render.watch_view import progress_line, render_watch, sparkline

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
MiB = 1 << 20
T0 = datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)


def _state() -> WatchedProcess:
    """A process watched for 8 heap samples: in use grows 2 MiB a sample, then it was killed."""
    proc = WatchedProcess(pid=4242, process="leaky", started=T0)
    for i in range(8):
        when = T0 + timedelta(seconds=10 * i)
        totals = {"in_use_bytes": (40 + 2 * i) * MiB, "free_bytes": 3 * MiB}
        proc.heap.append(
            Sample(
                "heap",
                when,
                4242,
                "leaky",
                (50 + 2 * i) * MiB,
                totals=totals,
                pause_seconds=0.015,
                free_resident_bytes=(1 + i % 2) * MiB,
            )
        )
        proc.pause_seconds += 0.015
        for second in range(1, 10, 3):
            proc.rss.append(
                Sample("rss", when + timedelta(seconds=second), 4242, "leaky", (51 + 2 * i) * MiB)
            )
            proc.rss_samples += 1
    proc.gaps.append(
        SeriesEvent(
            "gap",
            T0 + timedelta(seconds=35),
            4242,
            "leaky",
            "heap sample skipped: no safe point within 10 s",
            rss_bytes=57 * MiB,
        )
    )
    proc.ended = SeriesEvent(
        "exit", T0 + timedelta(seconds=80), 4242, "leaky", "the process exited", rss_bytes=66 * MiB
    )
    proc.oom_kill = SeriesEvent(
        "oom-kill",
        T0 + timedelta(seconds=80),
        4242,
        "leaky",
        "killed by the kernel OOM killer (memcg), anon-rss 64.0 MiB",
        rss_bytes=66 * MiB,
    )
    proc.trend = compute_trend([*proc.heap, *proc.rss])
    return proc


def _check_snapshot(name: str, text: str) -> None:
    """Compare with tests/cli/snapshots/NAME; UPDATE_SNAPSHOTS=1 rewrites it."""
    path = SNAPSHOTS / name
    if os.environ.get("UPDATE_SNAPSHOTS") == "1" or not path.exists():
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


def test_live_view_snapshot() -> None:
    console = Console(file=StringIO(), width=100, color_system=None)
    console.print(render_watch([_state()], elapsed_seconds=80.0, footer="Ctrl-C stops"))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "trend so far: in-use-growing" in text
    assert "oom-kill: killed by the kernel OOM killer" in text
    _check_snapshot("watch_view.txt", text)


def test_progress_lines_snapshot() -> None:
    proc = _state()
    lines = [progress_line(s, proc) for s in [*proc.heap[-2:], proc.rss[-1]]]
    lines += [progress_line(e, proc) for e in (*proc.gaps, proc.ended, proc.oom_kill) if e]
    assert lines[2] is None  # RSS samples are too many to print one line each
    _check_snapshot("watch_progress.txt", "\n".join(line for line in lines if line) + "\n")


def test_sparkline_scales_between_min_and_max() -> None:
    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█"
    assert sparkline([5, 5, 5]) == "▁▁▁"
    assert sparkline([None, None]) == ""
    assert len(sparkline(list(range(100)), width=10)) == 10


def test_needs_a_target() -> None:
    result = CliRunner().invoke(cli, ["watch"])
    assert result.exit_code == 2
    assert "give at least one PID" in result.stderr


def test_count_and_duration_exclude_each_other() -> None:
    result = CliRunner().invoke(cli, ["watch", "1", "--count", "2", "--duration", "1m"])
    assert result.exit_code == 2


def test_bad_interval_is_a_usage_error() -> None:
    assert CliRunner().invoke(cli, ["watch", "1", "--interval", "soon"]).exit_code == 2
    assert CliRunner().invoke(cli, ["watch", "1", "--rss-interval", "0s"]).exit_code == 2


def test_no_such_process_is_exit_3(tmp_path: Path) -> None:
    pid = 4_000_000  # above pid_max's ceiling: never a process
    result = CliRunner().invoke(cli, ["watch", str(pid), "--count", "1"])
    assert result.exit_code == 3, result.output
    assert result.stderr.startswith("error:")


def test_timeout_help_says_what_a_deadline_does_in_each_command() -> None:
    """In watch a sample past the deadline is a gap in the series; elsewhere it is exit 6."""
    watch_help = " ".join(CliRunner().invoke(cli, ["watch", "--help"]).output.split())
    inspect_help = " ".join(CliRunner().invoke(cli, ["inspect", "--help"]).output.split())
    assert "Skip a heap sample (recorded as a gap" in watch_help
    assert "exit 6" not in watch_help.split("--timeout", 1)[1].split("--gdb", 1)[0]
    assert "Give up (exit 6, target left running)" in inspect_help
