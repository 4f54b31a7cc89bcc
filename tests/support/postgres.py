"""A throwaway PostgreSQL cluster for the service tests, driven by pgbench.

Debian's server binaries (initdb, postgres, pgbench) in a temp dir: a private port on
127.0.0.1, a private unix socket dir, fsync off, trust auth; run as the ``postgres`` system
user when the tests run as root (the server refuses root). Started once per session, stopped
(fast shutdown, then SIGKILL to its process group) and removed in ``finally``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

PG_DATABASE = "memforensics_bench"
# Lines a healthy server never logs (a crashed backend, a forced shutdown, a panic).
PG_BAD_LOG = re.compile(
    r"PANIC:|FATAL:|terminated by signal|server process .* was terminated|"
    r"was terminated by exception|all server processes terminated"
)


def postgres_bindir() -> Path | None:
    """Debian's server binaries (/usr/lib/postgresql/N/bin, newest first), else PATH."""
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    for bindir in candidates:
        if (bindir / "postgres").exists() and (bindir / "pgbench").exists():
            return bindir
    found = shutil.which("initdb")
    if found and shutil.which("pgbench") and shutil.which("postgres"):
        return Path(found).parent
    return None


def postgres_skip_reason() -> str | None:
    if postgres_bindir() is None:
        return "no PostgreSQL server binaries (initdb, postgres, pgbench) on this machine"
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a 'postgres' user to run the server as"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PgbenchRun:
    """A pgbench run in the background; ``finish`` waits for it and returns its output."""

    proc: subprocess.Popen[str]
    duration_seconds: int
    output: str = ""

    def finish(self, *, timeout_seconds: float) -> str:
        self.output, _ = self.proc.communicate(timeout=timeout_seconds)
        return self.output

    @property
    def running(self) -> bool:
        return self.proc.poll() is None


def pgbench_failed_transactions(output: str) -> int | None:
    """pgbench's "number of failed transactions: N" (PostgreSQL >= 15); None when absent."""
    match = re.search(r"number of failed transactions: (\d+)", output)
    return int(match.group(1)) if match else None


def pgbench_processed_transactions(output: str) -> int | None:
    match = re.search(r"number of transactions actually processed: (\d+)", output)
    return int(match.group(1)) if match else None


class PostgresCluster:
    """A throwaway cluster: initdb, postgres on a private port and socket dir, fsync off."""

    def __init__(self, bindir: Path, root: Path) -> None:
        self.bindir = bindir
        self.root = root
        self.data = root / "data"
        self.sockets = root / "sockets"
        self.log_path = root / "server.log"
        self.port = 0
        self.postmaster: subprocess.Popen[bytes] | None = None
        self._as_postgres = os.geteuid() == 0

    @property
    def _run_as(self) -> str | None:
        # As root the server must run as a non-root user: Debian's postgres system user.
        return "postgres" if self._as_postgres else None

    def _client_args(self) -> list[str]:
        return ["-h", str(self.sockets), "-p", str(self.port), "-U", "postgres"]

    def init(self) -> None:
        self.sockets.mkdir()
        if self._as_postgres:
            for path in (self.root, self.sockets):
                shutil.chown(path, "postgres", "postgres")
        subprocess.run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
            timeout=120,
            user=self._run_as,
            group=self._run_as,
        )

    def start(self, *, timeout_seconds: float = 60.0) -> None:
        for _ in range(3):  # a port taken between _free_port and bind: try another
            self.port = _free_port()
            with open(self.log_path, "ab") as log:
                self.postmaster = subprocess.Popen(
                    [
                        str(self.bindir / "postgres"),
                        "-D",
                        str(self.data),
                        "-p",
                        str(self.port),
                        "-k",
                        str(self.sockets),
                        "-c",
                        "listen_addresses=127.0.0.1",
                        "-c",
                        "fsync=off",
                        "-c",
                        "synchronous_commit=off",
                        "-c",
                        "full_page_writes=off",
                        "-c",
                        "shared_buffers=32MB",
                        "-c",
                        "max_connections=20",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    user=self._run_as,
                    group=self._run_as,
                )
            if self._wait_ready(timeout_seconds):
                return
            self.stop()
        raise RuntimeError(f"postgres did not start; log:\n{self.log()[-2000:]}")

    def _wait_ready(self, timeout_seconds: float) -> bool:
        deadline = time.monotonic() + timeout_seconds
        assert self.postmaster is not None
        while time.monotonic() < deadline:
            if "ready to accept connections" in self.log():
                return True
            if self.postmaster.poll() is not None:
                return False
            time.sleep(0.05)
        return False

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def bad_log_lines(self) -> list[str]:
        return [line for line in self.log().splitlines() if PG_BAD_LOG.search(line)]

    def run_client(self, tool: str, *args: str, timeout_seconds: float = 120.0) -> str:
        done = subprocess.run(
            [str(self.bindir / tool), *self._client_args(), *args],
            check=True,
            capture_output=True,
            text=True,
            timeout=timeout_seconds,
        )
        return done.stdout + done.stderr

    def pgbench_init(self, *, scale: int) -> None:
        self.run_client("createdb", PG_DATABASE)
        self.run_client("pgbench", "-i", "-q", "-s", str(scale), PG_DATABASE)

    def pgbench(
        self, *, clients: int, duration_seconds: int, scripts: tuple[str, ...] = ()
    ) -> PgbenchRun:
        """``pgbench -c CLIENTS -T SECONDS`` in the background (one connection per client);
        ``scripts`` are extra pgbench arguments (``-b NAME@W``, ``-f FILE@W``)."""
        argv = [
            str(self.bindir / "pgbench"),
            *self._client_args(),
            "-c",
            str(clients),
            "-j",
            "2",
            "-T",
            str(duration_seconds),
            *scripts,
            PG_DATABASE,
        ]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return PgbenchRun(proc=proc, duration_seconds=duration_seconds)

    def backend_pids(self, *, wanted: int, timeout_seconds: float = 30.0) -> list[int]:
        """PIDs of the postmaster's children serving pgbench's connections (cmdline
        "postgres: postgres DB [local] ..."), once ``wanted`` of them exist."""
        assert self.postmaster is not None
        deadline = time.monotonic() + timeout_seconds
        pids: list[int] = []
        while time.monotonic() < deadline:
            pids = []
            for child in psutil.Process(self.postmaster.pid).children():
                with contextlib.suppress(psutil.NoSuchProcess):
                    title = " ".join(child.cmdline())
                    if f"postgres {PG_DATABASE} [local]" in title:
                        pids.append(child.pid)
            if len(pids) >= wanted:
                return sorted(pids)
            time.sleep(0.1)
        raise RuntimeError(f"found {len(pids)} pgbench backends, wanted {wanted}")

    def stop(self, *, timeout_seconds: float = 30.0) -> None:
        """Fast shutdown (SIGINT to the postmaster); SIGKILL to its group if it hangs."""
        proc = self.postmaster
        if proc is None:
            return
        self.postmaster = None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=timeout_seconds)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


@contextlib.contextmanager
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A started cluster with the pgbench tables loaded; stopped and removed in ``finally``."""
    bindir = postgres_bindir()
    assert bindir is not None
    root = Path(tempfile.mkdtemp(prefix="memforensics-pg-"))
    cluster = PostgresCluster(bindir, root)
    try:
        cluster.init()
        cluster.start()
        cluster.pgbench_init(scale=2)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
