"""Benchmark `memforensics oom` against the manual way, measured in the same run.

1. A 300 MB kern.log (syslog form: `Nov 23 10:00:00 node-7 kernel: [uptime] text`) of ordinary
   kernel noise with 300 OOM incidents of every form (full reports, group kills, summary-only,
   container paths): `memforensics oom --file LOG --json` against
   `grep -c 'Killed process' LOG`, each a fresh process (start-up included), target <= 2x.
2. A large journal (built with systemd-journal-remote): `memforensics oom --directory DIR --json`
   against a bare `journalctl` with the same filter and output (target <= 1.2x).

Everything is generated under a temporary directory at run time and removed afterwards.
Usage: python benchmarks/bench_oom.py [--log-mib 300] [--journal-entries 400000] [--runs 3]
       [--skip-journal]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures" / "oom"
JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"
MEMFORENSICS = [sys.executable, "-m", "memforensics"]
_DMESG_PREFIX = re.compile(r"^(?:\[[^\]]*\d:\d\d:\d\d[^\]]*\] |\[\s*\d+\.\d+\](?:\[\s*T\d+\])? )")

NOISE = (
    "EXT4-fs (nvme0n1p2): re-mounted. Opts: errors=remount-ro. Quota mode: none.",
    "usb 1-1.4: new high-speed USB device number {n} using xhci_hcd",
    "IPv6: ADDRCONF(NETDEV_CHANGE): veth{n:x}: link becomes ready",
    'audit: type=1400 audit({n}.123:45): apparmor="STATUS" operation="profile_replace" '
    'profile="unconfined" name="snap.lxd.daemon" pid={n} comm="apparmor_parser"',
    "docker0: port 2(veth{n:x}) entered forwarding state",
    "nfs: server 10.0.0.{m} not responding, still trying",
    "TCP: request_sock_TCP: Possible SYN flooding on port 443. Sending cookies.",
    "perf: interrupt took too long (2503 > 2500), lowering kernel.perf_event_max_sample_rate",
    "sd 0:0:0:0: [sda] Write cache: enabled, read cache: enabled, doesn't support DPO or FUA",
    "br-{n:x}: port 1(veth{m}) entered blocking state",
    "kauditd_printk_skb: {m} callbacks suppressed",
    "CPU{m}: Package temperature above threshold, cpu clock throttled (total events = {n})",
)


def incident_lines() -> list[list[str]]:
    """Real and hand-made incidents from fixtures/oom, without their original prefixes."""
    blocks = []
    for name in (
        "cadvisor-3.13-global.log",
        "cadvisor-4.8-docker.log",
        "handmade-5.10-global-caller-ids.log",
        "handmade-oom-group-v2-6.12.log",
        "lkml-5.0-rc-oom-group-kills-init.log",
        "harvester-kb-5.3-dmesg-T-kubevirt.log",
        "handmade-k8s-cgroup-paths.log",
    ):
        text = (FIXTURES / name).read_text()
        lines = [_DMESG_PREFIX.sub("", line) for line in text.splitlines()]
        blocks.append(lines)
    return blocks


def make_text_log(path: Path, target_bytes: int, incidents: int) -> int:
    """Write kern.log-style noise with ``incidents`` OOM incidents spread evenly; returns the
    number of victim lines (Killed lines, and kills known from a summary line alone)."""
    rng = random.Random(42)
    blocks = incident_lines()
    uptime = 1.0
    every = target_bytes // incidents
    written = 0
    next_incident = every // 2
    placed = 0
    kills = 0
    with path.open("w", buffering=1 << 20) as out:
        while written < target_bytes:
            chunk = []
            for _ in range(2000):
                uptime += rng.random() * 0.01
                template = NOISE[rng.randrange(len(NOISE))]
                text = template.format(n=rng.randrange(1, 1 << 20), m=rng.randrange(1, 64))
                chunk.append(f"{_stamp(uptime)} node-7 kernel: [{uptime:12.6f}] {text}\n")
            if written >= next_incident and placed < incidents:
                block = blocks[placed % len(blocks)]
                chunk.extend(
                    f"{_stamp(uptime)} node-7 kernel: [{uptime:12.6f}] {line}\n" for line in block
                )
                kills += sum("Killed process" in line for line in block)
                placed += 1
                next_incident += every
            data = "".join(chunk)
            out.write(data)
            written += len(data)
    return kills


def _stamp(uptime: float) -> str:
    """A syslog stamp for a time ``uptime`` seconds into Nov 23, 08:00 (no year, as rsyslog)."""
    seconds = 8 * 3600 + int(uptime)
    return f"Nov 23 {seconds // 3600 % 24:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def timed(argv: Sequence[str], runs: int) -> tuple[float, bytes]:
    """Median wall time of ``runs`` runs (after one warm-up) and the last stdout."""
    median, _, out = timed_both(argv, runs)
    return median, out


def timed_both(argv: Sequence[str], runs: int) -> tuple[float, float, bytes]:
    """(median, fastest) wall time of ``runs`` runs after one warm-up, and the last stdout.
    The fastest run is the least disturbed by other load on a shared machine. The median
    CPU time (user + system of the child) is kept in CPU_SECONDS[argv]."""
    out = subprocess.run(argv, capture_output=True, check=False).stdout
    times = []
    cpu = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        out = subprocess.run(argv, capture_output=True, check=False).stdout
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    CPU_SECONDS[tuple(argv)] = statistics.median(cpu)
    return statistics.median(times), min(times), out


CPU_SECONDS: dict[tuple[str, ...], float] = {}


def peak_rss_mib(argv: Sequence[str]) -> float:
    """Peak resident memory of one run of ``argv`` (its largest process), in MiB: a fresh
    child process whose RUSAGE_CHILDREN is its own command's."""
    probe = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], capture_output=True); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, check=True)
    return int(out.stdout) / 1024


