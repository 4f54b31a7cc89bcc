"""The gdb way's background work, made to yield to gdb and the target: thread priority and
switches, and the gate that parks the scan while gdb stops the target's threads."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

# Background work runs at this nice value: on a busy host (or one with 2 cores) it yields the
# CPU to gdb and to the target's own threads, which would otherwise wait for it (a gdb
# descheduled while it attaches keeps the target's threads stopped that much longer).
_BACKGROUND_NICE = 10
# While a scan runs beside the gdb session, the thread driving gdb must get the GIL back
# quickly: each MI answer it waits for is part of the target's pause, and Python's default
# switch interval (5 ms) would add up to 5 ms to every answer.
_SESSION_SWITCH_SECONDS = 0.0002


@contextlib.contextmanager
def prompt_thread_switches() -> Iterator[None]:
    """Python's thread switch interval lowered for the duration (see _SESSION_SWITCH_SECONDS)."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(min(previous, _SESSION_SWITCH_SECONDS))
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def lower_thread_priority() -> None:
    """The calling thread (only it: Linux's nice is per thread) yields to everything else."""
    thread = threading.get_native_id()
    with contextlib.suppress(OSError):
        # Never lower a nice value someone set higher (as root, that would raise priority).
        nice = max(os.getpriority(os.PRIO_PROCESS, thread), _BACKGROUND_NICE)
        os.setpriority(os.PRIO_PROCESS, thread, nice)


class QuietGate:
    """Background workers (the residency scan) stop at their next checkpoint while gdb attaches.

    gdb stops the target's threads one by one as it attaches and resumes them after (and
    stops them again to detach): every millisecond it waits for a CPU then is a millisecond
    more of their stop. Measured on 2 cores: the ticker of a 16-thread target felt 13-17 ms
    alone and 27 ms with one busy core beside the attach (no more than alone beside the calls
    or the detach of 16 threads; at 1,500 threads the detach is long enough to matter too).
    ``quiet()`` (around the attach and the detach) closes the gate and waits, at most
    ``settle_seconds``, until every worker has parked at a checkpoint or finished;
    ``checkpoint()`` parks a worker while the gate is closed.
    """

    def __init__(self, *, settle_seconds: float = 0.05, park_max_seconds: float = 2.0) -> None:
        self._settle_seconds = settle_seconds
        self._park_max_seconds = park_max_seconds  # a gate left closed only delays a worker
        self._condition = threading.Condition()
        self._open = True
        self._busy = 0  # workers running outside a checkpoint

    @contextlib.contextmanager
    def worker(self) -> Iterator[None]:
        """Around a worker's whole run: busy inside, parked first if the gate is closed."""
        with self._condition:
            self._busy += 1
        try:
            self.checkpoint()
            yield
        finally:
            with self._condition:
                self._busy -= 1
                self._condition.notify_all()

    def checkpoint(self) -> None:
        """Park here while the gate is closed (a worker between two units of work)."""
        with self._condition:
            if self._open:
                return
            self._busy -= 1
            self._condition.notify_all()
            self._condition.wait_for(lambda: self._open, self._park_max_seconds)
            self._busy += 1

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """Closed for the duration, once the workers are parked (or the settle time is up)."""
        with self._condition:
            self._open = False
            self._condition.wait_for(lambda: self._busy <= 0, self._settle_seconds)
        try:
            yield
        finally:
            with self._condition:
                self._open = True
                self._condition.notify_all()
