"""Short stops of a live target around the read-only reading of its arenas (heapmaps'
ArenaHold), each a ptrace hold of every thread (memforensics.sources.proc.ptrace_hold).

One stop covers consecutive arenas until it has lasted ``stop_budget_seconds`` (or, in a
process of many threads, a share of the time holding them all took); the target then runs
again and the next arena begins a new stop, so no stop is much longer than that plus the
read of one arena, however many arenas there are. Nothing is written into
the target and no code runs there: the threads are only held while /proc/PID/mem is read.

An arena is safe to read in a stop when no thread is in the middle of changing it. A thread
changing an arena holds its mutex (heapmaps checks the word), except in a process that never
started a second thread: glibc then takes no lock (SINGLE_THREAD_P), so ``in_allocator``
looks at where that one thread stopped: inside the allocator's code, or inside a system call
the allocator makes to grow or shrink its memory.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator

from memforensics.sources.glibc.libc_elf import LibcImage
from memforensics.sources.proc.cpu_quota import stop_reading_seconds
from memforensics.sources.proc.ptrace_hold import ThreadHold

STOP_BUDGET_SECONDS = 0.004  # a stop takes no further arena once it has lasted this long
# ... or, in a process of at least STOP_SHARE_MIN_THREADS threads (whose hold alone takes tens
# of ms: 20-40 ms for 1,500), once it has read for STOP_SHARE_OF_HOLD of the time the hold
# took, at most STOP_SHARE_MAX_SECONDS: each stop's stall grows by at most that share over
# the hold's own cost, and the stops a read needs, each paying that cost to stop and to
# release every thread, fall as much. (By the threads, not by the hold's time alone: a few
# busy threads on few CPUs are sometimes slow to stop, 100 ms and more, and a stop that then
# read for half that long would add that much to a stall that was the moment's, not the
# process's.)
STOP_SHARE_OF_HOLD = 0.5
STOP_SHARE_MIN_THREADS = 200
STOP_SHARE_MAX_SECONDS = 0.025
# How long a locked target runs before its arena is read again: the first wait, doubled at
# each attempt up to the longest, each drawn between half and 1.5 times that so the stops
# fall at no fixed phase of a thread's loop (60 attempts span about 1.4 s: a thread holding
# its arena two thirds of the time is found holding it at all of them once in 10^10 reads).
LET_RUN_SECONDS = 0.002
LET_RUN_MAX_SECONDS = 0.025
# brk, mmap, munmap, mprotect, madvise, mremap: how an allocator grows and trims.
ALLOCATOR_SYSCALLS = frozenset((12, 9, 11, 10, 28, 25))


def reading_budget_seconds(budget_seconds: float, hold_seconds: float, threads: int) -> float:
    """How long a stop whose hold of ``threads`` threads took ``hold_seconds`` may go on
    taking arenas: ``budget_seconds``, or in a process of at least STOP_SHARE_MIN_THREADS
    threads STOP_SHARE_OF_HOLD of its hold's time (at most STOP_SHARE_MAX_SECONDS), the
    longer. (A process of a thousand threads takes tens of ms to stop and as long to
    release: reading only the budget in each stop, its read would be a hundred stops of which
    the holds are nine tenths, and run out of its time; reading for as long as the hold took
    would double the stall every thread feels. The stall is what the read is judged by, its
    wall is the operator's.)"""
    if threads < STOP_SHARE_MIN_THREADS:
        return budget_seconds
    return max(budget_seconds, min(STOP_SHARE_OF_HOLD * hold_seconds, STOP_SHARE_MAX_SECONDS))


def in_allocator(libc: LibcImage, pc: int, syscall: int) -> bool:
    """A thread stopped at ``pc`` (in system call ``syscall``, its orig_rax) is inside the
    allocator: in its code, or in one of the system calls it makes to grow or trim."""
    return libc.in_allocator(pc) or (syscall in ALLOCATOR_SYSCALLS and libc.in_text(pc))


class StopBatches:
    """heapmaps.ArenaHold for a live target; ``stops_seconds`` lists every stop's length."""

    def __init__(
        self,
        pid: int,
        *,
        libc: LibcImage | None,
        single_threaded: bool,
        timeout_seconds: float = 1.0,
        stop_budget_seconds: float = STOP_BUDGET_SECONDS,
    ) -> None:
        self.pid = pid
        self._libc = libc
        self._single_threaded = single_threaded
        self._timeout_seconds = timeout_seconds
        self._budget = stop_budget_seconds
        self._hold: ThreadHold | None = None
        self._hold_seconds = 0.0  # how long the stop running took to hold every thread
        self._hold_threads = 0  # and how many it holds
        self._since = 0.0
        self._bytes_per_second: float | None = None  # how fast arenas were read in stops
        self._locked_since = 0.0  # when the arena read now was first found locked
        self.stops_seconds: list[float] = []

    def _start(self) -> None:
        hold = ThreadHold(
            self.pid, timeout_seconds=self._timeout_seconds, registers=self._single_threaded
        )
        began = time.monotonic()
        hold.__enter__()
        self._hold = hold
        self._since = time.monotonic()
        self._hold_seconds = self._since - began
        self._hold_threads = len(hold.thread_ids)

    def _end(self) -> None:
        hold, self._hold = self._hold, None
        if hold is not None:
            hold.__exit__(None, None, None)
            self.stops_seconds.append(hold.stop_seconds)

    def _budget_seconds(self) -> float:
        """How long the stop running may go on taking arenas (reading_budget_seconds; under
        a CPU quota, at most what two readers may read in one stop within it)."""
        budget = reading_budget_seconds(self._budget, self._hold_seconds, self._hold_threads)
        return stop_reading_seconds(budget, readers=2)

    @contextlib.contextmanager
    def arena(self, weight_bytes: int = 0) -> Iterator[None]:
        """The target stopped around one arena's read of about ``weight_bytes`` of heap. A
        stop already running takes it while the stop would stay within the budget with it
        (judged from how fast the arenas before it were read); else a new stop begins."""
        self.make_room(weight_bytes)
        if self._hold is None:
            self._start()
        began = time.monotonic()
        try:
            yield
        except BaseException:
            self._end()
            raise
        now = time.monotonic()
        if weight_bytes and now > began:
            rate = weight_bytes / (now - began)
            known = self._bytes_per_second
            self._bytes_per_second = rate if known is None else (known + rate) / 2
        if now - self._since >= self._budget_seconds():
            self._end()

    def in_allocator(self) -> bool:
        """A single-threaded target's thread stopped inside the allocator's code, or in a
        system call the allocator makes (its heap is then half changed, and unlocked)."""
        if not self._single_threaded or self._libc is None or self._hold is None:
            return False
        counters = self._hold.program_counters
        return any(
            tid not in counters or in_allocator(self._libc, *counters[tid])
            for tid in self._hold.thread_ids
        )

    def let_run(self, attempt: int) -> bool:
        """End the stop and let the target run, longer at each ``attempt``; False at once
        when every thread was in a job-control stop (SIGSTOP by someone else): it will not
        run, and its lock will not be released; False too once this arena has been found
        locked for the timeout (from its first ``attempt``, 0): as long as the gdb path
        waits for a safe point."""
        hold = self._hold
        stopped = hold is not None and set(hold.stop_kinds.values()) == {"group"}
        self._end()
        now = time.monotonic()
        if attempt == 0:
            self._locked_since = now
        wait_seconds = min(LET_RUN_SECONDS * 2**attempt, LET_RUN_MAX_SECONDS)
        wait_seconds *= random.uniform(0.5, 1.5)
        if stopped or now + wait_seconds - self._locked_since > self._timeout_seconds:
            return False
        time.sleep(wait_seconds)
        return True

    def make_room(self, weight_bytes: int) -> None:
        """Before an arena's read of about ``weight_bytes``: end the stop running, if any,
        when that read would not fit in it (judged from how fast the arenas before it were
        read); ``arena()`` then begins a new one."""
        if self._hold is not None and self._bytes_per_second:
            predicted = weight_bytes / self._bytes_per_second
            if time.monotonic() - self._since + predicted > self._budget_seconds():
                self._end()

    @property
    def stopped(self) -> bool:
        """A stop holds the target now."""
        return self._hold is not None

    @property
    def total_stop_seconds(self) -> float:
        """The stops' lengths summed, the one running now (if any) up to this moment."""
        running = time.monotonic() - self._since if self._hold is not None else 0.0
        return sum(self.stops_seconds) + running

    def release(self) -> None:
        """End the stop now, if any: the target runs (the next arena begins a new one)."""
        self._end()

    def close(self) -> None:
        """End any stop (idempotent): the target runs."""
        self._end()
