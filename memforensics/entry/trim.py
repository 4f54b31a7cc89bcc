"""`trim` of one live process: the one trim routine, and the one place that decides how the
call into the allocator is made.

The routine (measure RSS, read and forecast, decide, call, measure again, the result) is
written here once; a way of trimming (entry.trimmers: the self-restoring direct call, gdb,
a foreign allocator's purge) supplies only the read with its forecast and the call.
``choose_trimmer`` is the policy: which way serves a target, and when another stands in.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from memforensics.entry.common import exited_error, now_utc, settled_memory
from memforensics.entry.targets import resolve_targets
from memforensics.entry.trimmers.protocol import Trimmer, TrimSettings
from memforensics.errors import GdbNotForAllocatorError, MemforensicsError, NoSuchProcessError
from memforensics.model.process import ProcessFacts
from memforensics.model.trim import TrimFailure, TrimOutcome, TrimResult, before_after
from memforensics.sources.proc import memory_figures, target_check
from memforensics.sources.proc.procfs import pid_alive

__all__ = ["TrimSettings", "choose_trimmer", "resolve_pids", "trim_outcome", "trim_process"]


def choose_trimmer(pid: int, facts: ProcessFacts, settings: TrimSettings) -> Trimmer:
    """The way ``pid`` is trimmed: its foreign allocator's purge; else malloc_trim through
    the self-restoring direct call; gdb where asked for (``settings.gdb_path``), or where
    the machine cannot make the direct call (not x86-64, a shadow stack), which the result's
    notes then say. gdb's way is refused for a heap found corrupt (entry.inspect's
    refuse_if_corrupt), unless ``settings.accept_corrupt_risk``; the direct way's own read
    refuses it."""
    foreign = facts.allocator.foreign
    if foreign is not None and foreign.serves_malloc:
        if settings.gdb_path is not None:
            raise GdbNotForAllocatorError(
                f"PID {pid} runs on {facts.allocator.kind}: its purge is called without gdb",
                pid=pid,
            )
        from memforensics.entry.trimmers.allocator import AllocatorTrimmer

        return AllocatorTrimmer(pid, facts, settings)
    if settings.gdb_path is None and settings.direct:
        from memforensics.entry.trimmers.direct import DirectTrimmer
        from memforensics.sources.glibc.call_moment import direct_unavailable

        if direct_unavailable(pid) is None:
            return DirectTrimmer(pid, facts, settings)
    from memforensics.entry.inspect import refuse_if_corrupt
    from memforensics.entry.trimmers.gdb import GdbTrimmer

    # gdb calls malloc_info and malloc_trim: never into a heap found corrupt.
    refuse_if_corrupt(
        pid, accept_risk=settings.accept_corrupt_risk, timeout_seconds=settings.timeout_seconds
    )
    return GdbTrimmer(pid, facts, settings)


def trim_process(pid: int, settings: TrimSettings) -> TrimResult:
    """Measure RSS, read and forecast, trim (unless skipped), measure again, by the way
    ``choose_trimmer`` picks. Raises the project's errors; the target is left running."""
    # Refuses what is neither glibc's malloc nor a foreign allocator it can call.
    from memforensics.sources.glibc.after_call import checked_after_call

    facts = target_check.check_target(pid, foreign_ok=True)
    try:
        # A call that fails (gdb's malloc_info for the forecast, or the trim itself) is
        # reported with the target's state as checked afterwards, never as assumed.
        with checked_after_call(pid, facts.libc_path):
            return _trim(pid, facts, settings, choose_trimmer(pid, facts, settings))
    except MemforensicsError as exc:
        if isinstance(exc, NoSuchProcessError) or not pid_alive(pid):
            raise exited_error(pid, exc) from exc
        raise


def _trim(pid: int, facts: ProcessFacts, settings: TrimSettings, way: Trimmer) -> TrimResult:
    from memforensics.analysis.trim import skip_reason

    started = now_utc()
    before = memory_figures.read_memory(pid)
    if before.rss_bytes is None:
        raise exited_error(pid)
    reading = way.read()
    skipped, detail = skip_reason(
        reading.forecast, min_free_bytes=settings.min_free_bytes, dry_run=settings.dry_run
    )
    notes = [*reading.forecast.notes, *reading.notes]
    pause_seconds = reading.pause_seconds
    returned: int | None = None
    if skipped is None:
        read_at = time.monotonic()
        made = way.call()
        pause_seconds += made.pause_seconds
        returned = made.returned
        age = f"forecast figures were at most {time.monotonic() - read_at:.2f} s old at the "
        notes.append(age + way.call_name + (f"; {made.how}" if made.how else ""))
    after = settled_memory(pid) if skipped is None else None
    return TrimResult(
        pid=pid,
        name=facts.name,
        time=started,
        **before_after(before, after),
        forecast=reading.forecast,
        free_bytes=reading.free_bytes,
        heap_bytes=reading.heap_bytes,
        arenas=reading.arenas,
        pad_bytes=way.pad_bytes,
        dry_run=settings.dry_run,
        trim_returned=returned,
        trim_called=skipped is None and returned is None,
        pause_seconds=pause_seconds,
        skipped=skipped,
        skipped_detail=detail,
        notes=tuple(dict.fromkeys(notes)),
        purge=way.purge,
    )


def trim_outcome(pid: int, settings: TrimSettings) -> TrimOutcome:
    """``trim_process`` with its error turned into a TrimFailure, so other targets go on."""
    try:
        return trim_process(pid, settings)
    except MemforensicsError as exc:
        return TrimFailure(
            pid=pid, time=now_utc(), message=exc.message, hint=exc.hint, exit_code=exc.exit_code
        )


def resolve_pids(pids: Sequence[int], names: Sequence[str]) -> list[int]:
    """The PIDs given plus those matching each ``--name``, in order, without repeats."""
    return [pid for pid, _explicit in resolve_targets(pids, names)]
