"""Bring back a thread that gdb left inside a call when gdb died (run by the watchdog).

gdb makes a call by pointing the thread at the function, with a return address at the
program's entry point where it has written a breakpoint (int3). If gdb dies (SIGKILL, OOM
killer, an internal error) while the function runs, the kernel detaches ptrace and the thread
runs on, returns into that int3 with no tracer, and SIGTRAP kills the whole process. The
guardian takes gdb's place: it PTRACE_SEIZEs the calling thread, lets the call finish, catches
the trap, restores the registers gdb had saved before the call (general, and the vector state
through PTRACE_SETREGSET NT_X86_XSTATE: xmm, upper ymm, zmm and mask registers), puts back the
entry point's original byte and detaches. The thread resumes where it was (a system call it
was blocked in is restarted by the kernel, as after gdb's own restore).

It never lets go of a call in flight: let go, the call's return would land in that int3 and
kill the process. Past its deadline, a call still running is waited for again; a call
blocked waiting for a lock (a futex wait: an arena's mutex that a stuck thread holds, stdio's
list lock) is unwound where it waits, as gdb's unwindonsignal would. Waiting for an arena's
mutex or stdio's list lock, the calls made (malloc_info, malloc_trim, malloc, open_memstream,
fclose, free) hold no allocator lock: each takes one arena's mutex at a time, and waits for it
holding none. (One wait does hold one: malloc's reused_arena takes glibc's free_list_lock
holding the arena it chose; that lock is held for a few instructions at a time, so a wait
for it past the deadline means a process already stuck.)

x86-64 only; memforensics sends the saved registers as gdb reported them (see gdb.py).
"""

from __future__ import annotations

import ctypes
import os
import signal
import struct
import time

from memforensics.sources.gdb.user_regs import USER_REGS

_PTRACE_CONT = 7
_PTRACE_DETACH = 17
_PTRACE_GETREGS = 12
_PTRACE_SETREGS = 13
_PTRACE_GETREGSET = 0x4204
_PTRACE_SETREGSET = 0x4205
_PTRACE_SEIZE = 0x4206
_PTRACE_INTERRUPT = 0x4207
_PTRACE_EVENT_STOP = 128
_NT_X86_XSTATE = 0x202
_WALL = 0x40000000
_XSTATE_MAX_BYTES = 16384

# What a call may change and gdb restores; segment registers are left as they are.
_RESTORED_GPRS = frozenset(USER_REGS) - {"cs", "ss", "ds", "es", "fs", "gs"}

# Offsets in the standard (non-compacted) XSAVE layout the kernel uses for NT_X86_XSTATE.
_XMM_OFFSET = 160
_XSTATE_BV_OFFSET = 512
_YMMH_OFFSET = 576  # component 2: upper halves of ymm0-15
_OPMASK_OFFSET = 1088  # component 5: k0-k7
_ZMMH_OFFSET = 1152  # component 6: upper 256 bits of zmm0-15
_HI16_ZMM_OFFSET = 1664  # component 7: zmm16-31 whole
_FAULTS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT}
_SYS_FUTEX = 202  # x86-64
# How often the thread is looked at: often while the call should end soon, rarely past the
# deadline (a call blocked for hours must not cost a CPU).
_POLL_SECONDS = 0.0005
_LATE_POLL_SECONDS = 0.01
# What a futex wait interrupted by PTRACE_INTERRUPT returns (include/linux/errno.h): the
# kernel restarts the wait on resume. ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND,
# ERESTART_RESTARTBLOCK.
_RESTARTING = {-512, -513, -514, -516}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


def _ptrace(request: int, tid: int, addr: int = 0, data: int | object = 0) -> int:
    data_arg = data if not isinstance(data, int) else ctypes.c_void_p(data)
    result = int(_libc.ptrace(request, tid, ctypes.c_void_p(addr), data_arg))
    if result == -1:
        errno = ctypes.get_errno()
        if errno:
            raise OSError(errno, os.strerror(errno))
    return result


