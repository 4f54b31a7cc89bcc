"""malloc_info called without gdb (sources.glibc.called_malloc_info, entry.readers.call): the
default's stand-in where the read from memory is refused.

The oracle is the target's own malloc_info (heap_shapes writes it once its shape is built):
every arena but the calling thread's is equal line for line; that one differs at most by the
two small chunks the calls allocate there (the fmemopen FILE and its cookie). What the calls
leave: the target running, untraced, its maps as before; and a SIGKILL of the process making
them at any moment leaves it alive, untraced, running and answering.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from memforensics.entry.readers.call import call_malloc_info
from memforensics.errors import ReadOnlyRefusedError
from memforensics.sources.glibc.called_malloc_info import REGION_BYTES
from memforensics.sources.proc import target_check
from memforensics.sources.proc.procmaps import parse_maps
from tests.support.called_compare import assert_equal_but_the_callers_arena, heaps
from tests.support.stall_target import StallTarget
from tests.support.targets import Target, compile_target, live_skip_reason, proc_status, running

_SKIP = live_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]

CALL_TIMEOUT_SECONDS = 10.0
KILLS = 12
RELEASE_SECONDS = 6.0
INSPECT = [sys.executable, "-m", "memforensics", "inspect"]


@contextlib.contextmanager
def shape_target(shape: str, seed: int, own: Path) -> Iterator[Target]:
    binary = compile_target("heap_shapes")
    with running([str(binary), str(seed), shape, str(own)], ready_timeout_seconds=60) as target:
        yield target


def _left_running(pid: int, what: str) -> None:
    """Every thread alive, traced by nobody, not stopped (a killed tracer's detach may take
    a moment)."""
    deadline = time.monotonic() + 10
    while True:
        tasks = [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]
        states = [proc_status(pid, tid) for tid in tasks]
        if all(s["TracerPid"] == "0" and s["State"][0] not in "Tt" for s in states):
            return
        assert time.monotonic() < deadline, f"after {what}: {states}"
        time.sleep(0.01)


def _regions_left(pid: int) -> list[str]:
    """Mappings of exactly the call's region size: what a killed series may leak."""
    maps = parse_maps(Path(f"/proc/{pid}/maps").read_text())
    return [f"{m.start_address:#x}" for m in maps if m.size_bytes == REGION_BYTES]


@pytest.mark.parametrize(("shape", "seed"), [("threads", 31), ("mmapped", 19), ("nocontig", 20)])
def test_called_malloc_info_equals_the_targets_own_arena_by_arena(
    shape: str, seed: int, tmp_path: Path
) -> None:
    own = tmp_path / "own.xml"
    with shape_target(shape, seed, own) as target:
        facts = target_check.check_target(target.pid)
        maps_before = Path(f"/proc/{target.pid}/maps").read_text()
        called = call_malloc_info(target.pid, facts, CALL_TIMEOUT_SECONDS)
        _left_running(target.pid, "the calls")
        assert Path(f"/proc/{target.pid}/maps").read_text() == maps_before
        assert target.alive()
    equal = assert_equal_but_the_callers_arena(called.xml.decode(), own.read_text())
    assert equal >= len(heaps(own.read_text())) - 1
    if shape == "threads":
        assert len(heaps(own.read_text())) >= 3


_CALLER = """
import sys, time
from memforensics.entry.readers.call import call_malloc_info
from memforensics.sources.proc import target_check
pid = int(sys.argv[1])
facts = target_check.check_target(pid)
print("ready", flush=True)
while True:
    call_malloc_info(pid, facts, 10.0)
"""


