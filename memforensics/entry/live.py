"""Library entry points for live processes: inspect one, trim one, find them by name.

Each function composes the sources (gdb session, /proc) and the analysis into model objects
and never prints, so ``import memforensics.entry.live`` gives what the commands show.

The analysis, the malloc_info reader and the trim's model are imported where they are first
needed, after the gdb session (`inspect` never loads the trim's): the residency scan runs
meanwhile in its worker thread, and the session starts that much sooner. (Importing them in
another thread during the session was measured too: on 2 cores it slowed the scan more than
it saved, 1.20x against 1.13x the gdb recipe.)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from memforensics.entry.background import prompt_thread_switches
from memforensics.entry.inspection import Inspection
from memforensics.entry.scanning import BackgroundScan
from memforensics.entry.targets import resolve_targets
from memforensics.errors import (
    MemforensicsError,
    NoSuchProcessError,
    NotGlibcMallocError,
    TargetError,
    TargetExitedError,
)
from memforensics.model.advice import Advice
from memforensics.model.heap import process_source
from memforensics.model.heapscan import HeapScan
from memforensics.model.process import HeapResidency, ProcessFacts, ProcessMemory, Waterfall
from memforensics.sources.gdb.gdb import GdbSession
from memforensics.sources.gdb.gdb_capture import capture_malloc_info
from memforensics.sources.glibc.heapmaps import WALK_BUDGET_SECONDS, scan_heap
from memforensics.sources.proc import procfs
from memforensics.sources.proc.procfs import pid_alive

if TYPE_CHECKING:
    from memforensics.model.heap import HeapDump
    from memforensics.model.trim import TrimOutcome, TrimResult

# A scan that ran beside the session and measured less than this share of the dump's free
# bytes is done again after the session (PostgreSQL backends under pgbench: 66-88 % measured
# by the scan beside the session, 84-100 % by one right after the dump).
RESCAN_BELOW_SHARE = 0.9
# The read while gdb holds a single-threaded target's only thread after the dump: for heaps
# whose process holds at most this much anonymous memory, with this time budget (bins it does
# not reach are estimated, and the reads beside and after the session may do better).
HELD_READ_MAX_ANON_BYTES = 64 * 1024 * 1024
HELD_READ_BUDGET_SECONDS = 0.05
_SETTLE_FIRST_SECONDS = 0.05
_SETTLE_STEP_SECONDS = 0.05
_SETTLE_MAX_READS = 6
_SETTLE_SAME_BYTES = 64 * 1024

Log = Callable[[str], None]


@dataclass(frozen=True)
class TrimSettings:
    """How to trim: the options of `memforensics trim`, as the library wants them."""

    pad_bytes: int = 0
    dry_run: bool = False
    min_free_bytes: int = 0
    timeout_seconds: float = 10.0
    gdb_path: str | None = None
    log: Log | None = None
    # No gdb: the heap read from memory, malloc_trim called through a self-restoring signal
    # frame (entry.trim_direct), where the machine allows it; a --gdb given means gdb.
    direct: bool = True
    # Call malloc_trim through gdb into a heap found corrupt (--accept-corrupt-heap-risk).
    accept_corrupt_risk: bool = False


def read_heap_residency(
    pid: int,
    dump: HeapDump,
    *,
    libc_path: str | None = None,
    budget_seconds: float = WALK_BUDGET_SECONDS,
    pad_bytes: int = 0,
) -> HeapResidency:
    """Read the live heap of ``pid`` (after detach) and set it against ``dump``; trimmable
    figures are for malloc_trim(``pad_bytes``)."""
    from memforensics.analysis.residency_build import build_residency

    scan = scan_heap(pid, libc_path=libc_path, budget_seconds=budget_seconds)
    return build_residency(dump, scan, pad_bytes=pad_bytes)


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def settled_memory(pid: int) -> ProcessMemory:
    """RSS after a trim, measured until it stops moving (not guessed from the forecast)."""
    time.sleep(_SETTLE_FIRST_SECONDS)
    memory = procfs.read_memory(pid)
    for _ in range(_SETTLE_MAX_READS - 1):
        time.sleep(_SETTLE_STEP_SECONDS)
        again = procfs.read_memory(pid)
        same = (
            memory.rss_bytes is not None
            and again.rss_bytes is not None
            and abs(memory.rss_bytes - again.rss_bytes) <= _SETTLE_SAME_BYTES
        )
        memory = again
        if same:
            break
    return memory


def exited_error(pid: int, exc: MemforensicsError) -> TargetExitedError:
    """A process that was there when we started and is gone now: say so, whatever step noticed."""
    if isinstance(exc, TargetExitedError):
        return exc
    return TargetExitedError(f"PID {pid} exited while being inspected", pid=pid)


def inspect_process(
    pid: int,
    *,
    timeout_seconds: float,
    gdb_path: str | None,
    allow_stopped: bool,
    log: Any = None,
    scan: BackgroundScan | None = None,
) -> Inspection:
    """Capture malloc_info safely (the session refuses what it cannot inspect) while the
    residency scan reads /proc; ``scan``: one already started for ``pid`` (early_scan).

    A process that exits at any moment after the first look gives TargetExitedError.
    """
    first = procfs.check_target(pid, allow_stopped=allow_stopped)  # no such PID: exit 3
    held_read = _read_while_held(pid, first)
    if scan is None and first.libc_path is not None:
        # No glibc mapped: the session refuses the target before anything else touches it.
        scan = BackgroundScan(pid, libc_path=first.libc_path)
    try:
        return _inspect(
            pid,
            scan,
            held_read=held_read,
            timeout_seconds=timeout_seconds,
            gdb_path=gdb_path,
            allow_stopped=allow_stopped,
            log=log,
        )
    except MemforensicsError as exc:
        if isinstance(exc, NoSuchProcessError) or not pid_alive(pid):
            raise exited_error(pid, exc) from exc
        raise


def _read_while_held(pid: int, facts: ProcessFacts) -> Callable[[], HeapScan] | None:
    """A heap read to run while gdb holds the caller right after the dump, for a target
    where that read sees the very heap the dump described (one thread, so nothing else
    runs) and costs the pause little (a small heap, and a budget of HELD_READ_BUDGET_SECONDS);
    else None, and the reads beside and after the session stand alone."""
    if facts.threads != 1 or facts.libc_path is None:
        return None
    anon = procfs.read_memory(pid).anon_bytes
    if anon is None or anon > HELD_READ_MAX_ANON_BYTES:
        return None
    libc_path = facts.libc_path
    return lambda: scan_heap(
        pid, libc_path=libc_path, budget_seconds=HELD_READ_BUDGET_SECONDS, arenas_only=True
    )


def _inspect(
    pid: int,
    scan: BackgroundScan | None,
    *,
    held_read: Callable[[], HeapScan] | None = None,
    timeout_seconds: float,
    gdb_path: str | None,
    allow_stopped: bool,
    log: Any,
) -> Inspection:
    # The heap's residency comes from /proc alone: it is read while gdb works (only the
    # calling thread is held in non-stop mode), never by gdb, which would lengthen the pause.
    with prompt_thread_switches():
        capture = capture_malloc_info(
            pid,
            timeout_seconds=timeout_seconds,
            gdb_path=gdb_path,
            log=log,
            allow_stopped=allow_stopped,
            quiet_while_stopping=scan.gate.quiet if scan is not None else None,
            while_held=held_read,
        )
    from memforensics.analysis.heap import analyze
    from memforensics.analysis.residency import one_verdict, residency_advice, waterfall
    from memforensics.analysis.residency_build import build_residency
    from memforensics.sources.malloc_info.malloc_xml import parse_dump

    facts = procfs.read_process(pid)
    memory = procfs.read_memory(pid)
    dump = parse_dump(capture.xml, name=process_source(pid))
    residency: HeapResidency | None = None
    flow: Waterfall | None = None
    extra: tuple[Advice, ...] = ()
    residency_error: str | None = None
    analysis = analyze(dump)
    try:
        reads: list[HeapResidency] = []
        beside = scan.result() if scan is not None else None
        if isinstance(capture.held_result, HeapScan):
            reads.append(build_residency(dump, _arenas_of(capture.held_result, beside)))
        if beside is not None:
            reads.append(build_residency(dump, beside))
        if not reads or not _close_to_dump(max(reads, key=_closer_to_dump)):
            # The scan began before the dump: on a busy heap, lists moved in between (and
            # gdb's own call sorts the unsorted bin). Under 90 % of the dump's free bytes
            # measured, or an arena out of balance: read it again now, right after it.
            reads.append(read_heap_residency(pid, dump, libc_path=facts.libc_path))
        residency = max(reads, key=_closer_to_dump)
        flow = waterfall(memory, dump, residency)
        # One verdict per question: the residency's trim advice replaces the XML's.
        analysis = replace(
            analysis, advice=one_verdict(analysis.advice, residency_advice(dump, residency))
        )
    except NoSuchProcessError:
        raise
    except (MemforensicsError, OSError) as exc:
        # The heap report stands without residency; say why the waterfall is missing.
        residency_error = str(exc)
    return Inspection(
        facts=facts,
        memory=memory,
        capture=capture,
        analysis=analysis,
        residency=residency,
        waterfall=flow,
        extra_advice=extra,
        residency_error=residency_error,
    )


def _arenas_of(held: HeapScan, beside: HeapScan | None) -> HeapScan:
    """The arenas of the read made while held, with the process-wide figures (mmapped chunks,
    stacks, anonymous memory) of the read beside the session, which the held read skips."""
    if beside is None:
        return held
    return replace(
        beside,
        chained=held.chained,
        arenas=held.arenas,
        heap_mapped_bytes=held.heap_mapped_bytes,
        heap_resident_bytes=held.heap_resident_bytes,
        walk_seconds=held.walk_seconds,
        walk_budget_seconds=held.walk_budget_seconds,
        notes=held.notes,
    )


def _close_to_dump(residency: HeapResidency) -> bool:
    """At least 90 % of the dump's free bytes measured, and every arena in balance."""
    return residency.measured_share >= RESCAN_BELOW_SHARE and all(
        a.balanced for a in residency.arenas
    )


