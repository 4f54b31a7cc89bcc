"""`memforensics inspect` as a user runs it, against real processes: report, JSON, --save-xml,
and memforensics itself interrupted (Ctrl-C, SIGTERM) or SIGKILLed in the middle of a session."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from memforensics.sources.malloc_info.malloc_xml import parse_dump
from tests.support.schema import missing_keys
from tests.support.targets import (
    Target,
    c_target,
    compile_target,
    live_skip_reason,
    running,
)

_SKIP = live_skip_reason()
pytestmark = [pytest.mark.integration, pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")]

MEMFORENSICS = [sys.executable, "-m", "memforensics"]


def _status(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def _wait_for(condition: object, timeout_seconds: float, what: str) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def _untraced_and_not_stopped(pid: int) -> bool:
    status = _status(pid)
    return status["TracerPid"] == "0" and status["State"][0] not in ("T", "t")


def _process_gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


@contextlib.contextmanager
def _memforensics(
    *args: str, stderr: int | None = subprocess.PIPE
) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [*MEMFORENSICS, *args], stdout=subprocess.PIPE, stderr=stderr, start_new_session=True
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_report_json_and_saved_xml(tmp_path: Path) -> None:
    with c_target("idle_arenas", "6", "1500") as target:
        human = subprocess.run(  # noqa: PLW1510 (the exit code is asserted)
            [*MEMFORENSICS, "inspect", str(target.pid)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert human.returncode == 0, human.stderr
        assert f"PID {target.pid}" in human.stdout
        assert "paused" in human.stdout and "safe point:" in human.stdout
        assert human.stderr == ""
        saved = tmp_path / "dump.xml"
        machine = subprocess.run(  # noqa: PLW1510
            [*MEMFORENSICS, "inspect", "--json", "--save-xml", str(saved), str(target.pid)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert machine.returncode == 0, machine.stderr
        document = json.loads(machine.stdout)
        assert document["schema"] == "memforensics/heap/1"
        assert missing_keys(document, "memforensics/heap/1") == []
        assert missing_keys(document, "memforensics/heap/1#inspect") == []
        assert document["process"]["pid"] == target.pid
        assert document["process"]["rss_bytes"] > 0
        assert 0 < document["pause_seconds"] < 5
        assert document["totals"]["arenas"] == 7
        assert document["waterfall"] is not None
        dump = parse_dump(saved.read_bytes(), name="saved")
        assert len(dump.arenas) == 7
        assert not list(tmp_path.glob(".*.tmp"))  # the atomic write left no temporary file
        assert _untraced_and_not_stopped(target.pid)


# Counts the opens of /proc/PID/<file> made by one default `inspect PID` (an audit hook, in a
# process of its own: a hook cannot be removed from the test's).
_COUNT_PROC_OPENS = """
import collections, json, sys
from memforensics.__main__ import main
prefix = f"/proc/{sys.argv[1]}/"
opened = collections.Counter()
def hook(event, args):
    if event == "open" and isinstance(args[0], str) and args[0].startswith(prefix):
        opened[args[0][len(prefix):].split("/")[0]] += 1
sys.addaudithook(hook)
sys.argv = ["memforensics", "inspect", "--json", sys.argv[1]]
try:
    main()
finally:
    print(json.dumps(opened), file=sys.stderr)
