"""The default `oom` table printed without rich where stdout is not a terminal: the same
characters rich would print there, at the width rich would choose.

The plain path (cli/oom.py _print_plain) exists for speed only; rich stays the reference. Its
width rule (cli/output.plain_stdout_width) is checked against rich's own Console, and its
text (render/oom.events_text) against the rich Text of events_table.
"""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console
from rich.text import Text

from memforensics.analysis.oom_select import scan
from memforensics.cli import cli
from memforensics.cli.output import plain_stdout_width
from memforensics.model.logrecord import LogRecord
from memforensics.model.oom import OomScan
from memforensics.render.oom import events_table, events_text
from memforensics.sources.logs.logfile import read_text_log

OOM = Path(__file__).resolve().parent.parent.parent / "fixtures" / "oom"
_RICH_ENVIRON = ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR", "TERM")


@pytest.fixture(autouse=True)
def _plain_environ(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in (*_RICH_ENVIRON, "JUPYTER_COLUMNS", "JUPYTER_LINES"):
        monkeypatch.delenv(name, raising=False)
    yield


def _scan_of(*names: str) -> OomScan:
    reference = datetime(2026, 1, 1, tzinfo=timezone.utc)
    streams = [(name, read_text_log(str(OOM / name), reference=reference)) for name in names]
    return scan(streams)


def _rich_width(file: io.TextIOBase) -> tuple[int, object]:
    console = Console(file=file)
    return console.width, console.color_system


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),  # rich's own answer below: a pipe's width comes from the terminals around
        ({"COLUMNS": "100"}, 100),
        ({"COLUMNS": "37", "LINES": "10"}, 37),
        ({"COLUMNS": "wide"}, None),
        ({"NO_COLOR": "1", "TERM": "dumb"}, None),
    ],
)
def test_a_pipe_gets_richs_width_and_no_styles(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], expected: int | None
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stdout", pipe)
    width, color_system = _rich_width(pipe)
    assert color_system is None
    assert plain_stdout_width() == width
    if expected is not None:
        assert width == expected


@pytest.mark.parametrize("name", ["FORCE_COLOR", "TTY_COMPATIBLE", "JUPYTER_COLUMNS"])
def test_settings_only_rich_reads_leave_the_printing_to_rich(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(name, "1")
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert plain_stdout_width() is None


def test_a_terminal_is_left_to_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    leader, follower = pty.openpty()
    try:
        with os.fdopen(follower, "w", closefd=False) as terminal:
            monkeypatch.setattr(sys, "stdout", terminal)
            assert plain_stdout_width() is None
            assert Console(file=terminal).is_terminal
    finally:
        os.close(leader)
        os.close(follower)


@pytest.mark.parametrize("width", [80, 100, 60, 30])
@pytest.mark.parametrize(
    "names",
    [
        ("handmade-k8s-cgroup-paths.log", "handmade-oom-group-v2-6.12.log"),
        ("harvester-kb-5.3-dmesg-T-kubevirt.log", "harvester-kb-5.14-kubevirt-summary-no-kill.log"),
        ("systemd-oomd.log", "handmade-earlyoom.log", "handmade-cjk-locales.log"),
        ("handmade-storm-interleaved.log",),
    ],
)
def test_the_plain_text_is_richs_text(names: tuple[str, ...], width: int) -> None:
    result = _scan_of(*names)
    table = events_table(result, width=width)
    assert isinstance(table, Text)
    assert events_text(result, width=width) == table.plain


def test_control_characters_in_a_name_are_dropped_as_rich_drops_them() -> None:
    record = LogRecord(
        "Out of memory: Killed process 4242 (ev\x07il\rname) total-vm:1000kB, "
        "anon-rss:2000kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:10kB oom_score_adj:0",
        "kern.log",
        "kernel",
        datetime(2026, 1, 1, tzinfo=timezone.utc),
    )
    result = scan([("kern.log", [record])])
    text = events_text(result, width=80)
    assert text is not None and "evilname" in text
    table = events_table(result, width=80)
    assert isinstance(table, Text)
    assert text == table.plain


def test_nothing_found_has_no_plain_text() -> None:
    assert events_text(OomScan(events=(), sources=("kern.log",)), width=80) is None


def test_the_command_prints_the_plain_text_through_a_pipe() -> None:
    """CliRunner's stdout is not a terminal: the plain path prints, and what it prints is
    rich's rendering of the same table at the same width."""
    name = "handmade-k8s-cgroup-paths.log"
    result = CliRunner().invoke(cli, ["oom", "--file", str(OOM / name)], env={"COLUMNS": "90"})
    assert result.exit_code == 0, result.output
    reference = datetime.fromtimestamp((OOM / name).stat().st_mtime, tz=timezone.utc)
    expected = io.StringIO()
    Console(file=expected, width=90, color_system=None).print(
        events_table(
            scan([(str(OOM / name), read_text_log(str(OOM / name), reference=reference))]),
            width=90,
        )
    )
    assert result.stdout == expected.getvalue()


def test_a_piped_table_loads_neither_rich_nor_the_heap_join(tmp_path: Path) -> None:
    """What `oom --file LOG | …` leaves out: rich (nothing to style), and the joining of kills
    with heap samples when there is nothing to join them with (no --recording, no state
    directory)."""
    environ = {**os.environ, "MEMFORENSICS_STATE_DIR": str(tmp_path / "no-such-state")}
    argv = [sys.executable, "-X", "importtime", "-m", "memforensics", "oom", "--file"]
    done = subprocess.run(
        [*argv, str(OOM / "handmade-k8s-cgroup-paths.log")],
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "OOM kills:" in done.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert "memforensics.render.oom" in imported  # the table was made here
    for module in ("rich", "memforensics.entry.oomjoin", "memforensics.model.series"):
        assert module not in imported, module
