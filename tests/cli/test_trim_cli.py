"""`memforensics trim` and `memforensics demo` through click: every exit code path and --help."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from memforensics.cli import cli
from tests.support.targets import needs_live, python_target, running

# A glibc Python process with a fragmented heap of ~8 MiB, idle in sleep (a safe point).
FRAGMENTED_PY = """
import ctypes, sys, time
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
blocks = [libc.malloc(1024) for _ in range(8000)]
for b in blocks:
    ctypes.memset(b, 1, 1024)
for b in blocks[:-1]:
    libc.free(b)
print("ready", flush=True)
time.sleep(120)
"""


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def dead_pid() -> int:
    """A PID that existed and is gone (reaped), so nothing can have it right now."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("name", ["trim", "demo"])
def test_help_lists_options_and_exit_codes(name: str) -> None:
    code, out, _ = run(name, "--help")
    assert code == 0
    assert "Exit codes:" in out and "6  timeout" in out
    for option in (
        ("--pad", "--dry-run", "--min-free", "--interval", "--count", "--json", "--timeout")
        if name == "trim"
        else ("--buffers", "--size", "--threads", "--json")
    ):
        assert option in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "at least one PID"),
        (("1", "--count", "3"), "--count needs --interval"),
        (("1", "--pad", "lots"), "not a size"),
        (("1", "--interval", "0s"), "longer than zero"),
        (("1", "--min-free", "-5"), "not a size"),
        (("0",), "0"),
    ],
)
def test_trim_usage_errors_exit_2(args: tuple[str, ...], message: str) -> None:
    code, _, err = run("trim", *args)
    assert code == 2
    assert message in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--size", "huge"), "not a size"),
        (("--threads", "0"), "--threads"),
        (("--buffers", "1000000000", "--size", "1TiB"), "more than half"),
    ],
)
def test_demo_usage_errors_exit_2(args: tuple[str, ...], message: str) -> None:
    code, _, err = run("demo", *args)
    assert code == 2
    assert message in err


def test_trim_no_such_process_exits_3_with_hint() -> None:
    code, out, err = run("trim", str(dead_pid()))
    assert code == 3
    assert out == ""
    assert err.startswith("error: ") and "hint: " in err
    assert "Traceback" not in err


def test_trim_unknown_name_exits_3() -> None:
    code, _, err = run("trim", "--name", "no-such-process-name-xyzzy-42")
    assert code == 3
    assert "no process matches" in err


def test_trim_zombie_exits_3() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            pass  # not reaped yet: a zombie until wait()
        code, _, err = run("trim", str(proc.pid))
        assert code == 3
        assert "zombie" in err
    finally:
        proc.wait()


@needs_live
def test_trim_gdb_missing_exits_5_and_target_untouched() -> None:
    with python_target(FRAGMENTED_PY) as target:
        code, _, err = run("trim", "--gdb", "/nonexistent/gdb", str(target.pid))
        assert code == 5
        assert "error: " in err and "gdb" in err
        assert target.alive() and target.state() in ("S", "R")  # running, not left stopped


@needs_live
def test_trim_json_success_exit_0() -> None:
    with python_target(FRAGMENTED_PY) as target:
        code, out, err = run("trim", "--json", str(target.pid))
        assert code == 0, err
        document = json.loads(out)
        assert document["schema"] == "memforensics/trim/1"
        assert document["pid"] == target.pid
        assert document["trimmed"] and document["trim_called"]  # no gdb: no return value
        assert document["released_bytes"] == (
            document["rss_before_bytes"] - document["rss_after_bytes"]
        )
        assert document["released_bytes"] > 4 * 1024 * 1024
        assert document["pause_seconds"] > 0


@needs_live
def test_trim_several_targets_worst_exit_code_and_one_result_each() -> None:
    gone = dead_pid()
    with python_target(FRAGMENTED_PY) as target:
        code, out, err = run("trim", "--json", "--dry-run", str(target.pid), str(gone))
        assert code == 3
        document = json.loads(out)
        results = {r["pid"]: r for r in document["results"]}
        assert results[target.pid]["error"] is None
        assert results[target.pid]["forecast_bytes"] > 4 * 1024 * 1024
        assert results[gone]["error"]["exit_code"] == 3
        assert f"PID {gone}" in err


@needs_live
def test_trim_human_report() -> None:
    with python_target(FRAGMENTED_PY) as target:
        code, out, _ = run("trim", str(target.pid))
        assert code == 0
        for word in ("before", "after", "released", "forecast", "malloc_trim(0) called (no gdb)"):
            assert word in out


@needs_live
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a target as another user")
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) missing")
def test_trim_other_users_process_exits_4() -> None:
    # The target runs as nobody; memforensics runs as root but without CAP_SYS_PTRACE (dropped
    # from the bounding set), so the kernel refuses to let it or its gdb trace another user.
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    with running([*as_nobody, sys.executable, "-c", FRAGMENTED_PY]) as target:
        proc = subprocess.run(
            ["setpriv", "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace",
             sys.executable, "-m", "memforensics", "trim", str(target.pid)],
            check=False, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 4, proc.stderr
        assert proc.stderr.startswith("error: ") and "hint: " in proc.stderr
        assert "Traceback" not in proc.stderr
        assert target.alive() and target.state() in ("S", "R")  # running, not left stopped


@needs_live
def test_trim_timeout_exits_6_and_target_left_running() -> None:
    # A 1 ms deadline cannot even cover gdb's attach: the session gives up and detaches.
    # (Without gdb, a trim can fit in 1 ms; its timeout: test_read_only's locked arena.)
    with python_target(FRAGMENTED_PY) as target:
        code, out, err = run("trim", "--gdb", "gdb", "--timeout", "1ms", str(target.pid))
        assert code == 6
        assert out == ""
        # What the message says of the target is what was checked after gdb let go.
        assert "hint: " in err and "checked after the call" in err and "traced by nothing" in err
        assert target.alive() and target.state() in ("S", "R")
        assert Path(f"/proc/{target.pid}/status").read_text().count("TracerPid:\t0\n") == 1


@needs_live
def test_demo_timeout_exits_6_and_child_stopped() -> None:
    # gdb's path: its attach and safe point cannot fit in 1 ms (the memory read and the no-gdb
    # call can, on 2,000 chunks).
    code, _, err = run("demo", "--buffers", "2000", "--timeout", "1ms", "--gdb", "gdb")
    assert code == 6
    assert "error: " in err
    assert not _demo_children()


@needs_live
def test_demo_gdb_missing_exits_5_and_child_stopped() -> None:
    code, _, err = run("demo", "--buffers", "2000", "--gdb", "/nonexistent/gdb")
    assert code == 5
    assert "gdb" in err
    assert not _demo_children()


def test_demo_child_failing_exits_3() -> None:
    # The child cannot get its memory (address-space limit inherited from us): a target problem.
    limit = "import resource; resource.setrlimit(resource.RLIMIT_AS, (600 << 20, 600 << 20))"
    code = f"{limit}; from memforensics.cli import main; main()"
    proc = subprocess.run(
        [sys.executable, "-c", code, "demo", "--buffers", "1", "--size", "1GiB"],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if "more than half" in proc.stderr:
        pytest.skip("less than 2 GiB of RAM available for the size check to pass")
    assert proc.returncode == 3, proc.stderr
    assert "demo child exited before it was ready" in proc.stderr
    assert "malloc(" in proc.stderr


def _demo_children() -> list[int]:
    """Demo children still alive whose parent is this test process."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if b"memforensics.entry.demo_target" in cmdline and ppid == os.getpid():
            found.append(int(entry.name))
    return found
