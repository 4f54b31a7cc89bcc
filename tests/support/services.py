"""Real services for the integration tests, each started once per session and always stopped.

- PostgreSQL under pgbench: see tests/support/postgres.py.
- ``java_service``: tests/targets/NativeChurn.java compiled with javac into a temp dir.
- ``python_service``: tests/targets/py_service.py, a threading line-protocol server.
- ``c_service``: tests/targets/busy_service.c, compiled like the other targets.

The JVM, Python and C services answer a line protocol on a loopback port they print as
"ready port=N"; ``Prober`` asks them over and over while a test inspects and trims them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.targets import TARGETS_DIR, Target, compile_target, memory_cgroup, running

ANSWER_TIMEOUT_SECONDS = 10.0  # a healthy service answers in ms; an inspect pauses it < 1 s


def _port_of(target: Target) -> int:
    match = re.search(r"port=(\d+)", target.ready_line)
    if match is None:
        raise RuntimeError(f"no port in the ready line {target.ready_line!r}")
    return int(match.group(1))


class LineClient:
    """One persistent connection to a line-protocol service on 127.0.0.1."""

    def __init__(self, port: int, *, timeout_seconds: float = ANSWER_TIMEOUT_SECONDS) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_seconds)
        self._file = self._sock.makefile("rwb")

    def ask(self, line: str) -> str:
        """Send one line, return the answer line (raises on timeout or a closed connection)."""
        self._file.write(line.encode() + b"\n")
        self._file.flush()
        answer = self._file.readline()
        if not answer:
            raise ConnectionError("the service closed the connection")
        return answer.decode(errors="replace").strip()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
            self._sock.close()


@dataclass
class TcpService:
    """A running service process and the loopback port of its health check."""

    name: str
    target: Target
    port: int
    crash_logs: Path | None = None  # where the service writes crash reports (JVM hs_err)

    @property
    def pid(self) -> int:
        return self.target.pid

    def ask(self, line: str) -> str:
        client = LineClient(self.port)
        try:
            return client.ask(line)
        finally:
            client.close()

    def health(self, line: str) -> str:
        """In words, for a failure message: the answer to ``line``, or why there is none
        (with the exit status and the end of stderr when the service died)."""
        if not self.target.alive():
            stderr = self.target.proc.stderr
            tail = stderr.read().decode(errors="replace")[-1500:] if stderr is not None else ""
            crash = ""
            if self.crash_logs is not None:
                for log in sorted(self.crash_logs.glob("hs_err_pid*.log"))[:1]:
                    crash = "; " + " | ".join(log.read_text(errors="replace").splitlines()[:10])
            return f"{self.name} died ({self.target.proc.returncode}); stderr: {tail!r}{crash}"
        try:
            return f"{self.name} answered {self.ask(line)!r} (state {self.target.state()})"
        except OSError as exc:
            return f"{self.name} did not answer: {exc} (state {self.target.state()})"


@dataclass
class Prober:
    """Asks a service ``line`` every ``interval_seconds`` in a thread; keeps every answer.

    ``failures`` collects what went wrong (timeouts, refused connections, answers that
    ``check`` rejects), so a test can assert the service answered throughout.
    """

    port: int
    line: str
    check: Callable[[str], bool]
    interval_seconds: float = 0.2
    answers: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    slowest_seconds: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        client: LineClient | None = None
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                if client is None:
                    client = LineClient(self.port)
                answer = client.ask(self.line)
                self.slowest_seconds = max(self.slowest_seconds, time.monotonic() - started)
                self.answers.append(answer)
                if not self.check(answer):
                    self.failures.append(f"unexpected answer {answer!r}")
            except OSError as exc:  # includes timeouts and refused connections
                self.failures.append(f"{type(exc).__name__}: {exc}")
                if client is not None:
                    client.close()
                client = None
            self._stop.wait(self.interval_seconds)
        if client is not None:
            client.close()

    def __enter__(self) -> Prober:
        self._thread = threading.Thread(target=self._run, name=f"probe-{self.port}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=ANSWER_TIMEOUT_SECONDS + 5)


@contextlib.contextmanager
def tcp_service(
    name: str,
    argv: list[str],
    *,
    crash_logs: Path | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[TcpService]:
    """Run ``argv`` (a "ready port=N" service, ``env`` added to ours) and yield it; killed
    in ``finally``."""
    with running(argv, env=env) as target:
        yield TcpService(name=name, target=target, port=_port_of(target), crash_logs=crash_logs)


# -- C, JVM, Python ------------------------------------------------------------------------


@contextlib.contextmanager
def c_service(*args: str) -> Iterator[TcpService]:
    """tests/targets/busy_service.c: 4 threads churning over a fragmented heap."""
    binary = compile_target("busy_service")
    with tcp_service("C busy_service", [str(binary), *args]) as service:
        yield service


def java_healthy(answer: str) -> bool:
    """NativeChurn's health check says every compress/inflate round trip was right."""
    return re.fullmatch(r"pong ops=\d+ errors=0", answer) is not None


