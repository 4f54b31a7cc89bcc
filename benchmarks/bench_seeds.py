"""`memforensics inspect` on the seeds' heap shapes (issue 31), against the manual gdb recipe in
the same run: the target's longest stall, the wall time and memforensics' own peak RSS.

The shapes, each one target process in a memory cgroup sized for it (when one can be made):

* "N x M MiB idle/busy": tests/targets/seeds_heap.c, N threads each with its own arena
  (glibc.malloc.arena_max=N+1) of M MiB under a raised mmap threshold
  (glibc.malloc.mmap_threshold, 32 MiB by default: the most mallopt and glibc's dynamic
  threshold reach), big blocks (0.5-32 MiB) and small ones, some of each freed between live
  ones; idle workers sleep, busy ones keep freeing and mallocing small blocks in their arena;
* "N x M MiB, spread lists": seeds_heap.c's spread shape, arenas above the copies' budget
  (192 MiB) whose free lists lie on about a third of their pages (a small free chunk between
  live blocks of 12 KiB);
* "1,500 arenas": tests/targets/many_arenas.c as benchmarks/bench_inspect.py runs it;
* "2M-chunk unsorted bin": seeds_heap.c's main-arena shape, every other one of 4 million
  small blocks freed in a scattered order and left in the unsorted bin (the main thread
  never mallocs again); "..., address order": the same freed in address order (read in
  relays, memforensics.sources.glibc.bin_relay); "..., busy": either with a thread that
  keeps mallocing and freeing small blocks in that arena (glibc.malloc.arena_max=1): its first
  mallocs sort the 2 million chunks into the small bins, then it takes from them and gives
  back, a few hundred blocks a millisecond;
* "held-out" and "held-out-busy": a seeds shape drawn from ``--seed`` (else from a seed
  drawn now, printed), 4-10 arenas of 100 MiB to 1 GiB with their own counts of small frees
  and share of small blocks, idle and busy: a heap no read was tuned on;
* not run by default: the 32 x 100 MiB shape under a 64 MiB threshold (accepted by the
  tunable, beyond what mallopt accepts), 64 x 100 MiB idle (the Epsio post's 64 arenas at
  its smallest arena size: 6.4 GiB of heap), bench_inspect's 2-million-chunk small bin, the
  unsorted shape with 3.1 million chunks (3m: more than a sweep keeps, so the default's read
  is refused and its stand-in call made, after the lists are proved in its hold), and
  "8 x 1 GiB, no pause" (8x1g-saturated: the busy workers churn without sleeping, every CPU
  the target's, so the read's scouts and catch-ups run on what is left).

Each round runs, on the one target of the shape, in an order reversed every other round:

* the recipe (bench_inspect.run_recipe: gdb calls malloc_info into a file); and the same with
  gdb told to read no separate debug symbols ("bare gdb"): where libc's debug package is
  installed (this machine's glibc), gdb reads it while the target is stopped, and that is most
  of the recipe's stall; the bars stay the recipe's, as an operator types it here;
* `memforensics inspect --json PID`, the default: memory read; where that read is refused,
  the target's malloc_info called without gdb (the JSON's ``fallback`` and stderr's note say
  so; then that call's figures count);
* `memforensics inspect --read-only --json PID`: no call; a refusal is its exit code and
  stderr's error line, and counts as not met.

Measured for each: the longest gap the target's own ticker saw (reset before, read after: the
stop the process felt, whoever caused it; each round also reads it over a second with no
reader, the shape's own noise), the wall time, and, for memforensics, the peak RSS of its
process (``os.wait4``'s ru_maxrss of the child); in the note column, the read's own word (its
JSON): its longest stop, its stops, and the parts of arenas read in parts (the ticker's gap is
that stop and whatever else kept the ticker waiting: a busy target's own threads compete for
its CPUs). Prints per shape the medians, the ratios to
the recipe and the issue's bars: stall <= max(0.1 x recipe's, 15 ms), wall <= 1.5 x
recipe's, peak RSS <= 256 MiB. Asserts nothing. Every target started is killed in ``finally``.

usage: python benchmarks/bench_seeds.py [--rounds N] [--shapes 32x100,32x100-busy,...]
                                       [--glibc 2.31|2.36|2.41] [--seed N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_inspect import Target, memforensics_command, recipe_argv, run_recipe  # noqa: E402

from tests.support import glibc_releases  # noqa: E402
from tests.support.gdb_binary import use_test_gdb  # noqa: E402
from tests.support.held_out import HeldOut  # noqa: E402
from tests.support.targets import compile_target, memory_cgroup  # noqa: E402

MIB = 1 << 20
THRESHOLD_BYTES = 32 * MIB  # glibc.malloc.mmap_threshold of the arena shapes
STALL_FLOOR_SECONDS = 0.015
STALL_RATIO_BAR = 0.1
WALL_RATIO_BAR = 1.5
RSS_BAR_BYTES = 256 * MIB
CHILD_TIMEOUT_SECONDS = 600.0
READY_TIMEOUT_SECONDS = 300.0
QUIET_SECONDS = 1.0  # each round also reads the ticker's gap over this long with no reader


@dataclass(frozen=True)
class Shape:
    """One heap shape: the target that builds it and the memory cgroup limit it runs under."""

    key: str
    title: str
    target: str
    args: list[str]
    tunables: str
    limit_mib: int
    env: tuple[tuple[str, str], ...] = ()  # added to the target's environment


def _arenas(key: str, title: str, threads: int, mib: int, busy: bool, threshold: int) -> Shape:
    return Shape(
        key,
        title,
        "seeds_heap",
        [str(threads), str(mib), "1" if busy else "0"],
        f"glibc.malloc.arena_max={threads + 1}:glibc.malloc.mmap_threshold={threshold}",
        threads * mib + 768,
    )


SHAPES = (
    _arenas("32x100", "32 x 100 MiB idle", 32, 100, False, THRESHOLD_BYTES),
    _arenas("32x100-busy", "32 x 100 MiB busy", 32, 100, True, THRESHOLD_BYTES),
    _arenas("8x1g", "8 x 1 GiB idle", 8, 1024, False, THRESHOLD_BYTES),
    _arenas("8x1g-busy", "8 x 1 GiB busy", 8, 1024, True, THRESHOLD_BYTES),
    replace(
        _arenas("8x1g-saturated", "8 x 1 GiB, no pause", 8, 1024, True, THRESHOLD_BYTES),
        env=(("SEEDS_CHURN", "1000000"),),  # each worker churns without a pause: CPUs all busy
    ),
    Shape(
        "4x384-spread",
        "4 x 384 MiB, spread lists",
        "seeds_heap",
        ["spread", "4", "384"],
        f"glibc.malloc.arena_max=5:glibc.malloc.mmap_threshold={THRESHOLD_BYTES}",
        4 * 384 + 768,
    ),
    Shape(
        "1500", "1,500 arenas", "many_arenas", ["1500", "600"], "glibc.malloc.arena_max=1500", 2048
    ),
    Shape("2m", "2M-chunk unsorted bin", "seeds_heap", ["unsorted", "4000000"], "", 2048),
    Shape(
        "2m-ordered",
        "2M-chunk unsorted bin, address order",
        "seeds_heap",
        ["unsorted", "4000000", "ordered"],
        "",
        2048,
    ),
    Shape(
        "2m-busy",
        "2M-chunk bin, busy",
        "seeds_heap",
        ["unsorted", "4000000"],
        "glibc.malloc.arena_max=1",
        2048,
        (("SEEDS_UNSORTED_BUSY", "1"),),
    ),
    Shape(
        "2m-ordered-busy",
        "2M-chunk bin, address order, busy",
        "seeds_heap",
        ["unsorted", "4000000", "ordered"],
        "glibc.malloc.arena_max=1",
        2048,
        (("SEEDS_UNSORTED_BUSY", "1"),),
    ),
    Shape(
        "3m",
        "3.1M-chunk unsorted bin, past the sweep",
        "seeds_heap",
        ["unsorted", "6200000"],
        "",
        3072,
    ),
    _arenas("32x100-t64", "32 x 100 MiB idle, t=64M", 32, 100, False, 64 * MIB),
    _arenas("64x100", "64 x 100 MiB idle", 64, 100, False, THRESHOLD_BYTES),
    Shape("2m-smallbin", "2M-chunk small bin", "many_arenas", ["1", "4000000", "24"], "", 2048),
)
HELD_OUT_KEYS = ("held-out", "held-out-busy")


def _held_out(drawn: HeldOut, busy: bool) -> Shape:
    """The held-out shape ``drawn`` (tests/support/held_out.py), idle or busy."""
    size = f"{drawn.threads}x{drawn.mib_per_arena}"
    return Shape(
        HELD_OUT_KEYS[busy],
        f"held-out {size} {'busy' if busy else 'idle'}",
        "seeds_heap",
        drawn.args(busy=busy),
        f"glibc.malloc.arena_max={drawn.threads + 1}:glibc.malloc.mmap_threshold={THRESHOLD_BYTES}",
        drawn.threads * drawn.mib_per_arena + 768,
        tuple(drawn.env().items()),
    )


DEFAULT_SHAPES = (
    "32x100,32x100-busy,8x1g,8x1g-busy,4x384-spread,1500,2m,2m-ordered,2m-busy,2m-ordered-busy,"
    "held-out,held-out-busy"
)


class CgroupTarget(Target):
    """bench_inspect's Target (driven by "reset" and "gap"), started inside a memory cgroup
    (it joins it before exec, so all its memory is charged there) and given time to build."""

    def __init__(self, shape: Shape, release: glibc_releases.GlibcRelease | None = None) -> None:
        """``release``: the glibc the target runs on (through its own loader); None: this
        machine's."""
        if release is None or release.native:
            argv = [str(compile_target(shape.target)), *shape.args]
        else:
            binary = glibc_releases.build_target(release, shape.target)
            argv = glibc_releases.command(release, binary, shape.args)
        self.group = memory_cgroup(f"memforensics-bench-seeds-{shape.key}", shape.limit_mib * MIB)
        if self.group is not None:
            argv = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.group), *argv]
        env = dict(os.environ, **dict(shape.env))
        if shape.tunables:
            env["GLIBC_TUNABLES"] = shape.tunables
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True
        )
        timer = threading.Timer(READY_TIMEOUT_SECONDS, self.proc.kill)
        timer.start()
        try:
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline().decode()
        finally:
            timer.cancel()
        if not line.startswith("ready"):
            self.close()
            raise RuntimeError(f"{shape.title}: target did not start ({line!r})")

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        if self.group is not None:
            with contextlib.suppress(OSError):
                self.group.rmdir()


