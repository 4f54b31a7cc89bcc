"""memforensics run under a memory limit (a container's, as a DaemonSet's pod has): its
copies' budget and its sweeps are cut to what the limit leaves it, so the kernel does not
OOM-kill it in the middle of a read.

Our side runs alone in a fresh memory cgroup (v1 or v2), the target in another."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.glibc_releases import build_target, command
from tests.support.targets import (
    compile_target,
    in_cgroup,
    live_skip_reason,
    memory_cgroup,
    proc_status,
    started_in_cgroup,
)

_SKIP = live_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]

OUR_LIMIT_BYTES = 64 << 20


@contextlib.contextmanager
def our_group(limit_bytes: int) -> Iterator[Path]:
    group = memory_cgroup("memforensics-test-our-limit", limit_bytes)
    assert group is not None, "no memory cgroup can be made on this machine"
    try:
        yield group
    finally:
        for _ in range(50):  # (a killed process leaves its cgroup a moment later)
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def _inspect_in(group: Path, pid: int, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "memforensics", "inspect", "--json", *extra, str(pid)]
    return subprocess.run(
        in_cgroup(group, argv), capture_output=True, text=True, timeout=300, check=False
    )


def _assert_running(pid: int) -> None:
    fields = proc_status(pid)
    assert fields["TracerPid"] == "0" and fields["State"][0] not in "Tt", fields


THREADS = 12
MIB_PER_ARENA = 40  # scouted (32 MiB or more); the lists lie on ~12% of the pages


@pytest.mark.slow
def test_scouted_arenas_read_in_a_64_mib_limit_equal_the_targets_own_malloc_info(
    release: Any, tmp_path: Path
) -> None:
    """12 arenas of 40 MiB (seeds_heap, idle), read by the default `inspect` run in a 64 MiB
    memory cgroup: with the budget of a machine without a limit (192 MiB), its scouts' and
    copies' pages outgrow the limit and the kernel kills it. It reads from memory, equal to
    the target's own malloc_info byte for byte, and the kernel counts no OOM kill in its
    cgroup."""
    binary = build_target(release, "seeds_heap")
    own, rebuilt = tmp_path / "own.xml", tmp_path / "read.xml"
    argv = command(release, binary, [str(THREADS), str(MIB_PER_ARENA), "0", str(own)])
    with (
        started_in_cgroup(
            argv,
            group_name="memforensics-test-limit-target",
            limit_bytes=2 << 30,
            arena_max=THREADS + 1,
            tunables=f"glibc.malloc.mmap_threshold={32 << 20}",
        ) as pid,
        our_group(OUR_LIMIT_BYTES) as group,
    ):
        done = _inspect_in(group, pid, "--save-xml", str(rebuilt))
        _assert_running(pid)
        killed = _oom_kills(group)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert killed == 0
    document = json.loads(done.stdout)
    assert document["fallback"] is None, done.stderr
    assert document["read_only"]["scouted_arenas"] == THREADS, document["read_only"]
    assert rebuilt.read_bytes() == own.read_bytes()


def _oom_kills(group: Path) -> int:
    """The kernel's count of OOM kills in the cgroup: v2 memory.events', v1
    memory.oom_control's (4.13 and later)."""
    name = "memory.events" if (group / "memory.events").exists() else "memory.oom_control"
    for line in (group / name).read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    raise AssertionError(f"{group / name} has no oom_kill count")


@pytest.mark.slow
def test_a_list_too_long_for_the_limit_is_given_up_with_why_not_killed() -> None:
    """1 million free chunks in the main arena's unsorted bin (seeds_heap unsorted 2000000),
    scattered: read by a sweep, whose arrays at that count need more than a 64 MiB limit
    holds. Our side is not killed: the sweep gives up, saying the limit is why, and the
    default takes the stand-in call; the target runs on, untraced."""
    with (
        started_in_cgroup(
            [str(compile_target("seeds_heap")), "unsorted", "2000000"],
            group_name="memforensics-test-limit-unsorted",
            limit_bytes=1 << 30,
            arena_max=2,
        ) as pid,
        our_group(OUR_LIMIT_BYTES) as group,
    ):
        done = _inspect_in(group, pid)
        _assert_running(pid)
        killed = _oom_kills(group)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert killed == 0
    document = json.loads(done.stdout)
    fallback = document["fallback"]
    assert fallback is not None and fallback["way"] == "call", document["read_only"]
    assert "within our memory cgroup's limit" in fallback["reason"], fallback


PIN_ARENAS = 16
PIN_LIMIT_BYTES = 48 << 20


@pytest.mark.slow
def test_pins_of_sixteen_100_mib_arenas_in_a_48_mib_limit_match_the_unlimited_picture() -> None:
    """`inspect --pins` on 16 thread arenas of 100 MiB (seeds_heap, idle; 600,000 chunks):
    run in a 48 MiB memory cgroup it is not killed (it was: the walk kept every heap's chunk
    arrays, 17 bytes a chunk, and the JSON held every heap map's cells at once). Each heap
    is pictured as it is walked, the windows shrink to what the limit leaves, and the maps
    are written heap by heap: the picture equals the one taken without a limit, and each
    heap's map adds up to the heap's bytes its pin figures give."""
    argv = [str(compile_target("seeds_heap")), str(PIN_ARENAS), "100", "0"]
    with started_in_cgroup(
        argv,
        group_name="memforensics-test-limit-pins",
        limit_bytes=3 << 30,
        arena_max=PIN_ARENAS + 1,
        tunables=f"glibc.malloc.mmap_threshold={32 << 20}",
    ) as pid:
        unlimited = subprocess.run(
            [sys.executable, "-m", "memforensics", "inspect", "--json", "--pins", str(pid)],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        with our_group(PIN_LIMIT_BYTES) as group:
            done = _inspect_in(group, pid, "--pins")
            killed = _oom_kills(group)
        _assert_running(pid)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert killed == 0
    limited, free = json.loads(done.stdout), json.loads(unlimited.stdout)
    assert limited["pins_error"] is None, limited["pins_error"]
    for key in ("pins", "pin_heaps", "heap_maps"):
        assert limited[key] == free[key], key
    heaps = limited["pin_heaps"]
    assert len(heaps) >= 2 * PIN_ARENAS  # a thread arena of 100 MiB spans two sub-heaps
    for figures, drawn in zip(heaps, limited["heap_maps"]["heaps"], strict=True):
        assert sum(map(sum, drawn["cells"].values())) == figures["heap_bytes"], figures
        parts = figures["live_bytes"] + figures["free_bytes"] + figures["top_bytes"]
        assert parts <= figures["heap_bytes"], figures
