"""Speed and coverage of the residency walk vs the per-chunk walk: same target, same run.

Targets (tests/targets/proc_arenas.c, pattern "alternate", 144-byte blocks: every other one
freed, so no two free chunks merge and none is a fastbin chunk) hold ~2 M free chunks:
16 arenas (16 threads x 125,000 free chunks) and 1,500 arenas (1,500 threads x ~1,333 free
chunks, GLIBC_TUNABLES=glibc.malloc.arena_max so every thread keeps its own arena). Case
"2m" is bench_inspect's: tests/targets/many_arenas.c `1 4000000 24`, one worker arena of
~128 MiB chained over several 64 MiB heaps holding 2 M free 32-byte chunks in one bin (its
dump taken with gdb). Each runs in a memory cgroup when one can be made. Each round runs, on
that one process,

  * memforensics' residency read (``memforensics.entry.readers.gdb.read_heap_residency``: find the
    arenas, copy their heaps in runs of resident pages, walk every bin with its consistency
    checks, measure pages) with its default time budget, as inspect and trim run it;
  * the same with the pure-Python loop (what runs where no C compiler built the optional
    memforensics.sources.glibc._chunkwalk);
  * the manual way: the same bins followed with one /proc/PID/mem read per chunk (how the
    walk worked before, and what a gdb or Python script reading the target does), no budget,

and prints medians: chunks/s (wall and CPU), the share of free bytes measured, and the ratio
memforensics/manual. Targets (issue 13): >= 2 M chunks/s; >= 90 % of free bytes measured at
1,500 arenas and in the 2 M-chunk arena. The machine's load average is printed: on a shared
machine absolute rates move, the ratio measured in the same run is what counts. Asserts
nothing.

usage: python benchmarks/bench_residency.py [--rounds N] [--cases 16,1500,2m] [--free-chunks N]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from memforensics.entry.readers.gdb import read_heap_residency  # noqa: E402
from memforensics.model import glibc  # noqa: E402
from memforensics.model.heap import HeapDump  # noqa: E402
from memforensics.sources.gdb.gdb_capture import capture_malloc_info  # noqa: E402
from memforensics.sources.glibc import heapcopy  # noqa: E402
from memforensics.sources.glibc.glibc_arenas import (  # noqa: E402
    find_heaps,
    find_main_arena,
    read_state,
)
from memforensics.sources.malloc_info.malloc_xml import parse_dump  # noqa: E402
from memforensics.sources.proc.procmaps import read_smaps  # noqa: E402
from memforensics.sources.proc.procmem import ProcessMemoryReader  # noqa: E402
from tests.support.targets import compile_target, started_in_cgroup  # noqa: E402

T = TypeVar("T")
BLOCK_BYTES = 144  # a 160-byte chunk: above the fastbin limit, so every free one is binned
LIMIT_BYTES = 3 << 30


@contextlib.contextmanager
def target(threads: int, chunks_per_thread: int) -> Iterator[tuple[int, Path]]:
    """proc_arenas with ``threads`` arenas of ``chunks_per_thread`` blocks, half freed."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["proc_arenas", tmp, str(threads), str(chunks_per_thread), str(BLOCK_BYTES)]
        with started([*argv, "alternate"], threads + 1) as pid:
            yield pid, Path(tmp)


@contextlib.contextmanager
def started(argv: list[str], arena_max: int) -> Iterator[int]:
    """The compiled target argv[0] with argv[1:], in a memory cgroup when one can be made;
    its PID once it printed "ready"."""
    binary = compile_target(argv[0])
    with started_in_cgroup(
        [str(binary), *argv[1:]],
        group_name="memforensics-bench-residency",
        limit_bytes=LIMIT_BYTES,
        arena_max=arena_max,
    ) as pid:
        yield pid


def dump_of(pid: int, control: Path) -> HeapDump:
    """The target's own malloc_info (SIGUSR1), parsed."""
    done = control / "dump.done"
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 120
    while not done.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("target wrote no dump")
        time.sleep(0.01)
    done.unlink()
    return parse_dump((control / "dump.xml").read_bytes(), name=f"pid {pid}")


