"""A real kernel OOM kill in a 64 MiB memory cgroup, then `oom --kmsg` and the default scan
(on a host without journal files: /dev/kmsg) must report the victim.

The hog joins the cgroup itself before it allocates (so it never runs outside the limit),
allocates at most 300 MiB within 20 s, and the cgroup is removed in ``finally``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from memforensics.cli import cli
from memforensics.entry.oomscan import scan_default
from memforensics.model.oom import OomEvent

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LIMIT_BYTES = 64 * 1024 * 1024
HOG = """
import os, sys, time
with open(sys.argv[1], "w") as procs:
    procs.write(str(os.getpid()))
with open("/proc/self/comm") as comm:
    print("ready", comm.read().strip(), flush=True)
sys.stdin.readline()
chunks = []
deadline = time.monotonic() + 20
while len(chunks) < 300 and time.monotonic() < deadline:
    chunks.append(bytearray(1 << 20))  # zero-filled: every page is touched and charged
sys.exit(3)  # survived: the limit did not hold
"""


@dataclass
class MemoryCgroup:
    """A child memory cgroup: its directory, the procs file to join, its path in the log."""

    directory: Path
    procs: Path
    log_path: str
    version: int


def _mounts() -> list[tuple[str, str, str]]:
    rows = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 4:
            rows.append((fields[1], fields[2], fields[3]))
    return rows


def _v2_root() -> Path | None:
    for mount_point, fstype, _ in _mounts():
        root = Path(mount_point)
        if (
            fstype == "cgroup2"
            and "memory" in (root / "cgroup.controllers").read_text().split()
            and os.access(root, os.W_OK)
        ):
            return root
    return None


def _v1_root() -> Path | None:
    for mount_point, fstype, options in _mounts():
        if fstype == "cgroup" and "memory" in options.split(","):
            root = Path(mount_point)
            if os.access(root, os.W_OK):
                return root
    return None


@contextlib.contextmanager
def memory_cgroup() -> Iterator[MemoryCgroup]:
    name = f"memforensics-oom-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    v2, v1 = _v2_root(), _v1_root()
    if v2 is not None:
        subtree = v2 / "cgroup.subtree_control"
        if "memory" not in subtree.read_text().split():
            subtree.write_text("+memory")
        directory = v2 / name
        directory.mkdir()
        cgroup = MemoryCgroup(directory, directory / "cgroup.procs", f"/{name}", 2)
        limits = {"memory.max": str(LIMIT_BYTES), "memory.swap.max": "0"}
    elif v1 is not None:
        directory = v1 / name
        directory.mkdir()
        cgroup = MemoryCgroup(directory, directory / "cgroup.procs", f"/{name}", 1)
        limits = {
            "memory.limit_in_bytes": str(LIMIT_BYTES),
            "memory.memsw.limit_in_bytes": str(LIMIT_BYTES),
        }
    else:
        pytest.skip(
            "no writable memory cgroup: neither a cgroup v2 hierarchy with the memory "
            "controller nor a v1 memory hierarchy can be written by this user"
        )
    try:
        for key, value in limits.items():
            with contextlib.suppress(
                FileNotFoundError
            ):  # swap files exist only with swap accounting
                (directory / key).write_text(value)
        yield cgroup
    finally:
        for _ in range(50):
            try:
                directory.rmdir()
                break
            except OSError:
                time.sleep(0.1)  # the killed task is still leaving the cgroup


@dataclass
class Kill:
    """A hog the kernel OOM-killed: its pid, comm and the cgroup path the log shows."""

    pid: int
    comm: str
    log_path: str


@pytest.fixture(scope="module")
def real_kill() -> Iterator[Kill]:
    """One real memcg OOM kill per session, shared by the tests that read it back."""
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg is not readable here")
    with memory_cgroup() as cgroup:
        hog = subprocess.Popen(
            [sys.executable, "-c", HOG, str(cgroup.procs)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert hog.stdout is not None and hog.stdin is not None
            ready = hog.stdout.readline().split()
            assert ready[:1] == ["ready"], ready
            comm = ready[1]
            assert str(hog.pid) in cgroup.procs.read_text().split()
            hog.stdin.write("go\n")
            hog.stdin.flush()
            returncode = hog.wait(timeout=60)
        finally:
            if hog.poll() is None:
                hog.send_signal(signal.SIGKILL)
                hog.wait(timeout=10)
        assert returncode == -signal.SIGKILL, "the hog was not OOM-killed"
        yield Kill(hog.pid, comm, cgroup.log_path)


def _check_event(event: dict[str, object] | OomEvent, kill: Kill) -> None:
    get = event.get if isinstance(event, dict) else lambda key: getattr(event, key)
    assert get("process") == kill.comm
    assert get("killer") == "kernel"
    assert get("scope") == "memcg"
    assert str(get("cgroup")).endswith(kill.log_path)
    assert str(get("oom_memcg")).endswith(kill.log_path)
    assert get("uid") == os.getuid()
    anon = get("anon_rss_bytes")
    assert isinstance(anon, int) and 16 * 1024 * 1024 < anon <= LIMIT_BYTES + 8 * 1024 * 1024
    assert get("boot_id") == Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace(
        "-", ""
    )
    assert get("confirmed") is True


def test_real_memcg_oom_kill_is_reported_from_kmsg(real_kill: Kill) -> None:
    result = CliRunner().invoke(cli, ["oom", "--kmsg", "--json"])
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    mine = [e for e in document["events"] if e["pid"] == real_kill.pid]
    assert len(mine) == 1, document["events"]
    event = mine[0]
    _check_event(event, real_kill)
    # kmsg time = boot time + printk timestamp: must be "just now".
    killed_at = datetime.fromisoformat(event["time"].replace("Z", "+00:00"))
    assert abs((datetime.now(timezone.utc) - killed_at).total_seconds()) < 120
    if event["constraint"] is not None:
        assert event["constraint"] == "CONSTRAINT_MEMCG"

    gate = CliRunner().invoke(
        cli, ["oom", "--kmsg", "--process", real_kill.comm, "--fail-if-found"]
    )
    assert gate.exit_code == 1


def test_default_scan_without_journal_files_finds_it_in_kmsg(
    real_kill: Kill, tmp_path: Path
) -> None:
    """Issue 12: "No OOM kills found" on a host without journal files while /dev/kmsg held
    the kill. The journal lookup is pointed at an empty directory; the reading is real."""
    empty_journal = tmp_path / "journal"
    empty_journal.mkdir()
    since = datetime.now(timezone.utc) - timedelta(minutes=10)
    result = scan_default(since=since, journal_dirs=(str(empty_journal),))
    assert "kmsg" in result.sources
    assert f"no journal files in {empty_journal}" in result.notes
    mine = [e for e in result.events if e.pid == real_kill.pid]
    assert len(mine) == 1, result.events
    _check_event(mine[0], real_kill)