def peak_rss_by_size(workdir: Path, log: Path, sizes_mib: Sequence[int]) -> None:
    """Peak RSS of `oom --file` on ``log`` and on smaller logs of the same shape: flat in the
    file's size (the mapped file is released behind the search)."""
    figures = [(log.stat().st_size, peak_rss_mib([*MEMFORENSICS, "oom", "--file", str(log)]))]
    for size_mib in sizes_mib:
        smaller = workdir / f"kern-{size_mib}.log"
        make_text_log(smaller, size_mib << 20, incidents=300)
        figures.append(
            (smaller.stat().st_size, peak_rss_mib([*MEMFORENSICS, "oom", "--file", str(smaller)]))
        )
        smaller.unlink()
    print(
        "  peak RSS of oom --file: "
        + ", ".join(f"{rss:.0f} MiB for {size / (1 << 20):.0f} MiB" for size, rss in figures),
        flush=True,
    )


def bench_text(workdir: Path, log_mib: int, runs: int) -> None:
    log = workdir / "kern.log"
    started = time.perf_counter()
    kills = make_text_log(log, log_mib << 20, incidents=300)
    size = log.stat().st_size
    print(
        f"text log: {size / (1 << 20):.0f} MiB, {kills} kill lines, "
        f"generated in {time.perf_counter() - started:.1f} s",
        flush=True,
    )
    load = os.getloadavg()[0]
    grep_seconds, grep_fastest, grep_out = timed_both(
        ["grep", "-c", "Killed process", str(log)], runs
    )
    table_seconds, table_fastest, _ = timed_both([*MEMFORENSICS, "oom", "--file", str(log)], runs)
    ours_seconds, ours_fastest, ours_out = timed_both(
        [*MEMFORENSICS, "oom", "--file", str(log), "--json"], runs
    )
    document = json.loads(ours_out)
    print(f"  load average before: {load:.1f} on {os.cpu_count()} cores")
    print(
        f"  grep -c 'Killed process': {grep_seconds:.3f} s median, {grep_fastest:.3f} s fastest "
        f"(count {grep_out.decode().strip()})"
    )
    print(
        f"  memforensics oom --file (table): {table_seconds:.3f} s median, "
        f"{table_fastest:.3f} s fastest"
    )
    print(
        f"  memforensics oom --file --json:  {ours_seconds:.3f} s median, "
        f"{ours_fastest:.3f} s fastest ({document['kills']} kills, "
        f"{len({e['incident'] for e in document['events']})} incidents, "
        f"{sum(not e['confirmed'] for e in document['events'])} from a summary line alone; "
        f"{kills} Killed lines written)"
    )
    grep_cpu = CPU_SECONDS[("grep", "-c", "Killed process", str(log))]
    for label, ours, fastest, argv in (
        ("table", table_seconds, table_fastest, (*MEMFORENSICS, "oom", "--file", str(log))),
        (
            "--json",
            ours_seconds,
            ours_fastest,
            (*MEMFORENSICS, "oom", "--file", str(log), "--json"),
        ),
    ):
        ratio = ours / grep_seconds
        verdict = "met" if ratio <= 2.0 else "NOT met"
        cpu_ratio = CPU_SECONDS[argv] / grep_cpu
        print(
            f"  ratio memforensics/grep ({label}) = {ratio:.2f}x median wall, "
            f"{fastest / grep_fastest:.2f}x fastest wall, {cpu_ratio:.2f}x CPU time "
            f"({CPU_SECONDS[argv]:.3f} s vs {grep_cpu:.3f} s) (target <= 2x wall: {verdict})",
            flush=True,
        )
    peak_rss_by_size(workdir, log, [100])


def export_entry(fields: dict[str, str]) -> bytes:
    return b"".join(f"{k}={v}\n".encode() for k, v in fields.items()) + b"\n"


