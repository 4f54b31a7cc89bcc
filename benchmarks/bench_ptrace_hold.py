"""How long ThreadHold stops a target: 1, 16 and 64 threads, against gdb's attach and detach.

Each target is tests/targets/hold_counter.c with THREADS - 1 workers (``idle`` by default:
every thread asleep, as a quiet service's are). Each round holds it with
``memforensics.sources.proc.ptrace_hold.ThreadHold`` and nothing inside the block, and
records ``stop_seconds`` (first PTRACE_INTERRUPT to the return of the last PTRACE_DETACH)
and the wall time of the whole ``with`` (seizing, the tracer thread's start and end
included). The manual way is ``gdb -p PID -batch -ex detach`` (all-stop: every thread
stopped from its attach to its detach), timed from outside as a whole, a bound on its stop
rather than a measure of it. Prints medians (and the range) per target and the ratio
gdb / hold; the machine's load average beside them. Asserts nothing.

usage: python benchmarks/bench_ptrace_hold.py [--rounds N] [--gdb-rounds N]
       [--threads 1,16,64] [--mode idle|paced|busy]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from memforensics.sources.proc.ptrace_hold import ThreadHold  # noqa: E402
from tests.support.gdb_binary import use_test_gdb  # noqa: E402
from tests.support.targets import compile_target, running  # noqa: E402


def _hold_seconds(pid: int, rounds: int) -> tuple[list[float], list[float], int]:
    """stop_seconds and wall seconds of ``rounds`` holds, and the threads held."""
    stops, walls, threads = [], [], 0
    for _ in range(rounds):
        started = time.perf_counter()
        with ThreadHold(pid) as hold:
            threads = len(hold.thread_ids)
        walls.append(time.perf_counter() - started)
        stops.append(hold.stop_seconds)
        time.sleep(0.01)  # let the target settle back into its sleep
    return stops, walls, threads


def _gdb_seconds(pid: int, rounds: int) -> list[float]:
    gdb = shutil.which("gdb")
    if gdb is None or rounds <= 0:
        return []
    found = []
    for _ in range(rounds):
        started = time.perf_counter()
        subprocess.run(
            [gdb, "-nx", "-batch", "-p", str(pid), "-ex", "detach"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        found.append(time.perf_counter() - started)
    return found


def _ms(values: list[float]) -> str:
    if not values:
        return "-"
    median, low, high = (1e3 * f(values) for f in (statistics.median, min, max))
    return f"{median:.3f} ({low:.3f}-{high:.3f})"


def main(argv: list[str] | None = None) -> int:
    use_test_gdb()  # the same gdb for memforensics and the recipe
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="holds per target (median)")
    parser.add_argument("--gdb-rounds", type=int, default=3, help="gdb attaches per target")
    parser.add_argument("--threads", default="1,16,64", help="thread counts, comma-separated")
    parser.add_argument("--mode", default="idle", choices=("idle", "paced", "busy"))
    args = parser.parse_args(argv)
    binary = compile_target("hold_counter")
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs, mode {args.mode}")
    print("threads  stop ms median (range)     hold wall ms median (range)   gdb ms      gdb/hold")
    for count in (int(word) for word in args.threads.split(",")):
        argv_target = [str(binary), str(count - 1), args.mode]
        with running(argv_target, stdin=subprocess.PIPE) as target:
            time.sleep(0.05)
            stops, walls, held = _hold_seconds(target.pid, args.rounds)
            gdb = _gdb_seconds(target.pid, args.gdb_rounds)
        ratio = f"{statistics.median(gdb) / statistics.median(stops):.0f}x" if gdb else "-"
        gdb_text = f"{statistics.median(gdb) * 1e3:.0f}" if gdb else "-"
        print(f"{held:>7}  {_ms(stops):<26} {_ms(walls):<29} {gdb_text:<11} {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
