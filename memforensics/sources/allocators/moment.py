"""A foreign allocator's own functions called in the target (no gdb), at a moment when the
calls cannot wait on the target or corrupt it.

Every thread is held (sources.proc.ptrace_hold); the moment is taken when no thread stopped
inside the allocator's code, nor inside a system call an allocator makes to map or give
back memory (its locks are held only there). Else the target runs a while and another
moment is tried, until the deadline (DeadlineError, exit 6: nothing was called). The calls
are made on one thread, preferably one waiting in a system call, while the others stay held
(sources.proc.ptrace_probe): each restores the thread by itself when it returns, whoever is
alive by then.

A thread of the target blocked on a lock inside the allocator (its program counter in
libc's futex wait) is not seen as inside it: a call that needs that lock waits until the
deadline, the hold is released, and the call ends and restores its thread by itself once
the lock is free; this reading is then lost (DeadlineError), the target is not.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from memforensics.errors import DeadlineError, TargetError
from memforensics.sources.glibc.arena_hold import ALLOCATOR_SYSCALLS
from memforensics.sources.glibc.libc_elf import LibcImage
from memforensics.sources.proc.ptrace_call import caller_thread
from memforensics.sources.proc.ptrace_hold import ThreadHold
from memforensics.sources.proc.ptrace_probe import ProbeCall, call_reading

_RETRY_FIRST_SECONDS = 0.002
_RETRY_MAX_SECONDS = 0.05
# The most calls one hold makes (each holds the target ~0.2-0.3 ms): a process of hundreds of
# arenas is read in many short holds, never one that freezes it for a large fraction of a
# second. Figures an allocator snapshots (jemalloc's epoch) read the same from any hold.
CALLS_PER_HOLD = 32


class AllocatorCalls:
    """Batches of calls into one process's allocator, each in one hold (see the module);
    ``stop_seconds`` adds up the holds, ``longest_stop_seconds`` is the longest one."""

    def __init__(
        self,
        pid: int,
        *,
        libc: LibcImage,
        code: Sequence[tuple[int, int]],
        timeout_seconds: float,
    ) -> None:
        if libc.restore_rt is None:
            raise TargetError(
                f"libc's __restore_rt was not found in {libc.path} of PID {pid}: no call "
                "can return through it",
                pid=pid,
            )
        self.pid = pid
        self._libc = libc
        self._restore_rt = libc.restore_rt
        self._code = tuple(code)
        self._deadline = time.monotonic() + timeout_seconds
        self._timeout_seconds = timeout_seconds
        self.stop_seconds = 0.0
        self.longest_stop_seconds = 0.0
        self.holds = 0

    def _busy(self, hold: ThreadHold) -> bool:
        counters = hold.program_counters
        for tid in hold.thread_ids:
            if tid not in counters:
                return True
            pc, syscall = counters[tid]
            if any(start <= pc < end for start, end in self._code):
                return True
            if syscall in ALLOCATOR_SYSCALLS and self._libc.in_text(pc):
                return True
        return False

    def run_bounded(
        self, calls: Sequence[ProbeCall], per_hold: int = CALLS_PER_HOLD
    ) -> list[bytes]:
        """``calls`` made in order, at most ``per_hold`` of them in each hold (``run``); for
        reads whose results do not depend on being made in one moment."""
        results: list[bytes] = []
        for first in range(0, len(calls), per_hold):
            results += self.run(calls[first : first + per_hold])
        return results

    def run(self, calls: Sequence[ProbeCall]) -> list[bytes]:
        """Make ``calls`` in one hold at a safe moment; each call's scratch as its function
        left it. DeadlineError when no safe moment came in time, or the calls did not end."""
        wait = _RETRY_FIRST_SECONDS
        while True:
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                raise DeadlineError(
                    f"PID {self.pid}: no moment with no thread inside the allocator within "
                    f"{self._timeout_seconds:g} s",
                    pid=self.pid,
                )
            results: list[bytes] | None = None
            called = False
            with ThreadHold(self.pid, timeout_seconds=min(remaining, 1.0), registers=True) as hold:
                caller = caller_thread(hold, self.pid)
                if caller is not None and not self._busy(hold):
                    called = True
                    results = call_reading(
                        hold,
                        caller,
                        calls,
                        restore_rt=self._restore_rt,
                        deadline=self._deadline,
                        pop3_ret=self._libc.pop3_ret,
                    )
            self.stop_seconds += hold.stop_seconds
            self.longest_stop_seconds = max(self.longest_stop_seconds, hold.stop_seconds)
            self.holds += 1
            if called and results is None:
                raise DeadlineError(
                    f"PID {self.pid}: the allocator's call had not returned after "
                    f"{self._timeout_seconds:g} s (it waits on a lock a held thread had?); it "
                    "goes on in the target and restores the thread by itself when it ends",
                    pid=self.pid,
                )
            if results is not None:
                return results
            time.sleep(min(wait, max(self._deadline - time.monotonic(), 0)))
            wait = min(wait * 2, _RETRY_MAX_SECONDS)
