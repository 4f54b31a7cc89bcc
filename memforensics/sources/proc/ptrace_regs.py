"""ptrace requests on a thread, and its x86-64 registers in a ptrace stop, read and written
whole.

Every request here must come from the thread that traces ``tid`` (the kernel takes them from
no other). PTRACE_SETREGS writes every general register in one request: there is no moment
at which the thread holds some registers of one state and some of another.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable, Sequence

from memforensics.sources import optional_native
from memforensics.sources.gdb.user_regs import USER_REGS

PTRACE_GETREGS = 12
PTRACE_SETREGS = 13
PTRACE_GETREGSET = 0x4204
NT_X86_XSTATE = 0x202
_XSTATE_MAX_BYTES = 1 << 16  # more than any XSAVE area (AMX's is ~11 KiB)

# The same request on many threads in one C loop (None: not in use).
_batch = optional_native("memforensics.sources.proc._ptrace_batch")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long


class UserRegs(ctypes.Structure):
    """struct user_regs_struct (sys/user.h), field for field."""

    _fields_ = [(name, ctypes.c_ulonglong) for name in USER_REGS]


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


def _check(result: int, what: str, tid: int) -> None:
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"{what} of thread {tid}: {os.strerror(err)}")


_NAMES = {17: "PTRACE_DETACH", 0x4206: "PTRACE_SEIZE", 0x4207: "PTRACE_INTERRUPT", 7: "PTRACE_CONT"}


def request(number: int, tid: int, data: int = 0) -> None:
    """One ptrace request with a null addr and an integer ``data``; OSError with errno."""
    _check(_libc.ptrace(number, tid, None, data or None), _NAMES.get(number, str(number)), tid)


def request_each(
    number: int,
    tids: Sequence[int],
    data: Sequence[int] | int = 0,
    *,
    one: Callable[[int, int, int], None] = request,
) -> dict[int, int]:
    """``number`` made on every one of ``tids`` in turn (``data``: one per thread, or one for
    all); the errno of each that failed, by thread. One C loop (_ptrace_batch) when it is
    built and ``one`` is ``request``; else ``one`` per thread (a test's replacement for it
    sees every request)."""
    if _batch is not None and one is request:
        errors = _batch.each(number, tids, data)
        return {tid: err for tid, err in zip(tids, errors, strict=True) if err}
    failed: dict[int, int] = {}
    for index, tid in enumerate(tids):
        try:
            one(number, tid, data if isinstance(data, int) else data[index])
        except OSError as exc:
            failed[tid] = exc.errno or errno.EIO
    return failed


def get_regs(tid: int) -> UserRegs:
    """Every general register of ``tid``."""
    regs = UserRegs()
    _check(_libc.ptrace(PTRACE_GETREGS, tid, None, ctypes.byref(regs)), "PTRACE_GETREGS", tid)
    return regs


def set_regs(tid: int, regs: UserRegs) -> None:
    """Every general register of ``tid`` at once."""
    _check(_libc.ptrace(PTRACE_SETREGS, tid, None, ctypes.byref(regs)), "PTRACE_SETREGS", tid)


def get_xstate(tid: int) -> bytes:
    """``tid``'s x87/SSE/AVX… state as the XSAVE area the kernel gives user space (standard
    format; its software-reserved bytes say which features and how long, as in a signal
    frame)."""
    buffer = ctypes.create_string_buffer(_XSTATE_MAX_BYTES)
    iov = _IoVec(ctypes.cast(buffer, ctypes.c_void_p), _XSTATE_MAX_BYTES)
    _check(
        _libc.ptrace(PTRACE_GETREGSET, tid, ctypes.c_void_p(NT_X86_XSTATE), ctypes.byref(iov)),
        "PTRACE_GETREGSET",
        tid,
    )
    return buffer.raw[: iov.length]
