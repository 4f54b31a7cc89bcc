"""A function of the target's libc called on one of its threads so that the thread restores
itself when the function returns: nobody on our side needs to be alive for that.

Before the call, a signal frame is built on the thread's own stack, below its red zone,
exactly as the kernel builds one to run a signal handler: the thread's general registers,
its signal mask and its whole x87/SSE/AVX state (the XSAVE area with the software bytes and
the closing magic the kernel checks). The function is entered with that frame's return
address being libc's own ``__restore_rt`` (``mov $15, %rax; syscall``, the trampoline every
handler of the process returns through; LibcImage.restore_rt, found in the very image that
is mapped): when the function returns, ``rt_sigreturn`` puts back every register, the mask
and the vector state, as after any signal handler. No code is written into the target, no
breakpoint is set, and the registers of the call are written in one PTRACE_SETREGS, after
the frame is in place: at no moment is the thread half set up. If
memforensics (and everything it started) is killed at any moment, the kernel releases the
thread, which either has not been touched yet, or runs the function to its end and then
restores itself.

A thread stopped inside a system call is restarted as after a signal whose handler has the
SA_RESTART flag: a call that asks to be restarted (-ERESTARTSYS, -ERESTARTNOINTR,
-ERESTARTNOHAND) is made again; one that continues through restart_syscall (a sleep) returns
-EINTR, as after any handler (rt_sigreturn forgets what it was to continue).

The function's return value is not kept: the thread's rax is the restored one. Completion is
seen from the thread's stack pointer: above the frame again. x86-64 only; a process with a
shadow stack (CET) is refused, since the return into ``__restore_rt`` would not match it.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from memforensics.errors import DeadlineError, TargetError, TargetExitedError
from memforensics.sources.proc import ptrace_regs
from memforensics.sources.proc.ptrace_hold import ThreadHold

RED_ZONE_BYTES = 128  # the x86-64 ABI's: a leaf function's scratch below rsp
STACK_MARGIN_BYTES = 64 << 10  # room the called function must have below the frame
_FP_XSTATE_MAGIC1 = 0x46505853
_FP_XSTATE_MAGIC2 = 0x46505845
_UC_FP_XSTATE, _UC_SIGCONTEXT_SS, _UC_STRICT_RESTORE_SS = 0x1, 0x2, 0x4
_SIGFRAME_BYTES = 8 + 304 + 128  # pretcode, struct ucontext, struct siginfo
_FX_SW_OFFSET = 464  # the software-reserved bytes of the legacy FXSAVE area
PTRACE_CONT, PTRACE_INTERRUPT = 7, 0x4207
# A system call's stop code under PTRACE_O_TRACESYSGOOD: SIGTRAP | 0x80, no signal.
SYSCALL_STOP = 5 | 0x80
_WALL, _WNOTHREAD = 0x40000000, 0x20000000
_PTRACE_EVENT_STOP = 128
_ERESTART = (512, 513, 514)  # ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND
_ERESTART_RESTARTBLOCK, _EINTR = 516, 4
_FLAGS_DF_TF = 0x400 | 0x100  # the direction flag (clear at a call) and the trap flag
_U64 = (1 << 64) - 1
LOOK_SECONDS = 5.0  # the longest an interrupted thread may take to stop and be looked at
# How long the called thread runs between two looks: from the first, doubling to the last.
_FIRST_NAP_SECONDS = 0.0005
_LAST_NAP_SECONDS = 0.01
# sigcontext's general registers, in its order (asm/sigcontext.h, x86-64).
_SIGCONTEXT_REGS = [
    "r8",
    "r9",
    "r10",
    "r11",
    "r12",
    "r13",
    "r14",
    "r15",
    "rdi",
    "rsi",
    "rbp",
    "rbx",
    "rdx",
    "rax",
    "rcx",
    "rsp",
    "rip",
    "eflags",
]
_ARG_REGS = ("rdi", "rsi", "rdx", "rcx", "r8", "r9")


def shadow_stack_enabled(pid: int) -> bool:
    """The process runs with a CET shadow stack (a return it did not call would fault)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("x86_Thread_features:"):
            return "shstk" in line.split(":", 1)[1].split()
    return False


def signal_mask(pid: int, tid: int) -> int:
    """The signals ``tid`` blocks (/proc's SigBlk), which the frame restores."""
    for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return int(line.split()[1], 16)
    raise TargetExitedError(f"thread {tid} of PID {pid} is gone", pid=pid)


@dataclass(frozen=True)
class Frame:
    """The signal frame of one call: where it goes and its bytes (from ``address`` on)."""

    address: int  # the frame's return address slot: the rt_sigframe rt_sigreturn reads
    image: bytes  # from ``entry`` on
    scratch: int = 0  # where the scratch bytes are, above the frame (0: none asked for)
    entry: int = 0  # the called function's rsp at entry (``address`` without stack args)


