"""Calls into a held thread whose results come back through memory: an allocator's statistics
read by its own functions (jemalloc's mallctl, tcmalloc's MallocExtension, mimalloc's
mi_process_info), with no gdb and nothing taken from the target's allocator.

Each call is made as sources.proc.ptrace_call makes one: a signal frame on the thread's own
stack, one PTRACE_SETREGS, a return into libc's ``__restore_rt`` that restores the thread by
itself, so a death of memforensics at any moment leaves the thread untouched, or calling and
then restored. What the call reads and writes (a name, an out-buffer, its length) is placed
in scratch above the frame, out of the called function's reach. The thread runs under
PTRACE_SYSCALL (with PTRACE_O_TRACESYSGOOD, which tells a system call's stop from a
SIGTRAP's) until it enters rt_sigreturn with its stack pointer just above the frame's return
address: the function has returned and the scratch is as it left it, while the thread has
not yet restored itself and run on (below its stack pointer, where the scratch is, its own
calls would write). The scratch is read then, and the thread restores itself, up to the
exit of rt_sigreturn, where it stops again, ready for the next call or the release.

Several calls run one after the other in one hold of the process: every other thread stays
held throughout, unless a call asks that the others run from its start on (ProbeCall.
others_run), as malloc_trim's does.
"""

from __future__ import annotations

import os
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from memforensics.errors import DeadlineError, TargetError
from memforensics.sources.proc import ptrace_regs
from memforensics.sources.proc.ptrace_call import (
    LOOK_SECONDS,
    PTRACE_INTERRUPT,
    SYSCALL_STOP,
    Frame,
    ScratchRef,
    enter_call,
    signal_mask,
    stop_of,
    stopped,
)
from memforensics.sources.proc.ptrace_hold import ThreadHold

_PTRACE_SYSCALL = 24
_PTRACE_SETOPTIONS = 0x4200
_PTRACE_O_TRACESYSGOOD, _PTRACE_O_TRACECLONE = 0x1, 0x8
_RT_SIGRETURN = 15
R = TypeVar("R")


@dataclass(frozen=True)
class ProbeCall:
    """One call: ``function(*args)`` with ``scratch`` placed in the thread's memory first
    (a ScratchRef argument is an address in it). ``others_run``: every other thread is let go
    as this call starts (ThreadHold.let_others_go) and stays so for the rest of the series."""

    function: int
    args: tuple[int | ScratchRef, ...]
    scratch: bytes
    others_run: bool = False


def call_reading(
    hold: ThreadHold,
    tid: int,
    calls: Sequence[ProbeCall],
    *,
    restore_rt: int,
    deadline: float,
    pop3_ret: int | None = None,
) -> list[bytes] | None:
    """Make ``calls`` in turn on held thread ``tid`` (see the module); each call's scratch as
    its function left it (a 7th to 9th argument goes through libc's ``pop3_ret``, see
    ptrace_call.build_frame). None when ``deadline`` came first: the call in flight goes on
    after the hold is released and restores the thread by itself; the rest are not made.
    TargetError when the thread is in no plain stop or its stack has no room."""
    return call_chain(
        hold, tid, _in_turn(calls), restore_rt=restore_rt, deadline=deadline, pop3_ret=pop3_ret
    )


def _in_turn(calls: Sequence[ProbeCall]) -> Generator[ProbeCall, bytes, list[bytes]]:
    results: list[bytes] = []
    for spec in calls:
        results.append((yield spec))
    return results


