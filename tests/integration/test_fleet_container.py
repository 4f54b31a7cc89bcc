"""A real target in a real cgroup named the way the kubelet (systemd driver) and containerd
name a container's: collect labels its metrics with the pod UID and container ID read from
/proc/PID/cgroup. The cgroup is created under this test's own and removed in ``finally``."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from memforensics.sources.proc.cgroup import process_cgroup_path
from tests.support.fleet import collect_cli
from tests.support.targets import c_target, live_skip_reason

pytestmark = pytest.mark.integration

POD = "fbdfe8e3-1c87-4ff2-907c-b2ec8e25d012"
CID = "ef807430361e6e82b45db92e2e9b6fbec98f419b12c591e655c1a725565e73a8"
CONTAINER_PATH = (
    "mf-fleet-test/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{POD.replace('-', '_')}.slice/cri-containerd-{CID}.scope"
)


def own_cgroup_directory() -> Path | None:
    """This process's cgroup directory for the hierarchy collect reads (memory on v1)."""
    text = Path("/proc/self/cgroup").read_text()
    path = process_cgroup_path(text)
    if path is None:
        return None
    v1_memory = any(
        line.split(":")[1].split(",").count("memory") for line in text.splitlines() if ":" in line
    )
    for root in (
        Path("/sys/fs/cgroup/memory") if v1_memory else Path("/sys/fs/cgroup"),
        Path("/sys/fs/cgroup/unified"),
    ):
        directory = root / path.lstrip("/")
        if (directory / "cgroup.procs").exists():
            return directory
    return None


@contextlib.contextmanager
def container_cgroup() -> Iterator[Path]:
    """The leaf directory of a kubelet-style cgroup tree; all of it removed afterwards."""
    base = own_cgroup_directory()
    if os.geteuid() != 0 or base is None or not os.access(base, os.W_OK):
        pytest.skip("needs root and a writable cgroup hierarchy to create a container's cgroup")
    leaf = base / CONTAINER_PATH
    try:
        leaf.mkdir(parents=True)
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup here: {exc}")
    try:
        yield leaf
    finally:
        for directory in [leaf, *leaf.parents]:
            if directory == base:
                break
            deadline = time.monotonic() + 10
            while directory.exists():
                try:
                    directory.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)  # the killed target is still leaving the cgroup


def test_container_identity_labels(tmp_path: Path) -> None:
    reason = live_skip_reason()
    if reason:
        pytest.skip(reason)
    with container_cgroup() as leaf, c_target("proc_idle") as target:
        (leaf / "cgroup.procs").write_text(str(target.pid))
        assert CID in Path(f"/proc/{target.pid}/cgroup").read_text()
        done = collect_cli(str(target.pid), "--textfile-dir", str(tmp_path), "--no-oom")
        assert done.returncode == 0, done.stderr
    prom = (tmp_path / "memforensics.prom").read_text()
    labels = f'allocator="glibc",container_id="{CID}",pid="{target.pid}",pod_uid="{POD}"'
    assert f"memforensics_heap_free_bytes{{{labels}" in prom
    assert f"memforensics_target_up{{{labels}" in prom
