"""`inspect --read-only` against malloc_info itself, on glibc 2.31, 2.36 and 2.41.

The oracle is the target's own malloc_info(0): tests/targets/heap_shapes.c writes it through
a FILE opened before its first allocation, with a static buffer, so writing it allocates
nothing and the heap after it is the heap it describes. The read-only document (no gdb, no
call, the target's memory read in short ptrace stops) must equal it byte for byte, on every
shape of the generator and on each glibc release's tree, run through its own loader
(tests/support/glibc_releases.py). gdb's malloc_info of the same target differs only where
gdb's own call allocated (its caller's arena); every other arena must be equal line for line.
A target stopped by SIGSTOP is read as it stands, and left stopped. A locked arena is read
again after the target ran, and never read while its lock is held.
"""

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
from typing import Any

import pytest

from tests.support.glibc_releases import build_target, command
from tests.support.stall_target import StallTarget
from tests.support.targets import (
    Target,
    assert_integrity_intact,
    compile_target,
    live_skip_reason,
    proc_status,
    running,
)

_SKIP = live_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]

MEMFORENSICS = [sys.executable, "-m", "memforensics"]
CLI_TIMEOUT_SECONDS = 120
# Every idle shape of the generator, each with a seed of its own (the random shape with three).
SHAPES = (
    ("fast", 11),
    ("small", 12),
    ("large", 13),
    ("unsorted", 14),
    ("mixed", 15),
    ("threads", 16),
    ("bigmain", 17),
    ("subheaps", 18),
    ("mmapped", 19),
    ("nocontig", 20),
    ("random", 21),
    ("random", 22),
    ("random", 23),
)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MEMFORENSICS, *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_SECONDS,
        env=env,
        check=False,
    )


def assert_running(target: Target, what: str) -> None:
    """Alive, traced by nobody, not stopped: what a read leaves behind."""
    assert target.alive(), f"the target died after {what}"
    fields = proc_status(target.pid)
    assert fields["TracerPid"] == "0", f"still traced after {what}: {fields['TracerPid']}"
    assert fields["State"][0] not in "Tt", f"left stopped after {what}: {fields['State']}"


def read_only(pid: int, xml: Path, *extra: str) -> dict[str, Any]:
    """`inspect --read-only --json --save-xml XML PID`: its document, having exited 0."""
    done = run_cli("inspect", "--read-only", "--json", "--save-xml", str(xml), *extra, str(pid))
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


@contextlib.contextmanager
def shape_target(argv: list[str]) -> Iterator[Target]:
    with running(argv, ready_timeout_seconds=60) as target:
        yield target


@pytest.mark.slow
@pytest.mark.parametrize(("shape", "seed"), SHAPES, ids=[f"{s}-{n}" for s, n in SHAPES])
def test_read_only_equals_the_targets_own_malloc_info(
    release: Any, shape: str, seed: int, tmp_path: Path
) -> None:
    binary = build_target(release, "heap_shapes")
    own = tmp_path / "own.xml"
    rebuilt = tmp_path / "read-only.xml"
    with shape_target(command(release, binary, [str(seed), shape, str(own)])) as target:
        document = read_only(target.pid, rebuilt)
        assert_running(target, "inspect --read-only")
    assert rebuilt.read_bytes() == own.read_bytes()
    read = document["read_only"]
    assert read["source"] == "live" and read["stops"] >= 1
    assert read["glibc_version"] == release.version
    # The layout was decided from memory: mp_'s shape changed in 2.35.
    expected_layout = "2.35" if tuple(map(int, release.version.split("."))) >= (2, 35) else "2.26"
    assert read["malloc_par_layout"] == expected_layout
    # The residency is the same read's: every arena's free bytes balanced against the dump.
    assert document["residency"] is not None
    assert all(arena["balanced"] for arena in document["residency"]["arenas"])