@dataclass
class Run:
    """One method's run: what the target felt, how long it took, how it ended."""

    stall: float
    wall: float
    peak_rss: int | None = None  # bytes; None for the recipe (not measured)
    refused: str | None = None  # the error line of a run that did not produce a report
    fallback: str | None = None  # the way that stood in for the refused read, and why
    # The read's own word (its JSON's read_only): its longest stop, its stops, the parts of
    # the arenas it read in parts. The stall above is the target's: that stop and whatever
    # else kept the ticker from running (its busy threads' own scheduling among them).
    longest_stop: float | None = None
    stops: int = 0
    arena_parts: int = 0
    relayed: int = 0  # arenas (or parts) read in relays, and of those, swept
    swept: int = 0


def _read_only_figures(run: Run, out: Path) -> Run:
    """``run`` with its JSON's read_only figures (none where the report has none)."""
    read = json.loads(out.read_bytes()).get("read_only") or {}
    run.longest_stop = read.get("longest_stop_seconds")
    run.stops = int(read.get("stops") or 0)
    run.arena_parts = int(read.get("arena_parts") or 0)
    run.relayed = int(read.get("relayed_arenas") or 0)
    run.swept = int(read.get("swept_arenas") or 0)
    return run


@dataclass
class Outcome:
    runs: dict[str, list[Run]] = field(default_factory=dict)
    quiet: list[float] = field(default_factory=list)  # the ticker's gap with nothing attached