def java_skip_reason() -> str | None:
    if shutil.which("javac") is None or shutil.which("java") is None:
        return "no JDK (javac and java) on this machine: the OpenJDK package is not installed"
    return None


@contextlib.contextmanager
def java_service(*args: str, memory_limit_bytes: int | None = None) -> Iterator[TcpService]:
    """tests/targets/NativeChurn.java compiled into a temp dir and run on a small heap; with
    ``memory_limit_bytes``, in a fresh memory cgroup of that limit (where one can be made),
    removed at the end."""
    group = memory_cgroup("mf-jvm", memory_limit_bytes) if memory_limit_bytes else None
    try:
        with _java_service(args, group) as service:
            yield service
    finally:
        if group is not None:
            with contextlib.suppress(OSError):
                group.rmdir()


@contextlib.contextmanager
def _java_service(args: tuple[str, ...], group: Path | None) -> Iterator[TcpService]:
    with tempfile.TemporaryDirectory(prefix="memforensics-jvm-") as classes:
        subprocess.run(
            ["javac", "-nowarn", "-d", classes, str(TARGETS_DIR / "NativeChurn.java")],
            check=True,
            capture_output=True,
            timeout=120,
        )
        argv = [
            "java",
            # The churn is native; the Java heap only holds the work arrays. Touched whole at
            # start, so its growth does not blur the RSS a trim gives back.
            "-Xms64m",
            "-Xmx64m",
            "-XX:+AlwaysPreTouch",
            "-XX:+UseSerialGC",  # one GC thread: the 16 workers are the busy ones
            "-XX:TieredStopAtLevel=1",  # quick warm-up, little compiler CPU on 2 cores
            f"-XX:ErrorFile={classes}/hs_err_pid%p.log",  # a crash report, not in the cwd
            "-cp",
            classes,
            "NativeChurn",
            *args,
        ]
        if group is not None:  # exec: the JVM keeps the shell's PID, inside the group
            argv = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group), *argv]
        with tcp_service("OpenJDK NativeChurn", argv, crash_logs=Path(classes)) as service:
            yield service


@contextlib.contextmanager
def python_service(*args: str, preload: str | None = None) -> Iterator[TcpService]:
    """tests/targets/py_service.py: a threading line-protocol server on 127.0.0.1; with
    ``preload``, that allocator library serves its malloc (LD_PRELOAD)."""
    argv = [sys.executable, str(TARGETS_DIR / "py_service.py"), *args]
    env = {"LD_PRELOAD": preload} if preload else None
    with tcp_service("Python py_service", argv, env=env) as service:
        yield service


def _py_service_module() -> Any:
    """tests/targets/py_service.py as a module: clients recompute its answers with it."""
    spec = importlib.util.spec_from_file_location(
        "memforensics_py_service", TARGETS_DIR / "py_service.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class LoadGenerator:
    """``clients`` threads, each on its own connection, sending ``work SEED COUNT`` and
    checking every digest, paced and bounded in time; ``ok``/``wrong``/``errors`` count."""

    port: int
    clients: int = 4
    count: int = 16
    pause_seconds: float = 0.01
    limit_seconds: float = 600.0  # a bound even if nobody stops it
    ok: int = 0
    wrong: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _client(self, index: int, expected: Callable[[int, int], str]) -> None:
        deadline = time.monotonic() + self.limit_seconds
        seed = (index + 1) * 10_000_000
        client: LineClient | None = None
        while not self._stop.is_set() and time.monotonic() < deadline:
            seed += 1
            try:
                if client is None:
                    client = LineClient(self.port)
                answer = client.ask(f"work {seed} {self.count}")
            except OSError as exc:
                with self._lock:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                if client is not None:
                    client.close()
                client = None
                self._stop.wait(0.2)
                continue
            right = answer == f"ok {expected(seed, self.count)}"
            with self._lock:
                if right:
                    self.ok += 1
                else:
                    self.wrong += 1
            self._stop.wait(self.pause_seconds)
        if client is not None:
            client.close()

    def start(self) -> LoadGenerator:
        expected = _py_service_module().expected_digest
        for index in range(self.clients):
            thread = threading.Thread(
                target=self._client, args=(index, expected), name=f"load-{index}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=ANSWER_TIMEOUT_SECONDS + 5)

    def wait_for_answers(self, more_than: int, *, timeout_seconds: float = 30.0) -> None:
        """Poll until ``ok`` exceeds ``more_than`` (the service is answering correctly)."""
        deadline = time.monotonic() + timeout_seconds
        while self.ok <= more_than:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the service gave {self.ok} correct answers, wanted more than {more_than}; "
                    f"wrong {self.wrong}, errors {self.errors[-3:]}"
                )
            time.sleep(0.05)
