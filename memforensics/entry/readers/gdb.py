"""The gdb way of reading a heap: malloc_info called through gdb/MI at a safe point, with the
/proc residency walk running meanwhile in a worker thread (entry.inspect chooses it).

The analysis, the malloc_info reader and the trim's model are imported where they are first
needed, after the gdb session (`inspect` never loads the trim's): the residency scan runs
meanwhile in its worker thread, and the session starts that much sooner. (Importing them in
another thread during the session was measured too: on 2 cores it slowed the scan more than
it saved, 1.20x against 1.13x the gdb recipe.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from memforensics.entry.common import exited_error
from memforensics.entry.readers.gdb_background import prompt_thread_switches
from memforensics.entry.readers.gdb_scan import BackgroundScan
from memforensics.errors import MemforensicsError, NoSuchProcessError
from memforensics.model.advice import Advice
from memforensics.model.heap import process_source
from memforensics.model.heapscan import HeapScan
from memforensics.model.inspection import Inspection
from memforensics.model.process import HeapResidency, ProcessFacts, Waterfall
from memforensics.sources.gdb.gdb_capture import capture_malloc_info
from memforensics.sources.glibc.heapmaps import WALK_BUDGET_SECONDS, scan_heap
from memforensics.sources.proc import memory_figures, process_facts, target_check
from memforensics.sources.proc.procfs import pid_alive

if TYPE_CHECKING:
    from memforensics.model.heap import HeapDump

# A scan that ran beside the session and measured less than this share of the dump's free
# bytes is done again after the session (PostgreSQL backends under pgbench: 66-88 % measured
# by the scan beside the session, 84-100 % by one right after the dump).
RESCAN_BELOW_SHARE = 0.9
# The read while gdb holds a single-threaded target's only thread after the dump: for heaps
# whose process holds at most this much anonymous memory, with this time budget (bins it does
# not reach are estimated, and the reads beside and after the session may do better).
HELD_READ_MAX_ANON_BYTES = 64 * 1024 * 1024
HELD_READ_BUDGET_SECONDS = 0.05


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


def inspect_process(
    pid: int,
    *,
    timeout_seconds: float,
    gdb_path: str | None,
    allow_stopped: bool,
    log: Any = None,
    scan: BackgroundScan | None = None,
    facts: ProcessFacts | None = None,
) -> Inspection:
    """Capture malloc_info safely (the session refuses what it cannot inspect) while the
    residency scan reads /proc; ``scan``: one already started for ``pid`` (early_scan);
    ``facts``: what target_check.check_target already gave for ``pid``.

    A process that exits at any moment after the first look gives TargetExitedError.
    """
    first = facts or target_check.check_target(pid, allow_stopped=allow_stopped)  # no PID: exit 3
    held_read = read_while_held(pid, first)
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


def read_while_held(pid: int, facts: ProcessFacts) -> Callable[[], HeapScan] | None:
    """A heap read to run while gdb holds the caller right after the dump, for a target
    where that read sees the very heap the dump described (one thread, so nothing else
    runs) and costs the pause little (a small heap, and a budget of HELD_READ_BUDGET_SECONDS);
    else None, and the reads beside and after the session stand alone."""
    if facts.threads != 1 or facts.libc_path is None:
        return None
    anon = memory_figures.read_memory(pid).anon_bytes
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

    facts = process_facts.read_process(pid)
    memory = memory_figures.read_memory(pid)
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
        if not reads or not close_to_dump(max(reads, key=closer_to_dump)):
            # The scan began before the dump: on a busy heap, lists moved in between (and
            # gdb's own call sorts the unsorted bin). Under 90 % of the dump's free bytes
            # measured, or an arena out of balance: read it again now, right after it.
            reads.append(read_heap_residency(pid, dump, libc_path=facts.libc_path))
        residency = max(reads, key=closer_to_dump)
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


def close_to_dump(residency: HeapResidency) -> bool:
    """At least 90 % of the dump's free bytes measured, and every arena in balance."""
    return residency.measured_share >= RESCAN_BELOW_SHARE and all(
        a.balanced for a in residency.arenas
    )


def closer_to_dump(residency: HeapResidency) -> tuple[float, int]:
    """Orders two reads of one heap against one dump: the larger measured share of the dump's
    free bytes, then the smaller unaccounted difference."""
    return residency.measured_share, -sum(abs(a.unaccounted_bytes) for a in residency.arenas)
