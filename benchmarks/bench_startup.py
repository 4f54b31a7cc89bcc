#!/usr/bin/env python3
"""Start-up cost: ``memforensics --version`` and each command's imports, against a bare interpreter.

The manual way costs one interpreter start (``python -c pass``); everything memforensics
adds on top is what a user waits for before any work. Each row is the best of N runs in
fresh processes, measured in this same run:

* wall time of ``memforensics --version`` and of ``memforensics CMD --help`` (which imports
  the command) against ``python -c pass`` (ratio);
* the import time of each command module (``python -X importtime``, top-level imports summed,
  interpreter start-up imports subtracted), and the heaviest third-party imports it pulls in.

Asserts nothing; prints a table. Run: ``python benchmarks/bench_startup.py [--repeat N]``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

COMMANDS = ("inspect", "trim", "parse", "diff", "oom", "demo")
_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)$")
_ENTRY = "from memforensics.cli import main; import sys; sys.argv[0] = 'memforensics'; main()"


def _wall_seconds(argv: list[str], repeat: int) -> float:
    best = float("inf")
    env = dict(os.environ, NO_COLOR="1")
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False
        )
        best = min(best, time.perf_counter() - started)
    return best


def _imports(code: str) -> dict[str, int]:
    """Microseconds spent importing each module (its own time) in ``python -c code``."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True
    )
    found: dict[str, int] = {}
    for line in proc.stderr.splitlines():
        match = _LINE.match(line)
        if match:
            found[match.group(4)] = int(match.group(1))
    return found


def _import_seconds(module: str, repeat: int, baseline: set[str]) -> tuple[float, list[str]]:
    """Best total import time beyond the interpreter's own, and the packages it goes to."""
    best, heaviest = float("inf"), []
    for _ in range(repeat):
        found = {n: us for n, us in _imports(f"import {module}").items() if n not in baseline}
        total = sum(found.values()) / 1e6
        if total < best:
            best = total
            by_package: dict[str, int] = {}
            for name, us in found.items():
                package = name.split(".")[0]
                by_package[package] = by_package.get(package, 0) + us
            heaviest = [
                f"{name} {us / 1000:.0f}"
                for name, us in sorted(by_package.items(), key=lambda kv: -kv[1])[:5]
            ]
    return best, heaviest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs per row (best is kept)")
    args = parser.parse_args(argv)
    bare = _wall_seconds([sys.executable, "-c", "pass"], args.repeat)
    baseline = set(_imports("pass"))
    load = os.getloadavg()[0]
    print(f"bare interpreter (python -c pass): {bare * 1000:.0f} ms; load average {load:.1f}")
    header = f"{'case':<34} {'wall ms':>8} {'ratio':>7} {'imports ms':>11}  heaviest packages (ms)"
    print(header)
    print("-" * len(header))
    version = _wall_seconds([sys.executable, "-c", _ENTRY, "--version"], args.repeat)
    group, heavy = _import_seconds("memforensics.cli", args.repeat, baseline)
    print(
        f"{'memforensics --version':<34} {version * 1000:>8.0f} {version / bare:>6.2f}x"
        f" {group * 1000:>11.0f}  {', '.join(heavy)}"
    )
    for command in COMMANDS:
        wall = _wall_seconds([sys.executable, "-c", _ENTRY, command, "--help"], args.repeat)
        seconds, heavy = _import_seconds(f"memforensics.cli.{command}", args.repeat, baseline)
        print(
            f"{'memforensics ' + command + ' --help':<34} {wall * 1000:>8.0f} {wall / bare:>6.2f}x"
            f" {seconds * 1000:>11.0f}  {', '.join(heavy)}"
        )
    print(f"best of {args.repeat}; ratio = wall time / bare interpreter start in this run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
