"""memforensics and everything it started SIGKILLed together, at many moments: the target
lives on, untraced, running and undisturbed.

The paths without gdb are the ones that must survive it: `trim` (the heap read from memory,
malloc_trim called through a signal frame that restores the thread by itself), and
`inspect`, `watch` and `collect` as they run by default (the heap read from memory, nothing
called at all; gdb only where that read is refused, which it is not here). memforensics
runs in its own process group with every process it starts (it starts none on these
paths), and the whole group is SIGKILLed at once, as a pod deletion or a unit's final
SIGKILL does. The target has 2 million free chunks, so its read and its malloc_trim take a
few hundred ms and the kills land inside them; the seeds' shapes (busy thread arenas read
with a scout, and a main arena whose 2 million scattered chunks the default reads by a
sweep, list_sweep) are killed the same way, under every command; the integrity target (registers
with upper ymm lanes, an ordered pipe, SIGALRM every 2 ms, heap buffers) says whether
anything in it was disturbed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.targets import (
    assert_integrity_intact,
    compile_target,
    live_skip_reason,
    memory_cgroup,
    proc_status,
    running,
)

_SKIP = live_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
    pytest.mark.skipif(os.uname().machine != "x86_64", reason="the frame is x86-64's"),
]

MEMFORENSICS = [sys.executable, "-m", "memforensics"]
# Moments after the start of the command (its Python start-up takes ~0.15 s of them).
MOMENTS_SECONDS = (0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.8, 1.0)


def _left_running(pid: int, what: str) -> None:
    """Alive, traced by nobody, not stopped, every thread."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        tasks = [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]
        states = [proc_status(pid, tid) for tid in tasks]
        if all(s["TracerPid"] == "0" and s["State"][0] not in "Tt" for s in states):
            return
        time.sleep(0.01)
    raise AssertionError(f"after {what}: {[proc_status(pid, tid) for tid in tasks]}")


