"""Stop and wall time of `memforensics inspect` (its default, from memory, and its gdb path) vs
the manual gdb recipe: same target, same run.

Three cases, each a target with a ticker thread that wakes every millisecond and records the
longest gap between two wake-ups: the longest stop the process felt, by its own clock.

* 16 arenas: tests/targets/bench_fragmented.c, 16 worker threads with fragmented heaps
  (targets: stop <= 0.1x the recipe's, wall <= 1.0x);
* 1,500 arenas: tests/targets/many_arenas.c, 1,500 threads under
  GLIBC_TUNABLES=glibc.malloc.arena_max=1500, each with its own arena of sorted free chunks,
  a malloc_info document of several MB (targets: stop <= 0.2x, wall <= 2.0x);
* 2 million free chunks: many_arenas.c, one arena, every other 24-byte block freed in a
  scattered order (malloc_info walks 2 million chunks).

Each round runs, on that one process, the manual recipe

    gdb -p PID -batch -ex 'set $f=(void*)fopen(FILE,"w")' \\
        -ex 'call (int)malloc_info(0,$f)' -ex 'call (int)fclose($f)'

and `memforensics inspect --gdb gdb --json PID` (the gdb path; the bars above), plus the gdb
session alone (``capture_malloc_info`` in a fresh Python, no /proc reading or report) and
`memforensics inspect --json PID`, the default, which reads memory with no gdb (issue 22's
bars, stop <= 0.05x and wall <= 0.3x at 16 arenas, 0.05x and 0.5x at 1,500; the live path's
stop must also stay within the gdb path's bars), reversing the order every other round; the
ticker's
gap is reset before each and read after. Prints medians and the ratios memforensics/recipe.
Asserts nothing.

Also prints each round's own ratio (memforensics and the recipe ran back to back in it), whose
median is steadier than the ratio of medians on a host whose speed drifts.

usage: python benchmarks/bench_inspect.py [--rounds N] [--cases 16,1500,2m]
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
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.gdb_binary import use_test_gdb  # noqa: E402
from tests.support.targets import compile_target  # noqa: E402


class Target:
    """A benchmark target, driven through its stdin ("reset", "gap")."""

    def __init__(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        binary = compile_target(name)
        self.proc = subprocess.Popen(
            [str(binary), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, **(env or {})},
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


@dataclass(frozen=True)
class Case:
    """One benchmark case: a target and the issue's bars for it."""

    key: str
    title: str
    target: str
    args: list[str]
    env: dict[str, str]
    stop_bar: float | None
    wall_bar: float | None
    rounds: int = 5  # the 16-arena case is quick and noisy on a shared host: it gets more
    # `inspect`'s default (no gdb; issue 22's bars): its stop and wall against the recipe.
    read_only_stop_bar: float | None = None
    read_only_wall_bar: float | None = None


CASES = (
    Case(
        "16",
        "16 arenas",
        "bench_fragmented",
        ["16", "20000"],
        {},
        0.1,
        1.0,
        rounds=15,
        read_only_stop_bar=0.05,
        read_only_wall_bar=0.3,
    ),
    Case(
        "1500",
        "1,500 arenas",
        "many_arenas",
        ["1500", "600"],
        {"GLIBC_TUNABLES": "glibc.malloc.arena_max=1500"},
        0.2,
        2.0,
        read_only_stop_bar=0.05,
        read_only_wall_bar=0.5,
    ),
    Case("2m", "2 million free chunks", "many_arenas", ["1", "4000000", "24"], {}, None, None),
)


def recipe_argv(pid: int, out: Path) -> list[str]:
    """The manual recipe from the issue, exactly as an operator types it: the target's
    malloc_info written to ``out`` by gdb."""
    return [
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
    ]


def run_recipe(pid: int, scratch: Path) -> None:
    """The manual recipe (recipe_argv), its document checked."""
    out = scratch / f"malloc_info-{pid}.xml"
    subprocess.run(
        recipe_argv(pid, out),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    if not out.read_bytes().startswith(b"<malloc"):
        raise RuntimeError("the recipe wrote no malloc_info XML")


def memforensics_command() -> list[str]:
    """The installed `memforensics` console script, as an operator types it; ``python -m
    memforensics`` only where there is none (it also loads runpy: ~10 ms more to start)."""
    script = Path(sys.executable).parent / "memforensics"
    return [str(script)] if script.exists() else [sys.executable, "-m", "memforensics"]


def run_memforensics(pid: int, scratch: Path) -> None:
    """`memforensics inspect --gdb gdb --json PID`, a fresh process as an operator runs it:
    the package as installed (``nox -s bench`` installs it as the README does, bytecode
    compiled by pip), run from a directory that does not shadow it with the source tree."""
    subprocess.run(
        [*memforensics_command(), "inspect", "--gdb", "gdb", "--json", str(pid)],
        stdout=subprocess.DEVNULL,
        check=True,
        cwd=scratch,
    )


def run_read_only(pid: int, scratch: Path) -> None:
    """`memforensics inspect --json PID`, the default: no gdb, the target held per arena
    (--read-only: a refused read would be an error here, not a gdb session)."""
    subprocess.run(
        [*memforensics_command(), "inspect", "--read-only", "--json", str(pid)],
        stdout=subprocess.DEVNULL,
        check=True,
        cwd=scratch,
    )


_CAPTURE_ONLY = (
    "import sys; from memforensics.sources.gdb.gdb_capture import capture_malloc_info; "
    "sys.stdout.buffer.write(capture_malloc_info(int(sys.argv[1])).xml)"
)


def run_capture_only(pid: int, scratch: Path) -> None:
    """Only the gdb session (attach, malloc_info, detach), without /proc reading and report."""
    subprocess.run(
        [sys.executable, "-c", _CAPTURE_ONLY, str(pid)],
        stdout=subprocess.DEVNULL,
        check=True,
        cwd=scratch,
    )


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="bench-inspect-") as name:
        yield Path(name)