def _heaps(xml: str) -> list[str]:
    return re.findall(r'<heap nr="\d+">.*?</heap>', xml, flags=re.DOTALL)


def _system_lines(heap: str) -> list[str]:
    return [line for line in heap.splitlines() if "<system" in line or "<aspace" in line]


def _equal_but_the_callers_arena(
    mine: list[str], gdbs: list[str], moving: frozenset[int] = frozenset()
) -> int:
    """Every arena equal line for line, but at most one (the arena of the thread gdb made
    its call in, whose bins the call's own allocations changed) besides the ``moving`` ones
    (changed by the target itself meanwhile), and that one's system and aspace figures
    equal. Returns how many arenas were compared equal."""
    assert len(mine) == len(gdbs)
    differ = [
        index
        for index, (a, b) in enumerate(zip(mine, gdbs, strict=True))
        if a != b and index not in moving
    ]
    assert len(differ) <= 1, differ
    for index in differ:
        assert _system_lines(mine[index]) == _system_lines(gdbs[index])
    return len(mine) - len(differ) - len(moving)


@pytest.mark.slow
def test_read_only_equals_gdbs_malloc_info_where_gdbs_call_allocated_nothing(
    tmp_path: Path,
) -> None:
    """gdb's malloc_info call allocates (its memory stream) in the caller's arena: that
    arena's bins differ from the target's own dump, its system figures do not; every other
    arena is equal line for line to gdb's, and all of them to the target's own."""
    binary = compile_target("heap_shapes")
    own, rebuilt, by_gdb = tmp_path / "own.xml", tmp_path / "ro.xml", tmp_path / "gdb.xml"
    with shape_target([str(binary), "31", "threads", str(own)]) as target:
        read_only(target.pid, rebuilt)
        done = run_cli(
            "inspect", "--gdb", "gdb", "--json", "--save-xml", str(by_gdb), str(target.pid)
        )
        assert done.returncode == 0, done.stderr
        assert_running(target, "inspect")
    assert rebuilt.read_bytes() == own.read_bytes()
    mine, gdbs = _heaps(rebuilt.read_text()), _heaps(by_gdb.read_text())
    assert len(mine) == len(gdbs) >= 3
    _equal_but_the_callers_arena(mine, gdbs)


@pytest.mark.slow
def test_a_stopped_busy_target_is_read_as_it_stands_and_left_stopped(tmp_path: Path) -> None:
    """The busy shape churns its main arena forever; stopped by SIGSTOP, the read-only
    document is the same twice in a row, and agrees with gdb's (--allow-stopped) on every
    thread arena but the one gdb's call allocated in; the target stays stopped."""
    binary = compile_target("heap_shapes")
    first, second, by_gdb = tmp_path / "1.xml", tmp_path / "2.xml", tmp_path / "gdb.xml"
    with shape_target([str(binary), "32", "busy", "-"]) as target:
        time.sleep(0.2)
        try:
            # Stopped in the middle of a malloc, its arena stays locked (exit 3, saying so):
            # stop it again at another moment until it stopped between two.
            for attempt in range(50):
                os.kill(target.pid, signal.SIGSTOP)
                deadline = time.monotonic() + 5
                while proc_status(target.pid)["State"][0] != "T" and time.monotonic() < deadline:
                    time.sleep(0.01)
                done = run_cli(
                    "inspect",
                    "--read-only",
                    "--allow-stopped",
                    "--save-xml",
                    str(first),
                    str(target.pid),
                )
                if done.returncode == 0:
                    break
                assert done.returncode == 3 and "stays held" in done.stderr, done.stderr
                os.kill(target.pid, signal.SIGCONT)
                time.sleep(0.01 * (attempt % 7))
            assert done.returncode == 0, done.stderr
            read_only(target.pid, second, "--allow-stopped")
            assert proc_status(target.pid)["State"][0] == "T", "a stopped target must stay stopped"
            done = run_cli(
                "inspect",
                "--gdb",
                "gdb",
                "--allow-stopped",
                "--json",
                "--save-xml",
                str(by_gdb),
                str(target.pid),
            )
            assert done.returncode == 0, done.stderr
            assert proc_status(target.pid)["State"][0] == "T"
        finally:
            os.kill(target.pid, signal.SIGCONT)
        assert first.read_bytes() == second.read_bytes()
        mine, gdbs = _heaps(first.read_text()), _heaps(by_gdb.read_text())
        assert len(mine) == 3
        # gdb's session lets the threads it does not call in run (non-stop mode), stopped
        # target or not: the churning main arena moves under it.
        assert _equal_but_the_callers_arena(mine, gdbs, moving=frozenset({0})) >= 1
        time.sleep(0.1)
        assert_running(target, "SIGCONT")


