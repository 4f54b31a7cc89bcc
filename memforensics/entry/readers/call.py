"""The call way of reading a heap, with no gdb: the target's own malloc_info called through
the self-restoring call (sources.glibc.called_malloc_info), at a safe moment. `inspect`'s
default uses it where the read from memory was refused (entry.inspect decides).

The moment is chosen as the direct malloc_trim chooses its own (entry.trimmers.direct):
every thread held, no thread inside the allocator's code nor in a system call it makes, no
arena's mutex held; else the target runs a while and another moment is tried, until the
deadline (DeadlineError, exit 6: nothing was called). In that moment's hold, before any
call, the arenas the refused read left unread are proved to let malloc_info's loops end
(sources.glibc.list_proof; rule 8): a heap found corrupt there is reported (exit 8) and one
that cannot be proved is refused, nothing called; so are arenas too big to prove within the
hold's bound (list_proof's: told before any hold, and again in it). The calls run on one
thread while the others stay held until malloc_info starts (they run during it); each
restores the thread by itself when it returns, so a SIGKILL of our whole side at any moment
leaves the target alive and running, at worst with the call's region and FILE leaked (see
that module). The residency is read from memory right after.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from memforensics.entry.common import exited_error
from memforensics.errors import (
    DeadlineError,
    GdbMayHelpError,
    HeapCorruptionError,
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
from memforensics.sources.glibc.glibc_arenas import brk_extent
from memforensics.sources.glibc.heapmaps import scan_heap
from memforensics.sources.glibc.libc_elf import LibcImage, load_libc_image
from memforensics.sources.glibc.list_proof import (
    Proof,
    ProofTarget,
    hold_refusal,
    proof_buffer,
    prove_arenas,
)
from memforensics.sources.proc import memory_figures, process_facts, procfs
from memforensics.sources.proc.procfs import pid_alive
from memforensics.sources.proc.procmaps import read_maps
from memforensics.sources.proc.procmem import ProcessMemoryReader
from memforensics.sources.proc.ptrace_call import caller_thread
from memforensics.sources.proc.ptrace_hold import ThreadHold
from memforensics.sources.proc.ptrace_probe import call_chain
from memforensics.units import format_bytes

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
    proof: Proof | None = None  # the unread arenas' lists proved in that hold, where asked


@dataclass(frozen=True)
class Unproved:
    """Arenas the refused read left unread, to be proved in the call's hold before any call
    (list_proof): rule 8 holds for lists no read could follow."""

    targets: tuple[ProofTarget, ...] = ()
    sbrk_base: int | None = None


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


def call_malloc_info(
    pid: int, facts: ProcessFacts, timeout_seconds: float, unproved: Unproved = Unproved()
) -> CalledDocument:
    """malloc_info(0) of ``pid`` through the self-restoring call, at a safe moment (see the
    module), the lists of ``unproved``'s arenas proved first in that moment's hold.
    GdbMayHelpError when this target or kernel cannot take the call; DeadlineError when no
    safe moment came in time, the calls did not end (what they left is said), or the proof
    did not; HeapCorruptionError when the proof finds the heap corrupt, GdbMayHelpError when
    it cannot be made (nothing called in any of these three)."""
    libc = _usable_libc(pid, facts)
    assert libc.restore_rt is not None  # libc_refusal checked it
    mutexes = arena_mutexes(pid, libc.path)
    deadline = time.monotonic() + timeout_seconds
    wait = _RETRY_FIRST_SECONDS
    holds = 0
    buffer = proof_buffer() if unproved.targets else None  # (made before any hold)
    with ProcessMemoryReader(pid) as mem:
        if unproved.targets:
            why = hold_refusal(mem, unproved.targets, brk_extent(read_maps(pid)))
            if why is not None:
                raise _past_bound_error(pid, why)
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
            proof: Proof | None = None
            try:
                with ThreadHold(pid, timeout_seconds=min(remaining, 1.0), registers=True) as hold:
                    caller = caller_thread(hold, pid)
                    if caller is not None and not unsafe_moment(hold, libc, mutexes, mem):
                        if unproved.targets:
                            proof = _proved(pid, mem, unproved, deadline, buffer)
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
                return CalledDocument(document, hold.stop_seconds, holds, proof)
            time.sleep(min(wait, max(deadline - time.monotonic(), 0)))
            wait = min(wait * 2, _RETRY_MAX_SECONDS)


def _proved(
    pid: int,
    mem: ProcessMemoryReader,
    unproved: Unproved,
    deadline: float,
    buffer: bytearray | None = None,
) -> Proof:
    """In the call's hold: ``unproved``'s arenas proved (list_proof, in ``buffer``: its
    proof_buffer); raises, so that nothing is called, where one is corrupt or could not be
    proved."""
    proof = prove_arenas(
        mem,
        unproved.targets,
        brk=brk_extent(read_maps(pid)),
        sbrk_base=unproved.sbrk_base,
        deadline=deadline,
        buffer=buffer,
    )
    numbers = {t.address: t.number for t in unproved.targets}
    if proof.corruption is not None:
        found = proof.corruption.numbered(numbers.get(proof.corruption.arena_address, 0))
        raise HeapCorruptionError(
            f"the heap is corrupt: arena {found.arena}, {found.bin}, chunk "
            f"{found.chunk_address:#x}: {found.check} (found proving the lists the read "
            "could not follow, every thread held); no call is made into a corrupt heap",
            (found,),
            pid=pid,
        )
    if proof.out_of_time:
        raise DeadlineError(
            f"PID {pid}: malloc_info was not called: the lists the read could not follow were "
            f"not proved whole in the time left ({proof.unproved}, after {proof.seconds:.1f} s "
            "with every thread held)",
            pid=pid,
        )
    if proof.past_bound:
        raise _past_bound_error(pid, proof.unproved)
    if proof.unproved is not None:
        raise GdbMayHelpError(
            f"PID {pid}: malloc_info was not called: the lists the read could not follow "
            f"could not be proved whole while every thread was held ({proof.unproved})",
            hint="gdb's way calls malloc_info without that proof",
            pid=pid,
        )
    return proof


def _past_bound_error(pid: int, why: str | None) -> GdbMayHelpError:
    """The refusal of a proof past its hold's bound (list_proof): nothing was called."""
    return GdbMayHelpError(
        f"PID {pid}: malloc_info was not called: the lists the read could not follow are "
        f"proved first with every thread held, and {why}",
        hint="gdb's way calls malloc_info without that proof",
        pid=pid,
    )


