"""`trim` without gdb: the figures read from the target's memory (entry.readonly), and
malloc_trim called through a signal frame that restores the calling thread by itself
(sources.proc.ptrace_call), so that nothing on our side has to survive for the target to be
left whole: a SIGKILL of memforensics at any moment leaves it untouched, or trimming and
then restored.

The call is made only at a moment when it cannot wait on the target or corrupt it: every
thread held, no arena's mutex held, no thread stopped inside the allocator's code or in a
system call the allocator makes; else the target runs a while and another moment is tried,
until the deadline (exit 6). The other threads stay held while malloc_trim runs.
"""

from __future__ import annotations

import os
import time

from memforensics.errors import DeadlineError, NotGlibcMallocError, TargetError
from memforensics.model.process import HeapResidency, ProcessFacts
from memforensics.model.trim import TrimResult, before_after
from memforensics.sources.glibc.arena_hold import in_allocator
from memforensics.sources.glibc.libc_elf import LibcImage, load_libc_image
from memforensics.sources.proc import procfs
from memforensics.sources.proc.procmem import ProcessMemoryReader
from memforensics.sources.proc.ptrace_call import call, caller_thread, shadow_stack_enabled
from memforensics.sources.proc.ptrace_hold import ThreadHold

_RETRY_FIRST_SECONDS = 0.002
_RETRY_MAX_SECONDS = 0.05


def direct_unavailable(pid: int) -> str | None:
    """Why malloc_trim cannot be called without gdb in ``pid``; None when it can."""
    if os.uname().machine != "x86_64":
        return "calls without gdb are made on x86-64 only"
    if shadow_stack_enabled(pid):
        return "the process runs with a shadow stack (CET)"
    return None


def _busy(hold: ThreadHold, libc: LibcImage, mutexes: list[int], mem: ProcessMemoryReader) -> bool:
    """A thread is inside the allocator, or an arena's mutex is held: no call now."""
    counters = hold.program_counters
    if any(tid not in counters or in_allocator(libc, *counters[tid]) for tid in hold.thread_ids):
        return True
    for address in mutexes:
        word = mem.read(address, 4)
        if word is None or int.from_bytes(word, "little"):
            return True
    return False


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
        raise TargetError(
            f"libc's __restore_rt was not found in {facts.libc_path} of PID {pid}",
            hint="trim with gdb: --gdb gdb",
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
                if caller is not None and not _busy(hold, libc, mutexes, mem):
                    outcome = call(
                        hold,
                        caller,
                        libc.functions["malloc_trim"],
                        [pad_bytes],
                        restore_rt=restore_rt,
                        deadline=deadline,
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


def trim_direct(
    pid: int,
    facts: ProcessFacts,
    pad_bytes: int,
    dry_run: bool,
    min_free_bytes: int,
    timeout_seconds: float,
) -> TrimResult:
    """Measure RSS, read the heap (no gdb), forecast, call malloc_trim (unless skipped),
    measure again: TrimResult as the gdb path gives, ``trim_returned`` None (the call keeps
    no return value) and ``trim_called`` True when it was made."""
    from memforensics.analysis.trim import skip_reason
    from memforensics.analysis.trim_forecast import forecast_trim
    from memforensics.entry.live import now_utc, settled_memory
    from memforensics.entry.readonly import inspect_read_only

    started = now_utc()
    before = procfs.read_memory(pid)
    if before.rss_bytes is None:
        raise TargetError(f"PID {pid} has no memory figures (exited?)", pid=pid)
    inspection = inspect_read_only(
        pid, timeout_seconds=min(timeout_seconds, 1.0), pad_bytes=pad_bytes
    )
    dump = inspection.analysis.dump
    if dump.all_zero:
        raise NotGlibcMallocError(
            f"PID {pid} ({facts.name}) maps glibc but its malloc holds no memory: "
            "another allocator serves it",
            pid=pid,
        )
    residency = inspection.residency
    page = residency.page_bytes if residency else os.sysconf("SC_PAGE_SIZE")
    forecast = forecast_trim(dump, residency, page_bytes=page, pad_bytes=pad_bytes)
    skipped, detail = skip_reason(forecast, min_free_bytes=min_free_bytes, dry_run=dry_run)
    pause_seconds = inspection.capture.pause_seconds
    notes = list(forecast.notes) + (list(residency.notes) if residency else [])
    if skipped is None:
        figures_read = time.monotonic()
        pause_seconds += call_malloc_trim(pid, facts, residency, pad_bytes, timeout_seconds)
        notes.append(
            f"forecast figures were at most {time.monotonic() - figures_read:.2f} s old at "
            "the trim; malloc_trim was called without gdb (its return value is not kept)"
        )
    after = settled_memory(pid) if skipped is None else None
    return TrimResult(
        pid=pid,
        name=facts.name,
        time=started,
        **before_after(before, after),
        forecast=forecast,
        free_bytes=dump.free_bytes,
        heap_bytes=dump.system_bytes,
        arenas=len(dump.arenas),
        pad_bytes=pad_bytes,
        dry_run=dry_run,
        trim_returned=None,
        trim_called=skipped is None,
        pause_seconds=pause_seconds,
        skipped=skipped,
        skipped_detail=detail,
        notes=tuple(dict.fromkeys(notes)),
    )
