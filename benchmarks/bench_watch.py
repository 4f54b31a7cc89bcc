"""What a watch costs the target: pause per heap sample and share of wall time, against the
manual way of sampling a heap over time (the gdb recipe in a loop), in the same run.

The target is tests/targets/bench_fragmented.c (worker threads with fragmented heaps, and a
ticker thread that measures the longest time the process was kept from running). Two runs of
``--samples`` samples, ``--interval`` apart, on the same process:

* ``memforensics watch PID --interval I --count N --json``: the pause it reports for each
  heap sample (gdb's stop, measured by memforensics) and the ticker's longest gap;
* the recipe ``gdb -p PID -batch -ex 'call malloc_info(0, fopen(…))'`` every I seconds, with
  the ticker's longest gap per round as its pause (the recipe measures nothing itself).

Prints pause per sample (median, max), the share of wall time the target was stopped, and the
ratios memforensics/recipe. Asserts nothing.

usage: python benchmarks/bench_watch.py [--samples N] [--interval S] [--threads T] [--blocks B]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_inspect import Target, run_recipe  # noqa: E402


def watch_run(target: Target, samples: int, interval: float) -> dict[str, float]:
    target.reset()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "memforensics",
            "watch",
            str(target.pid),
            "--interval",
            f"{interval}s",
            "--count",
            str(samples),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    gap = target.longest_gap_seconds()
    document = json.loads(result.stdout)
    elapsed = document["watch"]["elapsed_seconds"]
    return {
        "pause_total": document["pause_seconds"],
        "pause_per_sample": document["pause_per_sample_seconds"],
        "elapsed": elapsed,
        "longest_gap": gap,
    }


def recipe_run(target: Target, samples: int, interval: float) -> dict[str, float]:
    gaps = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-watch-") as tmp:
        for index in range(samples):
            target.reset()
            run_recipe(target.pid, Path(tmp))
            gaps.append(target.longest_gap_seconds())
            next_start = started + (index + 1) * interval
            time.sleep(max(next_start - time.monotonic(), 0.0))
    elapsed = time.monotonic() - started - interval  # the last wait is not part of the run
    return {
        "pause_total": sum(gaps),
        "pause_per_sample": statistics.median(gaps),
        "elapsed": elapsed,
        "longest_gap": max(gaps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=20000)
    args = parser.parse_args()
    target = Target("bench_fragmented", [str(args.threads), str(args.blocks)])
    try:
        ours = watch_run(target, args.samples, args.interval)
        recipe = recipe_run(target, args.samples, args.interval)
    finally:
        target.close()
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"{args.samples} heap samples every {args.interval:g} s, {args.threads} threads")
    for name, run in (("memforensics watch", ours), ("gdb recipe loop", recipe)):
        share = run["pause_total"] / run["elapsed"] if run["elapsed"] > 0 else 0.0
        print(
            f"  {name:20s} pause/sample {run['pause_per_sample'] * 1000:7.1f} ms  "
            f"longest gap {run['longest_gap'] * 1000:7.1f} ms  "
            f"stopped {share:6.2%} of {run['elapsed']:.1f} s"
        )
    print(
        f"ratio memforensics/recipe: pause per sample "
        f"{ours['pause_per_sample'] / recipe['pause_per_sample']:.2f}, "
        f"longest gap {ours['longest_gap'] / recipe['longest_gap']:.2f}"
    )


if __name__ == "__main__":
    main()