@pytest.mark.slow
def test_a_busy_running_target_is_read_consistently(tmp_path: Path) -> None:
    """While the main thread churns its arena: every arena read at one moment (a parse of
    the document finds nothing implausible), balanced against the same read's residency."""
    binary = compile_target("heap_shapes")
    with shape_target([str(binary), "33", "busy", "-"]) as target:
        for round_index in range(5):
            document = read_only(target.pid, tmp_path / f"{round_index}.xml")
            assert document["read_only"]["stops"] >= 1
            assert all(a["balanced"] for a in document["residency"]["arenas"])
        assert_running(target, "five reads")


@pytest.mark.slow
def test_a_locked_arena_is_never_read_while_locked(tmp_path: Path) -> None:
    """Its mutex held at every stop: the read gives up cleanly (exit 3, a hint to the gdb
    path), the target untouched; released while the read retries: read after it ran."""
    staller = StallTarget(20000)
    try:
        assert staller.say("stall") == "stalling"
        time.sleep(0.1)
        done = run_cli("inspect", "--read-only", "--json", str(staller.pid))
        # No moment with the arena unlocked came: a timeout (exit 6), as for a safe point.
        assert done.returncode == 6, done.stderr
        assert "locked at every stop" in done.stderr and "hint:" in done.stderr
        # --timeout bounds the retries as it bounds the gdb path's wait for a safe point
        # (60 retries alone take ~1.4 s).
        started = time.monotonic()
        done = run_cli("inspect", "--read-only", "--timeout", "0.1s", str(staller.pid))
        assert done.returncode == 6 and "locked at every stop" in done.stderr, done.stderr
        assert time.monotonic() - started < 1.0
        fields = proc_status(staller.pid)
        assert fields["TracerPid"] == "0" and fields["State"][0] not in "Tt"
        # Still held: read again, and release it once the read has found the lock held
        # (its retries span ~1.4 s): once a stop has been seen (the target traced), not
        # after a fixed time (the CLI's start alone takes 0.3-0.5 s).
        releasing = threading.Event()

        def release() -> None:
            deadline = time.monotonic() + 10
            while proc_status(staller.pid)["TracerPid"] == "0" and time.monotonic() < deadline:
                if releasing.wait(0.001):
                    return
            releasing.wait(0.05)
            while not releasing.wait(0.01):
                staller.drain_stderr()

        releaser = threading.Thread(target=release)
        started = time.monotonic()
        releaser.start()
        try:
            document = read_only(staller.pid, tmp_path / "after.xml")
        finally:
            releasing.set()
            releaser.join()
        assert document["read_only"]["lock_retries"] >= 1, time.monotonic() - started
        staller.drain_stderr()
        # trim without gdb waits for a moment with every arena unlocked, and gives up at its
        # deadline (exit 6) with nothing called; with the lock released it trims.
        time.sleep(0.2)
        assert staller.say("stall") == "stalling"
        time.sleep(0.1)
        done = run_cli("trim", "--timeout", "1s", str(staller.pid))
        assert done.returncode in (3, 6), done.stderr  # the read, or then the call, gave up
        _assert_staller_carries_on(staller)
    finally:
        staller.close()