def _saved_registers(regs: ptrace_regs.UserRegs) -> dict[str, int]:
    """The registers the frame restores, with a system call's restart as after a signal."""
    saved = {name: getattr(regs, name) for name in _SIGCONTEXT_REGS}
    in_syscall = regs.orig_rax != _U64
    result = -(((regs.rax ^ _U64) + 1) & _U64) if regs.rax >> 63 else regs.rax
    if in_syscall and -result in _ERESTART:
        saved["rax"], saved["rip"] = regs.orig_rax, regs.rip - 2  # the syscall again
    elif in_syscall and -result == _ERESTART_RESTARTBLOCK:
        saved["rax"] = -_EINTR & _U64
    return saved


def build_frame(
    regs: ptrace_regs.UserRegs,
    xstate: bytes,
    sigmask: int,
    restore_rt: int,
    scratch: bytes = b"",
    stack_args: Sequence[int] = (),
    pop3_ret: int | None = None,
) -> Frame:
    """The frame for a call on a thread with ``regs``, ``xstate`` (PTRACE_GETREGSET's
    NT_X86_XSTATE) and blocked signals ``sigmask``: below rsp's red zone, ``scratch`` (the
    call's in-memory arguments) 16-byte aligned, the XSAVE area 64-byte aligned with its
    software bytes and closing magic, then the rt_sigframe 16-byte aligned less 8 (a called
    function's rsp), whose return address is ``restore_rt``. Everything the frame holds is
    above the called function's stack pointer, out of its reach.

    With ``stack_args`` (a 7th to 9th argument), the function is entered 32 bytes lower, on
    [``pop3_ret``, its stack arguments, zeros]: it returns into the three pops, which step
    over them and return into ``restore_rt`` (the sigframe's first word) as before."""
    if len(stack_args) > 3 or (stack_args and pop3_ret is None):
        raise ValueError("up to three stack arguments, through a pop-pop-pop-ret in libc")
    area = bytearray(xstate)
    xfeatures = struct.unpack_from("<Q", area, _FX_SW_OFFSET)[0]  # ptrace puts XCR0 there
    software = struct.pack("<IIQI28x", _FP_XSTATE_MAGIC1, len(area) + 4, xfeatures, len(area))
    area[_FX_SW_OFFSET : _FX_SW_OFFSET + len(software)] = software
    fp_image = bytes(area) + struct.pack("<I", _FP_XSTATE_MAGIC2)
    scratch_at = _scratch_address(regs, scratch)
    fpstate = (scratch_at - len(fp_image)) & ~63
    frame = ((fpstate - _SIGFRAME_BYTES) & ~15) - 8
    saved = _saved_registers(regs)
    sigcontext = struct.pack(
        "<18Q4H4QQ64x",
        *(saved[name] & _U64 for name in _SIGCONTEXT_REGS),
        regs.cs,
        regs.gs,
        regs.fs,
        regs.ss,
        0,  # err
        0,  # trapno
        sigmask,  # oldmask
        0,  # cr2
        fpstate,
    )
    # uc_stack with an invalid mode: rt_sigreturn's sigaltstack() refuses it (EINVAL) and
    # leaves the thread's alternate stack as it is.
    uc_stack = struct.pack("<Qi4xQ", 0, 0x7FFFFFFF, 0)
    flags = _UC_FP_XSTATE | _UC_SIGCONTEXT_SS | _UC_STRICT_RESTORE_SS
    ucontext = struct.pack("<QQ", flags, 0) + uc_stack + sigcontext + struct.pack("<Q", sigmask)
    head = struct.pack("<Q", restore_rt) + ucontext + bytes(128)  # siginfo: unused
    gap = fpstate - (frame + len(head))
    image = head + bytes(gap) + fp_image
    if scratch:
        image += bytes(scratch_at - (frame + len(image))) + scratch
    entry = frame
    if stack_args:
        words = [pop3_ret or 0, *stack_args, *[0] * (3 - len(stack_args))]
        entry = frame - 8 * len(words)  # 32 bytes: still 8 mod 16, as after a call
        image = struct.pack(f"<{len(words)}Q", *(w & _U64 for w in words)) + image
    return Frame(frame, image, scratch_at if scratch else 0, entry)


def _stack_room(pid: int, rsp: int, low: int) -> bool:
    """``low`` (the lowest byte the call may use) lies in the mapping that holds ``rsp``
    (a thread stack has a guard page below it), or that mapping is [stack], which grows."""
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        span, *rest = line.split(None, 5)
        start, end = (int(part, 16) for part in span.split("-"))
        if start <= rsp < end:
            return low >= start or (len(rest) == 5 and rest[4].strip() == "[stack]")
    return False


