#!/usr/bin/env python3
"""Parse speed and peak memory of ``memforensics parse`` against a bare ``lxml.etree`` parse.

Generates, under a temporary directory, glibc-2.36-shaped malloc_info XML (per-arena totals
are sums of the bins plus a top chunk, process totals are sums of the arenas):

* a single dump of 8,000 arenas x 131 bucket lines (~64 MB, a million ``<size>`` lines);
* a ~20 MB and a ~200 MB series file (many dumps appended, as a process dumping
  periodically into one log writes them).

Rows, each against the manual way measured in the same run:

* ``parse --json`` (the whole command, output written to /dev/null): target <= 2.0x;
* ``parse`` text report: target <= 1.5x;
* the library's ``iter_dumps`` alone;
* ``parse --json`` of the two series: peak RSS must stay flat as the file grows tenfold.

Each measurement runs in its own child process so that its peak RSS is that run alone (the
child's own ``VmHWM``: ``ru_maxrss`` from ``wait4`` also counts the parent's peak, which a
vfork+exec child inherits, and the parent peaks while it generates the inputs); the time is
taken inside the child from before importing memforensics to the end of the command, best of
N. The "manual way" is lxml building the
whole tree: ``etree.parse(path)`` for the single dump; for a series (several root elements,
which ``etree.parse`` refuses) the same bytes fed to an ``etree.XMLParser`` between a
synthetic ``<series>`` root. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PAGE_BYTES = 4096
READ_CHUNK_BYTES = 1 << 20
METHODS = ("lxml", "iter_dumps", "parse-text", "parse-json")
TARGETS = {"parse-json": 2.0, "parse-text": 1.5}
# lxml's whole tree of a 200 MB series peaks near 4.5 GB: every child runs in a memory
# cgroup of this size when the machine lets us make one, else under an address-space cap.
CHILD_MEMORY_LIMIT_BYTES = 8 << 30
CHILD_ADDRESS_SPACE_LIMIT_BYTES = 16 << 30
CHILD_TIMEOUT_SECONDS = 120


# --------------------------------------------------------------------------------------------
# Synthetic glibc 2.36 dumps


def _bins(rng: random.Random) -> Iterator[tuple[str, int, int, int, int]]:
    """(tag, from, to, total, count) for a full arena: fastbins, small, large, unsorted."""
    for chunk in range(32, 129, 16):  # fastbins: even `to`, from = to - 15
        count = rng.randint(1, 400)
        yield "size", chunk - 15, chunk, chunk * count, count
    for chunk in range(32, 1009, 16):  # small bins: one size each, PREV_INUSE makes it odd
        count = rng.randint(1, 300)
        yield "size", chunk + 1, chunk + 1, (chunk + 1) * count, count
    start = 1024
    # large bins on 64-bit: 32 x 64 B, 16 x 512 B, 8 x 4 KiB, 4 x 32 KiB, 2 x 256 KiB wide
    for width, n in ((64, 32), (512, 16), (4096, 8), (32768, 4), (262144, 2)):
        for _ in range(n):
            count = rng.randint(1, 40)
            low, high = start + 1, start + width - 15
            total = sum(rng.randrange(low, high + 1, 2) for _ in range(min(count, 3)))
            total += (count - min(count, 3)) * low
            yield "size", low, high, total, count
            start += width
    count = rng.randint(1, 20)
    yield "unsorted", 49, 200001, 49 * count + 199952, count


def synth_dump(n_arenas: int, seed: int) -> str:
    """One ``<malloc version="1">`` document shaped like glibc 2.36 prints it."""
    rng = random.Random(seed)
    out: list[str] = ['<malloc version="1">\n']
    totals = dict.fromkeys(("fc", "fb", "rc", "rb", "sys", "max", "at", "am"), 0)
    for nr in range(n_arenas):
        out.append(f'<heap nr="{nr}">\n<sizes>\n')
        fast_count = fast_bytes = bin_count = bin_bytes = 0
        for tag, low, high, total, count in _bins(rng):
            out.append(f'  <{tag} from="{low}" to="{high}" total="{total}" count="{count}"/>\n')
            if tag == "size" and high % 2 == 0:
                fast_count += count
                fast_bytes += total
            else:
                bin_count += count
                bin_bytes += total
        top_bytes = rng.randrange(0, 1 << 20, 16)
        rest_count, rest_bytes = bin_count + 1, bin_bytes + top_bytes
        in_use_bytes = rng.randrange(1 << 20, 64 << 20)
        system = -(-(fast_bytes + rest_bytes + in_use_bytes) // PAGE_BYTES) * PAGE_BYTES
        system_max = system + rng.randrange(0, 4) * PAGE_BYTES
        out.append(
            "</sizes>\n"
            f'<total type="fast" count="{fast_count}" size="{fast_bytes}"/>\n'
            f'<total type="rest" count="{rest_count}" size="{rest_bytes}"/>\n'
            f'<system type="current" size="{system}"/>\n'
            f'<system type="max" size="{system_max}"/>\n'
            f'<aspace type="total" size="{system}"/>\n'
            f'<aspace type="mprotect" size="{system_max}"/>\n'
        )
        if nr:
            out.append(f'<aspace type="subheaps" size="{-(-system // (64 << 20))}"/>\n')
        out.append("</heap>\n")
        for key, value in (
            ("fc", fast_count),
            ("fb", fast_bytes),
            ("rc", rest_count),
            ("rb", rest_bytes),
            ("sys", system),
            ("max", system_max),
            ("at", system),
            ("am", system_max),
        ):
            totals[key] += value
    out.append(
        f'<total type="fast" count="{totals["fc"]}" size="{totals["fb"]}"/>\n'
        f'<total type="rest" count="{totals["rc"]}" size="{totals["rb"]}"/>\n'
        f'<total type="mmap" count="{rng.randint(0, 99)}" size="{rng.randrange(0, 1 << 30)}"/>\n'
        f'<system type="current" size="{totals["sys"]}"/>\n'
        f'<system type="max" size="{totals["max"]}"/>\n'
        f'<aspace type="total" size="{totals["at"]}"/>\n'
        f'<aspace type="mprotect" size="{totals["am"]}"/>\n'
        "</malloc>\n"
    )
    return "".join(out)


def write_series(path: Path, target_bytes: int, arenas_per_dump: int) -> int:
    """Append dumps (a few distinct ones, cycled) until ``target_bytes``; return the count."""
    variants = [synth_dump(arenas_per_dump, seed).encode() for seed in range(4)]
    written = dumps = 0
    with path.open("wb") as out:
        while written < target_bytes:
            data = variants[dumps % len(variants)]
            out.write(data)
            written += len(data)
            dumps += 1
    return dumps


# --------------------------------------------------------------------------------------------
# Child side: one parse, timed inside the process


def _count_dumps(path: str) -> int:
    """Dumps in a file, for the cross-check against lxml (outside the timed part)."""
    count = 0
    with open(path, "rb") as stream:
        while chunk := stream.read(READ_CHUNK_BYTES):
            count += chunk.count(b"<malloc ")
    return count


def _child(method: str, path: str, series: bool) -> dict[str, float | int]:
    if method == "lxml":
        from lxml import etree

        started, cpu_started = time.perf_counter(), time.process_time()
        if series:
            parser = etree.XMLParser()
            parser.feed(b"<series>")
            with open(path, "rb") as stream:
                while chunk := stream.read(READ_CHUNK_BYTES):
                    parser.feed(chunk)
            parser.feed(b"</series>")
            root = parser.close()
            count = len(root)
        else:
            tree = etree.parse(path)
            count = 1 if tree.getroot().tag == "malloc" else 0
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    elif method == "iter_dumps":
        started, cpu_started = time.perf_counter(), time.process_time()
        from memforensics.sources.malloc_info.malloc_xml import iter_dumps

        count = 0
        free_bytes = 0
        for count, dump in enumerate(iter_dumps(path), 1):  # noqa: B007
            free_bytes += dump.free_bytes  # consume each dump as a report would
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    else:
        # The whole command as a user runs it, stdout to /dev/null (the writing is included).
        started, cpu_started = time.perf_counter(), time.process_time()
        from memforensics.cli import cli

        argv = ["parse", "--json", path] if method == "parse-json" else ["parse", path]
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            try:
                cli.main(argv, prog_name="memforensics", standalone_mode=False)
            except SystemExit as exc:
                if exc.code not in (0, None):
                    raise
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        count = _count_dumps(path)
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "dumps": count,
        "peak_rss_bytes": _own_peak_rss_bytes(),
    }


def _own_peak_rss_bytes() -> int:
    """This process's peak RSS since its exec (VmHWM), or 0 where /proc does not say it."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# --------------------------------------------------------------------------------------------