"""


def test_the_default_inspect_reads_each_fact_of_its_target_once() -> None:
    """The facts about a process are read once and handed down: status once for the check
    and once for the memory figures and the report's closing facts together; stat, comm and
    cmdline once; maps once to find the allocator and once for libc's ELF mapping; exe opened
    once for a linked-in allocator and once for its ELF class (the heap read takes the
    class from the check)."""
    with c_target("idle_arenas", "2", "100") as target:
        result = subprocess.run(  # noqa: PLW1510
            [sys.executable, "-c", _COUNT_PROC_OPENS, str(target.pid)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["process"]["pid"] == target.pid
    opened = json.loads(result.stderr.strip().splitlines()[-1])
    facts = {name: opened.get(name, 0) for name in ("status", "stat", "comm", "cmdline")}
    assert facts == {"status": 2, "stat": 1, "comm": 1, "cmdline": 1}, opened
    assert (opened.get("maps"), opened.get("exe")) == (2, 2), opened


def test_several_targets_one_report_each_and_the_worst_exit_code() -> None:
    with (
        c_target("idle_arenas", "2", "100") as first,
        c_target("idle_arenas", "3", "100") as second,
    ):
        result = subprocess.run(  # noqa: PLW1510
            [*MEMFORENSICS, "inspect", "--json", str(first.pid), str(second.pid), "4194000"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 3, result.stderr
        documents = json.loads(result.stdout)
        assert [d["process"]["pid"] for d in documents] == [first.pid, second.pid]
        assert "error: PID 4194000" in result.stderr


def test_name_selects_targets() -> None:
    blocks = str(100 + os.getpid() % 1000)  # an argument no other process has
    with c_target("idle_arenas", "2", blocks) as target:
        binary = Path(str(target.proc.args[0])).name  # type: ignore[index]
        result = subprocess.run(  # noqa: PLW1510
            [*MEMFORENSICS, "inspect", "--json", "--name", f"{binary} 2 {blocks}$"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        # --name always gives an array (docs/json.md), here of the one match.
        assert [d["process"]["pid"] for d in json.loads(result.stdout)] == [target.pid]


def _attached_by_gdb(target: Target) -> int:
    """Wait until gdb traces the target; return gdb's PID. (memforensics itself may hold the
    target a moment first: `--gdb` reads the heap from memory before any call, to refuse a
    corrupt one; its tracer is not gdb.)"""
    tracer: list[int] = []

    def traced() -> bool:
        value = int(_status(target.pid)["TracerPid"])
        try:
            by_gdb = value != 0 and Path(f"/proc/{value}/comm").read_text().strip() == "gdb"
        except OSError:
            by_gdb = False
        if by_gdb:
            tracer.append(value)
        return by_gdb

    _wait_for(traced, 20, "gdb to attach")
    return tracer[-1]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_while_waiting_for_a_safe_point_detaches(signum: int) -> None:
    binary = compile_target("stuck_in_malloc_stats")
    with (
        running([str(binary)]) as target,
        _memforensics("inspect", "--gdb", "gdb", "--timeout", "60s", str(target.pid)) as tool,
    ):
        gdb_pid = _attached_by_gdb(target)
        time.sleep(0.2)  # now running forward, waiting for a malloc/free entry
        tool.send_signal(signum)
        _, stderr = tool.communicate(timeout=20)
        assert tool.returncode == 128 + signum, stderr
        assert b"interrupted" in stderr
        assert b"Traceback" not in stderr
        assert _untraced_and_not_stopped(target.pid)
        # After a clean detach gdb exits on its own, reaped in the background, not waited for
        # (reaper.py): it may still be exiting when memforensics has.
        _wait_for(lambda: _process_gone(gdb_pid), 5, "gdb to exit after its clean detach")
        assert _status(target.pid)["State"][0] == "S"  # still blocked in malloc_stats' write


def test_sigkilled_while_running_forward_leaves_target_untraced() -> None:
    binary = compile_target("stuck_in_malloc_stats")
    with (
        running([str(binary)]) as target,
        _memforensics("inspect", "--gdb", "gdb", "--timeout", "60s", str(target.pid)) as tool,
    ):
        gdb_pid = _attached_by_gdb(target)
        time.sleep(0.2)
        tool.kill()
        tool.wait(timeout=10)
        _wait_for(lambda: _process_gone(gdb_pid), 10, "the watchdog to end gdb")
        _wait_for(lambda: _untraced_and_not_stopped(target.pid), 10, "the target to be released")


def _read_until_attached(read_end: int) -> None:
    """Follow memforensics' -v log until gdb has answered the attach, then stop reading."""
    attach_token: str | None = None
    pending = b""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        chunk = os.read(read_end, 4096)
        assert chunk, "memforensics ended before attaching"
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            text = line.decode(errors="replace")
            match = re.match(r"gdb -> (\d+)-target-attach", text)
            if match:
                attach_token = match.group(1)
            if attach_token and text.startswith(f"gdb <- {attach_token}^done"):
                return
    raise AssertionError("no attach in memforensics' log")


