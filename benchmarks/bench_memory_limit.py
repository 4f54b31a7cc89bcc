#!/usr/bin/env python3
"""`inspect` under a container's memory limit: does our side finish, how, and at what peak.

A DaemonSet's pod or a debug container runs with a memory limit; past it the kernel
OOM-kills our side in the middle of a read, with nothing printed. The default `inspect` runs
alone in a fresh memory cgroup of each limit (v1 or v2), the target in its own (bench_seeds'
shapes: 32 x 100 MiB idle, the 2-million-chunk unsorted bin), once per limit. Per shape and
limit: how the read ended (read from memory; given up and the stand-in call; killed by the
kernel) and the cgroup's peak usage, the kernel's figure. The manual way, the gdb recipe,
holds no copy of the heap: its own peak is printed for the same limits' comparison.

Asserts nothing; prints a table. Run: ``python benchmarks/bench_memory_limit.py [--shapes
32x100,2m] [--limits 256,128,96,64,48]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_inspect import memforensics_command, recipe_argv, scratch_dir
from bench_seeds import SHAPES, CgroupTarget

from tests.support.targets import in_cgroup, memory_cgroup

MIB = 1 << 20


def _peak_bytes(group: Path) -> int:
    for name in ("memory.max_usage_in_bytes", "memory.peak"):  # v1, v2 (5.19+)
        with contextlib.suppress(OSError, ValueError):
            return int((group / name).read_text())
    return -1


def _run(argv: list[str], limit_mib: int, scratch: Path) -> tuple[str, int]:
    """How ``argv`` ended in a fresh cgroup of ``limit_mib``, and the cgroup's peak bytes."""
    group = memory_cgroup("memforensics-bench-memlimit", limit_mib * MIB)
    if group is None:
        return "no memory cgroup can be made here", -1
    try:
        done = subprocess.run(
            in_cgroup(group, argv), check=False, capture_output=True, text=True, cwd=scratch
        )
        peak = _peak_bytes(group)
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    if done.returncode < 0:
        return f"killed (signal {-done.returncode})", peak
    if done.returncode != 0:
        return f"exit {done.returncode}", peak
    with contextlib.suppress(ValueError, KeyError):
        fallback = json.loads(done.stdout)["fallback"]
        if fallback:
            return f"the call: {fallback['reason'][-70:]}", peak
        return "read from memory", peak
    return "done", peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="32x100,2m")
    parser.add_argument("--limits", default="256,128,96,64,48")
    args = parser.parse_args()
    limits = [int(value) for value in args.limits.split(",")]
    print("bench_memory_limit: our side alone in a memory cgroup of each limit, once each")
    print(f"{'shape':>8} {'method':>8} {'limit':>9} {'peak':>9}  how it ended")
    with scratch_dir() as scratch:
        for key in args.shapes.split(","):
            shape = next(s for s in SHAPES if s.key == key)
            target = CgroupTarget(shape)
            try:
                recipe = recipe_argv(target.pid, scratch / "out.xml")
                for limit in limits:
                    for name, argv in (
                        (
                            "default",
                            [*memforensics_command(), "inspect", "--json", str(target.pid)],
                        ),
                        ("recipe", recipe),
                    ):
                        how, peak = _run(argv, limit, scratch)
                        print(
                            f"{key:>8} {name:>8} {limit:>5} MiB {peak / MIB:>5.0f} MiB  {how}",
                            flush=True,
                        )
            finally:
                target.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
