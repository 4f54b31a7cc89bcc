"""What a census costs, against a bare read of the target's heap bytes in the same run.

Target: tests/targets/census_bench.cpp (g++ -O2 -s): THREADS arenas (default 32, each its
own: glibc.malloc.arena_max) of MB MiB each (default 100: the seeds' shape) filled with
polymorphic objects of OBJECT_BYTES (default 1024; every eighth a text), in a memory cgroup
when one can be made. Each round runs, on that one process,

  * the bare read: every present page of every heap (the [heap] and each sub-heap's in-use
    part) read through /proc/PID/mem in 4 MiB preads, nothing parsed (the goal's measure);
    and the same through the census's own C copy (shown for comparison);
  * ``memforensics.entry.census.census_live``: the walk in stops, every chunk classified;

and prints medians: seconds of each, the ratio census / bare, the goal (census <= 3 x bare +
0.5 s), the target's longest stall in the census (goal <= 20 ms) and memforensics' own peak
RSS (goal <= 256 MiB). The machine's load average is printed: on a shared machine the ratio
measured in the same run is what counts. Asserts nothing.

usage: python benchmarks/bench_census.py [--rounds N] [--threads N] [--mb N] [--object-bytes N]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from memforensics.entry.census import census_live  # noqa: E402
from memforensics.sources.glibc.glibc_arenas import find_heaps  # noqa: E402
from memforensics.sources.proc.procmaps import read_smaps  # noqa: E402
from memforensics.sources.proc.procmem import ProcessMemoryReader  # noqa: E402
from tests.support.census_targets import compile_cxx  # noqa: E402
from tests.support.targets import started_in_cgroup  # noqa: E402

READ_BYTES = 4 << 20


@contextlib.contextmanager
def started(threads: int, megabytes: int, object_bytes: int) -> Iterator[int]:
    binary = compile_cxx("census_bench")
    with started_in_cgroup(
        [str(binary), str(threads), str(megabytes), str(object_bytes)],
        group_name="memforensics-bench-census",
        limit_bytes=(threads * megabytes + 512) << 21,
        arena_max=threads + 1,
    ) as pid:
        yield pid


def bare_read(pid: int) -> tuple[float, int]:
    """(seconds, bytes) of reading every present page of every heap, nothing parsed."""
    started = time.monotonic()
    mappings = read_smaps(pid)
    total = 0
    with ProcessMemoryReader(pid) as mem:
        spans = [(m.start_address, m.end_address) for m in mappings if m.path == "[heap]"]
        spans += [(h.start, h.start + h.size_bytes) for h in find_heaps(mappings, mem)]
        for start, end in spans:
            for at in range(start, end, READ_BYTES):
                stop = min(end, at + READ_BYTES)
                total += len(mem.read_present(at, stop - at))
    return time.monotonic() - started, total


def c_copy_read(pid: int) -> float | None:
    """Seconds of the same read through the optional C copy the census uses (one pread of
    /proc/PID/mem per run of present pages), for comparison; None where it is not built."""
    from memforensics.sources.glibc.heapcopy import native_loop

    native = native_loop()
    if native is None:
        return None
    started = time.monotonic()
    mappings = read_smaps(pid)
    buffer = bytearray(READ_BYTES)
    with ProcessMemoryReader(pid) as mem:
        spans = [(m.start_address, m.end_address) for m in mappings if m.path == "[heap]"]
        spans += [(h.start, h.start + h.size_bytes) for h in find_heaps(mappings, mem)]
        for start, end in spans:
            pages = mem.pagemap(start, end)
            for at in range(start, end, READ_BYTES):
                stop = min(end, at + READ_BYTES)
                first = (at - start) // mem.page_bytes
                flags = memoryview(pages.present)[first : first + (stop - at) // mem.page_bytes]
                view = memoryview(buffer)[: stop - at]
                native.copy(mem.mem_fd, view, at, flags, mem.page_bytes, True, 1)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--object-bytes", type=int, default=1024)
    args, _ = parser.parse_known_args()
    print(
        f"census: {args.threads} arenas x {args.mb} MiB of {args.object_bytes}-byte objects; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    bare: list[float] = []
    vm: list[float] = []
    census: list[float] = []
    stalls: list[float] = []
    with started(args.threads, args.mb, args.object_bytes) as pid:
        heap_bytes = 0
        for _ in range(args.rounds):
            seconds, heap_bytes = bare_read(pid)
            bare.append(seconds)
            vm_seconds = c_copy_read(pid)
            if vm_seconds is not None:
                vm.append(vm_seconds)
            began = time.monotonic()
            result = census_live(pid)
            census.append(time.monotonic() - began)
            stalls.append(result.read.longest_stop_seconds)
        print(
            f"  {result.live_chunks:,} live chunks, {heap_bytes / 2**20:,.0f} MiB of heap read; "
            f"top type {result.types[0].name} x {result.types[0].count:,}"
        )
    bare_s, census_s = statistics.median(bare), statistics.median(census)
    goal = 3 * bare_s + 0.5
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  bare read {bare_s:.2f} s, census {census_s:.2f} s: {census_s / bare_s:.1f}x")
    if vm:
        vm_s = statistics.median(vm)
        print(f"  (the same bytes through the C copy: {vm_s:.2f} s; census {census_s / vm_s:.1f}x)")
    verdict = "met" if census_s <= goal else "NOT met"
    print(f"  goal census <= 3 x bare + 0.5 s = {goal:.2f} s: {verdict}")
    print(
        f"  longest stall {max(stalls) * 1000:.1f} ms (goal <= 20 ms: "
        f"{'met' if max(stalls) <= 0.020 else 'NOT met'}); memforensics peak RSS {peak_mib:.0f} MiB"
    )


if __name__ == "__main__":
    main()