def _closer_to_dump(residency: HeapResidency) -> tuple[float, int]:
    """Orders two reads of one heap against one dump: the larger measured share of the dump's
    free bytes, then the smaller unaccounted difference."""
    return residency.measured_share, -sum(abs(a.unaccounted_bytes) for a in residency.arenas)


def trim_process(pid: int, settings: TrimSettings) -> TrimResult:
    """Measure RSS, dump, forecast, trim at a safe point (unless skipped), measure again.

    Two short stops rather than one long one: the first attach only dumps malloc_info;
    the forecast walks the free chunks through /proc while the target runs again (that
    walk takes ~0.4 s on 100,000 free chunks, too long to keep a service stopped); the
    second attach only calls malloc_trim. The forecast therefore describes the heap a
    moment before the trim. Raises the project's errors; the target is always detached
    and left running.
    """
    # Refuses what is neither glibc's malloc nor a foreign allocator it can call.
    facts = procfs.check_target(pid, foreign_ok=True)
    try:
        if facts.allocator.foreign is not None and facts.allocator.foreign.serves_malloc:
            return _trim_foreign(pid, facts, settings)
        if settings.gdb_path is None and settings.direct:
            from memforensics.entry.trim_direct import direct_unavailable, trim_direct

            if direct_unavailable(pid) is None:
                return trim_direct(
                    pid,
                    facts,
                    settings.pad_bytes,
                    settings.dry_run,
                    settings.min_free_bytes,
                    settings.timeout_seconds,
                )
        return _trim(pid, facts, settings)
    except MemforensicsError as exc:
        if isinstance(exc, NoSuchProcessError) or not pid_alive(pid):
            raise exited_error(pid, exc) from exc
        raise