# Parent side


def _own_memory_cgroup_dirs() -> list[Path]:
    """cgroup directories holding this process: v1 memory controller first, then v2."""
    v1: list[Path] = []
    v2: list[Path] = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        hierarchy, controllers, rel = line.split(":", 2)
        if "memory" in controllers.split(","):
            v1.append(Path("/sys/fs/cgroup/memory") / rel.lstrip("/"))
        elif hierarchy == "0":
            for root in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
                if (root / "cgroup.controllers").exists():
                    v2.append(root / rel.lstrip("/"))
                    break
    return v1 + v2


def make_memory_cgroup(limit_bytes: int) -> Path | None:
    """A child memory cgroup of our own capped at ``limit_bytes``, or None if not allowed."""
    for parent in _own_memory_cgroup_dirs():
        child = parent / f"memforensics-bench-{os.getpid()}"
        try:
            child.mkdir()
        except OSError:
            continue
        for limit_file in ("memory.limit_in_bytes", "memory.max"):
            try:
                (child / limit_file).write_text(str(limit_bytes))
                return child
            except OSError:
                continue
        child.rmdir()
    return None


def bounded(argv: list[str], cgroup: Path | None) -> list[str]:
    """Wrap ``argv`` in a shell that joins the cgroup (or caps address space), then execs."""
    if cgroup is not None:
        script = f'echo $$ > "{cgroup / "cgroup.procs"}" && exec "$@"'
    else:
        script = f'ulimit -v {CHILD_ADDRESS_SPACE_LIMIT_BYTES // 1024} && exec "$@"'
    return ["/bin/sh", "-c", script, "sh", *argv]


