"""The five shapes that read wrong when only the arenas are looked at, on real processes.

Each target (tests/targets/verdict_shapes.c, and a CPython process) is watched with the
real CLI, `memforensics watch PID --interval 1s --count 9 --record F`, then
`memforensics report F --json` must give its verdict; `report F --fail-on VERDICT` exits 1
on it, and `report F --fail-on growing` exits 1 for the leak verdicts only:

- a CPython small-object leak: `outside-malloc-growing` (CPython's object arenas are its own
  mmaps), with the runtime named;
- a leak of 256 KiB blocks (above the mmap threshold): `mmap-growing`;
- constant live memory moving from mmapped blocks to the heap: `stable`;
- one step of 40 MiB: `stable`, the step named in the evidence;
- a periodic malloc_trim's sawtooth of free resident memory: `stable`.

Every target is bounded by its own arguments (at most ~150 MiB) and, where this machine lets
us create one, runs inside a memory cgroup of 300 MiB; it is killed in ``finally``.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from memforensics.cli import cli
from tests.support.targets import Target, compile_target, live_skip_reason, memory_cgroup, running

pytestmark = [pytest.mark.integration, pytest.mark.slow]

_SKIP = live_skip_reason()
if _SKIP:
    pytest.skip(_SKIP, allow_module_level=True)

LIMIT_BYTES = 300 << 20

PY_LEAK = """
import os, time
head = None
made = 0
print("ready", os.getpid(), flush=True)
while True:
    if made < 150 << 20:
        for _ in range(5000):  # ~2 MiB of small objects a tick, each under 512 bytes
            head = (bytes(300), head)
        made += 5000 * 400
    time.sleep(0.25)
"""


def _memory_cgroup() -> Path | None:
    return memory_cgroup("memforensics-verdicts", LIMIT_BYTES)


@contextlib.contextmanager
def bounded(argv: list[str]) -> Iterator[Target]:
    """Run ``argv`` inside a 300 MiB memory cgroup when one can be made; killed in finally."""
    group = _memory_cgroup()
    if group is not None:
        # The shell joins the cgroup, then execs the target: its memory is charged there.
        argv = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group), *argv]
    try:
        with running(argv) as target:
            yield target
    finally:
        if group is not None:
            with contextlib.suppress(OSError):
                group.rmdir()


SHAPES = {
    "cpython-leak": ("python", [], "outside-malloc-growing"),
    "mmap-leak": ("c", ["mmap-leak", "500", "60"], "mmap-growing"),
    # (Its ticks of 1.3 s, not the watch's 1 s: a sample's figures come from moments a read
    # apart, and a tick in phase with the samples, drifting across that read, showed as a
    # step of "other anonymous" across the last samples: a growth, 2 runs in ~40.)
    "mmap-to-heap": ("c", ["mmap-to-heap", "1300", "60"], "stable"),
    "step": ("c", ["step", "1000", "60"], "stable"),
    "sawtooth": ("c", ["sawtooth", "500", "60"], "stable"),
}


def _argv(shape: str) -> list[str]:
    kind, args, _ = SHAPES[shape]
    if kind == "python":
        return [sys.executable, "-c", PY_LEAK]
    return [str(compile_target("verdict_shapes")), *args]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_shape_gets_its_verdict(tmp_path: Path, shape: str) -> None:
    record = tmp_path / f"{shape}.jsonl"
    expected = SHAPES[shape][2]
    with bounded(_argv(shape)) as target:
        watched = CliRunner().invoke(
            cli,
            ["watch", str(target.pid), "--interval", "1s", "--count", "9", "--record", str(record)],
        )
        assert watched.exit_code == 0, watched.output
        assert target.alive(), "the target must be left running"
    reported = CliRunner().invoke(cli, ["report", str(record), "--json"])
    assert reported.exit_code == 0, reported.output
    document = json.loads(reported.stdout)
    trend = document["trend"]
    assert trend["verdict"] == expected, "\n".join(trend["evidence"])
    assert trend["figures"] == "waterfall"
    # A gate accepts every verdict: gated on its own verdict, each shape fails.
    gate = CliRunner().invoke(cli, ["report", str(record), "--fail-on", expected])
    assert gate.exit_code == 1, gate.output
    assert f"is {expected}" in gate.stderr
    grow_gate = CliRunner().invoke(cli, ["report", str(record), "--fail-on", "growing"])
    assert grow_gate.exit_code == (1 if expected.endswith("-growing") else 0), grow_gate.output
    if shape == "cpython-leak":
        assert document["runtime"] == "cpython"
        assert "other_anon" in trend["growing_lines"]
        assert "tracemalloc" in trend["evidence"][0]
        lines = [json.loads(line) for line in record.read_text().splitlines()]
        assert all(line.get("runtime") == "cpython" for line in lines if line["kind"] == "heap")
    else:
        assert document["runtime"] is None
    if shape == "mmap-leak":
        assert trend["mmap_chunks_growing"] is True
        assert trend["arena_in_use_growing"] is False
    if shape == "mmap-to-heap":
        # The move happened inside the window: the arena's in use rose, mmapped chunks fell,
        # their sum did not.
        assert trend["arena_in_use_change_bytes"] > 16 << 20
        assert trend["mmap_chunks_change_bytes"] < -(16 << 20)
        assert trend["live_growing"] is False
    if shape == "step":
        assert trend["live_growing"] is False
        assert trend["step_lines"] and not trend["growing_lines"]
        assert any("one step of" in line for line in trend["evidence"])
    if shape == "sawtooth":
        assert trend["free_resident_growing"] is False