def test_a_sigkill_at_any_moment_leaves_the_target_running() -> None:
    """The process making the calls (over and over) is SIGKILLed with its whole group at a
    random moment 0-50 ms into its calls, KILLS times: the target stays alive, untraced,
    running and answering; what it may keep is the documented leak (a region of the call's
    size), and a last series of calls, to the end, still works (no lock was left held)."""
    rng = random.Random(20260531)
    target = StallTarget(2000)
    try:
        for kill in range(KILLS):
            proc = subprocess.Popen(
                [sys.executable, "-c", _CALLER, str(target.pid)],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                assert proc.stdout is not None
                assert proc.stdout.readline().startswith(b"ready"), "the caller did not start"
                time.sleep(rng.uniform(0, 0.05))
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(timeout=10)
            _left_running(target.pid, f"kill {kill}")
            assert target.proc.poll() is None, f"the target died at kill {kill}"
            assert target.say("gap").startswith("gap "), f"no answer after kill {kill}"
        leaked = _regions_left(target.pid)
        print(f"{KILLS} kills: the target ran on after each; regions leaked: {len(leaked)}")
        assert len(leaked) <= KILLS
        facts = target_check.check_target(target.pid)
        called = call_malloc_info(target.pid, facts, CALL_TIMEOUT_SECONDS)
        assert called.xml.startswith(b'<malloc version="1">')
        assert called.xml.rstrip().endswith(b"</malloc>")
        assert len(_regions_left(target.pid)) == len(leaked)
        _left_running(target.pid, "the last calls")
        assert target.say("gap").startswith("gap ")
    finally:
        target.close()


def test_the_default_stands_in_with_the_call_where_the_read_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`inspect` (the default) on a target whose read from memory is refused (made to refuse
    here): the call stands in, never gdb; the JSON says which way and why, stderr notes it."""
    from memforensics.cli import cli
    from memforensics.entry.readers import gdb, memory

    def refused(pid: int, **_: object) -> None:
        raise ReadOnlyRefusedError("made to refuse by the test", pid=pid)

    def no_gdb(*_: object, **__: object) -> None:
        raise AssertionError("gdb's way was taken")

    monkeypatch.setattr(memory, "inspect_read_only", refused)
    monkeypatch.setattr(gdb, "inspect_process", no_gdb)
    own, saved = tmp_path / "own.xml", tmp_path / "saved.xml"
    with shape_target("threads", 31, own) as target:
        result = CliRunner().invoke(
            cli, ["inspect", "--json", "--save-xml", str(saved), str(target.pid)]
        )
        _left_running(target.pid, "inspect")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["fallback"] == {"way": "call", "reason": "made to refuse by the test"}
    assert document["read_only"] is None
    assert "called without gdb" in document["safe_point"]
    assert "gdb" not in document["pins_error"]
    assert "by calling its malloc_info (without gdb)" in result.stderr
    assert document["totals"]["arenas"] == len(heaps(own.read_text()))
    assert len(heaps(saved.read_text())) == len(heaps(own.read_text()))


def test_a_read_that_only_ran_out_of_time_gets_no_call(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`inspect` (the default) whose read from memory runs out of its own time (given none
    here) before it reaches every arena: that read was only slow, not impossible, so no call
    stands in for it and no gdb runs; exit 6, one line naming the read's time and the arenas
    not read, the hint to give it more with --timeout; the target left running, untraced,
    with no region of the call's left in it."""
    from memforensics.cli import cli
    from memforensics.entry.readers import call, gdb, memory
    from memforensics.sources.glibc import heapmaps

    def no_other_way(*_: object, **__: object) -> None:
        raise AssertionError("another way stood in for a read that only ran out of time")

    monkeypatch.setattr(memory, "read_budget_seconds", lambda timeout_seconds: 0.0)
    monkeypatch.setattr(heapmaps, "_HELD_SECONDS_PER_ARENA", 0.0)
    monkeypatch.setattr(heapmaps, "_HELD_SECONDS_PER_GIB", 0.0)
    monkeypatch.setattr(call, "inspect_by_call", no_other_way)
    monkeypatch.setattr(gdb, "inspect_process", no_other_way)
    with shape_target("threads", 31, tmp_path / "own.xml") as target:
        result = CliRunner().invoke(cli, ["inspect", str(target.pid)])
        _left_running(target.pid, "inspect")
        assert _regions_left(target.pid) == []
    assert result.exit_code == 6, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2, result.stderr  # the error, and its hint
    assert "the read's time (0.0 s) ran out before arena" in lines[0]
    assert "nothing was called into the target" in lines[1]
    assert "--timeout" in lines[1]
    assert result.stdout == ""


@pytest.mark.slow
def test_a_refused_read_falls_back_to_the_call_once_the_arena_is_unlocked() -> None:
    """The main arena locked at every stop of the read (a thread inside malloc_stats): plain
    `inspect` says the read was refused and why, and calls malloc_info without gdb once the
    lock is free (released here after RELEASE_SECONDS, well after the read's retries, about
    1.4 s, gave up); the report is the call's, the target left running, untraced, unleaked."""
    staller = StallTarget(20000)
    try:
        assert staller.say("stall") == "stalling"
        time.sleep(0.1)
        proc = subprocess.Popen(
            [*INSPECT, "--json", "--timeout", "60s", str(staller.pid)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            time.sleep(RELEASE_SECONDS)
            assert proc.poll() is None, proc.communicate()
            assert _regions_left(staller.pid) == []  # no call yet: the arena is locked
            staller.drain_stderr()  # malloc_stats returns: the lock is free for malloc_info
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err
        document = json.loads(out)
        assert document["fallback"]["way"] == "call"
        assert "locked at every stop" in document["fallback"]["reason"]
        assert document["read_only"] is None
        assert "called without gdb" in document["safe_point"]
        assert f"note: PID {staller.pid} was inspected by calling its malloc_info" in err
        assert document["totals"]["arenas"] >= 1
        _left_running(staller.pid, "inspect")
        assert _regions_left(staller.pid) == []
        assert staller.say("gap").startswith("gap ")
    finally:
        staller.close()


@pytest.mark.slow
def test_a_refused_read_whose_arena_stays_locked_gets_no_call() -> None:
    """The main arena locked at every stop (a thread inside malloc_stats): the read is
    refused, and the call that stands in finds no moment with every arena unlocked, so it
    makes none and exits 6 at its deadline; the target is left running, and carries on."""
    staller = StallTarget(20000)
    try:
        assert staller.say("stall") == "stalling"
        time.sleep(0.1)
        done = subprocess.run(
            [*INSPECT, "--timeout", "3s", str(staller.pid)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 6, done.stderr
        assert "no moment with every arena unlocked" in done.stderr
        assert "nothing was called" in done.stderr
        _left_running(staller.pid, "inspect")
        assert _regions_left(staller.pid) == []
        staller.drain_stderr()
        assert staller.say("gap").startswith("gap ")
    finally:
        staller.close()