@dataclass
class Measurement:
    """Best wall and CPU time and the peak RSS of one method on one file over the repeats."""

    seconds: float
    peak_rss_bytes: int
    dumps: int
    cpu_seconds: float = float("inf")


def measure(method: str, path: Path, series: bool, repeat: int, cgroup: Path | None) -> Measurement:
    """Run ``repeat`` bounded children; best time, highest peak RSS seen."""
    best_seconds = best_cpu = float("inf")
    peak_rss_bytes = 0
    dumps = 0
    argv = [sys.executable, __file__, "--child", method, str(path)]
    if series:
        argv.append("--series")
    for _ in range(repeat):
        proc = subprocess.Popen(
            bounded(argv, cgroup), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        # The kill timer bounds time; wait4 gives this child's own rusage (ru_maxrss: KiB).
        timer = threading.Timer(CHILD_TIMEOUT_SECONDS, _kill, (proc.pid,))
        timer.start()
        try:
            _, status, rusage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        assert proc.stdout is not None and proc.stderr is not None
        out, err = proc.stdout.read(), proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
        if proc.returncode != 0:
            why = err.decode(errors="replace").strip() or f"exit {proc.returncode}"
            raise SystemExit(f"{method} on {path.name} failed (memory/time bound?): {why}")
        result = json.loads(out)
        best_seconds = min(best_seconds, float(result["seconds"]))
        best_cpu = min(best_cpu, float(result["cpu_seconds"]))
        # ru_maxrss (KiB) includes the parent's peak (see the module docstring): only where
        # /proc gives no VmHWM.
        own_peak = int(result.get("peak_rss_bytes", 0)) or rusage.ru_maxrss * 1024
        peak_rss_bytes = max(peak_rss_bytes, own_peak)
        dumps = int(result["dumps"])
    return Measurement(best_seconds, peak_rss_bytes, dumps, best_cpu)


def measure_pair(
    method: str, path: Path, series: bool, repeat: int, cgroup: Path | None
) -> tuple[Measurement, Measurement]:
    """lxml and ``method`` alternately, ``repeat`` times each: (best lxml, best ours)."""
    bare = ours = None
    for _ in range(repeat):
        once_bare = measure("lxml", path, series, 1, cgroup)
        once_ours = measure(method, path, series, 1, cgroup)
        bare = once_bare if bare is None else _best(bare, once_bare)
        ours = once_ours if ours is None else _best(ours, once_ours)
    assert bare is not None and ours is not None
    return bare, ours


def _best(a: Measurement, b: Measurement) -> Measurement:
    return Measurement(
        min(a.seconds, b.seconds),
        max(a.peak_rss_bytes, b.peak_rss_bytes),
        max(a.dumps, b.dumps),
        min(a.cpu_seconds, b.cpu_seconds),
    )


def _kill(pid: int) -> None:
    """Kill a child we started that overran its time bound."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time and peak RSS of `memforensics parse` vs a bare lxml parse.",
        epilog="Prints a table; targets: --json <= 2.0x, text <= 1.5x, peak RSS flat.",
    )
    parser.add_argument("--arenas", type=int, default=8000, help="arenas in the big dump")
    parser.add_argument("--series-mb", type=int, default=200, help="size of the big series")
    parser.add_argument("--small-series-mb", type=int, default=20, help="the small series")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (best)")
    parser.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--series", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("path", nargs="?", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Generate the inputs, measure both ways, print the table."""
    args = _parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.path, args.series)))
        return 0
    started = time.perf_counter()
    cgroup = make_memory_cgroup(CHILD_MEMORY_LIMIT_BYTES)
    try:
        _run(args, started, cgroup)
    finally:
        if cgroup is not None:
            with contextlib.suppress(OSError):
                cgroup.rmdir()
    return 0


