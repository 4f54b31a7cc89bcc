"""tests/targets/hold_counter.c for the ptrace hold tests: started with a command pipe, asked
for its counters, and checked for being left running (alive, untraced, not stopped, counting)."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.targets import Target, compile_target, running

ANSWER_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Counts:
    """What the target counted so far."""

    alarms: int  # SIGALRMs handled (alarm=USEC): a chain that stops means one was lost
    threads_created: int  # short-lived threads made (churn)
    vforker: int  # the vfork thread's count after vfork returned
    workers: tuple[int, ...]  # each worker thread's count


@dataclass
class CounterTarget:
    """A running hold_counter and its command pipe."""

    target: Target

    @property
    def pid(self) -> int:
        return self.target.pid

    def counts(self) -> Counts:
        """Ask the target for its counters (answered by its command thread)."""
        proc = self.target.proc
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"counts\n")
        proc.stdin.flush()
        fd = proc.stdout.fileno()
        line = b""
        deadline = time.monotonic() + ANSWER_TIMEOUT_SECONDS
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            assert left > 0, f"no answer from the target within {ANSWER_TIMEOUT_SECONDS:g} s"
            readable, _, _ = select.select([fd], [], [], left)
            if readable:
                chunk = os.read(fd, 4096)
                assert chunk, f"the target closed its stdout (exit {proc.poll()})"
                line += chunk
        words = line.split()
        assert words[0] == b"counts", line
        numbers = [int(word) for word in words[1:]]
        return Counts(numbers[0], numbers[1], numbers[2], tuple(numbers[3:]))

    def threads(self) -> dict[int, tuple[str, int]]:
        """tid -> (one-letter state, TracerPid) of every thread listed now."""
        found = {}
        for entry in Path(f"/proc/{self.pid}/task").iterdir():
            with contextlib.suppress(OSError):
                fields = dict(
                    line.partition(":")[::2] for line in (entry / "status").read_text().splitlines()
                )
                found[int(entry.name)] = (
                    fields["State"].strip()[:1],
                    int(fields["TracerPid"].strip()),
                )
        return found


@contextlib.contextmanager
def hold_counter(*args: str) -> Iterator[CounterTarget]:
    """Compile and run hold_counter with ``args``; killed in ``finally``."""
    binary = compile_target("hold_counter")
    with running([str(binary), *args], stdin=subprocess.PIPE) as target:
        yield CounterTarget(target)


def untraced_and_not_stopped(threads: dict[int, tuple[str, int]]) -> bool:
    """No thread traced, none stopped (a zombie leader counts as neither)."""
    return all(tracer == 0 and state not in ("T", "t") for state, tracer in threads.values())


def wait_left_running(counter: CounterTarget, timeout_seconds: float = 10.0) -> None:
    """Until every thread is untraced and not stopped (the kernel may take a moment to let go
    of a dead tracer's tracees); fails naming the threads that are not."""
    deadline = time.monotonic() + timeout_seconds
    threads = counter.threads()
    while not untraced_and_not_stopped(threads) and time.monotonic() < deadline:
        time.sleep(0.005)
        threads = counter.threads()
    assert counter.target.alive(), f"target died: {counter.target.proc.returncode}"
    assert untraced_and_not_stopped(threads), threads


def assert_progress(counter: CounterTarget, *, alarms: bool = False, seconds: float = 0.3) -> None:
    """Every worker counts on (and the SIGALRM chain goes on, with ``alarms``)."""
    before = counter.counts()
    time.sleep(seconds)
    after = counter.counts()
    stalled = [
        i for i, (a, b) in enumerate(zip(before.workers, after.workers, strict=True)) if b <= a
    ]
    assert stalled == [], f"workers {stalled} made no progress: {before} -> {after}"
    if alarms:
        assert after.alarms > before.alarms, f"the SIGALRM chain stopped: {before} -> {after}"