def manual_walk(pid: int) -> int:
    """Every bin of every arena followed with one /proc/PID/mem read per chunk."""
    mappings = read_smaps(pid)
    chunk_words = struct.Struct("<4Q")
    with ProcessMemoryReader(pid) as mem:
        arenas = {h.ar_ptr for h in find_heaps(mappings, mem)}
        main = find_main_arena(mappings, mem, None, arenas)
        chunks = 0
        for address in [*arenas, *([main] if main is not None else [])]:
            state = read_state(mem, address)
            if state is None:
                continue
            for index in range(1, glibc.NBINS):
                head = state.address + glibc.OFF_BINS + 16 * (index - 1) - 16
                previous, chunk = head, state.bins[2 * (index - 1)]
                while chunk != head:
                    data = mem.read(chunk, 32)
                    if data is None:
                        break
                    _, _, next_chunk, back = chunk_words.unpack(data)
                    if back != previous:
                        break
                    chunks += 1
                    previous, chunk = chunk, next_chunk
    return chunks


def timed(function: Callable[[], T]) -> tuple[T, float, float]:
    """``function()``, its wall seconds and its CPU seconds."""
    wall, cpu = time.monotonic(), time.process_time()
    result = function()
    return result, time.monotonic() - wall, time.process_time() - cpu


def run_case(arenas: int, free_chunks: int, rounds: int) -> None:
    per_thread = 2 * free_chunks // arenas
    print(f"\n== {arenas} arenas, {arenas * per_thread // 2:,} free chunks of 160 bytes ==")
    with target(arenas, per_thread) as (pid, control):
        compare(pid, dump_of(pid, control), rounds)


def run_two_million(rounds: int) -> None:
    """bench_inspect's "2m" target: one worker arena, 2 M free 32-byte chunks in one bin."""
    print("\n== 2m: one worker arena (many_arenas 1 4000000 24), 2,000,000 free chunks ==")
    with started(["many_arenas", "1", "4000000", "24"], 8) as pid:
        xml = capture_malloc_info(pid, timeout_seconds=120).xml
        compare(pid, parse_dump(xml, name=f"pid {pid}"), rounds)


def compare(pid: int, dump: HeapDump, rounds: int) -> None:
    """memforensics (C, Python) and the manual walk on ``pid``, alternating; medians."""
    print(f"dump: {len(dump.arenas)} arenas, {dump.rest_chunks:,} free chunks (bins + tops)")
    native = heapcopy._native
    names = ["memforensics", "pure Python", "manual"] if native else ["pure Python", "manual"]
    rows: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in names}
    for turn in range(rounds):
        order = names if turn % 2 == 0 else names[::-1]
        for name in order:
            if name != "manual":
                heapcopy._native = native if name == "memforensics" else None
                residency, wall, cpu = timed(lambda: read_heap_residency(pid, dump))
                heapcopy._native = native
                chunks = sum(a.walked_chunks for a in residency.arenas)
                share = residency.measured_share
            else:
                chunks, wall, cpu = timed(lambda: manual_walk(pid))
                share = float("nan")
            rows[name].append((chunks / wall, chunks / max(cpu, 1e-9), share, wall))
    print(f"{'':14} {'chunks/s wall':>14} {'chunks/s cpu':>14} {'measured':>9} {'seconds':>8}")
    medians = {}
    for name, samples in rows.items():
        wall_rate = statistics.median(s[0] for s in samples)
        cpu_rate = statistics.median(s[1] for s in samples)
        share = statistics.median(s[2] for s in samples)
        seconds = statistics.median(s[3] for s in samples)
        medians[name] = (wall_rate, cpu_rate)
        shown = "-" if math.isnan(share) else f"{share:.1%}"
        print(f"{name:14} {wall_rate:>14,.0f} {cpu_rate:>14,.0f} {shown:>9} {seconds:>8.2f}")
    for name in names[:-1]:
        ratio_wall = medians[name][0] / medians["manual"][0]
        ratio_cpu = medians[name][1] / medians["manual"][1]
        print(f"ratio {name}/manual: {ratio_wall:.1f}x (wall), {ratio_cpu:.1f}x (cpu)")


def python_speed_seconds() -> float:
    """CPU seconds of a fixed pure-Python loop (10 M additions): ~0.4 s on an idle modern
    core; a higher figure says how much a shared machine slows every Python loop here."""
    cpu = time.process_time()
    total = 0
    for number in range(10_000_000):
        total += number
    return time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", default="16,1500,2m", help="arena counts or 2m, comma-separated")
    parser.add_argument("--free-chunks", type=int, default=2_000_000)
    args = parser.parse_args()
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    print(f"calibration: 10 M Python additions take {python_speed_seconds():.2f} s CPU here")
    for case in args.cases.split(","):
        if case == "2m":
            run_two_million(args.rounds)
        else:
            run_case(int(case), args.free_chunks, args.rounds)


if __name__ == "__main__":
    main()