def inspect_by_call(
    pid: int,
    facts: ProcessFacts,
    *,
    timeout_seconds: float,
    fallback: Fallback | None = None,
    unwalked: tuple[int, ...] = (),
    unproved: Unproved = Unproved(),
) -> Inspection:
    """The heap report of ``pid`` from its own malloc_info, called with no gdb (see the
    module), with the residency read from memory right after; ``fallback``: why this way
    stood in; ``unwalked``: the arenas (malloc_state addresses) whose lists the refused read
    found too long to follow, whose lists the residency read does not walk again (their free
    bytes are then estimated); ``unproved``: the arenas that read left unread, proved before
    the call. A process that exits meanwhile gives TargetExitedError."""
    try:
        return _inspect(pid, facts, timeout_seconds, fallback, unwalked, unproved)
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
    unproved: Unproved,
) -> Inspection:
    from memforensics.entry.readers.memory import report_parts
    from memforensics.sources.malloc_info.malloc_xml import parse_dump

    called = call_malloc_info(pid, facts, timeout_seconds, unproved)
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
            + _proved_text(called.proof, unproved)
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


def _proved_text(proof: Proof | None, unproved: Unproved) -> str:
    """What the safe point says of the proof made before the call (none: nothing)."""
    if proof is None:
        return ""
    arenas = ", ".join(str(t.number) for t in unproved.targets)
    return (
        f"; first, in that hold, the lists of arena{'s' if len(unproved.targets) > 1 else ''} "
        f"{arenas} (which the read could not follow) proved to close "
        f"({format_bytes(proof.heap_bytes)} of heap walked in {proof.seconds * 1000:.0f} ms)"
    )