def make_journal(directory: Path, entries: int, incidents: int) -> None:
    """A journal of ``entries`` kernel/userspace noise entries over 3 boots, plus incidents."""
    rng = random.Random(7)
    blocks = incident_lines()
    directory.mkdir()
    boots = [f"{b:032x}" for b in (0xB001, 0xB002, 0xB003)]
    every = max(1, entries // incidents)
    start_usec = 1_715_000_000_000_000
    proc = subprocess.Popen(
        [JOURNAL_REMOTE, f"--output={directory / 'system.journal'}", "--split-mode=none", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None
    batch: list[bytes] = []
    placed = 0
    for index in range(entries):
        boot = boots[index * len(boots) // entries]
        usec = start_usec + index * 1000
        base = {
            "__REALTIME_TIMESTAMP": str(usec),
            "__MONOTONIC_TIMESTAMP": str(index * 1000 + 1),
            "_BOOT_ID": boot,
            "_MACHINE_ID": "0123456789abcdef0123456789abcdef",
            "_HOSTNAME": "bench",
        }
        if index % 3:
            template = NOISE[rng.randrange(len(NOISE))]
            fields = {
                **base,
                "_TRANSPORT": "kernel",
                "SYSLOG_IDENTIFIER": "kernel",
                "PRIORITY": "6",
                "MESSAGE": template.format(n=rng.randrange(1, 1 << 20), m=rng.randrange(64)),
            }
        else:
            fields = {
                **base,
                "_TRANSPORT": "syslog",
                "SYSLOG_IDENTIFIER": "sshd",
                "PRIORITY": "6",
                "_PID": "812",
                "MESSAGE": f"Accepted publickey for deploy from 10.0.{index % 255}.7 port "
                f"{index % 60000} ssh2",
            }
        batch.append(export_entry(fields))
        if index % every == every // 2 and placed < incidents:
            for offset, line in enumerate(blocks[placed % len(blocks)]):
                batch.append(
                    export_entry(
                        {
                            **base,
                            "__REALTIME_TIMESTAMP": str(usec + offset + 1),
                            "_TRANSPORT": "kernel",
                            "SYSLOG_IDENTIFIER": "kernel",
                            "PRIORITY": "4",
                            "MESSAGE": line,
                        }
                    )
                )
            placed += 1
        if len(batch) >= 5000:
            proc.stdin.write(b"".join(batch))
            batch.clear()
    proc.stdin.write(b"".join(batch))
    proc.stdin.close()
    proc.wait()


def bench_journal(workdir: Path, entries: int, runs: int) -> None:
    if shutil.which("journalctl") is None or not Path(JOURNAL_REMOTE).exists():
        print("journal benchmark skipped: needs journalctl and systemd-journal-remote")
        return
    sys.path.insert(0, str(REPO))
    from memforensics.sources.logs.journal import JournalReader

    directory = workdir / "journal"
    started = time.perf_counter()
    make_journal(directory, entries, incidents=200)
    size = sum(p.stat().st_size for p in directory.iterdir())
    print(
        f"journal: {entries} noise entries + 200 incidents, {size / (1 << 20):.0f} MiB on disk, "
        f"built in {time.perf_counter() - started:.1f} s",
        flush=True,
    )
    bare = JournalReader(directory=str(directory)).argv()
    bare_seconds, bare_out = timed(bare, runs)
    ours_seconds, ours_out = timed(
        [*MEMFORENSICS, "oom", "--directory", str(directory), "--json"], runs
    )
    document = json.loads(ours_out)
    print(
        f"  bare journalctl, same filter: {bare_seconds:.3f} s ({len(bare_out.splitlines())} "
        "matching entries)"
    )
    print(f"  memforensics oom --directory: {ours_seconds:.3f} s ({document['kills']} kills)")
    ratio = ours_seconds / bare_seconds
    verdict = "met" if ratio <= 1.2 else "NOT met"
    print(f"  ratio memforensics/journalctl = {ratio:.2f}x (target <= 1.2x: {verdict})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log-mib", type=int, default=300, help="size of the text log")
    parser.add_argument("--skip-journal", action="store_true", help="only the text benchmark")
    parser.add_argument("--journal-entries", type=int, default=400_000)
    parser.add_argument("--runs", type=int, default=3, help="timed runs per command (median)")
    parser.add_argument(
        "--no-compile",
        action="store_true",
        help="do not byte-compile memforensics first (an installed package has its .pyc files; "
        "a source tree run with PYTHONDONTWRITEBYTECODE=1 compiles every module on every run)",
    )
    args = parser.parse_args()
    if not args.no_compile:
        import compileall

        compileall.compile_dir(REPO / "memforensics", quiet=1)
    with tempfile.TemporaryDirectory(prefix="memforensics-bench-oom-") as temp:
        workdir = Path(temp)
        bench_text(workdir, args.log_mib, args.runs)
        (workdir / "kern.log").unlink()
        if not args.skip_journal:
            bench_journal(workdir, args.journal_entries, args.runs)


if __name__ == "__main__":
    main()
