"""Real target processes for integration tests: compiled from tests/targets/*.c or Python,
started behind a "ready" handshake on stdout, always killed in ``finally``."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

TARGETS_DIR = Path(__file__).resolve().parent.parent / "targets"
_BUILD_DIR = Path(tempfile.gettempdir()) / f"memforensics-test-targets-{os.getuid()}"
READY_TIMEOUT_SECONDS = 20.0


@dataclass
class Target:
    """A running target process and the line it printed after "ready"."""

    proc: subprocess.Popen[bytes]
    ready_line: str

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def state(self) -> str:
        """The one-letter state from /proc/PID/stat ('R', 'S', 'T', 'Z', ...)."""
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0]

    def settled_state(self, timeout_seconds: float = 2.0) -> str:
        """state() once it is no longer 'R' (or after ``timeout_seconds``): a thread released
        from a ptrace stop runs for a moment, restarting the call it slept in, before it
        sleeps again. A target left stopped reads 'T' or 't' at once."""
        deadline = time.monotonic() + timeout_seconds
        state = self.state()
        while state == "R" and time.monotonic() < deadline:
            time.sleep(0.01)
            state = self.state()
        return state


def have_cc() -> bool:
    return shutil.which("cc") is not None


def live_skip_reason() -> str | None:
    """Why real gdb cannot attach to test targets here, or None when it can."""
    if shutil.which("gdb") is None:
        return "gdb is not installed"
    return ptrace_skip_reason()


def ptrace_skip_reason() -> str | None:
    """Why the tests cannot build targets and ptrace them here, or None when they can."""
    if not have_cc():
        return "no C compiler (cc) to build the targets"
    scope_file = Path("/proc/sys/kernel/yama/ptrace_scope")
    if scope_file.exists():
        scope = int(scope_file.read_text())
        if scope >= 3:
            return "kernel.yama.ptrace_scope is 3: ptrace attach is disabled on this machine"
        if scope >= 1 and os.geteuid() != 0:
            return f"kernel.yama.ptrace_scope is {scope} and the tests do not run as root"
    return None


# Integration tests that attach gdb skip, with the reason, where this machine cannot.
needs_live = pytest.mark.skipif(live_skip_reason() is not None, reason=str(live_skip_reason()))


def compile_target(name: str, *extra_flags: str) -> Path:
    """Compile tests/targets/NAME.c (cached by content and flags) and return the binary."""
    source = TARGETS_DIR / f"{name}.c"
    digest = hashlib.sha256(source.read_bytes() + " ".join(extra_flags).encode()).hexdigest()[:12]
    _BUILD_DIR.mkdir(mode=0o700, exist_ok=True)
    binary = _BUILD_DIR / f"{name}-{digest}"
    if not binary.exists():
        tmp = binary.with_suffix(".tmp")
        subprocess.run(
            ["cc", "-O1", "-g0", "-o", str(tmp), str(source), "-pthread", *extra_flags],
            check=True,
            capture_output=True,
        )
        tmp.rename(binary)
    return binary


def _read_ready(proc: subprocess.Popen[bytes], timeout_seconds: float) -> str:
    """Wait for a line starting with 'ready' on the target's stdout, for at most the deadline.

    Reads with select() and os.read(), never a blocking readline(): a target that hangs
    before printing, or prints half a line, fails its test instead of hanging the suite.
    """
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout_seconds
    pending = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"target did not say ready within {timeout_seconds:g} s")
        readable, _, _ = select.select([fd], [], [], min(left, 0.5))
        if not readable:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            proc.wait(timeout=max(deadline - time.monotonic(), 1.0))
            raise RuntimeError(f"target exited with {proc.returncode} before saying ready")
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace").strip()
            if line.startswith("ready"):
                return line


@contextlib.contextmanager
def running(
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    ready_timeout_seconds: float = READY_TIMEOUT_SECONDS,
    stdin: int = subprocess.DEVNULL,
) -> Iterator[Target]:
    """Start ``argv``, wait for its "ready" line, yield it, and kill it in ``finally``.
    ``stdin=subprocess.PIPE`` gives the test a command pipe (``proc.stdin``)."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    proc = subprocess.Popen(
        list(argv),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=full_env,
        start_new_session=True,
    )
    try:
        yield Target(proc=proc, ready_line=_read_ready(proc, ready_timeout_seconds))
    finally:
        if proc.poll() is None:
            # A target left stopped by a failed test still dies: SIGKILL works on stopped tasks.
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(BrokenPipeError):  # unsent commands to a dead target
                    stream.close()