def _run(args: argparse.Namespace, started: float, cgroup: Path | None) -> None:
    mb = 1024 * 1024
    with tempfile.TemporaryDirectory(prefix="memforensics-bench-") as tmp:
        big = Path(tmp) / "big-dump.xml"
        big.write_text(synth_dump(args.arenas, seed=42))
        small_series = Path(tmp) / "series-small.xml"
        large_series = Path(tmp) / "series-large.xml"
        small_count = write_series(small_series, args.small_series_mb * mb, 48)
        large_count = write_series(large_series, args.series_mb * mb, 48)
        load = os.getloadavg()[0]
        print(
            f"inputs: {big.name} {args.arenas} arenas x 131 buckets;"
            f" {small_series.name} {small_count} dumps; {large_series.name} {large_count} dumps"
            f" (48 arenas each, full bins); generated in {time.perf_counter() - started:.1f}s;"
            f" children bounded by {f'memory cgroup {cgroup.name}' if cgroup else 'ulimit -v'};"
            f" load average {load:.1f}",
            file=sys.stderr,
        )
        header = (
            f"{'case':<28} {'size MB':>8} {'dumps':>6} {'lxml s':>8} {'ours s':>8}"
            f" {'ratio':>6} {'cpu ratio':>9} {'target':>7} {'lxml peak MB':>13}"
            f" {'ours peak MB':>13}"
        )
        print(header)
        print("-" * len(header))
        rows = [
            (big, False, "parse-json"),
            (big, False, "parse-text"),
            (big, False, "iter_dumps"),
            (small_series, True, "parse-json"),
            (large_series, True, "parse-json"),
        ]
        for path, series, method in rows:
            # Interleaved, best of N each: on a shared machine the load drifts, and the ratio
            # must compare runs made under the same conditions.
            bare, ours = measure_pair(method, path, series, args.repeat, cgroup)
            if ours.dumps != bare.dumps:
                raise SystemExit(f"{path.name}: {method} saw {ours.dumps}, lxml {bare.dumps}")
            target = TARGETS.get(method) if not series else None
            label = f"{method} {path.stem}"
            print(
                f"{label:<28} {path.stat().st_size / mb:>8.1f} {ours.dumps:>6}"
                f" {bare.seconds:>8.2f} {ours.seconds:>8.2f}"
                f" {ours.seconds / bare.seconds:>5.2f}x"
                f" {ours.cpu_seconds / bare.cpu_seconds:>8.2f}x"
                f" {f'{target:.1f}x' if target else '':>7}"
                f" {bare.peak_rss_bytes / mb:>13.0f} {ours.peak_rss_bytes / mb:>13.0f}",
                flush=True,
            )
    print(
        f"best of {args.repeat}; ours = from importing memforensics to the end of the command;"
        f" cpu ratio = the same in CPU seconds of the child (steadier on a loaded machine);"
        f" peak RSS = child's VmHWM (interpreter and imports included); series rows:"
        f" ours peak RSS must stay flat from {args.small_series_mb} to {args.series_mb} MB."
        f" Total {time.perf_counter() - started:.0f}s."
    )


if __name__ == "__main__":
    sys.exit(main())