def _frozen_while_gdb_holds(target: Target) -> subprocess.Popen[bytes]:
    """Start `inspect` and SIGSTOP it at a moment when gdb holds a thread of the target
    stopped (state t); retries with a fresh inspect if one finishes before being caught."""
    for _ in range(20):
        proc = subprocess.Popen(
            [*MEMFORENSICS, "inspect", "--gdb", "gdb", str(target.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        while proc.poll() is None:
            status = _status(target.pid)
            if status["TracerPid"] != "0" and status["State"][0] == "t":
                os.kill(proc.pid, signal.SIGSTOP)
                time.sleep(0.05)  # gdb's own short stops (a signal passed on) end by themselves
                status = _status(target.pid)
                if status["TracerPid"] != "0" and status["State"][0] == "t":
                    return proc
                os.kill(proc.pid, signal.SIGCONT)
        proc.wait()
    raise AssertionError("never caught gdb holding the target")


def test_sigkilled_while_target_is_stopped_leaves_it_running() -> None:
    """memforensics is frozen while gdb holds the target's thread stopped, then SIGKILLed:
    the watchdog must end gdb and the target must end up running."""
    with c_target("busy_heap", "0") as target:
        tool = _frozen_while_gdb_holds(target)
        try:
            gdb_pid = int(_status(target.pid)["TracerPid"])
            time.sleep(0.3)
            assert _status(target.pid)["State"][0] == "t"  # still held: memforensics is frozen
            tool.kill()
            tool.wait(timeout=10)
            _wait_for(lambda: _process_gone(gdb_pid), 10, "the watchdog to end gdb")
            _wait_for(lambda: _untraced_and_not_stopped(target.pid), 10, "target running")
        finally:
            if tool.poll() is None:
                tool.kill()
            tool.wait(timeout=10)
        # It keeps running: new heartbeats keep coming and no corruption was reported.
        assert target.proc.stdout is not None
        os.set_blocking(target.proc.stdout.fileno(), False)
        before = (target.proc.stdout.read() or b"").decode()
        time.sleep(0.3)
        after = (target.proc.stdout.read() or b"").decode()
        assert "beat" in after
        assert "corrupt" not in before + after
        assert target.alive()


def _killed_after_attach(target: Target, *, delay_seconds: float) -> threading.Thread:
    """SIGKILL the target ``delay_seconds`` after gdb attached to it, and reap it at once
    (as a service's parent would: no zombie lingers for the tool to find)."""

    def kill() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if _status(target.pid)["TracerPid"] != "0":
                    break
            time.sleep(0.0005)
        time.sleep(delay_seconds)
        with contextlib.suppress(ProcessLookupError):
            os.kill(target.pid, signal.SIGKILL)
        target.proc.wait(timeout=10)

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    return killer


@pytest.mark.slow
@pytest.mark.parametrize("delay_seconds", [0.0, 0.005, 0.02, 0.05, 0.1, 0.2])
@pytest.mark.parametrize("path", [(), ("--gdb", "gdb")], ids=["memory", "gdb"])
def test_target_exiting_at_any_moment_is_exit_3_never_a_tooling_error(
    delay_seconds: float, path: tuple[str, ...]
) -> None:
    """Issue 10 item 5: the race is the target's. Exit 3 naming the PID, never exit 5."""
    with c_target("idle_arenas", "4", "3000") as target:
        killer = _killed_after_attach(target, delay_seconds=delay_seconds)
        result = subprocess.run(  # noqa: PLW1510
            [*MEMFORENSICS, "inspect", *path, str(target.pid)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        killer.join(timeout=30)
        assert "install gdb" not in result.stderr
        if result.returncode == 0:
            assert delay_seconds > 0  # the inspect finished before the kill landed
            return
        assert result.returncode == 3, result.stderr
        assert f"PID {target.pid} exited while being inspected" in result.stderr, result.stderr


def test_name_match_that_exits_mid_run_is_skipped_and_the_others_reported() -> None:
    blocks = str(100 + (os.getpid() + 7) % 1000)
    with (
        c_target("idle_arenas", "2", blocks) as first,
        c_target("idle_arenas", "2", blocks) as second,
    ):
        binary = Path(str(first.proc.args[0])).name  # type: ignore[index]
        killer = _killed_after_attach(first, delay_seconds=0.0)
        result = subprocess.run(  # noqa: PLW1510
            [*MEMFORENSICS, "inspect", "--json", "--name", f"{binary} 2 {blocks}$"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        killer.join(timeout=30)
        assert result.returncode == 0, result.stderr
        assert f"note: PID {first.pid} (matched by --name) exited; skipped" in result.stderr
        documents = json.loads(result.stdout)
        documents = documents if isinstance(documents, list) else [documents]
        assert [d["process"]["pid"] for d in documents] == [second.pid]
        # An explicit PID that exits is the caller's business: exit 3.
        gone = subprocess.run(  # noqa: PLW1510
            [*MEMFORENSICS, "inspect", str(first.pid)], capture_output=True, text=True, timeout=60
        )
        assert gone.returncode == 3


@pytest.mark.skipif(os.geteuid() != 0, reason="reading /proc/PID/map_files needs root")
def test_libc_replaced_on_disk_is_read_from_the_mapping(tmp_path: Path) -> None:
    """Issue 10 item 4: every libc6 update leaves running services mapping a deleted libc."""
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6")
    loader = Path("/lib64/ld-linux-x86-64.so.2")
    if not libc.exists() or not loader.exists():
        pytest.skip("not an x86-64 Debian-style glibc layout")
    private = tmp_path / "lib"
    private.mkdir()
    shutil.copy(libc, private / "libc.so.6")
    binary = compile_target("idle_arenas")
    argv = [str(loader), "--library-path", str(private), str(binary), "4", "1500"]
    with running(argv) as target:
        # The "upgrade": the mapped file is deleted and something else takes its name.
        (private / "libc.so.6").unlink()
        shutil.copy("/bin/true", private / "libc.so.6")
        maps = Path(f"/proc/{target.pid}/maps").read_text()
        assert f"{private}/libc.so.6 (deleted)" in maps
        result = subprocess.run(  # noqa: PLW1510
            [*MEMFORENSICS, "inspect", "--json", str(target.pid)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        document = json.loads(result.stdout)
        assert document["totals"]["arenas"] == 5
        assert _untraced_and_not_stopped(target.pid)
