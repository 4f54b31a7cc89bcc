"""Pause and wall time of `memforensics inspect` vs the manual gdb recipe: same target, same run.

The target (tests/targets/bench_fragmented.c) has 16 worker threads, each with a fragmented heap
in its own arena, and a ticker thread that wakes every millisecond and records the longest gap
between two wake-ups: the longest time the process was kept from running, measured by the
target's own clock. Each round runs, on that one process, the manual recipe

    gdb -p PID -batch -ex 'set $f=(void*)fopen(FILE,"w")' \\
        -ex 'call (int)malloc_info(0,$f)' -ex 'call (int)fclose($f)'

and `memforensics inspect --json PID`, plus the gdb session alone (``capture_malloc_info`` in a
fresh Python, no /proc reading or report), reversing the order every other round; the ticker's
gap is reset before each and read after. Prints medians and the ratios memforensics/recipe
(targets: pause <= 0.1, wall <= 1.0). Asserts nothing.

usage: python benchmarks/bench_inspect.py [--rounds N] [--threads T] [--blocks B]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.targets import compile_target  # noqa: E402


class Target:
    """The benchmark target, driven through its stdin ("reset", "gap")."""

    def __init__(self, threads: int, blocks: int) -> None:
        binary = compile_target("bench_fragmented")
        self.proc = subprocess.Popen(
            [str(binary), str(threads), str(blocks)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if not line.startswith("ready"):
            raise RuntimeError(f"target did not start: {line!r}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _say(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()

    def reset(self) -> None:
        self._say("reset")
        time.sleep(0.05)  # let the ticker settle after the reset

    def longest_gap_seconds(self) -> float:
        time.sleep(0.05)  # a few ticks after the method: the gap is closed and recorded
        self._say("gap")
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode().split()
        return int(line[1]) / 1e6

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def run_recipe(pid: int, scratch: Path) -> None:
    """The manual recipe from the issue, exactly as an operator types it."""
    out = scratch / f"malloc_info-{pid}.xml"
    subprocess.run(
        [
            "gdb",
            "-p",
            str(pid),
            "-batch",
            "-ex",
            f'set $f=(void*)fopen("{out}","w")',
            "-ex",
            "call (int)malloc_info(0,$f)",
            "-ex",
            "call (int)fclose($f)",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    if not out.read_bytes().startswith(b"<malloc"):
        raise RuntimeError("the recipe wrote no malloc_info XML")


def run_memforensics(pid: int, _scratch: Path) -> None:
    """`memforensics inspect --json PID`, a fresh process as an operator runs it."""
    subprocess.run(
        [sys.executable, "-m", "memforensics", "inspect", "--json", str(pid)],
        stdout=subprocess.DEVNULL,
        check=True,
        cwd=REPO,
    )


_CAPTURE_ONLY = (
    "import sys; from memforensics.sources.gdb import capture_malloc_info; "
    "sys.stdout.buffer.write(capture_malloc_info(int(sys.argv[1])).xml)"
)


def run_capture_only(pid: int, _scratch: Path) -> None:
    """Only the gdb session (attach, malloc_info, detach), without /proc reading and report."""
    subprocess.run(
        [sys.executable, "-c", _CAPTURE_ONLY, str(pid)],
        stdout=subprocess.DEVNULL,
        check=True,
        cwd=REPO,
    )


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="bench-inspect-") as name:
        yield Path(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=20000, help="blocks per worker thread")
    args = parser.parse_args()
    if shutil.which("gdb") is None:
        print("bench_inspect: gdb is not installed; nothing to measure", file=sys.stderr)
        return 0
    methods: dict[str, Callable[[int, Path], None]] = {
        "recipe": run_recipe,
        "memforensics": run_memforensics,
        "capture-only": run_capture_only,
    }
    pauses: dict[str, list[float]] = {name: [] for name in methods}
    walls: dict[str, list[float]] = {name: [] for name in methods}
    target = Target(args.threads, args.blocks)
    try:
        with scratch_dir() as scratch:
            for method in methods.values():  # warm-up: page cache, compiled target
                method(target.pid, scratch)
            for round_index in range(args.rounds):
                names = list(methods)
                order = names if round_index % 2 == 0 else names[::-1]
                for name in order:
                    target.reset()
                    started = time.monotonic()
                    methods[name](target.pid, scratch)
                    walls[name].append(time.monotonic() - started)
                    pauses[name].append(target.longest_gap_seconds())
    finally:
        target.close()
    print(
        f"bench_inspect: {args.threads} threads x {args.blocks} blocks, {args.rounds} rounds, "
        f"{os.cpu_count()} CPUs; medians (target's longest gap = pause)"
    )
    print(f"  {'method':<14}{'pause ms':>10}{'wall ms':>10}")
    for name in methods:
        print(
            f"  {name:<14}{statistics.median(pauses[name]) * 1000:>10.1f}"
            f"{statistics.median(walls[name]) * 1000:>10.1f}"
        )
    pause_ratio = statistics.median(pauses["memforensics"]) / statistics.median(pauses["recipe"])
    wall_ratio = statistics.median(walls["memforensics"]) / statistics.median(walls["recipe"])
    print(f"  pause ratio memforensics/recipe: {pause_ratio:.3f}  (target <= 0.100)")
    print(f"  wall ratio  memforensics/recipe: {wall_ratio:.3f}  (target <= 1.000)")
    capture_wall = statistics.median(walls["capture-only"]) / statistics.median(walls["recipe"])
    print(f"  wall ratio  capture-only/recipe: {capture_wall:.3f}  (the gdb session alone)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