@pytest.mark.slow
def test_a_locked_arena_whose_fastbin_moves_is_refused_as_locked_never_as_corrupt() -> None:
    """Its mutex held at every stop while another thread frees into one of its fastbins
    (glibc pushes there without the mutex): the read made after the last stop, the target
    running, sees that list move under it. The refusal is the locked arena's (exit 6), never
    a corruption; the default's stand-in and the gdb path make no call (the mutex is held at
    every look); the target is left untraced, and carries on once the mutex is let go."""
    staller = StallTarget(20000)
    try:
        # 2,000,000 frees, one every 20 us or more: the fastbin moves for 40 s or more, well
        # past the three reads (~10 s).
        assert staller.say("churn 2000000") == "churning"
        assert staller.say("stall") == "stalling"
        time.sleep(0.1)
        for args in (
            ("--read-only", "--json"),
            ("--timeout", "2s"),
            ("--gdb", "gdb", "--timeout", "2s"),
        ):
            before = int(staller.say("churned").split()[1])
            done = run_cli("inspect", *args, str(staller.pid))
            after = int(staller.say("churned").split()[1])
            # The fastbin moved during the read, and still moved as it ended.
            assert before < after < 2000000, (before, after)
            assert done.returncode == 6, (args, done.stderr)
            assert "corrupt" not in done.stderr.lower(), (args, done.stderr)
            assert "Traceback" not in done.stderr
            said = "locked at every stop" if "--read-only" in args else "nothing was called"
            assert said in done.stderr, (args, done.stderr)
            fields = proc_status(staller.pid)
            assert fields["TracerPid"] == "0" and fields["State"][0] not in "Tt", (args, fields)
        _assert_staller_carries_on(staller)
    finally:
        staller.close()


def _assert_staller_carries_on(staller: StallTarget) -> None:
    """Untraced, not stopped, and its main thread answers once its stall is released."""
    fields = proc_status(staller.pid)
    assert fields["TracerPid"] == "0" and fields["State"][0] not in "Tt"
    staller.drain_stderr()
    assert staller.say("gap").startswith("gap ")


