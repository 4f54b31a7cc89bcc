"""A throwaway Redis server for tests: a real jemalloc process under load, with jemalloc's own
figures (``INFO memory``) to check memforensics against.

Debian's redis-tools package ships the server program as /usr/bin/redis-check-rdb (and
redis-check-aof): Redis picks its role from argv[0], so a symlink named ``redis-server`` in a
temp dir runs the full server without the redis-server package, whose postinst would start a
system service. That program is linked to the system's libjemalloc.so.2.

Each server gets a temp dir (its working dir and log), a free port on 127.0.0.1, no
persistence; it is shut down (SHUTDOWN NOSAVE, then SIGKILL by PID) and its dir removed in
``finally``. Clients speak RESP over a socket: no redis-py. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias

REDIS_TOOLS_PACKAGE = "redis-tools"
# The server program as redis-tools ships it, run under the name redis-server.
REDIS_SERVER_PROGRAM = Path("/usr/bin/redis-check-rdb")
REDIS_BENCHMARK = Path("/usr/bin/redis-benchmark")
READY_TIMEOUT_SECONDS = 20.0
REPLY_TIMEOUT_SECONDS = 30.0
# Pipelined batches: big enough that round trips do not dominate, small enough that the
# server's reply buffer and ours stay a few hundred KiB.
PIPELINE_COMMANDS = 1000
PIPELINE_BYTES = 1 << 20

RespValue: TypeAlias = str | bytes | int | list["RespValue"] | None


class RedisError(RuntimeError):
    """The server answered a command with an error reply (``-ERR ...``)."""


def redis_skip_reason() -> str | None:
    """Why no test Redis can run here (naming the Debian package), or None when it can."""
    for program in (REDIS_SERVER_PROGRAM, REDIS_BENCHMARK):
        if not program.exists():
            return f"{program} is missing: install the Debian package {REDIS_TOOLS_PACKAGE}"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _encode(args: Sequence[str | bytes | int]) -> bytes:
    """One command as a RESP array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(parts)


class _Connection:
    """A RESP connection: sends commands, reads replies from a buffered socket."""

    def __init__(self, port: int, timeout_seconds: float) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_seconds)
        self.buffer = bytearray()
        self.start = 0

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        if self.start:
            del self.buffer[: self.start]
            self.start = 0
        chunk = self.sock.recv(1 << 18)
        if not chunk:
            raise ConnectionError("Redis closed the connection")
        self.buffer += chunk

    def _line(self) -> bytes:
        while (end := self.buffer.find(b"\r\n", self.start)) < 0:
            self._fill()
        line = bytes(self.buffer[self.start : end])
        self.start = end + 2
        return line

    def _exactly(self, size: int) -> bytes:
        while len(self.buffer) - self.start < size + 2:
            self._fill()
        data = bytes(self.buffer[self.start : self.start + size])
        self.start += size + 2
        return data

    def reply(self) -> RespValue | RedisError:
        """The next reply; an error reply is returned (not raised) so that a pipeline can
        read every reply it is owed before failing."""
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RedisError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            return None if size < 0 else self._exactly(size)
        if kind == b"*":
            count = int(rest)
            if count < 0:
                return None
            items: list[RespValue] = []
            for _ in range(count):
                item = self.reply()
                if isinstance(item, RedisError):
                    raise item
                items.append(item)
            return items
        raise ConnectionError(f"not a RESP reply: {line[:80]!r}")


@dataclass(frozen=True)
class BenchmarkResult:
    """What one redis-benchmark run reported.

    ``requests_per_second`` maps each test redis-benchmark ran (``SET``, ``GET``) to its
    rate; ``errors`` holds every line of its output that is neither a result nor its header
    (an error reply, a refused connection, an unfinished test), plus a line for a nonzero
    exit status: empty exactly when the run was clean.
    """

    requests_per_second: dict[str, float]
    errors: tuple[str, ...]
    returncode: int
    output: str

    @property
    def ok(self) -> bool:
        return not self.errors


def parse_benchmark_csv(
    stdout: str, stderr: str, returncode: int, tests: Sequence[str]
) -> BenchmarkResult:
    """A BenchmarkResult from ``redis-benchmark --csv`` output; ``tests`` are the tests it was
    asked to run (upper case), each of which must have a result row."""
    rates: dict[str, float] = {}
    errors: list[str] = []
    for row in csv.reader(stdout.splitlines()):
        if not row or row[0] == "test":
            continue
        try:
            rates[row[0]] = float(row[1])
        except (IndexError, ValueError):
            errors.append(",".join(row))
    errors.extend(line.strip() for line in stderr.splitlines() if line.strip())
    errors.extend(f"no result for {test}" for test in tests if test not in rates)
    if returncode != 0:
        errors.append(f"redis-benchmark exited with status {returncode}")
    return BenchmarkResult(rates, tuple(errors), returncode, stdout + stderr)


