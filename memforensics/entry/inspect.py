"""`inspect` of one live process (and `watch`'s and `collect`'s heap samples): the one place
that decides how a heap is read, and when another way may stand in.

The ways (entry.readers): the target's memory (the default: no gdb, no call), gdb's call to
malloc_info at a safe point, a foreign allocator's own statistics calls; a core file is
read as memory is (``inspect_core``). The policy, here and nowhere else:
- a process on jemalloc, tcmalloc or mimalloc is read by its allocator's statistics; memory
  only (``read-only``) and gdb's way are refused for it, saying why;
- ``gdb`` always uses gdb; ``read-only`` never does, nor makes any call;
- ``auto`` reads memory, and falls back only when that read was refused as impossible for
  this target (ReadOnlyRefusedError), never when it was only slower than its time
  (ReadTimeRanOutError: exit 6, nothing called; a longer ``--timeout`` gives the read more
  time), saying so in ``fallback``: to the target's own
  malloc_info called without gdb, through the self-restoring call (entry.readers.call), so
  that no gdb runs behind the user's back and a SIGKILL of our side at any moment leaves the
  target alive and running (at worst with a region and a FILE leaked); the default never
  starts gdb; the arenas the read left unread are first proved, in the call's own hold, to
  let malloc_info's loops end (sources.glibc.list_proof), and nothing is called where that
  proof finds the heap corrupt (exit 8) or cannot be made;
- a heap found corrupt (its lists failed glibc's checks in a read made while its threads
  were held: HeapCorruptionError, exit 8) is never called into, by any way: no fallback,
  and ``gdb`` reads memory first and refuses it unless ``accept_corrupt_risk``
  (``refuse_if_corrupt``, which trim's choice of gdb uses too);
- samples taken without a person watching (``watch``, ``collect``: the fleet, where pods are
  deleted with everything in them) never fall back: gdb's way is the one that a SIGKILL of
  our whole side can leave half-done (``sample_method``'s ``no-gdb``: memory, or a foreign
  allocator's statistics, whose calls restore their thread themselves).
"""

from __future__ import annotations

from typing import Literal

from memforensics.entry.common import Log
from memforensics.errors import (
    GdbNotForAllocatorError,
    HeapCorruptionError,
    MemforensicsError,
    NoSuchProcessError,
    ReadOnlyRefusedError,
    StatisticsOnlyError,
    TargetError,
)
from memforensics.model.inspection import Fallback, Inspection
from memforensics.model.process import ProcessFacts
from memforensics.sources.proc import target_check

InspectMethod = Literal["auto", "read-only", "no-gdb", "gdb"]

__all__ = [
    "InspectMethod",
    "inspect_core",
    "inspect_live",
    "inspect_method",
    "refuse_if_corrupt",
    "sample_method",
]


def inspect_method(*, read_only: bool, gdb_path: str | None) -> InspectMethod:
    """The commands' choice: read-only reads memory only, a gdb path calls malloc_info
    through that gdb, neither reads memory and, where that read is refused as impossible,
    calls malloc_info through the self-restoring call (no gdb)."""
    if read_only:
        return "read-only"
    return "gdb" if gdb_path is not None else "auto"


def sample_method(*, gdb_path: str | None) -> InspectMethod:
    """The way `watch` and `collect` read each sample: through gdb where asked for, else from
    memory (or a foreign allocator's own statistics) with no fallback: a refused read is a
    gap in the series, never a gdb session. Nor a stop of every thread as long as a walk of
    an arena's heaps (a busy arena's long lists swept in one stop; inspect_read_only's
    ``one_stop_sweeps``): at every sample, that would be a gap in the process's service."""
    return "gdb" if gdb_path is not None else "no-gdb"


def refuse_if_corrupt(
    pid: int, *, accept_risk: bool, timeout_seconds: float, allow_stopped: bool = False
) -> None:
    """The one rule on calling into a heap (malloc_info, malloc_trim, through gdb or not):
    never into one found corrupt. Before a call no read of this run has cleared (gdb's
    way, asked for or trim's stand-in), the heap is read from memory, held still:
    HeapCorruptionError when it fails glibc's checks, unless ``accept_risk`` (the user
    accepts that the call may hang or crash the target and leave an arena's lock held). A
    read that fails for another reason says nothing about corruption and does not refuse."""
    if accept_risk:
        return
    from memforensics.entry.readers.memory import inspect_read_only

    try:
        inspect_read_only(
            pid, timeout_seconds=min(timeout_seconds, 1.0), allow_stopped=allow_stopped
        )
    except HeapCorruptionError as exc:
        raise HeapCorruptionError(
            f"{exc.message}; no call is made into a corrupt heap",
            exc.findings,
            hint=exc.hint,
            pid=pid,
            partial=exc.partial,
        ) from exc
    except NoSuchProcessError:
        raise
    except MemforensicsError:
        return