def test_no_gdb_on_path_inspect_reads_memory_and_gdb_path_says_so(tmp_path: Path) -> None:
    """A host without gdb: `inspect` needs nothing but /proc (its document is the target's
    own malloc_info); `inspect --gdb gdb` exits 5 and says the default needs no gdb."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {**os.environ, "PATH": str(bin_dir)}
    assert shutil.which("gdb", path=str(bin_dir)) is None
    binary = compile_target("heap_shapes")
    own, rebuilt = tmp_path / "own.xml", tmp_path / "ro.xml"
    with shape_target([str(binary), "34", "mixed", str(own)]) as target:
        done = run_cli("inspect", "--gdb", "gdb", str(target.pid), env=env)
        assert done.returncode == 5, done.stderr
        assert "without --gdb the heap is read from memory" in done.stderr
        done = run_cli("inspect", "--save-xml", str(rebuilt), str(target.pid), env=env)
        assert done.returncode == 0, done.stderr
        assert "read-only" in done.stdout and "through gdb" not in done.stdout
        assert_running(target, "inspect")
    assert rebuilt.read_bytes() == own.read_bytes()


@pytest.mark.slow
def test_memforensics_killed_mid_read_leaves_the_target_running(tmp_path: Path) -> None:
    """SIGKILL of `inspect --read-only` at many moments of its read of a big heap: the
    kernel ends a dead tracer's seizes; the target runs on, untraced, and its heap is what
    it was (a later read equals its own malloc_info)."""
    binary = compile_target("heap_shapes")
    own = tmp_path / "own.xml"
    with shape_target([str(binary), "35", "subheaps", str(own)]) as target:
        for delay_seconds in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5):
            proc = subprocess.Popen(
                [*MEMFORENSICS, "inspect", "--read-only", "--json", str(target.pid)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(delay_seconds)
            proc.kill()
            proc.wait(timeout=10)
            deadline = time.monotonic() + 5
            while proc_status(target.pid)["TracerPid"] != "0" and time.monotonic() < deadline:
                time.sleep(0.01)
            assert_running(target, f"a SIGKILL after {delay_seconds} s")
        rebuilt = tmp_path / "after.xml"
        read_only(target.pid, rebuilt)
    assert rebuilt.read_bytes() == own.read_bytes()


@pytest.mark.slow
def test_the_integrity_target_is_undisturbed_by_twenty_reads(tmp_path: Path) -> None:
    """Registers (upper ymm lanes too) held across a loop, an ordered byte stream read from
    a pipe, SIGALRM every 2 ms, heap buffers: all intact after 20 read-only inspects."""
    binary = compile_target("integrity", "-mavx2")
    with running([str(binary)]) as target:
        for round_index in range(20):
            read_only(target.pid, tmp_path / f"{round_index}.xml")
            assert target.alive()
        assert_integrity_intact(target)


def _kernel_core_skip_reason() -> str | None:
    """Why the kernel cannot write a core into a test's directory here, or None (the
    machine-wide core_pattern is never changed by a test)."""
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    if pattern.startswith("|") or "/" in pattern:
        return f"core_pattern sends cores elsewhere ({pattern.split()[0]}); tests leave it"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["gcore", "kernel"])
def test_a_core_reads_as_the_live_target_did(writer: str, tmp_path: Path) -> None:
    """`inspect --core` of a gcore (and of the kernel's own core) of an idle target equals
    `inspect --read-only` of the live target and the target's own malloc_info, byte for byte;
    the residency is unknown and said to be."""
    import resource

    if writer == "kernel" and (reason := _kernel_core_skip_reason()) is not None:
        pytest.skip(reason)
    binary = compile_target("heap_shapes")
    own, live, from_core = tmp_path / "own.xml", tmp_path / "live.xml", tmp_path / "core.xml"
    cores = tmp_path / "cores"
    cores.mkdir()
    proc = subprocess.Popen(
        [str(binary), "36", "threads", str(own)],
        cwd=cores,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(b"ready")
        read_only(proc.pid, live)
        if writer == "gcore":
            done = subprocess.run(
                ["gdb", "-p", str(proc.pid), "-batch", "-ex", f"gcore {cores / 'core'}"],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert done.returncode == 0, done.stderr
        else:
            _soft, hard = resource.prlimit(proc.pid, resource.RLIMIT_CORE)
            resource.prlimit(proc.pid, resource.RLIMIT_CORE, (hard, hard))
            os.kill(proc.pid, signal.SIGSEGV)
            assert proc.wait(timeout=120) == -signal.SIGSEGV
        (core,) = [path for path in cores.iterdir() if path.is_file()]
        done = run_cli("inspect", "--core", str(core), "--json", "--save-xml", str(from_core))
        assert done.returncode == 0, done.stderr
        document = json.loads(done.stdout)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        for leftover in cores.iterdir():
            leftover.unlink()
    assert from_core.read_bytes() == live.read_bytes() == own.read_bytes()
    assert document["read_only"]["source"] == "core" and document["read_only"]["stops"] == 0
    assert document["residency"] is None and "core" in document["residency_error"]
    assert document["process"]["pid"] == proc.pid


def test_a_core_that_is_not_one_is_refused_in_one_line(tmp_path: Path) -> None:
    bogus = tmp_path / "core"
    bogus.write_bytes(b"\x7fELF" + bytes(60))
    done = run_cli("inspect", "--core", str(bogus))
    assert done.returncode == 7, done.stderr
    assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr
    done = run_cli("inspect", "--core", str(bogus), "1")
    assert done.returncode == 2  # a core and a PID: a usage error