@dataclass
class BenchmarkRun:
    """A redis-benchmark started in the background; ``finish`` collects its result."""

    proc: subprocess.Popen[str]
    tests: tuple[str, ...]
    timeout_seconds: float
    started: float = field(default_factory=time.monotonic)
    result: BenchmarkResult | None = None

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def finish(self) -> BenchmarkResult:
        """Wait for the run until its deadline (counted from its start) and parse its output
        (once: later calls return the same result). A run still going at the deadline is
        killed (redis-benchmark spins forever when its server vanishes) and raises
        TimeoutError."""
        if self.result is not None:
            return self.result
        left = max(self.started + self.timeout_seconds - time.monotonic(), 0.1)
        try:
            stdout, stderr = self.proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            self.stop()
            raise TimeoutError(
                f"redis-benchmark did not finish within {self.timeout_seconds:g} s"
            ) from None
        self.result = parse_benchmark_csv(stdout, stderr, self.proc.returncode, self.tests)
        return self.result

    def stop(self) -> None:
        """Kill the run if it is still going, and reap it."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.communicate(timeout=10)


class RedisServer:
    """A running test server: its process, port and dir, and a client connection to it."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, root: Path) -> None:
        self.proc = proc
        self.port = port
        self.root = root
        self.log_path = root / "redis.log"
        self._conn: _Connection | None = None
        self._loaded: dict[str, int] = {}
        self._benchmarks: list[BenchmarkRun] = []

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def _connection(self) -> _Connection:
        if self._conn is None:
            self._conn = _Connection(self.port, REPLY_TIMEOUT_SECONDS)
        return self._conn

    def close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def command(self, *args: str | bytes | int) -> RespValue:
        """Run one command and return its reply: simple strings as str, bulk strings as
        bytes, integers as int, arrays as lists, nil as None; an error reply raises
        RedisError."""
        conn = self._connection()
        try:
            conn.send(_encode(args))
            reply = conn.reply()
        except OSError:
            # A reply cut short (timeout, reset) leaves the stream out of step: reconnect
            # on the next command instead of reading this reply as that one's.
            self.close_connection()
            raise
        if isinstance(reply, RedisError):
            raise reply
        return reply

    def pipeline(self, commands: Iterable[Sequence[str | bytes | int]]) -> list[RespValue]:
        """Send ``commands`` (consumed lazily) in batches without waiting between them; their
        replies in order, None for an error reply. Raises the first error reply once every
        reply has been read (the connection stays in step)."""
        conn = self._connection()
        replies: list[RespValue] = []
        first_error: RedisError | None = None
        batch: list[bytes] = []
        size = 0

        def flush() -> None:
            nonlocal first_error, size
            conn.send(b"".join(batch))
            for _ in batch:
                reply = conn.reply()
                if isinstance(reply, RedisError):
                    first_error = first_error or reply
                    reply = None
                replies.append(reply)
            batch.clear()
            size = 0

        try:
            for args in commands:
                encoded = _encode(args)
                batch.append(encoded)
                size += len(encoded)
                if len(batch) >= PIPELINE_COMMANDS or size >= PIPELINE_BYTES:
                    flush()
            if batch:
                flush()
        except OSError:
            self.close_connection()  # out of step, as in ``command``
            raise
        if first_error is not None:
            raise first_error
        return replies

    def info_memory(self) -> dict[str, int | str]:
        """``INFO memory`` as a dict: integer fields as int (used_memory,
        allocator_allocated, allocator_active, allocator_resident, ...), the rest as str
        (mem_allocator, used_memory_human, allocator_frag_ratio, ...)."""
        reply = self.command("INFO", "memory")
        assert isinstance(reply, bytes), reply
        fields: dict[str, int | str] = {}
        for line in reply.decode().splitlines():
            if not line or line.startswith("#"):
                continue
            key, _, value = line.partition(":")
            fields[key] = int(value) if value.lstrip("-").isdigit() else value
        return fields

    def settled_info_memory(self, timeout_seconds: float = 5.0) -> dict[str, int | str]:
        """``INFO memory`` once its allocator figures have caught up with the last command.

        Redis samples jemalloc (``allocator_*``) in its cron, every 100 ms at the default
        ``hz 10``, so a plain ``info_memory`` right after a load still shows the old heap.
        This returns the first reading whose allocator figures equal those of a reading
        taken 250 ms (over two cron runs) before; TimeoutError when the heap keeps changing
        (a benchmark running) for ``timeout_seconds``."""
        keys = ("allocator_allocated", "allocator_active", "allocator_resident")
        deadline = time.monotonic() + timeout_seconds
        before = self.info_memory()
        while True:
            time.sleep(0.25)
            now = self.info_memory()
            if all(now.get(key) == before.get(key) for key in keys):
                return now
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Redis allocator figures still moving after {timeout_seconds:g} s"
                )
            before = now

    def load(self, keys: int, value_bytes: int, prefix: str) -> None:
        """SET ``keys`` keys ``PREFIX0`` .. ``PREFIX{keys-1}``, each to its own string of
        ``value_bytes`` bytes, pipelined. ``delete`` later knows how many keys a prefix has."""
        # Distinct values (the index up front) so that nothing in the path can share them.
        filler = b"v" * value_bytes

        def value(index: int) -> bytes:
            head = b"%d:" % index
            return (head + filler)[:value_bytes]

        encoded_prefix = prefix.encode()
        self.pipeline((b"SET", encoded_prefix + b"%d" % i, value(i)) for i in range(keys))
        self._loaded[prefix] = max(self._loaded.get(prefix, 0), keys)

    def delete(self, prefix: str, every: int) -> int:
        """DEL every ``every``-th key ``load`` set under ``prefix`` (indexes divisible by
        ``every``: 1 deletes all, 2 half), pipelined; the number of keys deleted. Raises
        KeyError for a prefix ``load`` never used."""
        if every < 1:
            raise ValueError(f"every must be at least 1, not {every}")
        count = self._loaded[prefix]
        encoded_prefix = prefix.encode()
        replies = self.pipeline(
            (b"DEL", encoded_prefix + b"%d" % i) for i in range(0, count, every)
        )
        return sum(reply for reply in replies if isinstance(reply, int))

    def start_benchmark(
        self,
        requests: int,
        clients: int = 4,
        *,
        tests: Sequence[str] = ("set", "get"),
        timeout_seconds: float = 60.0,
    ) -> BenchmarkRun:
        """Start ``redis-benchmark -n requests -c clients -t tests --csv`` against this server
        in the background; the server's ``finally`` kills it if the caller did not finish
        it."""
        argv = [str(REDIS_BENCHMARK), "-h", "127.0.0.1", "-p", str(self.port)]
        argv += ["-n", str(requests), "-c", str(clients), "-t", ",".join(tests), "--csv"]
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        run = BenchmarkRun(proc, tuple(test.upper() for test in tests), timeout_seconds)
        self._benchmarks.append(run)
        return run

    def benchmark(
        self,
        requests: int,
        clients: int = 4,
        *,
        tests: Sequence[str] = ("set", "get"),
        timeout_seconds: float = 60.0,
    ) -> BenchmarkResult:
        """Run redis-benchmark to the end (at most ``timeout_seconds``, else TimeoutError)."""
        return self.start_benchmark(
            requests, clients, tests=tests, timeout_seconds=timeout_seconds
        ).finish()

    def stop(self) -> None:
        """Stop benchmarks still running, then the server: SHUTDOWN NOSAVE, and SIGKILL by
        PID if it is still there 5 s later."""
        for run in self._benchmarks:
            run.stop()
        self.close_connection()
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                # A fresh connection: the shared one may be mid-reply after a failed test.
                conn = _Connection(self.port, 5.0)
                try:
                    conn.send(_encode(["SHUTDOWN", "NOSAVE"]))
                    with contextlib.suppress(OSError):
                        conn.reply()  # the server closes the connection as it exits
                finally:
                    conn.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def _wait_for_ping(server: RedisServer, timeout_seconds: float) -> None:
    deadline = time.monotonic() + timeout_seconds
    while True:
        if not server.alive():
            raise RuntimeError(
                f"redis-server exited with {server.proc.returncode}:\n{server.log_tail()}"
            )
        # Refused while Redis is still binding; an error reply (LOADING) before it is ready.
        with contextlib.suppress(OSError, RedisError):
            if server.command("PING") == "PONG":
                return
        server.close_connection()
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"redis-server did not answer PING within {timeout_seconds:g} s:\n"
                f"{server.log_tail()}"
            )
        time.sleep(0.05)