@contextlib.contextmanager
def c_target(
    name: str, *args: str, env: dict[str, str] | None = None, cflags: Sequence[str] = ()
) -> Iterator[Target]:
    """Compile and run tests/targets/NAME.c with ``args``."""
    binary = compile_target(name, *cflags)
    with running([str(binary), *args], env=env) as target:
        yield target


@contextlib.contextmanager
def python_target(code: str, *, env: dict[str, str] | None = None) -> Iterator[Target]:
    """Run ``python -c code``; the code must print a line starting with 'ready' and flush."""
    with running([sys.executable, "-c", code], env=env) as target:
        yield target


def memory_cgroup(name: str, limit_bytes: int) -> Path | None:
    """A fresh memory cgroup (v1 memory controller or v2) named ``name-PID`` under ours,
    limited to ``limit_bytes``; None where none can be made. The caller removes it."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            limit_file = "memory.limit_in_bytes"
            break
        if controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
            limit_file = "memory.max"
    else:
        return None
    group = base / f"{name}-{os.getpid()}"
    try:
        group.mkdir()
        (group / limit_file).write_text(str(limit_bytes))
    except OSError:
        with contextlib.suppress(OSError):
            group.rmdir()
        return None
    return group


def cpu_cgroup(name: str, quota_us: int, period_us: int = 100_000) -> Path | None:
    """A fresh cgroup named ``name-PID`` under ours with a CPU quota of ``quota_us`` in each
    ``period_us`` (v1 cpu controller, or v2 where our cgroup lets its children use cpu);
    None where none can be made. The caller removes it."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            base = Path("/sys/fs/cgroup/cpu") / path.lstrip("/")
            break
        if controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
            try:
                if "cpu" not in (base / "cgroup.subtree_control").read_text().split():
                    (base / "cgroup.subtree_control").write_text("+cpu")
            except OSError:
                return None
            break
    else:
        return None
    group = base / f"{name}-{os.getpid()}"
    try:
        group.mkdir()
        if (group / "cpu.max").exists():
            (group / "cpu.max").write_text(f"{quota_us} {period_us}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(period_us))
            (group / "cpu.cfs_quota_us").write_text(str(quota_us))
    except OSError:
        with contextlib.suppress(OSError):
            group.rmdir()
        return None
    return group


def in_cgroup(group: Path, argv: list[str]) -> list[str]:
    """``argv`` run inside ``group`` (its shell joins it, then becomes ``argv``)."""
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group), *argv]


@contextlib.contextmanager
def started_in_cgroup(
    argv: list[str],
    *,
    group_name: str,
    limit_bytes: int,
    arena_max: int,
    tunables: str = "",
    env: dict[str, str] | None = None,
    ready: list[str] | None = None,
) -> Iterator[int]:
    """``argv`` (a built target) run with glibc.malloc.arena_max=``arena_max`` (and the
    GLIBC_TUNABLES ``tunables``, "name=value:...", and ``env`` added to ours), in a fresh
    memory cgroup of ``limit_bytes`` when one can be made; its PID once it printed "ready"
    (the line appended to ``ready`` where given). Killed, and its cgroup removed, at the end."""
    group = memory_cgroup(group_name, limit_bytes)
    settings = ":".join(filter(None, [f"glibc.malloc.arena_max={arena_max}", tunables]))
    env = dict(os.environ, **(env or {}), GLIBC_TUNABLES=settings)
    if group is not None:
        argv = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group), *argv]
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if not line.startswith("ready"):
            raise RuntimeError(f"target did not start: {line!r}")
        if ready is not None:
            ready.append(line)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
        if group is not None:
            with contextlib.suppress(OSError):
                group.rmdir()


def proc_status(pid: int, tid: int | None = None) -> dict[str, str]:
    """/proc/PID/status (or a thread's, /proc/PID/task/TID/status) as a dict of its fields."""
    path = Path(f"/proc/{pid}/status" if tid is None else f"/proc/{pid}/task/{tid}/status")
    fields = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def assert_integrity_intact(target: Target) -> None:
    """End tests/targets/integrity.c (SIGTERM) and check its own report: it exits 0, found
    nothing corrupt (registers, pipe order, heap pattern), and made progress: bytes through
    its pipe and SIGALRMs handled."""
    os.kill(target.pid, signal.SIGTERM)
    assert target.proc.wait(timeout=20) == 0
    assert target.proc.stdout is not None
    report = target.proc.stdout.read().decode()
    assert "corrupt" not in report, report
    match = re.search(r"ok loops=(\d+) bytes=(\d+) alarms=(\d+)", report)
    assert match and int(match.group(2)) > 0 and int(match.group(3)) > 0, report