def call_chain(
    hold: ThreadHold,
    tid: int,
    chain: Generator[ProbeCall, bytes, R],
    *,
    restore_rt: int,
    deadline: float,
    pop3_ret: int | None = None,
) -> R | None:
    """Calls on held thread ``tid`` as ``call_reading`` makes them, each one the ``chain``
    yields: it is sent the call's scratch as the function left it (after its return, the
    thread restored), and may read the target's memory before it yields the next call, whose
    arguments may depend on what the earlier ones left there. What the chain returns (not
    None); None when ``deadline`` came first (the call in flight goes on after the hold is
    released and restores the thread by itself; the chain is closed, GeneratorExit at its
    yield). An exception the chain raises ends the series there, every thread restored."""
    pid = hold.pid
    if hold.stop_kinds.get(tid) != "interrupt":
        raise TargetError(f"thread {tid} of PID {pid} is not in a plain stop", pid=pid)

    def work() -> R | None:
        try:
            ptrace_regs.request(
                _PTRACE_SETOPTIONS, tid, _PTRACE_O_TRACECLONE | _PTRACE_O_TRACESYSGOOD
            )
            mask = signal_mask(pid, tid)  # one /proc read for the series, not one per call
            number = 0
            try:
                spec = next(chain)
                while True:
                    frame = enter_call(
                        pid,
                        tid,
                        spec.function,
                        spec.args,
                        restore_rt=restore_rt,
                        scratch=spec.scratch,
                        pop3_ret=pop3_ret,
                        again=number > 0,
                        sigmask=mask,
                    )
                    number += 1
                    if spec.others_run:
                        hold.let_others_go(tid)
                    scratch = _await_sigreturn(pid, tid, frame, len(spec.scratch), deadline)
                    if scratch is None:
                        chain.close()
                        return None
                    spec = chain.send(scratch)
            except StopIteration as done:
                result: R = done.value
                return result
        finally:
            # Whatever happened, the release detaches it with no stale signal; a thread
            # still calling calls on, and restores itself.
            hold.resumed(tid)

    return hold.in_tracer(work)


def _read(pid: int, address: int, size: int) -> bytes:
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.pread(fd, size, address)
    finally:
        os.close(fd)
    if len(data) != size:
        raise TargetError(f"could not read a call's results back from PID {pid}", pid=pid)
    return data


def _next_stop(tid: int, deadline: float) -> tuple[int, int] | None:
    """The thread's next stop; None at ``deadline``. A call of an allocator's statistics
    takes microseconds: the first looks spin, then the looks back off to every few ms."""
    spins = 200
    nap = 0.0001
    while (stop := stop_of(tid)) is None:
        if time.monotonic() > deadline:
            return None
        if spins:
            spins -= 1
            continue
        time.sleep(nap)
        nap = min(nap * 2, 0.005)
    return stop


def _await_sigreturn(
    pid: int, tid: int, frame: Frame, scratch_bytes: int, deadline: float
) -> bytes | None:
    """Run the calling thread under PTRACE_SYSCALL until it enters rt_sigreturn from the
    frame; read the scratch there, and let the thread restore itself up to that system
    call's exit, where it stops again (restored, not yet run on). Signals on their way in
    are delivered. None at ``deadline``, the thread then in an interrupt stop mid-call."""
    ptrace_regs.request(_PTRACE_SYSCALL, tid, 0)
    scratch: bytes | None = None
    while True:
        stop = _next_stop(tid, deadline if scratch is None else time.monotonic() + LOOK_SECONDS)
        if stop is None:
            if scratch is not None:
                raise DeadlineError(f"thread {tid} did not restore itself", pid=pid)
            ptrace_regs.request(PTRACE_INTERRUPT, tid)
            stopped(tid, time.monotonic() + LOOK_SECONDS)
            return None
        signal, event = stop
        if signal == SYSCALL_STOP and event == 0:
            regs = ptrace_regs.get_regs(tid)
            if scratch is not None and regs.rsp > frame.address:
                # The stop after rt_sigreturn's entry is its exit (which has set orig_rax to
                # -1: no restart): the thread restored, held in this stop.
                return scratch
            at_return = regs.orig_rax == _RT_SIGRETURN and regs.rsp == frame.address + 8
            if scratch is None and at_return:
                scratch = _read(pid, frame.scratch, scratch_bytes) if scratch_bytes else b""
            ptrace_regs.request(_PTRACE_SYSCALL, tid, 0)
        elif event != 0:  # an event's stop (an interrupt, a new thread): run on
            ptrace_regs.request(_PTRACE_SYSCALL, tid, 0)
        else:  # a signal on its way in: deliver it
            ptrace_regs.request(_PTRACE_SYSCALL, tid, signal)