def _start(root: Path, port: int) -> RedisServer:
    program = root / "redis-server"
    if not program.exists():
        program.symlink_to(REDIS_SERVER_PROGRAM)
    argv = [str(program), "--port", str(port), "--bind", "127.0.0.1", "--protected-mode", "yes"]
    argv += ["--save", "", "--appendonly", "no", "--dir", str(root), "--daemonize", "no"]
    # A fresh log per attempt: a retry is decided on this attempt's lines alone.
    with (root / "redis.log").open("wb") as log:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
    return RedisServer(proc, port, root)


@contextlib.contextmanager
def redis_server(*, ready_timeout_seconds: float = READY_TIMEOUT_SECONDS) -> Iterator[RedisServer]:
    """Start a test Redis on a free loopback port and yield it once it answers PING; stop it
    and remove its dir in ``finally``. The caller checks ``redis_skip_reason`` first."""
    root = Path(tempfile.mkdtemp(prefix="memforensics-redis-"))
    server: RedisServer | None = None
    try:
        # The port is free when picked but another process may take it before Redis binds;
        # such a start fails fast ("Address already in use"), and another port is tried.
        for attempt in range(3):
            server = _start(root, _free_port())
            try:
                _wait_for_ping(server, ready_timeout_seconds)
                break
            except RuntimeError:
                server.stop()
                if attempt == 2 or "already in use" not in server.log_tail():
                    raise
        assert server is not None
        yield server
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
