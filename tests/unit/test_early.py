"""early.py: which command lines pause the collector or start a log's search before click
parses them."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from click.testing import CliRunner

from memforensics.cli import cli
from memforensics.entry import early


def test_the_collector_pauses_for_an_inspect_and_comes_back_with_the_start_up_frozen() -> None:
    gc.enable()  # whatever an earlier test left (the collector is process-wide)
    gc.collect()
    frozen_before = gc.get_freeze_count()
    try:
        early.begin(["trim", "1"])
        assert gc.isenabled()  # another command: the collector runs as always
        early.begin(["inspect", "--json", "999999999"])
        assert not gc.isenabled()  # an inspect, whose start-up is paused
        cycle: list[object] = []
        cycle.append(cycle)
        early.resume_collector()
        assert gc.isenabled()
        assert gc.get_freeze_count() > frozen_before  # the start-up's objects, cycle included
        early.resume_collector()  # twice is harmless
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.enable()


def test_the_inspect_command_leaves_the_collector_on_for_its_caller() -> None:
    """Run in-process (tests, a library caller), `inspect` must not leave the collector off,
    whatever its outcome: here a PID that does not exist."""
    gc.enable()
    try:
        result = CliRunner().invoke(cli, ["inspect", "--json", "999999999"])
        assert result.exit_code == 3, result.output
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.enable()


def test_the_oom_options_known_early_are_the_commands_own() -> None:
    from memforensics.cli.oom import command as oom_command

    values = {
        o
        for p in oom_command.params
        if p.opts[0].startswith("-") and not getattr(p, "is_flag", False)
        for o in p.opts
    }
    flags = {o for p in oom_command.params if getattr(p, "is_flag", False) for o in p.opts}
    assert values == early.OOM_VALUE_OPTIONS
    assert flags == early.OOM_FLAG_OPTIONS


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["oom", "--file", "kern.log"], "kern.log"),
        (["oom", "--json", "--file=a.log", "--file", "b.log"], "a.log"),
        (["oom", "--file", "kern.log", "--since", "-1h", "--wide"], "kern.log"),
        (["oom", "--file", "-"], None),
        (["oom", "--file", "kern.log", "--kmsg"], None),
        (["oom", "--file", "kern.log", "--directory", "j"], None),
        (["oom", "--file", "kern.log", "--boot", "-1"], None),
        (["oom", "--file"], None),
        (["oom", "--help", "--file", "kern.log"], None),
        (["oom"], None),
        (["inspect", "--file", "kern.log"], None),
        (["oom", "kern.log"], None),  # a positional: not an option oom takes
        (["oom", "--file", "kern.log", "--bogus"], None),
        (["oom", "--wide=yes", "--file", "kern.log"], None),
    ],
)
def test_only_a_certainly_understood_oom_file_line_is_recognised(
    argv: list[str], expected: str | None
) -> None:
    assert early.oom_file(argv) == expected


def test_the_early_search_finds_what_the_reader_finds(tmp_path: Path) -> None:
    from memforensics.sources.logs import logsearch
    from memforensics.sources.logs.logfile import read_text_log

    log = tmp_path / "kern.log"
    kill = (
        "Nov 23 10:00:0{n} node kernel: [  1.0] Out of memory: Killed process {n}00 (java) "
        "total-vm:100kB, anon-rss:50kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB "
        "oom_score_adj:0\n"
    )
    log.write_text("".join("noise line\n" * 50 + kill.format(n=n) for n in range(3)))
    expected = list(read_text_log(str(log)))
    logsearch.start(str(log))
    assert str(log) in logsearch._searches
    assert list(read_text_log(str(log))) == expected
    assert str(log) not in logsearch._searches
    assert sum("Killed process" in record.text for record in expected) == 3


def test_the_inspect_options_known_early_are_the_commands_own() -> None:
    """Every option early knows is inspect's, a flag or a value as click has it; the ones it
    does not know are exactly those after which the heap is not read from PID's memory."""
    from memforensics.cli.inspect import command as inspect_command

    params = [p for p in inspect_command.params if p.opts[0].startswith("-")]
    values = {o for p in params if not getattr(p, "is_flag", False) for o in p.opts}
    flags = {
        o for p in params if getattr(p, "is_flag", False) for o in (*p.opts, *p.secondary_opts)
    }
    assert values >= early.INSPECT_VALUE_OPTIONS
    assert flags >= early.INSPECT_FLAG_OPTIONS
    unknown = (values | flags) - early.INSPECT_VALUE_OPTIONS - early.INSPECT_FLAG_OPTIONS
    assert unknown == {
        "--name",
        "--gdb",
        "--accept-corrupt-heap-risk",
        "--core",
        "--exe",
        "--sysroot",
    }


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["inspect", "123"], 123),
        (["inspect", "--json", "123"], 123),
        (["inspect", "123", "--top", "5", "--sort=free", "--pins", "-v"], 123),
        (["inspect", "--timeout", "30s", "--html", "h.html", "--read-only", "77"], 77),
        (["inspect", "--top", "5"], None),  # the value is not a PID
        (["inspect", "123", "456"], None),
        (["inspect", "--gdb", "gdb", "123"], None),
        (["inspect", "--core", "core.1", "123"], None),
        (["inspect", "--name", "java"], None),
        (["inspect", "--help", "123"], None),
        (["inspect", "0"], None),
        (["inspect", "123", "--json=yes"], None),
        (["inspect", "123", "--bogus"], None),
        (["inspect", "--since", "-1h", "123"], None),  # another command's option
        (["inspect", "123", "--top"], None),
        (["inspect", "١٢٣"], None),  # digits, not ASCII ones
        (["trim", "123"], None),
        ([], None),
    ],
)
def test_only_a_certainly_understood_inspect_line_names_its_pid(
    argv: list[str], expected: int | None
) -> None:
    assert early.inspect_pid(argv) == expected
