"""`trim` without gdb (the default way): the figures read from the target's memory
(entry.readers.memory), and
malloc_trim called through a signal frame that restores the calling thread by itself
(sources.proc.ptrace_call), so that nothing on our side has to survive for the target to be
left whole: a SIGKILL of memforensics at any moment leaves it untouched, or trimming and
then restored.

The call is made only at a moment when it cannot wait on the target or corrupt it: every
thread held, no arena's mutex held, no thread stopped inside the allocator's code or in a
system call the allocator makes; else the target runs a while and another moment is tried,
until the deadline (exit 6). The other threads are let go as malloc_trim starts: it takes
each arena's lock as any thread's malloc does, so a trim of gigabytes (madvise of every free
page) keeps only the calling thread busy, not the whole process stopped. The pause reported
is how long every thread was held (a single-threaded target's includes the call).
"""

from __future__ import annotations

import os
import time

from memforensics.entry.trimmers.protocol import CallMade, TrimReading, TrimSettings
from memforensics.errors import DeadlineError, GdbMayHelpError, NotGlibcMallocError
from memforensics.model.process import HeapResidency, ProcessFacts
from memforensics.sources.glibc.call_moment import unsafe_moment
from memforensics.sources.glibc.libc_elf import load_libc_image
from memforensics.sources.proc.procmem import ProcessMemoryReader
from memforensics.sources.proc.ptrace_call import call, caller_thread
from memforensics.sources.proc.ptrace_hold import ThreadHold

_RETRY_FIRST_SECONDS = 0.002
_RETRY_MAX_SECONDS = 0.05


def call_malloc_trim(
    pid: int, facts: ProcessFacts, residency: HeapResidency | None, pad_bytes: int, timeout: float
) -> float:
    """Call malloc_trim(``pad_bytes``) in ``pid`` at a safe moment (see the module); the
    seconds the target was held for it. DeadlineError when no safe moment came in time."""
    if facts.libc_path is None:
        raise NotGlibcMallocError(f"PID {pid} maps no glibc libc", pid=pid)
    libc = load_libc_image(pid, facts.libc_path)
    restore_rt = libc.restore_rt
    if restore_rt is None:
        raise GdbMayHelpError(
            f"libc's __restore_rt was not found in {facts.libc_path} of PID {pid}: "
            "malloc_trim cannot be called without gdb",
            hint="gdb's way makes the call from a safe point instead",
            pid=pid,
        )
    mutexes = [a.address for a in residency.arenas if a.address] if residency else []
    deadline = time.monotonic() + timeout
    wait = _RETRY_FIRST_SECONDS
    with ProcessMemoryReader(pid) as mem:
        while True:
            if time.monotonic() > deadline:
                raise DeadlineError(f"PID {pid}: no time left to call malloc_trim", pid=pid)
            with ThreadHold(pid, timeout_seconds=min(timeout, 1.0), registers=True) as hold:
                caller = caller_thread(hold, pid)
                outcome = None
                if caller is not None and not unsafe_moment(hold, libc, mutexes, mem):
                    outcome = call(
                        hold,
                        caller,
                        libc.functions["malloc_trim"],
                        [pad_bytes],
                        restore_rt=restore_rt,
                        deadline=deadline,
                        others_run=True,
                    )
            if outcome is not None and not outcome.finished:
                raise DeadlineError(
                    f"PID {pid}: malloc_trim had not returned after {timeout:g} s; it goes "
                    "on in the target and restores the thread by itself when it ends",
                    pid=pid,
                )
            if outcome is not None:
                return hold.stop_seconds
            if time.monotonic() + wait > deadline:
                raise DeadlineError(
                    f"PID {pid}: no moment with every arena unlocked and no thread inside "
                    f"the allocator within {timeout:g} s",
                    pid=pid,
                )
            time.sleep(wait)
            wait = min(wait * 2, _RETRY_MAX_SECONDS)


class DirectTrimmer:
    """malloc_trim without gdb (see the module): the heap read from memory, then the call."""

    call_name = "trim"
    purge: str | None = None

    def __init__(self, pid: int, facts: ProcessFacts, settings: TrimSettings) -> None:
        self.pid = pid
        self.facts = facts
        self.pad_bytes = settings.pad_bytes
        self.timeout_seconds = settings.timeout_seconds
        self._residency: HeapResidency | None = None

    def read(self) -> TrimReading:
        from memforensics.analysis.trim_forecast import forecast_trim
        from memforensics.entry.readers.memory import inspect_read_only, read_budget_seconds

        pid = self.pid
        inspection = inspect_read_only(
            pid,
            timeout_seconds=min(self.timeout_seconds, 1.0),
            pad_bytes=self.pad_bytes,
            budget_seconds=read_budget_seconds(self.timeout_seconds),
        )
        dump = inspection.analysis.dump
        if dump.all_zero:
            raise NotGlibcMallocError(
                f"PID {pid} ({self.facts.name}) maps glibc but its malloc holds no memory: "
                "nothing of it to trim (malloc never took memory here; what the process "
                "allocates, another allocator serves)",
                pid=pid,
            )
        residency = self._residency = inspection.residency
        page = residency.page_bytes if residency else os.sysconf("SC_PAGE_SIZE")
        forecast = forecast_trim(dump, residency, page_bytes=page, pad_bytes=self.pad_bytes)
        return TrimReading(
            forecast=forecast,
            free_bytes=dump.free_bytes,
            heap_bytes=dump.system_bytes,
            arenas=len(dump.arenas),
            pause_seconds=inspection.capture.pause_seconds,
            notes=residency.notes if residency else (),
        )

    def call(self) -> CallMade:
        pause_seconds = call_malloc_trim(
            self.pid, self.facts, self._residency, self.pad_bytes, self.timeout_seconds
        )
        return CallMade(
            pause_seconds=pause_seconds,
            returned=None,
            how="malloc_trim was called without gdb (its return value is not kept)",
        )
