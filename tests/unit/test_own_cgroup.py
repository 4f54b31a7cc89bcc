"""own_cgroup: what our memory cgroup's limit leaves us (v1 and v2, the tightest ancestor,
the inactive page cache counted as free), and the budgets cut by it: the copies' budget and
the free chunks a sweep keeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from memforensics.sources.glibc.heapcopy import COPY_MAX_BYTES, copy_budget_bytes
from memforensics.sources.glibc.list_sweep import (
    SWEEP_MAX_CHUNKS,
    SWEEP_PEAK_BYTES_PER_CHUNK,
    sweep_max_chunks,
)
from memforensics.sources.proc.own_cgroup import (
    MemoryLimits,
    cgroup_directories,
    memory_headroom_bytes,
)
from tests.support.fake_proc import fake_proc

MIB = 1 << 20


def _v1(directory: Path, limit: int, usage: int, inactive_file: int = 0) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "memory.limit_in_bytes").write_text(f"{limit}\n")
    (directory / "memory.usage_in_bytes").write_text(f"{usage}\n")
    (directory / "memory.stat").write_text(f"cache 1\ntotal_inactive_file {inactive_file}\n")


def test_v1_the_least_room_over_our_cgroup_and_its_ancestors(tmp_path: Path) -> None:
    mount = tmp_path / "memory"
    pod, container = mount / "kubepods" / "pod1", mount / "kubepods" / "pod1" / "c1"
    _v1(mount, 9223372036854771712, 10 * 1024 * MIB)  # the root: no limit
    _v1(mount / "kubepods", 9223372036854771712, 900 * MIB)
    _v1(pod, 512 * MIB, 400 * MIB)  # 112 MiB left in the pod
    _v1(container, 384 * MIB, 200 * MIB, inactive_file=40 * MIB)  # 224 MiB left here
    proc = fake_proc(
        tmp_path,
        "5:memory:/kubepods/pod1/c1\n3:cpu:/kubepods/pod1/c1\n",
        f"35 31 0:32 / {mount} rw,relatime - cgroup cgroup rw,memory\n",
    )
    assert [d for d, _ in cgroup_directories("memory", proc)] == [
        container,
        pod,
        mount / "kubepods",
        mount,
    ]
    assert memory_headroom_bytes(proc) == 112 * MIB
    _v1(pod, 9223372036854771712, 400 * MIB)
    assert memory_headroom_bytes(proc) == 224 * MIB  # the inactive page cache counts as free


def test_v2_max_is_no_limit_and_a_full_cgroup_has_no_room(tmp_path: Path) -> None:
    mount = tmp_path / "cgroup"
    ours = mount / "ours"
    ours.mkdir(parents=True)
    (ours / "memory.max").write_text("max\n")
    (ours / "memory.current").write_text(f"{50 * MIB}\n")
    proc = fake_proc(
        tmp_path, "0::/ours\n", f"30 23 0:27 / {mount} rw - cgroup2 cgroup2 rw,nsdelegate\n"
    )
    assert memory_headroom_bytes(proc) is None
    (ours / "memory.max").write_text(f"{64 * MIB}\n")
    (ours / "memory.stat").write_text(f"anon 1\ninactive_file {4 * MIB}\n")
    assert memory_headroom_bytes(proc) == 18 * MIB
    (ours / "memory.current").write_text(f"{80 * MIB}\n")  # over (the kernel is reclaiming)
    assert memory_headroom_bytes(proc) == 0
    assert memory_headroom_bytes(tmp_path / "nowhere") is None


def test_limits_read_once_the_usage_at_every_call(tmp_path: Path) -> None:
    mount = tmp_path / "cgroup"
    ours = mount / "ours"
    ours.mkdir(parents=True)
    (ours / "memory.max").write_text(f"{64 * MIB}\n")
    (ours / "memory.current").write_text(f"{50 * MIB}\n")
    proc = fake_proc(
        tmp_path, "0::/ours\n", f"30 23 0:27 / {mount} rw - cgroup2 cgroup2 rw,nsdelegate\n"
    )
    limits = MemoryLimits(proc)
    assert limits.headroom_bytes() == 14 * MIB
    (ours / "memory.current").write_text(f"{60 * MIB}\n")
    assert limits.headroom_bytes() == 4 * MIB  # the usage is read again
    (ours / "memory.max").write_text(f"{128 * MIB}\n")
    assert limits.headroom_bytes() == 4 * MIB  # the limit is not
    assert memory_headroom_bytes(proc) == 68 * MIB  # a fresh read sees it
    (ours / "memory.max").write_text("max\n")
    assert MemoryLimits(proc).headroom_bytes() is None
    assert MemoryLimits(tmp_path / "nowhere").headroom_bytes() is None


def test_the_copies_budget_is_half_the_room_at_most(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: 1 kB\nMemAvailable: {16 << 20} kB\n")  # 16 GiB
    assert copy_budget_bytes(meminfo) == COPY_MAX_BYTES
    assert copy_budget_bytes(meminfo, headroom_bytes=None) == COPY_MAX_BYTES
    assert copy_budget_bytes(meminfo, headroom_bytes=1 << 30) == COPY_MAX_BYTES
    assert copy_budget_bytes(meminfo, headroom_bytes=55 * MIB) == 27 * MIB + MIB // 2
    meminfo.write_text(f"MemAvailable: {20 << 10} kB\n")  # 20 MiB: the machine is tighter
    assert copy_budget_bytes(meminfo, headroom_bytes=55 * MIB) == 10 * MIB


@pytest.mark.parametrize(
    ("headroom", "expected"),
    [
        (None, SWEEP_MAX_CHUNKS),
        (1 << 40, SWEEP_MAX_CHUNKS),
        (96 * MIB, 96 * MIB // SWEEP_PEAK_BYTES_PER_CHUNK),
        (0, 0),
    ],
)
def test_a_sweep_keeps_what_the_room_holds(headroom: int | None, expected: int) -> None:
    assert sweep_max_chunks(headroom) == expected