def _run_child(argv: list[str], scratch: Path) -> tuple[float, int, int, Path, str]:
    """(wall seconds, exit code, peak RSS bytes, stdout file, stderr) of ``argv``, reaped by
    os.wait4 for its ru_maxrss; killed after CHILD_TIMEOUT_SECONDS."""
    out_path = scratch / "stdout"
    with open(out_path, "wb") as out, open(scratch / "stderr", "w+b") as err:
        started = time.monotonic()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=scratch)
        timer = threading.Timer(CHILD_TIMEOUT_SECONDS, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            timer.cancel()
        wall = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    return wall, proc.returncode, usage.ru_maxrss * 1024, out_path, stderr


def _error_line(code: int, stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return f"exit {code}: {(errors or lines or ['(no message)'])[0]}"


def run_default(pid: int, scratch: Path) -> Run:
    """`memforensics inspect --json PID`: the default way (a call where the read is refused)."""
    wall, code, rss, out, stderr = _run_child(
        [*memforensics_command(), "inspect", "--json", str(pid)], scratch
    )
    if code != 0:
        return Run(0.0, wall, rss, refused=_error_line(code, stderr))
    stood_in = json.loads(out.read_bytes()).get("fallback")
    fallback = f"{stood_in['way']}: {stood_in['reason']}" if stood_in else None
    return _read_only_figures(Run(0.0, wall, rss, fallback=fallback), out)


def run_read_only(pid: int, scratch: Path) -> Run:
    """`memforensics inspect --read-only --json PID`: memory only, a refusal is an error."""
    wall, code, rss, out, stderr = _run_child(
        [*memforensics_command(), "inspect", "--read-only", "--json", str(pid)], scratch
    )
    if code != 0:
        return Run(0.0, wall, rss, refused=_error_line(code, stderr))
    return _read_only_figures(Run(0.0, wall, rss), out)


def run_gdb_recipe(pid: int, scratch: Path) -> Run:
    """bench_inspect's recipe, timed here."""
    started = time.monotonic()
    run_recipe(pid, scratch)
    return Run(0.0, time.monotonic() - started)


# gdb told to read no separate debug symbols: libc's -dbg package, where installed, is read
# while the target is stopped, and is most of the recipe's stall where it is.
_NO_DEBUG_SYMBOLS = (
    "-iex",
    "set debug-file-directory /nonexistent",
    "-iex",
    "set debuginfod enabled off",
)


def run_bare_recipe(pid: int, scratch: Path) -> Run:
    """The recipe with gdb reading no separate debug symbols (as on a host without libc's
    debug package), its document checked."""
    out = scratch / f"malloc_info-bare-{pid}.xml"
    argv = recipe_argv(pid, out)
    argv[1:1] = _NO_DEBUG_SYMBOLS
    started = time.monotonic()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.monotonic() - started
    if not out.read_bytes().startswith(b"<malloc"):
        raise RuntimeError("the recipe without debug symbols wrote no malloc_info XML")
    return Run(0.0, wall)


METHODS: dict[str, Callable[[int, Path], Run]] = {
    "recipe": run_gdb_recipe,
    "bare gdb": run_bare_recipe,
    "default": run_default,
    "read-only": run_read_only,
}


def measure(
    shape: Shape, rounds: int, release: glibc_releases.GlibcRelease | None = None
) -> Outcome:
    """Every method ``rounds`` times on one target of ``shape`` on ``release`` (None: this
    machine's glibc), after one unmeasured run of each (page cache, bytecode), the order
    reversed every other round."""
    outcome = Outcome({name: [] for name in METHODS})
    target = CgroupTarget(shape, release)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-seeds-") as name:
            scratch = Path(name)
            for method in METHODS.values():
                method(target.pid, scratch)
            for round_index in range(rounds):
                names = list(METHODS) if round_index % 2 == 0 else list(METHODS)[::-1]
                for method_name in names:
                    target.reset()
                    run = METHODS[method_name](target.pid, scratch)
                    run.stall = target.longest_gap_seconds()
                    outcome.runs[method_name].append(run)
                target.reset()
                time.sleep(QUIET_SECONDS)
                outcome.quiet.append(target.longest_gap_seconds())
    finally:
        target.close()
    return outcome


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


COLUMNS = (
    f"{'shape':<26}{'method':<11}{'stall ms':>9}{'wall s':>8}{'RSS MiB':>8}"
    f"{'stall x':>8}{'wall x':>7}  {'stall bar':<10}{'wall bar':<10}{'RSS bar':<9}note"
)


def report(shape: Shape, outcome: Outcome) -> list[str]:
    """The shape's rows (medians of the rounds that produced a report; peak RSS the most of
    any round) and its notes."""
    recipe = outcome.runs["recipe"]
    recipe_stall = statistics.median(r.stall for r in recipe)
    recipe_wall = statistics.median(r.wall for r in recipe)
    stall_bar = max(STALL_RATIO_BAR * recipe_stall, STALL_FLOOR_SECONDS)
    rows = [
        f"{shape.title:<26}{'recipe':<11}{recipe_stall * 1000:>9.1f}{recipe_wall:>8.2f}"
        f"{'-':>8}{'1':>8}{'1':>7}  (stall bar {stall_bar * 1000:.1f} ms,"
        f" wall bar {WALL_RATIO_BAR * recipe_wall:.2f} s)",
        f"{'':<26}{'bare gdb':<11}"
        f"{statistics.median(r.stall for r in outcome.runs['bare gdb']) * 1000:>9.1f}"
        f"{statistics.median(r.wall for r in outcome.runs['bare gdb']):>8.2f}"
        "  (the recipe, gdb reading no separate debug symbols)",
        f"{'':<26}{'nothing':<11}{statistics.median(outcome.quiet) * 1000:>9.1f}"
        f"{QUIET_SECONDS:>8.2f}  (the ticker's own gap, no reader attached)",
    ]
    notes: list[str] = []
    for name in ("default", "read-only"):
        runs = outcome.runs[name]
        done = [r for r in runs if r.refused is None]
        refusals = sorted({r.refused for r in runs if r.refused is not None})
        fallbacks = sorted({r.fallback for r in done if r.fallback is not None})
        note = []
        if refusals:
            note.append(f"refused {len(runs) - len(done)}/{len(runs)}")
            notes += [f"  {shape.title}, {name}: {why}" for why in refusals]
        if fallbacks:
            note.append(f"fallback {sum(r.fallback is not None for r in done)}/{len(done)}")
            notes += [f"  {shape.title}, {name} fell back to {why}" for why in fallbacks]
        stops = [r.longest_stop for r in done if r.longest_stop is not None]
        if stops:
            note.append(
                f"its longest stop {statistics.median(stops) * 1000:.1f} ms, "
                f"{statistics.median(r.stops for r in done):.0f} stops"
                + (
                    f" ({statistics.median(r.arena_parts for r in done):.0f} parts)"
                    if any(r.arena_parts for r in done)
                    else ""
                )
            )
        if any(r.relayed for r in done):
            note.append(
                f"relayed {statistics.median(r.relayed for r in done):.0f}, "
                f"swept {statistics.median(r.swept for r in done):.0f}"
            )
        peak = max(r.peak_rss or 0 for r in runs)
        if not done:
            rows.append(
                f"{'':<26}{name:<11}{'-':>9}{'-':>8}{peak / MIB:>8.0f}{'-':>8}{'-':>7}  "
                f"{'NOT met':<10}{'NOT met':<10}{_verdict(peak <= RSS_BAR_BYTES):<9}"
                + "; ".join(note)
            )
            continue
        stall = statistics.median(r.stall for r in done)
        wall = statistics.median(r.wall for r in done)
        all_done = len(done) == len(runs)
        rows.append(
            f"{'':<26}{name:<11}{stall * 1000:>9.1f}{wall:>8.2f}{peak / MIB:>8.0f}"
            f"{stall / recipe_stall:>8.3f}{wall / recipe_wall:>7.2f}  "
            f"{_verdict(all_done and stall <= stall_bar):<10}"
            f"{_verdict(all_done and wall <= WALL_RATIO_BAR * recipe_wall):<10}"
            f"{_verdict(peak <= RSS_BAR_BYTES):<9}" + "; ".join(note)
        )
    return rows + notes


@contextlib.contextmanager
def _timed(label: str) -> Iterator[None]:
    started = time.monotonic()
    yield
    print(f"  ({label}: {time.monotonic() - started:.0f} s)", file=sys.stderr)


def main() -> int:
    use_test_gdb()  # the recipe's gdb: the gdb 18 of the test extra
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--shapes",
        default=DEFAULT_SHAPES,
        help=f"comma-separated, of: {', '.join([*(s.key for s in SHAPES), *HELD_OUT_KEYS])}",
    )
    parser.add_argument(
        "--seed",
        type=int,
        help="the held-out shapes' seed (tests/support/held_out.py); default: one drawn now",
    )
    parser.add_argument(
        "--glibc",
        choices=glibc_releases.RELEASES,
        help="run the targets on this glibc release (Debian's, through its own loader; "
        "fetched once); default: this machine's",
    )
    args = parser.parse_args()
    if shutil.which("gdb") is None:
        print("bench_seeds: gdb is not installed; nothing to measure", file=sys.stderr)
        return 0
    release = None
    if args.glibc is not None:
        release = glibc_releases.release_tree(args.glibc)
        if release is None:
            parser.error(f"glibc {args.glibc}: {glibc_releases.skip_reason(args.glibc)}")
    wanted = args.shapes.split(",")
    drawn = HeldOut.drawn(args.seed) if args.seed is not None else HeldOut.of_session()
    shapes = (*SHAPES, _held_out(drawn, busy=False), _held_out(drawn, busy=True))
    unknown = set(wanted) - {s.key for s in shapes}
    if unknown:
        parser.error(f"unknown shapes: {', '.join(sorted(unknown))}")
    print(
        f"bench_seeds: glibc {args.glibc or glibc_releases.native_version()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
        f"{args.rounds} rounds; medians (peak RSS: the most of any round); x: ratio to recipe"
    )
    if set(wanted) & set(HELD_OUT_KEYS):
        print(drawn)
    print(COLUMNS)
    for shape in shapes:
        if shape.key not in wanted:
            continue
        with _timed(shape.title):
            try:
                rows = report(shape, measure(shape, args.rounds, release))
            except Exception as exc:  # one shape's failure: said, and the next one runs
                rows = [f"{shape.title:<26}failed: {exc}"]
        print("\n".join(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
