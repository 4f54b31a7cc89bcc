#!/usr/bin/env python3
"""Start-up cost: ``memforensics --version`` and each command's imports, against a bare interpreter.

The manual way costs one interpreter start (``python -c pass``); everything memforensics
adds on top is what a user waits for before any work. Each row is the best of N runs in
fresh processes, measured in this same run:

* wall time of ``memforensics --version``, of ``memforensics CMD --help`` (which imports
  the command) and of ``memforensics parse --json`` of a small saved dump (which imports the
  model too) against ``python -c pass`` (ratio), through the program's entry point as the
  console script runs it: with this user's cache of dataclasses' compiled methods
  (sources/files/code_cache.py, warmed by a first run) and without it (every method compiled,
  as before the cache; the manual way for that column);
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
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.unit.test_malloc_xml import MODERN

COMMANDS = ("inspect", "trim", "parse", "diff", "oom", "demo")
_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)$")
_ENTRY = "from memforensics.__main__ import main; import sys; sys.argv[0] = 'memforensics'; main()"
# A cache folder that cannot exist (a path under a device): no table is read or written.
_NO_CACHE = "/dev/null/no-cache"


def _wall_seconds(argv: list[str], repeat: int, cache_home: str) -> float:
    best = float("inf")
    env = dict(os.environ, NO_COLOR="1", XDG_CACHE_HOME=cache_home)
    subprocess.run(argv, capture_output=True, env=env, check=False)  # (warms a cache)
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


def _row(label: str, argv: list[str], repeat: int, bare: float, cache_home: str) -> str:
    wall = _wall_seconds(argv, repeat, cache_home)
    cold = _wall_seconds(argv, repeat, _NO_CACHE)
    return (
        f"{label:<34} {wall * 1000:>8.0f} {wall / bare:>6.2f}x {cold * 1000:>9.0f}"
        f" {cold / bare:>6.2f}x"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs per row (best is kept)")
    args = parser.parse_args(argv)
    bare = _wall_seconds([sys.executable, "-c", "pass"], args.repeat, _NO_CACHE)
    baseline = set(_imports("pass"))
    load = os.getloadavg()[0]
    print(f"bare interpreter (python -c pass): {bare * 1000:.0f} ms; load average {load:.1f}")
    header = (
        f"{'case':<34} {'wall ms':>8} {'ratio':>7} {'no cache':>9} {'ratio':>7}"
        f" {'imports ms':>11}  heaviest packages (ms)"
    )
    print(header)
    print("-" * len(header))
    program = [sys.executable, "-c", _ENTRY]
    with tempfile.TemporaryDirectory() as scratch:
        cache_home = os.path.join(scratch, "cache")
        version = _row(
            "memforensics --version", [*program, "--version"], args.repeat, bare, cache_home
        )
        group, heavy = _import_seconds("memforensics.cli", args.repeat, baseline)
        print(f"{version} {group * 1000:>11.0f}  {', '.join(heavy)}")
        for command in COMMANDS:
            row = _row(
                f"memforensics {command} --help",
                [*program, command, "--help"],
                args.repeat,
                bare,
                cache_home,
            )
            seconds, heavy = _import_seconds(f"memforensics.cli.{command}", args.repeat, baseline)
            print(f"{row} {seconds * 1000:>11.0f}  {', '.join(heavy)}")
        dump = Path(scratch) / "dump.xml"
        dump.write_bytes(MODERN)
        row = _row(
            "memforensics parse --json DUMP",
            [*program, "parse", "--json", str(dump)],
            args.repeat,
            bare,
            cache_home,
        )
        print(row)
    print(
        f"best of {args.repeat}; ratio = wall time / bare interpreter start in this run; "
        "no cache: every dataclass method compiled (imports ms: without the cache)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
