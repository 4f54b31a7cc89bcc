#!/usr/bin/env python3
"""`inspect` under a container's CPU limit, against the gdb recipe under the same limit.

A DaemonSet's pod (``collect``) or an operator's debug container runs with a CPU quota: the
kernel lets the cgroup run ``quota`` of CPU per ``period`` (100 ms) and then throttles it
until the next period. A process throttled while it holds a target still stalls the target
as long. Both ways run in a fresh cgroup of each quota (v1 cpu controller or v2 cpu.max),
the target outside it, alternating, N rounds each, on two targets:

* 16 arenas: bench_inspect's (bench_fragmented 16 20000), arenas of 20 MiB copied whole in
  their stops;
* 32 x 100 MiB: bench_seeds' idle shape, scouted arenas whose stops copy their lists' pages,
  cut into parts under a small quota (cpu_quota.stop_copy_max_bytes).

Per quota: the target's longest stall (its own 1 ms ticker) and the wall, medians, with their
ratios to the recipe's; and whether the default read fell back to the stand-in call.

Asserts nothing; prints a table. Run:
``python benchmarks/bench_quota.py [--rounds N] [--targets 16,32x100]`` (``--targets``
takes any of bench_seeds' shapes: ``1500``, ``8x1g``, …).
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
from bench_seeds import SHAPES, CgroupTarget

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


class _SeedsTarget:
    """bench_seeds' target of one shape, with bench_inspect's Target's face (pid, reset,
    longest_gap_seconds, close)."""

    def __init__(self, key: str) -> None:
        self.title = next(shape.title for shape in SHAPES if shape.key == key)
        self._target = CgroupTarget(next(shape for shape in SHAPES if shape.key == key))
        self.pid = self._target.proc.pid

    def reset(self) -> None:
        self._target.reset()

    def longest_gap_seconds(self) -> float:
        return self._target.longest_gap_seconds()

    def close(self) -> None:
        self._target.close()


def _bench(target: Target | _SeedsTarget, title: str, rounds: int) -> None:
    print(f"bench_quota: {title}, {rounds} rounds, medians")
    print(
        f"{'quota':>9} {'method':>8} {'stall ms':>9} {'wall s':>7} "
        f"{'stall x':>8} {'wall x':>7}  read"
    )
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    seeds = [shape.key for shape in SHAPES]
    parser.add_argument(
        "--targets",
        default="16,32x100",
        help=f"comma-separated: 16, or bench_seeds' shapes ({', '.join(seeds)})",
    )
    arguments = parser.parse_args()
    for key in arguments.targets.split(","):
        if key == "16":
            target: Target | _SeedsTarget = Target("bench_fragmented", ["16", "20000"])
            title = "16 arenas (bench_fragmented 16 20000)"
        elif key in seeds:
            target = _SeedsTarget(key)
            title = f"{target.title} (bench_seeds' shape)"
        else:
            parser.error(f"unknown target {key!r}: 16, {', '.join(seeds)}")
        try:
            _bench(target, title, arguments.rounds)
        finally:
            target.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