def measure(case: Case, rounds: int) -> tuple[dict[str, tuple[float, float]], list[float]]:
    """method -> (median stop felt, median wall) seconds, on one target for the case; and
    each round's wall ratio memforensics/recipe (the two ran back to back in it)."""
    methods: dict[str, Callable[[int, Path], None]] = {
        "recipe": run_recipe,
        "gdb path": run_memforensics,
        "capture-only": run_capture_only,
        "default": run_read_only,
    }
    pauses: dict[str, list[float]] = {name: [] for name in methods}
    walls: dict[str, list[float]] = {name: [] for name in methods}
    target = Target(case.target, case.args, case.env)
    try:
        with scratch_dir() as scratch:
            for method in methods.values():  # warm-up: page cache, compiled target
                method(target.pid, scratch)
            for round_index in range(rounds):
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
    medians = {
        name: (statistics.median(pauses[name]), statistics.median(walls[name])) for name in methods
    }
    paired = [
        ours / recipe for ours, recipe in zip(walls["gdb path"], walls["recipe"], strict=True)
    ]
    return medians, paired


def report(
    case: Case, rounds: int, medians: dict[str, tuple[float, float]], paired: list[float]
) -> None:
    print(f"{case.title} ({case.target} {' '.join(case.args)}), {rounds} rounds, medians:")
    print(f"  {'method':<14}{'stop ms':>10}{'wall ms':>10}")
    for name, (stop, wall) in medians.items():
        print(f"  {name:<14}{stop * 1000:>10.1f}{wall * 1000:>10.1f}")
    recipe_stop, recipe_wall = medians["recipe"]
    stop, wall = medians["gdb path"]
    stop_bar = f"  (target <= {case.stop_bar:.3f})" if case.stop_bar is not None else ""
    wall_bar = f"  (target <= {case.wall_bar:.3f})" if case.wall_bar is not None else ""
    print(f"  stop ratio gdb path/recipe: {stop / recipe_stop:.3f}{stop_bar}")
    print(f"  wall ratio gdb path/recipe: {wall / recipe_wall:.3f}{wall_bar}")
    if len(paired) >= 4:
        low, middle, high = statistics.quantiles(paired, n=4)
        print(
            f"  the same ratio round by round (both ran back to back): median {middle:.3f},"
            f" quartiles {low:.3f}-{high:.3f}"
        )
    capture = medians["capture-only"][1] / recipe_wall
    print(f"  wall ratio capture-only/recipe: {capture:.3f}  (the gdb session alone)")
    stop, wall = medians["default"]
    for what, ratio, bar, live_bar in (
        ("stop", stop / recipe_stop, case.read_only_stop_bar, case.stop_bar),
        ("wall", wall / recipe_wall, case.read_only_wall_bar, case.wall_bar),
    ):
        target = f"  (target <= {bar:.3f}" if bar is not None else ""
        if live_bar is not None:
            target += f"{'; ' if target else '  ('}live path <= {live_bar:.3f})"
        elif target:
            target += ")"
        print(f"  {what} ratio default/recipe: {ratio:.3f}{target}")


def main() -> int:
    use_test_gdb()  # the same gdb for memforensics and the recipe
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds", type=int, help="rounds of every case (default: 15 for 16, 5 else)"
    )
    parser.add_argument("--cases", default="16,1500,2m", help="comma-separated: 16, 1500, 2m")
    args = parser.parse_args()
    if shutil.which("gdb") is None:
        print("bench_inspect: gdb is not installed; nothing to measure", file=sys.stderr)
        return 0
    wanted = set(args.cases.split(","))
    print(f"bench_inspect: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"  memforensics runs as: {' '.join(memforensics_command())}")
    for case in CASES:
        if case.key in wanted:
            rounds = args.rounds or case.rounds
            report(case, rounds, *measure(case, rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