_NO_SYSCALL = (1 << 64) - 1  # orig_rax of a thread that is in no system call


def caller_thread(hold: ThreadHold, pid: int) -> int | None:
    """The thread to call on, in a plain (interrupt) stop: one waiting in a system call
    (the main one first), else the main one, else any. A waiting thread goes back to the
    same wait with the same stack after the call, so its end is seen at once; a running one
    may be deeper in its stack than the call's frame by the time it is looked at."""
    plain = [tid for tid, kind in hold.stop_kinds.items() if kind == "interrupt"]
    waiting = [
        tid for tid in plain if hold.program_counters.get(tid, (0, _NO_SYSCALL))[1] != _NO_SYSCALL
    ]
    for group in (waiting, plain):
        if pid in group:
            return pid
        if group:
            return group[0]
    return None


@dataclass(frozen=True)
class CallOutcome:
    """What a call did: whether it was seen to end, and how long the thread ran it."""

    finished: bool  # False: still running at the deadline; it ends (and restores) by itself
    seconds: float


def call(
    hold: ThreadHold,
    tid: int,
    function: int,
    args: Sequence[int],
    *,
    restore_rt: int,
    deadline: float,
    others_run: bool = False,
) -> CallOutcome:
    """Call ``function(*args)`` on held thread ``tid`` (see the module), while every other
    thread stays held (``others_run``: is let go as the call starts, ThreadHold.let_others_go:
    a function that takes its own locks need not stop the whole process for as long as it
    runs); return once the thread has restored itself, or at ``deadline`` (the call then goes
    on after the hold is released, and restores the thread by itself). TargetError when the
    thread's stack has no room for the call."""
    pid = hold.pid
    if hold.stop_kinds.get(tid) != "interrupt":
        # Its stop holds a signal on its way in (or a job-control stop): resuming it into the
        # call would drop that signal.
        raise TargetError(f"thread {tid} of PID {pid} is not in a plain stop", pid=pid)

    def work() -> CallOutcome:
        frame = enter_call(pid, tid, function, args, restore_rt=restore_rt)
        if others_run:
            hold.let_others_go(tid)
        started = time.monotonic()
        try:
            ptrace_regs.request(PTRACE_CONT, tid, 0)
            finished = await_return(tid, frame.address, deadline)
        finally:
            # Whatever happened, the release detaches it with no stale signal: a signal
            # that stopped it was delivered, and a thread still calling calls on.
            hold.resumed(tid)
        return CallOutcome(finished, time.monotonic() - started)

    return hold.in_tracer(work)


@dataclass(frozen=True)
class ScratchRef:
    """A call argument that is an address in the call's scratch: its start plus ``offset``."""

    offset: int


def enter_call(
    pid: int,
    tid: int,
    function: int,
    args: Sequence[int | ScratchRef],
    *,
    restore_rt: int,
    scratch: bytes = b"",
    pop3_ret: int | None = None,
    again: bool = False,
    sigmask: int | None = None,
) -> Frame:
    """On held thread ``tid``: the frame (and ``scratch``) written on its stack, then the
    call's registers set in one PTRACE_SETREGS; from there on the thread calls
    ``function(*args)`` once resumed, and restores itself when it returns. A 7th to 9th
    argument goes on the stack, through libc's ``pop3_ret`` (ValueError without it, or for
    more). TargetError when its stack has no room. ``again``: the thread was restored from
    an earlier call of this hold, so its stack's room (checked then, for the same stack
    pointer) is not read again; ``sigmask``: its blocked signals, read once for such a
    series (each call's rt_sigreturn restores them), else read here. In the hold's tracer
    thread only."""
    regs = ptrace_regs.get_regs(tid)
    in_registers, on_stack = list(args[: len(_ARG_REGS)]), list(args[len(_ARG_REGS) :])
    scratch_at = _scratch_address(regs, scratch)
    frame = build_frame(
        regs,
        ptrace_regs.get_xstate(tid),
        signal_mask(pid, tid) if sigmask is None else sigmask,
        restore_rt,
        scratch,
        [_resolve(value, scratch_at) for value in on_stack],
        pop3_ret,
    )
    if not again and not _stack_room(pid, regs.rsp, frame.entry - STACK_MARGIN_BYTES):
        raise TargetError(
            f"thread {tid} of PID {pid} has no room on its stack for a call",
            hint="try again later",
            pid=pid,
        )
    fd = os.open(f"/proc/{pid}/mem", os.O_RDWR | os.O_CLOEXEC)
    try:
        if os.pwrite(fd, frame.image, frame.entry) != len(frame.image):
            raise TargetError(f"could not write a call frame into PID {pid}", pid=pid)
    finally:
        os.close(fd)
    entry = ptrace_regs.UserRegs.from_buffer_copy(bytes(regs))
    entry.rip, entry.rsp, entry.rax, entry.orig_rax = function, frame.entry, 0, _U64
    entry.eflags &= ~_FLAGS_DF_TF
    for name, value in zip(_ARG_REGS, in_registers, strict=False):
        setattr(entry, name, _resolve(value, frame.scratch) & _U64)
    ptrace_regs.set_regs(tid, entry)  # the one step from "untouched" to "calling"
    return frame


