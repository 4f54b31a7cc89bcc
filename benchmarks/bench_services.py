"""How long a read holds up a busy real service, as the service's own clients see it.

Three services: tests/targets/busy_service.c (16 threads churning malloc; a health check on
loopback), OpenJDK running tests/targets/NativeChurn.java (16 threads churning native
memory; a health check on loopback), also at the seeds' scale (each worker's burst of 460
Deflaters first: ten and more arenas of 100-250 MiB, ~80 % of it free, in a memory cgroup),
and a PostgreSQL backend serving pgbench (one client).
Each method reads the same process ROUNDS times; the figure of a read is the longest wait a
client of the service saw while it ran: for the JVM, a ping asked every millisecond over
loopback (the round trip that overlapped the read the longest); for PostgreSQL, pgbench's own
per-transaction latency log (the slowest transaction that overlapped the read). The same
clients' longest wait over windows as long with no read is the baseline (GC, JIT, the
scheduler of a 2-CPU host).

Methods: `inspect --json` (the default: the memory read held still, no gdb), `inspect --gdb
gdb --json`, and on PostgreSQL the manual gdb recipe (bench_inspect.run_recipe). Not the recipe
on the JVM: a call into a JVM from a bare gdb session stops on the JVM's own signals and can
end it. On the C service and the JVM, two controls split what a default read costs their
clients: "CPU as long" (a process keeping one CPU busy as long as the last default read took:
what any process's CPU use costs a service that fills a 2-CPU host) and "its stops alone" (as
many holds of every thread as the last default read made, each as long as its stops were on
average, spread over its read time as they were, and no other work). For the C service and
the JVM the client is a ping asked every millisecond over loopback, from a SCHED_FIFO thread
where it may be (Pinger says why). With ``--cpu-quota CPUS``, memforensics (and the controls)
run in a fresh cgroup of that CPU quota (a container's CPU limit), the service outside it; the
recipe does not. Prints medians; asserts nothing.

usage: python benchmarks/bench_services.py [--rounds N] [--cpu-quota CPUS]
       [--services c,jvm,jvm-seeds,postgres]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_inspect import memforensics_command, run_recipe  # noqa: E402

from tests.support.gdb_binary import use_test_gdb  # noqa: E402
from tests.support.postgres import postgres_cluster, postgres_skip_reason  # noqa: E402
from tests.support.services import (  # noqa: E402
    LineClient,
    c_service,
    java_service,
    java_skip_reason,
)
from tests.support.targets import cpu_cgroup, in_cgroup  # noqa: E402

# The cgroup memforensics runs in under --cpu-quota (empty: ours, no quota).
_QUOTA_GROUP: list[Path] = []
# The CPUs of that quota (1.0: none): a read under it takes up to 1/CPUs as long.
_QUOTA_CPUS: list[float] = [1.0]
JVM_SEEDS_LIMIT_BYTES = 4 << 30  # the seeds' scale JVM: RSS ~0.8 GiB, arenas ~2 GiB of space
Window = tuple[float, float]  # (start, end), on the clock of the client's samples
Samples = list[tuple[float, float]]  # (start, end) of each request a client made


def longest_wait_ms(samples: Samples, window: Window) -> float:
    """The longest request of ``samples`` that overlapped ``window``, in ms."""
    begin, end = window
    return 1000 * max((b - a for a, b in samples if b > begin and a < end), default=0.0)


class Pinger:
    """Asks a line-protocol service "ping" every millisecond in a thread, keeping each round
    trip's (start, end) on time.monotonic(). The thread runs SCHED_FIFO where it may (root):
    a client on another host does not wait for a CPU of the service's host, and on 2 CPUs
    shared with the service's busy threads an ordinary one would (after a stop, behind them
    all), which the figure would charge to the read. ``realtime`` says which it was."""

    def __init__(self, port: int) -> None:
        self.samples: Samples = []
        self.realtime = False
        self._client = LineClient(port)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pinger", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # (It sleeps between pings and waits on the socket: as a real-time thread it takes
        # the CPU only to send and to read, never spins.)
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
            self.realtime = True
        except OSError:
            pass
        while not self._stop.is_set():
            started = time.monotonic()
            self._client.ask("ping")
            self.samples.append((started, time.monotonic()))
            self._stop.wait(0.001)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)
        self._client.close()


def _client_kind(pinger: Pinger) -> str:
    return "the client SCHED_FIFO" if pinger.realtime else "the client at ordinary priority"


def read_windows(
    methods: dict[str, Callable[[], None]], rounds: int, clock: Callable[[], float]
) -> dict[str, list[Window]]:
    """Each method run ``rounds`` times, in turn, with a quiet window as long as the last
    read between reads (the baseline's); their windows on ``clock``."""
    windows: dict[str, list[Window]] = {name: [] for name in [*methods, "no read"]}
    for _ in range(rounds):
        for name, method in methods.items():
            began = clock()
            method()
            ended = clock()
            windows[name].append((began, ended))
            time.sleep(0.2)
            quiet = clock()
            time.sleep(ended - began)
            windows["no read"].append((quiet, clock()))
            time.sleep(0.2)
    return windows


def _run_ours(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    """``argv`` run as memforensics is: in the --cpu-quota cgroup where there is one."""
    return subprocess.run(
        in_cgroup(_QUOTA_GROUP[0], argv) if _QUOTA_GROUP else argv, capture_output=True, check=True
    )


@dataclass
class LastRead:
    """What the last default read took (its process's wall, its stops), for the controls."""

    wall_seconds: float = 0.3
    read_seconds: float = 0.1
    stops: int = 1
    stop_seconds: float = 0.005  # all its stops together


def inspect_runner(
    pid: int, *extra: str, stops: list[float] | None = None, last: LastRead | None = None
) -> Callable[[], None]:
    """`inspect … --json PID`; with ``stops``, the longest stop the read-only read reports
    (its own clock, set beside the client's) is appended to it, and a read that relayed or
    swept an arena (lists too long for one stop) says so; ``last`` is set to what it took."""

    def run() -> None:
        began = time.monotonic()
        done = _run_ours([*memforensics_command(), "inspect", *extra, "--json", str(pid)])
        wall = time.monotonic() - began
        if stops is not None:
            read = json.loads(done.stdout)["read_only"]
            if read is None:  # the read was refused and the malloc_info call stood in
                print(f"  (a read fell back to the call: {done.stderr.decode().strip()[-300:]})")
            else:
                stops.append(1000 * read["longest_stop_seconds"])
                if last is not None:
                    last.wall_seconds, last.read_seconds = wall, read["read_seconds"]
                    last.stops = max(1, int(read["stops"]))
                    last.stop_seconds = read["total_stop_seconds"]
                if read.get("relayed_arenas"):
                    print(
                        f"  (a read relayed {read['relayed_arenas']} arena(s), swept "
                        f"{read.get('swept_arenas', 0)}, in {read.get('relay_stops', 0)} stops)"
                    )

    return run


# A control's own program, in a fresh Python: "cpu SECONDS" keeps one CPU busy that long;
# "holds PID N HOLD GAP" holds every thread of PID N times, HOLD seconds each, GAP apart.
_CONTROL = """
import sys, time
sys.path.insert(0, sys.argv[1])
if sys.argv[2] == "cpu":
    end = time.monotonic() + float(sys.argv[3])
    while time.monotonic() < end:
        pass
else:
    from memforensics.sources.proc.ptrace_hold import ThreadHold
    pid, n, hold, gap = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
    for _ in range(n):
        with ThreadHold(pid):
            time.sleep(hold)
        time.sleep(gap)
"""


def cpu_runner(last: LastRead) -> Callable[[], None]:
    """One CPU kept busy as long as the last default read took, by a fresh process."""

    def run() -> None:
        _run_ours([sys.executable, "-c", _CONTROL, str(REPO), "cpu", f"{last.wall_seconds:.4f}"])

    return run


def stops_runner(pid: int, last: LastRead) -> Callable[[], None]:
    """The last default read's stops alone: as many holds of every thread of ``pid``, each
    its mean stop long, spread over its read time, by a fresh process doing nothing else."""

    def run() -> None:
        hold = last.stop_seconds / last.stops
        gap = max(0.0, last.read_seconds - last.stop_seconds) / last.stops
        argv = [sys.executable, "-c", _CONTROL, str(REPO), "holds", str(pid), str(last.stops)]
        _run_ours([*argv, f"{hold:.5f}", f"{gap:.5f}"])

    return run


def read_and_controls(pid: int, stops: list[float]) -> dict[str, Callable[[], None]]:
    """The methods a pinged service is read with: the default read (its longest stops into
    ``stops``), the gdb path, and the two controls that follow the default read."""
    last = LastRead()
    return {
        "inspect (read-only)": inspect_runner(pid, stops=stops, last=last),
        "inspect --gdb gdb": inspect_runner(pid, "--gdb", "gdb"),
        "CPU as long": cpu_runner(last),
        "its stops alone": stops_runner(pid, last),
    }


def report(
    title: str,
    windows: dict[str, list[Window]],
    wait: Callable[[Window], float],
    stops: list[float],
) -> None:
    print(f"{title}: longest wait of a client during the read, median (range) ms; read wall ms")
    for name, spans in windows.items():
        waits = [wait(w) for w in spans]
        walls = [1000 * (b - a) for a, b in spans]
        print(
            f"  {name:<22} {statistics.median(waits):8.1f} ({min(waits):.1f}-{max(waits):.1f})"
            f"   wall {statistics.median(walls):7.1f}"
        )
    if stops:
        print(
            f"  the read-only read's own longest stop: median {statistics.median(stops):.1f} ms "
            f"({min(stops):.1f}-{max(stops):.1f}; {len(stops)} reads from memory)"
        )


def bench_jvm(rounds: int, *, burst: str | None = None) -> None:
    """The JVM churning; with ``burst``, each worker's burst of that many Deflaters first
    (460: the seeds' scale, arenas of 100-250 MiB, ~80 % free), in a memory cgroup."""
    reason = java_skip_reason()
    if reason is not None:
        print(f"JVM: not measured ({reason})")
        return
    args = ("16",) if burst is None else ("16", "6", burst)
    limit = None if burst is None else JVM_SEEDS_LIMIT_BYTES
    with java_service(*args, memory_limit_bytes=limit) as service:
        time.sleep(3 if burst is None else 10)  # the bursts, the first rounds, the JIT's compiles
        pinger = Pinger(service.port)
        try:
            stops: list[float] = []
            methods = read_and_controls(service.pid, stops)
            windows = read_windows(methods, rounds, time.monotonic)
        finally:
            pinger.close()
        threads = len(os.listdir(f"/proc/{service.pid}/task"))
        print(f"answered {len(pinger.samples)} pings ({_client_kind(pinger)}); {threads} threads")
        shape = "" if burst is None else f", {_arena_shape(service.pid)}"
        report(
            f"OpenJDK NativeChurn (16 churning threads{shape}, {rounds} rounds)",
            windows,
            lambda window: longest_wait_ms(pinger.samples, window),
            stops,
        )


def bench_c(rounds: int) -> None:
    """tests/targets/busy_service.c with 16 churning workers: what holding a busy service
    costs its clients where no runtime of its own (a JVM's safepoints, its JIT) is in play."""
    with c_service("16") as service:
        time.sleep(2)
        pinger = Pinger(service.port)
        try:
            stops: list[float] = []
            methods = read_and_controls(service.pid, stops)
            windows = read_windows(methods, rounds, time.monotonic)
        finally:
            pinger.close()
        print(f"answered {len(pinger.samples)} pings ({_client_kind(pinger)})")
        report(
            f"C busy_service (16 churning threads, {rounds} rounds)",
            windows,
            lambda window: longest_wait_ms(pinger.samples, window),
            stops,
        )


def _arena_shape(pid: int) -> str:
    """How many arenas of 100 MiB or more one default read found, and their free bytes."""
    done = subprocess.run(
        [*memforensics_command(), "inspect", "--json", str(pid)], stdout=subprocess.PIPE, check=True
    )
    big = [
        arena for arena in json.loads(done.stdout)["arenas"] if arena["system_bytes"] >= 100 << 20
    ]
    free_mib = sum(arena["free_bytes"] for arena in big) >> 20
    return f"{len(big)} arenas of 100 MiB or more, {free_mib} MiB free in them"


def pgbench_samples(log_dir: Path) -> Samples:
    """(start, end) on the epoch clock of every transaction in pgbench's logs (``-l``: client,
    transaction, latency µs, script, end s, end µs, ...)."""
    samples: Samples = []
    for log in log_dir.glob("pgb*"):
        for line in log.read_text().split("\n"):
            fields = line.split()
            if len(fields) >= 6:
                end = int(fields[4]) + int(fields[5]) / 1e6
                samples.append((end - int(fields[2]) / 1e6, end))
    return samples


def bench_postgres(rounds: int) -> None:
    reason = postgres_skip_reason()
    if reason is not None:
        print(f"PostgreSQL: not measured ({reason})")
        return
    with postgres_cluster() as cluster, tempfile.TemporaryDirectory(prefix="pgb-") as logs:
        os.chmod(logs, 0o777)
        # pgbench writes its log buffered and loses it when killed: it is given time for
        # every read (~6 s a round, as many times more as a quota slows our side) and
        # waited for. (Ended early, its backend exits under the next read: exit 3.)
        duration = 10 + round(6 * rounds / min(1.0, _QUOTA_CPUS[0]))
        run = cluster.pgbench(
            clients=1, duration_seconds=duration, scripts=("-l", f"--log-prefix={logs}/pgb")
        )
        try:
            backend = cluster.backend_pids(wanted=1)[0]
            stops: list[float] = []
            time.sleep(2)
            with tempfile.TemporaryDirectory(prefix="recipe-") as scratch:
                os.chmod(scratch, 0o777)  # the backend (user postgres) writes the recipe's file
                methods = {
                    "inspect (read-only)": inspect_runner(backend, stops=stops),
                    "inspect --gdb gdb": inspect_runner(backend, "--gdb", "gdb"),
                    "gdb recipe": lambda: run_recipe(backend, Path(scratch)),
                }
                windows = read_windows(methods, rounds, time.time)
        finally:
            run.finish(timeout_seconds=duration + 60)
        if windows["no read"][-1][1] > windows["no read"][0][0] + duration:
            print("PostgreSQL: the reads outlasted pgbench; fewer --rounds")
            return
        samples = pgbench_samples(Path(logs))
        print(f"pgbench: {len(samples)} transactions logged")
        report(
            f"PostgreSQL backend under pgbench (1 client, {rounds} rounds)",
            windows,
            lambda window: longest_wait_ms(samples, window),
            stops,
        )


def main() -> int:
    use_test_gdb()  # the same gdb for memforensics and the recipe
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="reads per method (default 8)")
    parser.add_argument("--cpu-quota", type=float, default=None, help="memforensics' CPUs")
    parser.add_argument("--services", default="c,jvm,jvm-seeds,postgres")
    args, _ = parser.parse_known_args()
    if shutil.which("gdb") is None:
        print("bench_services: gdb is not installed; nothing to measure", file=sys.stderr)
        return 0
    print(f"bench_services: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    if args.cpu_quota is not None:
        group = cpu_cgroup("memforensics-bench-services", int(args.cpu_quota * 100_000))
        if group is None:
            print("bench_services: no cgroup with a CPU quota can be made here", file=sys.stderr)
            return 0
        _QUOTA_GROUP.append(group)
        _QUOTA_CPUS[0] = args.cpu_quota
        print(f"memforensics runs under a CPU quota of {args.cpu_quota} CPU ({group})")
    services = args.services.split(",")
    try:
        if "c" in services:
            bench_c(args.rounds)
        if "jvm" in services:
            bench_jvm(args.rounds)
        if "jvm-seeds" in services:
            bench_jvm(args.rounds, burst="460")
        if "postgres" in services:
            bench_postgres(args.rounds)
    finally:
        for group in _QUOTA_GROUP:
            group.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
