"""memforensics run under a CPU quota (a container's CPU limit, as a DaemonSet's pod has):
the quota it finds is the kernel's, and the default read still reads the target from
memory, equal to its own malloc_info, however long the quota makes the read.

The stall a throttled stop would cause is a timing, measured by benchmarks/bench_quota.py
against the gdb recipe run under the same quota, not asserted here."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.glibc_releases import build_target, command
from tests.support.targets import cpu_cgroup, in_cgroup, live_skip_reason, proc_status, running

_SKIP = live_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]

PERIOD_US = 100_000


@contextlib.contextmanager
def quota_group(quota_us: int) -> Iterator[Path]:
    group = cpu_cgroup("memforensics-test-quota", quota_us, PERIOD_US)
    assert group is not None, "no cgroup with a CPU quota can be made on this machine"
    try:
        yield group
    finally:
        with contextlib.suppress(OSError):
            group.rmdir()


def test_the_quota_found_is_the_one_the_kernel_enforces_on_us() -> None:
    """A process started in a cgroup of 0.15 CPU finds that quota, and where it is set; one
    outside it finds none tighter."""
    probe = (
        "from memforensics.sources.proc.cpu_quota import cpu_quota; q = cpu_quota(); "
        "print(q and q.quota_seconds, q and q.period_seconds, q and q.directory)"
    )
    with quota_group(15_000) as group:
        inside = subprocess.run(
            in_cgroup(group, [sys.executable, "-c", probe]),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.split()
    assert inside == ["0.015", "0.1", str(group)]
    outside = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    assert outside[0] == "None" or float(outside[0]) > 0.015, outside


THREADS = 12
MIB_PER_ARENA = 20  # copied whole in its stop (under heapmaps._SCOUT_MIN_BYTES)
TUNABLES = f"glibc.malloc.arena_max={THREADS + 1}:glibc.malloc.mmap_threshold={32 << 20}"


@pytest.mark.slow
def test_a_read_under_a_tenth_of_a_cpu_reads_memory_and_equals_the_targets_own_malloc_info(
    release: Any, tmp_path: Path
) -> None:
    """12 arenas of 20 MiB (seeds_heap, idle), read by the default `inspect` run in a cgroup
    of 0.1 CPU: the read takes many times its time at full speed, past its budget at full
    speed (which is of CPU time, not wall). It is read from memory all the same, never handed
    to the stand-in call, and equals the target's own malloc_info byte for byte; the JSON
    names the quota; the target runs on, untraced."""
    binary = build_target(release, "seeds_heap")
    own, rebuilt = tmp_path / "own.xml", tmp_path / "read.xml"
    argv = command(release, binary, [str(THREADS), str(MIB_PER_ARENA), "0", str(own)])
    with (
        running(argv, env={"GLIBC_TUNABLES": TUNABLES}, ready_timeout_seconds=120) as target,
        quota_group(10_000) as group,
    ):
        done = subprocess.run(
            in_cgroup(
                group,
                [
                    sys.executable,
                    "-m",
                    "memforensics",
                    "inspect",
                    "--json",
                    "--save-xml",
                    str(rebuilt),
                    str(target.pid),
                ],
            ),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        fields = proc_status(target.pid)
        assert fields["TracerPid"] == "0" and fields["State"][0] not in "Tt", fields
        assert target.alive()
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["fallback"] is None, done.stderr
    assert document["read_only"]["source"] == "live", document["read_only"]
    assert rebuilt.read_bytes() == own.read_bytes()
    assert any("CPU quota of 0.10 CPU" in note for note in document["waterfall"]["notes"])


SCOUTED_THREADS = 6
SCOUTED_MIB_PER_ARENA = 64  # scouted (32 MiB or more): its stop copies its lists' pages
SCOUTED_TUNABLES = (
    f"glibc.malloc.arena_max={SCOUTED_THREADS + 1}:glibc.malloc.mmap_threshold={32 << 20}"
)


def _inspect_json(argv_prefix: list[str], pid: int, rebuilt: Path) -> dict[str, Any]:
    done = subprocess.run(
        [
            *argv_prefix,
            sys.executable,
            "-m",
            "memforensics",
            "inspect",
            "--json",
            "--read-only",
            "--save-xml",
            str(rebuilt),
            str(pid),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


@pytest.mark.slow
def test_under_a_tenth_of_a_cpu_scouted_arenas_are_copied_in_parts_that_fit_the_quota(
    release: Any, tmp_path: Path
) -> None:
    """6 arenas of 64 MiB (seeds_heap, idle): scouted, their lists on some 6 MiB of pages
    each, which one stop copies at full speed (about 8 ms of CPU), and which under 0.1 CPU
    would take more than the quota has in a period: the stop would be throttled and hold the
    target until the next (100 ms). Under the quota the copies are cut into parts that fit
    (cpu_quota.stop_copy_max_bytes), so the read has parts where the same read without a
    quota has none; both equal the target's own malloc_info byte for byte."""
    binary = build_target(release, "seeds_heap")
    own = tmp_path / "own.xml"
    arguments = [str(SCOUTED_THREADS), str(SCOUTED_MIB_PER_ARENA), "0", str(own)]
    argv = command(release, binary, arguments)
    env = {"GLIBC_TUNABLES": SCOUTED_TUNABLES}
    with running(argv, env=env, ready_timeout_seconds=120) as target:
        free = _inspect_json([], target.pid, tmp_path / "free.xml")
        with quota_group(10_000) as group:
            limited = _inspect_json(in_cgroup(group, []), target.pid, tmp_path / "limited.xml")
        fields = proc_status(target.pid)
        assert fields["TracerPid"] == "0" and fields["State"][0] not in "Tt", fields
        assert target.alive()
    for document in (free, limited):
        assert document["fallback"] is None
        assert document["read_only"]["scouted_arenas"] == SCOUTED_THREADS
    assert free["read_only"]["arena_parts"] == 0, free["read_only"]
    assert limited["read_only"]["arena_parts"] > SCOUTED_THREADS, limited["read_only"]
    assert limited["read_only"]["stops"] > free["read_only"]["stops"]
    assert (tmp_path / "free.xml").read_bytes() == own.read_bytes()
    assert (tmp_path / "limited.xml").read_bytes() == own.read_bytes()