def register_bytes(values: dict[str, int], name: str, size_bytes: int) -> bytes | None:
    """A saved register as little-endian bytes, or None when gdb did not report it."""
    value = values.get(name)
    return None if value is None else value.to_bytes(size_bytes, "little")


def _patch_xstate(xstate: bytearray, saved: dict[str, int]) -> None:
    """Write the saved vector registers into a standard-format XSAVE buffer."""
    bits = 0

    def put(offset: int, data: bytes | None, bit: int) -> None:
        nonlocal bits
        if data is not None and offset + len(data) <= len(xstate):
            xstate[offset : offset + len(data)] = data
            bits |= 1 << bit

    for i in range(16):
        put(_XMM_OFFSET + 16 * i, register_bytes(saved, f"xmm{i}", 16), 1)
        put(_YMMH_OFFSET + 16 * i, register_bytes(saved, f"ymm{i}h", 16), 2)
        put(_ZMMH_OFFSET + 32 * i, register_bytes(saved, f"zmm{i}h", 32), 6)
    for i in range(8):
        put(_OPMASK_OFFSET + 8 * i, register_bytes(saved, f"k{i}", 8), 5)
    for i in range(16, 32):
        base = _HI16_ZMM_OFFSET + 64 * (i - 16)
        put(base, register_bytes(saved, f"xmm{i}", 16), 7)
        put(base + 16, register_bytes(saved, f"ymm{i}h", 16), 7)
        put(base + 32, register_bytes(saved, f"zmm{i}h", 32), 7)
    mxcsr = saved.get("mxcsr")
    if mxcsr is not None:
        struct.pack_into("<I", xstate, 24, mxcsr)
    (present,) = struct.unpack_from("<Q", xstate, _XSTATE_BV_OFFSET)
    struct.pack_into("<Q", xstate, _XSTATE_BV_OFFSET, present | bits)


def _restore_registers(tid: int, saved: dict[str, int]) -> None:
    regs = (ctypes.c_ulonglong * len(USER_REGS))()
    _ptrace(_PTRACE_GETREGS, tid, 0, ctypes.addressof(regs))
    for index, name in enumerate(USER_REGS):
        if name in _RESTORED_GPRS and name in saved:
            regs[index] = saved[name] & 0xFFFFFFFFFFFFFFFF
    _ptrace(_PTRACE_SETREGS, tid, 0, ctypes.addressof(regs))
    buffer = (ctypes.c_ubyte * _XSTATE_MAX_BYTES)()
    iov = _IoVec(ctypes.addressof(buffer), _XSTATE_MAX_BYTES)
    _ptrace(_PTRACE_GETREGSET, tid, _NT_X86_XSTATE, ctypes.addressof(iov))
    xstate = bytearray(bytes(buffer)[: iov.length])
    _patch_xstate(xstate, saved)
    ctypes.memmove(buffer, bytes(xstate), len(xstate))
    _ptrace(_PTRACE_SETREGSET, tid, _NT_X86_XSTATE, ctypes.addressof(iov))


def _register(tid: int, name: str) -> int:
    regs = (ctypes.c_ulonglong * len(USER_REGS))()
    _ptrace(_PTRACE_GETREGS, tid, 0, ctypes.addressof(regs))
    return int(regs[USER_REGS.index(name)])


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _in_futex_wait(pid: int, tid: int) -> bool:
    """``tid`` sleeps in a futex system call (/proc's syscall file: its number first)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/syscall") as text:
            return text.read().split(maxsplit=1)[:1] == [str(_SYS_FUTEX)]
    except (OSError, ValueError):
        return False


def write_text(pid: int, address: int, data: bytes) -> None:
    """Write bytes into the target's (read-only) text, as a debugger does."""
    fd = os.open(f"/proc/{pid}/mem", os.O_RDWR)
    try:
        os.pwrite(fd, data, address)
    finally:
        os.close(fd)


