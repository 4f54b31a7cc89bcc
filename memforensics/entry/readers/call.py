"""The call way of reading a heap, with no gdb: the target's own malloc_info called through
the self-restoring call (sources.glibc.called_malloc_info), at a safe moment. `inspect`'s
default uses it where the read from memory was refused (entry.inspect decides).

The moment is chosen as the direct malloc_trim chooses its own (entry.trimmers.direct):
every thread held, no thread inside the allocator's code nor in a system call it makes, no
arena's mutex held; else the target runs a while and another moment is tried, until the
deadline (DeadlineError, exit 6: nothing was called). The calls run on one thread while the
others stay held until malloc_info starts (they run during it); each restores the thread by
itself when it returns, so a SIGKILL of our
whole side at any moment leaves the target alive and running, at worst with the call's
region and FILE leaked (see that module). The residency is read from memory right after.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from memforensics.entry.common import exited_error
from memforensics.errors import (
    DeadlineError,
    GdbMayHelpError,
    MemforensicsError,
    NoSuchProcessError,
    NotGlibcMallocError,
)
from memforensics.model.capture import Capture
from memforensics.model.heap import process_source
from memforensics.model.inspection import Fallback, Inspection
from memforensics.model.process import ProcessFacts
from memforensics.sources.glibc.after_call import verified_state
from memforensics.sources.glibc.call_moment import (
    arena_mutexes,
    direct_unavailable,
    unsafe_moment,
)
from memforensics.sources.glibc.called_malloc_info import (
    MallocInfoChain,
    kernel_refusal,
    libc_refusal,
)
from memforensics.sources.glibc.heapmaps import scan_heap
from memforensics.sources.glibc.libc_elf import LibcImage, load_libc_image
from memforensics.sources.proc import memory_figures, process_facts, procfs
from memforensics.sources.proc.procfs import pid_alive
from memforensics.sources.proc.procmem import ProcessMemoryReader
from memforensics.sources.proc.ptrace_call import caller_thread
from memforensics.sources.proc.ptrace_hold import ThreadHold
from memforensics.sources.proc.ptrace_probe import call_chain

_RETRY_FIRST_SECONDS = 0.002
_RETRY_MAX_SECONDS = 0.05
# No hold is begun with less time than this left: stopping every thread may take that long
# (tens of ms with a thousand threads), and a hold cut shorter fails on its own timeout,
# which would be reported instead of what the wait found (no safe moment).
_HOLD_MIN_SECONDS = 0.05


@dataclass(frozen=True)
class CalledDocument:
    """malloc_info's document as the target's own call wrote it, and what it cost."""

    xml: bytes
    pause_seconds: float  # the hold in which the calls were made
    holds: int  # holds taken until a safe moment came


def _usable_libc(pid: int, facts: ProcessFacts) -> LibcImage:
    if facts.libc_path is None:
        raise NotGlibcMallocError(f"PID {pid} maps no glibc libc", pid=pid)
    why = direct_unavailable(pid) or kernel_refusal()
    libc = load_libc_image(pid, facts.libc_path)
    why = why or libc_refusal(libc)
    if facts.state in ("T", "t"):
        why = f"it is stopped (state {facts.state}): a stopped process makes no call"
    if why is not None:
        raise GdbMayHelpError(
            f"PID {pid}: malloc_info cannot be called without gdb: {why}", pid=pid
        )
    return libc


def call_malloc_info(pid: int, facts: ProcessFacts, timeout_seconds: float) -> CalledDocument:
    """malloc_info(0) of ``pid`` through the self-restoring call, at a safe moment (see the
    module). GdbMayHelpError when this target or kernel cannot take the call; DeadlineError
    when no safe moment came in time, or the calls did not end (what they left is said)."""
    libc = _usable_libc(pid, facts)
    assert libc.restore_rt is not None  # libc_refusal checked it
    mutexes = arena_mutexes(pid, libc.path)
    deadline = time.monotonic() + timeout_seconds
    wait = _RETRY_FIRST_SECONDS
    holds = 0
    with ProcessMemoryReader(pid) as mem:
        while True:
            remaining = deadline - time.monotonic()
            if remaining < _HOLD_MIN_SECONDS:
                raise DeadlineError(
                    f"PID {pid}: no moment with every arena unlocked and no thread inside "
                    f"the allocator within {timeout_seconds:g} s; nothing was called",
                    pid=pid,
                )
            chain: MallocInfoChain | None = None
            document: bytes | None = None
            try:
                with ThreadHold(pid, timeout_seconds=min(remaining, 1.0), registers=True) as hold:
                    caller = caller_thread(hold, pid)
                    if caller is not None and not unsafe_moment(hold, libc, mutexes, mem):
                        chain = MallocInfoChain(pid, libc)
                        document = call_chain(
                            hold,
                            caller,
                            chain.calls(),
                            restore_rt=libc.restore_rt,
                            deadline=deadline,
                            pop3_ret=libc.pop3_ret,
                        )
                holds += 1
                if chain is not None and document is None:
                    raise DeadlineError(
                        f"PID {pid}: malloc_info's calls had not ended after "
                        f"{timeout_seconds:g} s; the call in flight goes on and restores the "
                        "thread by itself",
                        pid=pid,
                    )
            except MemforensicsError as exc:
                if chain is None or isinstance(exc, NoSuchProcessError):
                    raise  # nothing was called
                # What the calls left, and the target's state as checked, never as assumed.
                left = f"; it may leave {' and '.join(chain.leaked)}" if chain.leaked else ""
                exc.message = f"{exc.message}{left}; {verified_state(pid, libc.path)}"
                exc.args = (exc.message,)
                raise
            if document is not None:
                return CalledDocument(document, hold.stop_seconds, holds)
            time.sleep(min(wait, max(deadline - time.monotonic(), 0)))
            wait = min(wait * 2, _RETRY_MAX_SECONDS)


def inspect_by_call(
    pid: int,
    facts: ProcessFacts,
    *,
    timeout_seconds: float,
    fallback: Fallback | None = None,
    unwalked: tuple[int, ...] = (),
) -> Inspection:
    """The heap report of ``pid`` from its own malloc_info, called with no gdb (see the
    module), with the residency read from memory right after; ``fallback``: why this way
    stood in; ``unwalked``: the arenas (malloc_state addresses) whose lists the refused read
    found too long to follow, whose lists the residency read does not walk again (their free
    bytes are then estimated). A process that exits meanwhile gives TargetExitedError."""
    try:
        return _inspect(pid, facts, timeout_seconds, fallback, unwalked)
    except MemforensicsError as exc:
        if isinstance(exc, NoSuchProcessError) or not pid_alive(pid):
            raise exited_error(pid, exc) from exc
        raise


def _inspect(
    pid: int,
    facts: ProcessFacts,
    timeout_seconds: float,
    fallback: Fallback | None,
    unwalked: tuple[int, ...],
) -> Inspection:
    from memforensics.entry.readers.memory import report_parts
    from memforensics.sources.malloc_info.malloc_xml import parse_dump

    called = call_malloc_info(pid, facts, timeout_seconds)
    dump = parse_dump(called.xml, name=process_source(pid))
    status = procfs.read_text(pid, "status")
    memory = memory_figures.read_memory(pid, status=status)
    try:
        scan = scan_heap(pid, libc_path=facts.libc_path, unwalked=unwalked)
    except NoSuchProcessError:
        raise
    except (MemforensicsError, OSError) as exc:
        from memforensics.analysis.heap import analyze

        # The heap report stands without residency; say why the waterfall is missing.
        analysis, residency, flow = analyze(dump), None, None
        residency_error: str | None = str(exc)
    else:
        analysis, residency, flow, residency_error = report_parts(dump, scan, memory)
    capture = Capture(
        xml=called.xml,
        pause_seconds=called.pause_seconds,
        safe_point=(
            "called without gdb: malloc_info in a self-restoring call, at a moment every "
            "thread was held, none inside the allocator, no arena locked"
        ),
    )
    return Inspection(
        facts=process_facts.facts_after(facts, status),
        memory=memory,
        capture=capture,
        analysis=analysis,
        residency=residency,
        waterfall=flow,
        extra_advice=(),
        residency_error=residency_error,
        fallback=fallback,
        pins_error="not read: malloc_info was called, the read from memory having been refused",
    )
