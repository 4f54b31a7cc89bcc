"""The kernel's view of whether a read copied a target's shared pages: its private bytes, and
a pinned read (process_vm_readv) to show that the kernel does copy on a pin here.

A read-only pin of an anonymous page a process shares copy-on-write with another makes the
kernel (Linux 5.19 and later) give it its own copy first, which smaps counts as private."""

from __future__ import annotations

import ctypes
import platform
from pathlib import Path


def private_bytes(pid: int) -> int:
    """Private_Clean + Private_Dirty of ``pid``, from its smaps_rollup."""
    total = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("Private_Clean", "Private_Dirty"):
            total += int(rest.split()[0]) * 1024
    return total


def heap_shared_bytes(pid: int) -> int:
    """Shared_Clean + Shared_Dirty of ``pid``'s [heap] mapping, from its smaps."""
    total, in_heap = 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and ":" not in fields[0]:
            in_heap = fields[-1] == "[heap]"
        elif in_heap and fields and fields[0] in ("Shared_Clean:", "Shared_Dirty:"):
            total += int(fields[1]) * 1024
    return total


def vm_readv(pid: int, address: int, length: int) -> int:
    """One process_vm_readv of [address, address + length) of ``pid``: bytes read."""

    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]

    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(length)
    local, remote = IoVec(ctypes.cast(buffer, ctypes.c_void_p), length), IoVec(address, length)
    libc.process_vm_readv.restype = ctypes.c_ssize_t
    return int(
        libc.process_vm_readv(
            pid, ctypes.byref(local), ctypes.c_ulong(1), ctypes.byref(remote), ctypes.c_ulong(1), 0
        )
    )


def kernel_copies_on_pin() -> bool:
    """Linux 5.19 and later copy a shared anonymous page before a read-only pin of it."""
    major, minor = (int(part) for part in platform.release().split(".")[:2])
    return (major, minor) >= (5, 19)