def _scratch_address(regs: ptrace_regs.UserRegs, scratch: bytes) -> int:
    """Where build_frame puts ``scratch`` for a thread with ``regs``."""
    return (int(regs.rsp) - RED_ZONE_BYTES - len(scratch)) & ~15


def _resolve(value: int | ScratchRef, scratch_at: int) -> int:
    return scratch_at + value.offset if isinstance(value, ScratchRef) else value


def stop_of(tid: int) -> tuple[int, int] | None:
    """(signal, ptrace event) of ``tid``'s stop, seen not consumed; None while it runs."""
    info = os.waitid(
        os.P_PID, tid, os.WSTOPPED | os.WEXITED | os.WNOHANG | os.WNOWAIT | _WALL | _WNOTHREAD
    )
    if info is None:
        return None
    if info.si_code not in (os.CLD_TRAPPED, os.CLD_STOPPED):
        raise TargetExitedError(f"thread {tid} exited during a call", pid=tid)
    return info.si_status & 0xFF, info.si_status >> 8


def stopped(tid: int, give_up: float) -> None:
    """Wait for ``tid`` to be in a ptrace stop that is no signal's (an interrupt's or an
    event's): a signal that stops it first is delivered, and it is interrupted again. A
    system call's stop (SYSCALL_STOP: a thread run under PTRACE_SYSCALL, ptrace_probe's,
    whose sleep the interrupt woke stops at that call's exit first) carries no signal: it
    is resumed with none, and the interrupt stops it next."""
    while True:
        stop = stop_of(tid)
        if stop is None:
            if time.monotonic() > give_up:
                raise DeadlineError(f"thread {tid} did not stop to be looked at", pid=tid)
            time.sleep(0.0001)
            continue
        if stop[1] != 0:
            return
        # A signal on its way in: delivered (the kernel refuses a "signal" above 64, such
        # as a system call stop's code, with EIO).
        ptrace_regs.request(PTRACE_CONT, tid, 0 if stop[0] == SYSCALL_STOP else stop[0])
        ptrace_regs.request(PTRACE_INTERRUPT, tid)


def await_return(tid: int, frame: int, deadline: float) -> bool:
    """Follow the called thread until its stack pointer is above ``frame`` again (the
    function returned and rt_sigreturn restored it), looking every few ms: at the stop of a
    signal on its way in (before its handler's frame is built: where the thread was), or
    else interrupting it; signals are delivered. Leaves it in an interrupt stop; False when
    ``deadline`` came first."""
    nap = _FIRST_NAP_SECONDS
    while True:
        stop = stop_of(tid)
        if stop is None:
            time.sleep(nap)
            nap = min(nap * 2, _LAST_NAP_SECONDS)
            stop = stop_of(tid)
        if stop is None:
            ptrace_regs.request(PTRACE_INTERRUPT, tid)
            give_up = max(deadline, time.monotonic()) + LOOK_SECONDS
            while (stop := stop_of(tid)) is None:
                if time.monotonic() > give_up:
                    raise DeadlineError(f"thread {tid} did not stop to be looked at", pid=tid)
                time.sleep(0.0001)
        rsp = int(ptrace_regs.get_regs(tid).rsp)
        if rsp > frame or time.monotonic() > deadline:
            if stop[1] == 0:  # a signal's stop: deliver it, then stop it plainly
                ptrace_regs.request(PTRACE_CONT, tid, stop[0])
                ptrace_regs.request(PTRACE_INTERRUPT, tid)
                stopped(tid, max(deadline, time.monotonic()) + LOOK_SECONDS)
            return rsp > frame
        if stop[1] == 0:
            # A signal on its way in: delivered at once, and the thread goes on. A stop that
            # waited for our next look would let the next one arrive meanwhile: a timer
            # signal faster than the looks (every 2 ms, the looks every 10 ms) then stops
            # the thread again as its handler returns, and the call never runs.
            ptrace_regs.request(PTRACE_CONT, tid, stop[0])
            nap = _FIRST_NAP_SECONDS
            continue
        ptrace_regs.request(PTRACE_CONT, tid, 0)
