"""Pause of `memforensics trim` against the manual recipe, on the same kind of target, same run.

The manual recipe is ``gdb -p PID -batch -ex 'call (int)malloc_trim(0)'``. Both trim a fresh
copy of the same fragmented target (the demo's ctypes child: N x 1 KiB written and freed but
the last, so ~N KiB of resident free pages). The pause is measured by the target itself: a
heartbeat thread sleeps 1 ms at a time and reports every gap longer than 10 ms, so both methods
are timed by the same clock, from the target's point of view, including gdb's attach and
detach. Wall time (what the operator waits) is printed too. Ratios < 1 mean memforensics
stops the target for less time than the manual recipe.

usage: python benchmarks/bench_trim.py [--buffers N] [--repeat R]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from memforensics.entry.trim import TrimSettings, trim_process
from memforensics.sources.proc import memory_figures

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.gdb_binary import use_test_gdb

# The demo's fragmentation, plus a heartbeat thread that measures how long it was stopped.
TARGET_CODE = r"""
import ctypes, sys, threading, time
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
count = int(sys.argv[1])
blocks = (ctypes.c_void_p * count)()
for i in range(count):
    blocks[i] = libc.malloc(1024)
    ctypes.memset(blocks[i], 0xA5, 1024)
for i in range(count - 1):
    libc.free(blocks[i])

def heartbeat():
    last = time.monotonic()
    while True:
        time.sleep(0.001)
        now = time.monotonic()
        if now - last > 0.010:
            print(f"gap {now - last:.6f}", flush=True)
        last = now

threading.Thread(target=heartbeat, daemon=True).start()
time.sleep(0.2)
print("ready", flush=True)
time.sleep(300)
"""


@dataclass
class Sample:
    """One trim of one fresh target."""

    pause_seconds: float  # longest stall the target saw
    wall_seconds: float  # how long the operator waited for the command
    released_bytes: int


@contextlib.contextmanager
def target(buffers: int) -> Iterator[subprocess.Popen[bytes]]:
    """A fresh fragmented target, killed in ``finally``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", TARGET_CODE, str(buffers)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith(b"ready"):
            raise RuntimeError("benchmark target did not start")
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def longest_gap(proc: subprocess.Popen[bytes], settle_seconds: float = 0.3) -> float:
    """The longest stall the target's heartbeat reported since the last call."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    gaps = [0.0]
    deadline = time.monotonic() + settle_seconds
    buffered = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            buffered += os.read(fd, 65536)
    for line in buffered.decode().splitlines():
        if line.startswith("gap "):
            gaps.append(float(line.split()[1]))
    return max(gaps)


def rss_bytes(pid: int) -> int:
    return memory_figures.read_memory(pid).rss_bytes or 0


def manual(buffers: int) -> Sample:
    """The recipe operators use today."""
    with target(buffers) as proc:
        longest_gap(proc, 0.1)
        before = rss_bytes(proc.pid)
        started = time.monotonic()
        subprocess.run(
            ["gdb", "-p", str(proc.pid), "-batch", "-ex", "call (int)malloc_trim(0)"],
            check=True,
            capture_output=True,
            stdin=subprocess.DEVNULL,
        )
        wall = time.monotonic() - started
        return Sample(longest_gap(proc), wall, before - rss_bytes(proc.pid))


def memforensics(buffers: int) -> Sample:
    """`memforensics trim PID`, through the same function the command runs."""
    with target(buffers) as proc:
        longest_gap(proc, 0.1)
        started = time.monotonic()
        result = trim_process(proc.pid, TrimSettings())
        wall = time.monotonic() - started
        return Sample(longest_gap(proc), wall, result.released_bytes or 0)


def main() -> int:
    """Run both methods alternately and print medians and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--buffers", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args, _ = parser.parse_known_args()
    use_test_gdb()  # the recipe's gdb: one that puts the thread back on this CPU
    if shutil.which("gdb") is None:
        print("bench_trim: gdb is not installed; nothing to compare", file=sys.stderr)
        return 0
    samples: dict[str, list[Sample]] = {"manual": [], "memforensics": []}
    for i in range(args.repeat):
        # Alternate the order so that neither method always runs on a warmer machine.
        order = (manual, memforensics) if i % 2 == 0 else (memforensics, manual)
        for method in order:
            samples[method.__name__].append(method(args.buffers))
    print(f"bench_trim: {args.buffers} x 1 KiB freed, {args.repeat} fresh targets per method")
    medians = {}
    for name, runs in samples.items():
        pause = statistics.median(s.pause_seconds for s in runs)
        wall = statistics.median(s.wall_seconds for s in runs)
        released = statistics.median(s.released_bytes for s in runs)
        medians[name] = (pause, wall)
        print(
            f"  {name:<13} pause {pause * 1000:7.1f} ms   wall {wall * 1000:7.1f} ms   "
            f"released {released / 2**20:6.1f} MiB"
        )
    pause_ratio = medians["memforensics"][0] / medians["manual"][0]
    wall_ratio = medians["memforensics"][1] / medians["manual"][1]
    print(f"  pause ratio memforensics/manual: {pause_ratio:.2f}")
    print(f"  wall ratio  memforensics/manual: {wall_ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
