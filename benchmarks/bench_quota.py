#!/usr/bin/env python3
"""`inspect` under a container's CPU limit, against the gdb recipe under the same limit.

A DaemonSet's pod (``collect``) or an operator's debug container runs with a CPU quota: the
kernel lets the cgroup run ``quota`` of CPU per ``period`` (100 ms) and then throttles it
until the next period. A process throttled while it holds a target still stalls the target
as long. Both ways run in a fresh cgroup of each quota (v1 cpu controller or v2 cpu.max),
the target outside it, on the 16-arena target of bench_inspect (bench_fragmented 16 20000),
alternating, N rounds each. Per quota: the target's longest stall (its own 1 ms ticker) and
the wall, medians, with their ratios to the recipe's; and whether the default read fell back
to the stand-in call.

Asserts nothing; prints a table. Run: ``python benchmarks/bench_quota.py [--rounds N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_inspect import Target, memforensics_command, recipe_argv, scratch_dir

from tests.support.targets import cpu_cgroup, in_cgroup

QUOTAS_CPUS = (None, 0.5, 0.2, 0.1)
PERIOD_US = 100_000


def _recipe(group: Path | None, pid: int, scratch: Path) -> tuple[float, str]:
    argv = recipe_argv(pid, scratch / f"malloc_info-{pid}.xml")
    began = time.perf_counter()
    subprocess.run(
        in_cgroup(group, argv) if group else argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    return time.perf_counter() - began, "recipe"


def _default(group: Path | None, pid: int, scratch: Path) -> tuple[float, str]:
    argv = [*memforensics_command(), "inspect", "--json", str(pid)]
    began = time.perf_counter()
    done = subprocess.run(
        in_cgroup(group, argv) if group else argv,
        capture_output=True,
        text=True,
        check=True,
        cwd=scratch,
    )
    wall = time.perf_counter() - began
    document = json.loads(done.stdout)
    return wall, "call" if document["fallback"] else "memory"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    target = Target("bench_fragmented", ["16", "20000"])
    print(f"bench_quota: 16 arenas (bench_fragmented 16 20000), {rounds} rounds, medians")
    print(
        f"{'quota':>9} {'method':>8} {'stall ms':>9} {'wall s':>7} "
        f"{'stall x':>8} {'wall x':>7}  read"
    )
    try:
        with scratch_dir() as scratch:
            for cpus in QUOTAS_CPUS:
                group = None
                if cpus is not None:
                    group = cpu_cgroup("memforensics-bench-quota", int(cpus * PERIOD_US), PERIOD_US)
                    if group is None:
                        print(f"{cpus:>9}: no cgroup with a CPU quota can be made here")
                        continue
                try:
                    runs: dict[str, list[tuple[float, float, str]]] = {"recipe": [], "default": []}
                    for _ in range(rounds):
                        for name, way in (("recipe", _recipe), ("default", _default)):
                            target.reset()
                            wall, how = way(group, target.pid, scratch)
                            runs[name].append((target.longest_gap_seconds(), wall, how))
                finally:
                    if group is not None:
                        with contextlib.suppress(OSError):
                            group.rmdir()
                label = "none" if cpus is None else f"{cpus} CPU"
                recipe_stall = statistics.median(r[0] for r in runs["recipe"])
                recipe_wall = statistics.median(r[1] for r in runs["recipe"])
                for name, rows in runs.items():
                    stall = statistics.median(r[0] for r in rows)
                    wall = statistics.median(r[1] for r in rows)
                    hows = ", ".join(sorted({r[2] for r in rows}))
                    print(
                        f"{label:>9} {name:>8} {stall * 1e3:>9.1f} {wall:>7.2f} "
                        f"{stall / recipe_stall:>8.3f} {wall / recipe_wall:>7.2f}  {hows}",
                        flush=True,
                    )
    finally:
        target.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