def _trim_foreign(pid: int, facts: ProcessFacts, settings: TrimSettings) -> TrimResult:
    from memforensics.entry.foreign import trim_foreign

    kind = facts.allocator.kind
    if settings.gdb_path is not None:
        raise TargetError(
            f"PID {pid} runs on {kind}: its purge is called without gdb",
            hint="drop --gdb",
            pid=pid,
        )
    return trim_foreign(
        pid,
        facts,
        dry_run=settings.dry_run,
        min_free_bytes=settings.min_free_bytes,
        timeout_seconds=settings.timeout_seconds,
    )


def _trim(pid: int, facts: ProcessFacts, settings: TrimSettings) -> TrimResult:
    from memforensics.entry.readonly import refuse_if_corrupt

    # gdb calls malloc_info and malloc_trim: never into a heap found corrupt.
    refuse_if_corrupt(
        pid, accept_risk=settings.accept_corrupt_risk, timeout_seconds=settings.timeout_seconds
    )
    started = now_utc()
    before = procfs.read_memory(pid)
    if before.rss_bytes is None:
        raise NoSuchProcessError(f"PID {pid} has no memory figures (exited?)")
    capture = capture_malloc_info(
        pid,
        timeout_seconds=settings.timeout_seconds,
        gdb_path=settings.gdb_path,
        log=settings.log,
        while_held=_read_while_held(pid, facts),
    )
    from memforensics.analysis.residency_build import build_residency
    from memforensics.analysis.trim import skip_reason
    from memforensics.analysis.trim_forecast import forecast_trim
    from memforensics.model.trim import TrimResult, before_after
    from memforensics.sources.malloc_info.malloc_xml import parse_dump

    pause_seconds = capture.pause_seconds
    dump = parse_dump(capture.xml, name=process_source(pid))
    if dump.all_zero:
        # glibc's malloc holds nothing: jemalloc/tcmalloc replaced it; trimming is pointless.
        raise NotGlibcMallocError(
            f"PID {pid} ({facts.name}) maps glibc but its malloc holds no memory: "
            "another allocator serves it"
        )
    residency: HeapResidency | None = None
    residency_notes: tuple[str, ...] = ()
    try:
        if isinstance(capture.held_result, HeapScan):
            residency = build_residency(dump, capture.held_result, pad_bytes=settings.pad_bytes)
        else:
            residency = read_heap_residency(
                pid, dump, libc_path=facts.libc_path, pad_bytes=settings.pad_bytes
            )
        if not _close_to_dump(residency):
            again = read_heap_residency(
                pid, dump, libc_path=facts.libc_path, pad_bytes=settings.pad_bytes
            )
            if _closer_to_dump(again) > _closer_to_dump(residency):
                residency = again
        residency_notes = residency.notes
    except NoSuchProcessError:
        raise
    except MemforensicsError as exc:
        residency_notes = (f"no residency figures: {exc.message}",)
    figures_read = time.monotonic()
    forecast = forecast_trim(
        dump, residency, page_bytes=_page_bytes(residency), pad_bytes=settings.pad_bytes
    )
    skipped, detail = skip_reason(
        forecast, min_free_bytes=settings.min_free_bytes, dry_run=settings.dry_run
    )
    trim_returned: int | None = None
    if skipped is None:
        with GdbSession(
            pid,
            timeout_seconds=settings.timeout_seconds,
            gdb_path=settings.gdb_path,
            log=settings.log,
        ) as session:
            trim_returned = session.malloc_trim(settings.pad_bytes)
        pause_seconds += session.pause_seconds
        age_seconds = time.monotonic() - figures_read
        residency_notes += (f"forecast figures were at most {age_seconds:.2f} s old at the trim",)
    after = settled_memory(pid) if trim_returned is not None else None
    return TrimResult(
        pid=pid,
        name=facts.name,
        time=started,
        **before_after(before, after),
        forecast=forecast,
        free_bytes=dump.free_bytes,
        heap_bytes=dump.system_bytes,
        arenas=len(dump.arenas),
        pad_bytes=settings.pad_bytes,
        dry_run=settings.dry_run,
        trim_returned=trim_returned,
        pause_seconds=pause_seconds,
        skipped=skipped,
        skipped_detail=detail,
        notes=tuple(dict.fromkeys((*forecast.notes, *residency_notes))),
    )


def _page_bytes(residency: HeapResidency | None) -> int:
    return residency.page_bytes if residency is not None else os.sysconf("SC_PAGE_SIZE")


def trim_outcome(pid: int, settings: TrimSettings) -> TrimOutcome:
    """``trim_process`` with its error turned into a TrimFailure, so other targets go on."""
    from memforensics.model.trim import TrimFailure

    try:
        return trim_process(pid, settings)
    except MemforensicsError as exc:
        return TrimFailure(
            pid=pid, time=now_utc(), message=exc.message, hint=exc.hint, exit_code=exc.exit_code
        )


def resolve_pids(pids: Sequence[int], names: Sequence[str]) -> list[int]:
    """The PIDs given plus those matching each ``--name``, in order, without repeats."""
    return [pid for pid, _explicit in resolve_targets(pids, names)]
