"""A process `watch` records while it grows past a memory cgroup's limit until the kernel
OOM-kills it: the real kill the OOM tests read back (bounded: at most 600 MiB in 20 s)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# argv: the cgroup's procs file, the pause between 2 MiB blocks in seconds.
HOG = """
import os, sys, time
with open(sys.argv[1], "w") as procs:
    procs.write(str(os.getpid()))
print("ready", flush=True)
sys.stdin.readline()
chunks = []
deadline = time.monotonic() + 20
while len(chunks) < 300 and time.monotonic() < deadline:
    chunks.append(bytearray(2 << 20))  # zero-filled: every page is touched and charged
    time.sleep(float(sys.argv[2]))
sys.exit(3)
"""


@dataclass(frozen=True)
class WatchedKill:
    """The OOM-killed hog's PID and what its `watch` printed and returned."""

    pid: int
    watch_returncode: int
    watch_stdout: str
    watch_stderr: str


def watch_until_oom_killed(
    record: Path,
    *,
    interval: str,
    rss_interval: str,
    duration: str,
    grow_pause_seconds: float,
    first_sample_poll_seconds: float,
) -> WatchedKill:
    """Start the hog in a 64 MiB memory cgroup, `memforensics watch` it into ``record``,
    let it grow once the first heap sample is recorded, and return once the kernel killed
    it and `watch` ended. Both processes are killed in ``finally``."""
    from tests.integration.test_oom_kernel import memory_cgroup

    with memory_cgroup() as cgroup:
        hog = subprocess.Popen(
            [sys.executable, "-c", HOG, str(cgroup.procs), str(grow_pause_seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        watcher: subprocess.Popen[str] | None = None
        try:
            assert hog.stdout is not None and hog.stdin is not None
            assert hog.stdout.readline().startswith("ready")
            watch = ["watch", str(hog.pid), "--interval", interval, "--rss-interval"]
            watcher = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "memforensics",
                    *watch,
                    rss_interval,
                    "--duration",
                    duration,
                    "--record",
                    str(record),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            # Let the first heap sample in before the hog starts to grow.
            deadline = time.monotonic() + 30
            while not record.exists() or '"kind": "heap"' not in record.read_text():
                assert watcher.poll() is None, watcher.communicate()
                assert time.monotonic() < deadline, "no heap sample within 30 s"
                time.sleep(first_sample_poll_seconds)
            hog.stdin.write("go\n")
            hog.stdin.flush()
            assert hog.wait(timeout=60) == -signal.SIGKILL, "the hog was not OOM-killed"
            out, err = watcher.communicate(timeout=90)
        finally:
            for proc in (hog, watcher):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)
    return WatchedKill(hog.pid, watcher.returncode, out, err)