def inspect_live(
    pid: int,
    *,
    method: InspectMethod,
    timeout_seconds: float,
    allow_stopped: bool = False,
    gdb_path: str | None = None,
    log: Log | None = None,
    pins: bool = False,
    accept_corrupt_risk: bool = False,
) -> Inspection:
    """One live inspection of ``pid`` by ``method`` (see the module for the policy).
    ``pins``: the memory way also walks every heap's chunks for its pins (gdb's reads none).
    The target's facts are read once, here, and handed to the way that reads it; a target
    no way can read is refused before any gdb is started."""
    if method == "gdb":
        from memforensics.sources.gdb.gdb_spawn import find_gdb

        find_gdb(gdb_path)  # no gdb to use: say so before the target is looked at
    facts = target_check.check_target(pid, allow_stopped=allow_stopped, foreign_ok=True)
    foreign = facts.allocator.foreign
    if foreign is not None and foreign.serves_malloc:
        return _inspect_allocator(pid, facts, method, timeout_seconds)
    if method != "gdb":
        from memforensics.entry.readers.memory import inspect_read_only, read_budget_seconds

        try:
            return inspect_read_only(
                pid,
                timeout_seconds=timeout_seconds,
                allow_stopped=allow_stopped,
                facts=facts,
                pins=pins,
                budget_seconds=read_budget_seconds(timeout_seconds),
                one_stop_sweeps=method != "no-gdb",
            )
        except ReadOnlyRefusedError as exc:
            if method != "auto":
                raise
            from memforensics.entry.readers.call import Unproved, inspect_by_call
            from memforensics.model.heapscan import HeapScan
            from memforensics.sources.glibc.list_proof import unread_arenas

            unproved = (
                Unproved(*unread_arenas(exc.partial))
                if isinstance(exc.partial, HeapScan)
                else Unproved()
            )
            return inspect_by_call(
                pid,
                facts,
                timeout_seconds=timeout_seconds,
                fallback=Fallback(way="call", reason=exc.message),
                unwalked=exc.too_long,
                unproved=unproved,
            )
    refuse_if_corrupt(
        pid,
        accept_risk=accept_corrupt_risk,
        timeout_seconds=timeout_seconds,
        allow_stopped=allow_stopped,
    )
    from memforensics.entry.readers.gdb import inspect_process  # the gdb machinery: only now
    from memforensics.sources.glibc.after_call import checked_after_call

    # A call that fails is reported with the target's state as checked, never as assumed.
    with checked_after_call(pid, facts.libc_path):
        return inspect_process(
            pid,
            timeout_seconds=timeout_seconds,
            gdb_path=gdb_path,
            allow_stopped=allow_stopped,
            log=log,
            facts=facts,
        )


def _inspect_allocator(
    pid: int, facts: ProcessFacts, method: InspectMethod, timeout_seconds: float
) -> Inspection:
    from memforensics.entry.readers.allocator import inspect_foreign

    kind = facts.allocator.kind
    if method == "read-only":
        raise StatisticsOnlyError(
            f"PID {pid} runs on {kind}, whose figures come from its own statistics calls; "
            "a read-only inspection makes none",
            pid=pid,
        )
    if method == "gdb":
        raise GdbNotForAllocatorError(
            f"PID {pid} runs on {kind}: the gdb path reads glibc's malloc only", pid=pid
        )
    if facts.state in ("T", "t"):
        raise TargetError(
            f"PID {pid} is stopped (state {facts.state}): {kind}'s statistics are read by "
            "calls, which a stopped process cannot make",
            hint="continue it (kill -CONT PID) and retry",
            pid=pid,
        )
    return inspect_foreign(pid, facts, timeout_seconds=timeout_seconds)


def inspect_core(
    path: str, *, exe: str | None = None, sysroot: str | None = None, pins: bool = False
) -> tuple[Inspection, tuple[str, ...]]:
    """The heap report of the process a core file saved, and the core's warnings (the one
    way a core is read: its memory; entry.readers.core)."""
    from memforensics.entry.readers.core import inspect_core as read_core

    return read_core(path, exe=exe, sysroot=sysroot, pins=pins)