def _kill_side_at(argv: list[str], moment_seconds: float) -> None:
    """Run ``argv`` in a process group of its own; SIGKILL the whole group at the moment."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        time.sleep(moment_seconds)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)


class ChunkTarget:
    """many_arenas with one arena of 2 million free 32-byte chunks, driven on its stdin."""

    def __init__(self) -> None:
        binary = compile_target("many_arenas")
        self.proc = subprocess.Popen(
            [str(binary), "1", "4000000", "24"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().startswith(b"ready")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def answers(self) -> bool:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(b"gap\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().startswith(b"gap ")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@contextlib.contextmanager
def chunk_target() -> Iterator[ChunkTarget]:
    target = ChunkTarget()
    try:
        yield target
    finally:
        target.close()


class SeedsTarget(ChunkTarget):
    """tests/targets/seeds_heap.c in a shape of the seeds' (issue 31), inside a memory cgroup
    of ``limit_bytes`` when one can be made, driven on its stdin like ChunkTarget."""

    def __init__(self, args: list[str], tunables: str, limit_bytes: int) -> None:
        binary = compile_target("seeds_heap")
        self.group = memory_cgroup(f"memforensics-test-killed-{args[0]}", limit_bytes)
        argv = [str(binary), *args]
        if self.group is not None:
            argv = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.group), *argv]
        env = dict(os.environ)
        if tunables:
            env["GLIBC_TUNABLES"] = tunables
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().startswith(b"ready")

    def close(self) -> None:
        super().close()
        if self.group is not None:
            with contextlib.suppress(OSError):
                self.group.rmdir()


# The seeds' shapes as tests/integration/test_seeds_read.py and benchmarks/bench_seeds.py make
# them: busy thread arenas (read with a scout, their lists moving), arenas above the copies'
# budget whose lists lie on ~100 MiB of pages each (scouted for longer, their stops copying
# that much), and a main arena whose unsorted bin holds 2 million scattered chunks (its scout
# and its relay give up, and the default reads it by a sweep; trim calls malloc_trim). The
# stand-in call itself is killed at any moment in tests/integration/test_called_malloc_info.py.
SEEDS_SHAPES = {
    "busy-arenas": (
        ["5", "24", "1"],
        "glibc.malloc.arena_max=6:glibc.malloc.mmap_threshold=33554432",
        1 << 30,
    ),
    "spread-lists": (
        ["spread", "2", "320"],
        "glibc.malloc.arena_max=3:glibc.malloc.mmap_threshold=33554432",
        2 << 30,
    ),
    "unsorted-2m": (["unsorted", "4000000"], "", 2 << 30),
}


@pytest.fixture(scope="module", params=list(SEEDS_SHAPES), ids=list(SEEDS_SHAPES))
def seeds_target(request: pytest.FixtureRequest) -> Iterator[SeedsTarget]:
    target = SeedsTarget(*SEEDS_SHAPES[request.param])
    try:
        yield target
    finally:
        target.close()


COMMANDS = {
    "trim": lambda pid, tmp: ["trim", "--timeout", "30s", str(pid)],
    "inspect": lambda pid, tmp: ["inspect", "--json", str(pid)],
    "watch": lambda pid, tmp: [
        "watch",
        "--interval",
        "0.2s",
        "--count",
        "5",
        "--json",
        str(pid),
    ],
    "collect": lambda pid, tmp: [
        "collect",
        "--no-oom",
        "--textfile-dir",
        str(tmp),
        str(pid),
    ],
}


@pytest.mark.parametrize("command", list(COMMANDS), ids=list(COMMANDS))
def test_a_target_with_two_million_free_chunks_survives_every_kill(
    command: str, tmp_path: Path
) -> None:
    with chunk_target() as target:
        if command == "inspect":  # the default path here is the read, never gdb
            whole = subprocess.run(
                [*MEMFORENSICS, "inspect", "--json", str(target.pid)],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert whole.returncode == 0, whole.stderr
            assert json.loads(whole.stdout)["fallback"] is None
            assert "malloc_info" not in whole.stderr
        for moment in MOMENTS_SECONDS:
            _kill_side_at([*MEMFORENSICS, *COMMANDS[command](target.pid, tmp_path)], moment)
            _left_running(target.pid, f"{command} killed after {moment} s")
            assert target.answers(), f"the target stopped answering after {moment} s"
        # Its heap is whole: read (no gdb) and trimmed once more, to the end.
        done = subprocess.run(
            [*MEMFORENSICS, "trim", "--json", str(target.pid)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        _left_running(target.pid, "a whole trim")
        assert target.answers()


@pytest.mark.parametrize("command", list(COMMANDS), ids=list(COMMANDS))
def test_the_seeds_shapes_survive_every_kill(
    seeds_target: SeedsTarget, command: str, tmp_path: Path
) -> None:
    """Every default path killed at 10 moments of its read (a scout, a stop, a relay, a
    sweep): the target lives on, untraced, running and answering, each time."""
    for moment in MOMENTS_SECONDS:
        _kill_side_at([*MEMFORENSICS, *COMMANDS[command](seeds_target.pid, tmp_path)], moment)
        _left_running(seeds_target.pid, f"{command} killed after {moment} s")
        assert seeds_target.answers(), f"the target stopped answering after {moment} s"
    done = subprocess.run(
        [*MEMFORENSICS, "inspect", "--json", str(seeds_target.pid)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    _left_running(seeds_target.pid, "a whole inspect")


def test_the_integrity_target_is_undisturbed_by_killed_trims_and_reads(tmp_path: Path) -> None:
    binary = compile_target("integrity", "-mavx2")
    with running([str(binary)]) as target:
        for index, moment in enumerate(MOMENTS_SECONDS * 2):
            command = ("trim", "inspect")[index % 2]
            _kill_side_at([*MEMFORENSICS, *COMMANDS[command](target.pid, tmp_path)], moment)
            _left_running(target.pid, f"{command} killed after {moment} s")
        for _ in range(5):  # and whole calls, to the end
            done = subprocess.run(
                [*MEMFORENSICS, "trim", str(target.pid)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, done.stderr
        assert_integrity_intact(target)


def _all_traced(pid: int) -> bool:
    """Every thread of ``pid`` has a tracer now (a hold of every thread)."""
    tracers = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            tracers.append(proc_status(pid, int(task.name))["TracerPid"])
    return bool(tracers) and "0" not in tracers


def _kill_side_inside_a_hold(argv: list[str], pid: int, held_seconds: float) -> bool:
    """Run ``argv`` in a process group of its own; SIGKILL the whole group once every thread
    of ``pid`` has been traced for ``held_seconds`` without a break (a hold that long: the
    read's own stops last milliseconds). Whether such a hold came before the command ended."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        since: float | None = None
        while proc.poll() is None:
            now = time.monotonic()
            since = (since or now) if _all_traced(pid) else None
            if since is not None and now - since >= held_seconds:
                os.killpg(proc.pid, signal.SIGKILL)
                return True
            time.sleep(0.001)
        return False
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_a_kill_inside_the_proof_before_the_stand_in_call_leaves_the_target_whole() -> None:
    """3.1 million scattered unsorted chunks, more than a sweep keeps: the default's read is
    refused, and before its stand-in malloc_info call the lists are proved in one hold of
    every thread (list_proof; about half a second here). The whole side SIGKILLed 10, 35 and
    60 % of the way into that hold (by its length in a whole run): each time the target
    lives on, untraced and running, main_arena's lock word (read from its memory) is free,
    and nothing was called (its maps are as before: the call's region would be new)."""
    from memforensics.sources.glibc.list_sweep import SWEEP_MAX_CHUNKS
    from tests.support.targets import started_in_cgroup

    blocks = str(2 * (SWEEP_MAX_CHUNKS + 100_000))
    argv = [str(compile_target("seeds_heap")), "unsorted", blocks, "scattered"]
    with started_in_cgroup(
        argv, group_name="memforensics-test-killed-proof", limit_bytes=3 << 30, arena_max=2
    ) as pid:
        maps = Path(f"/proc/{pid}/maps").read_text()
        whole = subprocess.run(
            [*MEMFORENSICS, "inspect", "--json", str(pid)],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert whole.returncode == 0, whole.stderr
        document = json.loads(whole.stdout)
        assert "proved to close" in document["safe_point"], document["safe_point"]
        main_arena = int(document["residency"]["arenas"][0]["address"], 16)
        # Its length in that whole run (its safe point says it); past the read's own stops.
        # The proof's length varies with the machine's load (0.29-0.65 s seen): a kill that
        # found no hold that long is tried again at half the time.
        proof_ms = int(re.search(r"walked in (\d+) ms", document["safe_point"]).group(1))  # type: ignore[union-attr]
        inspect = [*MEMFORENSICS, "inspect", "--json", str(pid)]
        for held_seconds in _kills_inside_a_hold(inspect, pid, proof_ms / 1000):
            _left_running(pid, f"inspect killed {held_seconds} s into the proof")
            with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
                mem.seek(main_arena)
                assert int.from_bytes(mem.read(4), "little") == 0, "main_arena's lock is held"
            assert Path(f"/proc/{pid}/maps").read_text() == maps


def _kills_inside_a_hold(argv: list[str], pid: int, hold_seconds: float) -> Iterator[float]:
    """``argv``'s whole side SIGKILLed 10, 35 and 60 % of the way into a hold of every thread
    of ``pid`` that lasts ``hold_seconds`` in a whole run; yields how far in each kill came,
    once it has. A hold's length varies with the machine's load: a kill that found no hold
    that long is tried again at half the time (never under 30 ms: the read's own stops)."""
    for share in (0.1, 0.35, 0.6):
        held_seconds = max(0.03, share * hold_seconds)
        while not _kill_side_inside_a_hold(argv, pid, held_seconds):
            assert held_seconds > 0.03, "no hold of every thread as long as the read's stops"
            held_seconds = max(0.03, held_seconds / 2)
        yield held_seconds


def test_a_kill_inside_a_sweep_in_one_stop_leaves_the_busy_target_running() -> None:
    """2 million scattered unsorted chunks and a thread churning in the same arena: its lists
    move between the sweep's stops, and the read sweeps the arena in one stop of every thread
    (a few hundred ms here). The whole side SIGKILLed 10, 35 and 60 % of the way into that
    stop (by its length in a whole run): each time the target lives on, untraced and running,
    and a read after the kills is whole (from memory, no call)."""
    from tests.support.targets import started_in_cgroup

    argv = [str(compile_target("seeds_heap")), "unsorted", "4000000"]
    with started_in_cgroup(
        argv,
        group_name="memforensics-test-killed-one-stop",
        limit_bytes=2 << 30,
        arena_max=1,
        env={"SEEDS_UNSORTED_BUSY": "1"},
    ) as pid:
        inspect = [*MEMFORENSICS, "inspect", "--json", str(pid)]
        whole = subprocess.run(inspect, capture_output=True, text=True, timeout=180, check=False)
        assert whole.returncode == 0, whole.stderr
        read = json.loads(whole.stdout)["read_only"]
        assert read["swept_in_one_stop_arenas"] == 1, read
        for held_seconds in _kills_inside_a_hold(inspect, pid, read["longest_stop_seconds"]):
            _left_running(pid, f"inspect killed {held_seconds} s into the sweep's one stop")
        again = subprocess.run(inspect, capture_output=True, text=True, timeout=180, check=False)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["fallback"] is None
        _left_running(pid, "a whole inspect after the kills")