def finish_call(
    pid: int,
    tid: int,
    saved: dict[str, int],
    *,
    dummy_address: int,
    dummy_byte: bytes,
    timeout_seconds: float,
) -> str:
    """Seize ``tid``, wait for its return into the dummy breakpoint, restore it, detach.
    Past ``timeout_seconds`` (and every such time after it), a call blocked in a futex wait
    is unwound there; one still running is waited for (see the module).

    Returns what happened, in words (the watchdog has nobody to tell, but tests read it).
    """
    try:
        _ptrace(_PTRACE_SEIZE, tid)
        _ptrace(_PTRACE_INTERRUPT, tid)  # one look: is it really inside a call?
    except OSError as exc:
        return f"could not seize thread {tid}: {exc.strerror}"
    call = _Call(pid, tid, saved, dummy_address, dummy_byte, timeout_seconds)
    try:
        return call.follow()
    except OSError as exc:
        return f"lost thread {tid}: {exc.strerror}"


class _Call:
    """The seized thread of a call in flight, followed until it is restored or gone."""

    def __init__(
        self,
        pid: int,
        tid: int,
        saved: dict[str, int],
        dummy_address: int,
        dummy_byte: bytes,
        timeout_seconds: float,
    ) -> None:
        self.pid, self.tid, self.saved = pid, tid, saved
        self.dummy_address, self.dummy_byte = dummy_address, dummy_byte
        self.timeout_seconds = timeout_seconds
        self.deadline = time.monotonic() + timeout_seconds
        self.unwinding = False  # interrupted past the deadline, in a futex wait: unwind there
        self.poll_seconds = _POLL_SECONDS

    def follow(self) -> str:
        checked = False
        while True:
            status = self._next_stop()
            if os.WIFEXITED(status) or os.WIFSIGNALED(status):
                return "the thread ended"
            if not os.WIFSTOPPED(status):
                continue
            sig = os.WSTOPSIG(status)
            if not checked:
                checked = True
                # In a call the stack pointer is in gdb's dummy frame, below the caller's
                # red zone. At or above the saved one, gdb never started the call (it died
                # first) or had already restored the thread: nothing to do.
                if "rsp" in self.saved and _register(self.tid, "rsp") >= self.saved["rsp"]:
                    _ptrace(_PTRACE_DETACH, self.tid, 0, 0 if status >> 16 else sig)
                    return "the thread was not inside a call; detached"
            if status >> 16 == _PTRACE_EVENT_STOP:
                if self.unwinding and self._still_waiting():
                    return self._restore("call blocked on a lock past the deadline; unwound")
                self.unwinding = False
                _ptrace(_PTRACE_CONT, self.tid, 0, 0)  # a group-stop or interrupt: keep running
                continue
            if sig == signal.SIGTRAP and _register(self.tid, "rip") == self.dummy_address + 1:
                return self._restore("call finished")
            if sig in _FAULTS:
                # The call faulted: unwind it as gdb's unwindonsignal would.
                return self._restore(f"call raised {signal.Signals(sig).name}")
            _ptrace(_PTRACE_CONT, self.tid, 0, sig)  # the program's own signal: deliver it

    def _next_stop(self) -> int:
        """The thread's next wait status; past the deadline, a futex wait is interrupted
        (to be unwound at that stop) and a running call given another deadline."""
        while True:
            waited, status = os.waitpid(self.tid, os.WNOHANG | _WALL)
            if waited:
                return status
            if not self.unwinding and time.monotonic() >= self.deadline:
                if _in_futex_wait(self.pid, self.tid):
                    _ptrace(_PTRACE_INTERRUPT, self.tid)
                    self.unwinding = True
                self.deadline = time.monotonic() + self.timeout_seconds
                self.poll_seconds = _LATE_POLL_SECONDS
            time.sleep(self.poll_seconds)

    def _still_waiting(self) -> bool:
        """Stopped inside its futex wait, not past it (then holding the lock it waited for)."""
        return (
            _register(self.tid, "orig_rax") == _SYS_FUTEX
            and _signed(_register(self.tid, "rax")) in _RESTARTING
        )

    def _restore(self, what: str) -> str:
        _restore_registers(self.tid, self.saved)
        write_text(self.pid, self.dummy_address, self.dummy_byte)
        _ptrace(_PTRACE_DETACH, self.tid, 0, 0)
        return f"{what}; thread restored"
