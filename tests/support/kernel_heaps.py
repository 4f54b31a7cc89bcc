"""The heaps of a process as the kernel maps them, read without memforensics' code: an oracle
for the arenas' `<system type="current">` bytes of a malloc_info document.

A thread arena's heaps are 64 MiB reservations at 64 MiB boundaries (glibc's HEAP_MAX_SIZE on
64-bit): the part ever used is read-write, the rest PROT_NONE, and each begins with a
heap_info {ar_ptr, prev, size, mprotect_size}. The read-write part is ``mprotect_size``
(shrinking a heap gives its pages back with MADV_DONTNEED and keeps them read-write), which
malloc_info sums as `<aspace type="mprotect">`; ``size``, the part in use, sums to the
arena's system bytes. The main arena's system bytes are the program break's span, the
[heap] mapping.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HEAP_MAX_BYTES = 64 * 1024 * 1024
_HEAP_INFO_SIZE_OFFSET = 16


@dataclass(frozen=True)
class KernelHeaps:
    thread_heap_rw_bytes: int  # the kernel's: read-write bytes of every thread-arena heap
    thread_heap_size_bytes: int  # glibc's: the heaps' heap_info.size, summed
    thread_heaps: int
    brk_heap_bytes: int | None  # the kernel's: the [heap] mappings' sizes; None without one


def _maps(pid: int) -> list[tuple[int, int, str, int, str]]:
    rows = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        start, end = (int(part, 16) for part in fields[0].split("-"))
        path = fields[5].strip() if len(fields) > 5 else ""
        rows.append((start, end, fields[1], int(fields[4]), path))
    return rows


def kernel_heaps(pid: int) -> KernelHeaps:
    """The process's heaps from /proc/PID/maps, each confirmed by its heap_info (a
    mprotect_size that is the read-write part, a size within it)."""
    maps = _maps(pid)
    rw_total = size_total = count = 0
    brk: int | None = None
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        for index, (start, end, perms, inode, path) in enumerate(maps):
            if path == "[heap]":  # the kernel names every mapping of the break's span so
                brk = (brk or 0) + end - start
                continue
            if start % HEAP_MAX_BYTES or not perms.startswith("rw") or inode or path:
                continue
            reserved_end = end
            if index + 1 < len(maps):
                following = maps[index + 1]
                if following[0] == end and following[2].startswith("---"):
                    reserved_end = following[1]
            if reserved_end - start < HEAP_MAX_BYTES:
                continue
            header = os.pread(fd, 16, start + _HEAP_INFO_SIZE_OFFSET)
            size = int.from_bytes(header[:8], "little")
            mprotect = int.from_bytes(header[8:], "little")
            if mprotect != end - start or not 0 < size <= mprotect:
                continue  # a 64 MiB-aligned mapping that is not one of malloc's heaps
            rw_total += end - start
            size_total += size
            count += 1
    finally:
        os.close(fd)
    return KernelHeaps(
        thread_heap_rw_bytes=rw_total,
        thread_heap_size_bytes=size_total,
        thread_heaps=count,
        brk_heap_bytes=brk,
    )


def _state(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("State:"):
            return line.split()[1]
    return "?"


def _all_threads_stopped(pid: int) -> bool:
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        if stat[stat.rindex(")") + 2] not in "Tt":
            return False
    return True


@contextmanager
def stopped(pid: int, *, timeout_seconds: float = 5.0) -> Iterator[None]:
    """``pid`` in group stop (SIGSTOP, every thread stopped) for the block; SIGCONT after."""
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + timeout_seconds
        while not _all_threads_stopped(pid):
            assert time.monotonic() < deadline, f"PID {pid} did not stop (state {_state(pid)})"
            time.sleep(0.002)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
