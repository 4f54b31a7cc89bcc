"""Who a process is and what state it is in, read from /proc as one ProcessFacts: its name,
command line, uid, threads, state, tracer, executable and allocator (never stopping it)."""

from __future__ import annotations

import contextlib
import os

from memforensics.errors import MemforensicsError, TargetPermissionError
from memforensics.model.process import AllocatorInfo, ProcessFacts
from memforensics.sources.proc.allocator_detect import detect_allocator
from memforensics.sources.proc.procfs import (
    exe_path,
    is_kernel_thread,
    proc_path,
    read_text,
    stat_fields,
    status_fields,
)

_COMM_MAX_CHARS = 15  # TASK_COMM_LEN - 1


def process_name(pid: int) -> str:
    """The process's name as ps shows it; the kernel cuts comm at 15 characters, so a name of
    that length is completed from argv[0] when that starts with it (psutil's rule)."""
    name = read_text(pid, "comm").strip()
    if len(name) >= _COMM_MAX_CHARS:
        with contextlib.suppress(OSError):
            argv0 = (
                proc_path(pid, "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
            )
            full = os.path.basename(argv0)
            if full.startswith(name):
                return full
    return name


def describe_pid(pid: int) -> str:
    """``PID (name)``, or the bare PID when its name cannot be read."""
    try:
        return f"{pid} ({process_name(pid)})"
    except MemforensicsError:
        return str(pid)


def read_process(pid: int, *, allocator: AllocatorInfo | None = None) -> ProcessFacts:
    """Identity, state, tracer and allocator of PID, from /proc (never stops it).
    ``allocator``: what detect_allocator already gave for this PID, kept rather than looked
    for again (it reads the maps and libc: tens of ms for a process of thousands of threads)."""
    status = status_fields(pid)
    state = stat_fields(pid)[0]
    kernel_thread = is_kernel_thread(pid)
    name = process_name(pid)
    cmdline = tuple(
        arg for arg in read_text(pid, "cmdline").split("\0") if arg
    )  # zombies and kernel threads have none
    uid_field = status.get("Uid", "").split()
    threads_field = status.get("Threads")
    if kernel_thread or state in ("Z", "X"):
        # Their maps are empty; there is no allocator to look for.
        allocator = AllocatorInfo(kind="unknown", detail="no user memory")
        exe = None
    elif allocator is not None:
        exe = exe_path(pid)
    else:
        try:
            allocator = detect_allocator(pid)
        except TargetPermissionError:
            # Another user's maps are unreadable without CAP_SYS_PTRACE; the facts still help
            # diagnose_attach_failure, and check_target re-raises the permission error.
            allocator = AllocatorInfo(kind="unknown", detail=f"/proc/{pid}/maps not readable")
        exe = exe_path(pid)
    return ProcessFacts(
        pid=pid,
        name=name,
        cmdline=cmdline,
        uid=int(uid_field[1]) if len(uid_field) > 1 else None,  # effective uid
        threads=int(threads_field) if threads_field else None,
        state=state,
        allocator=allocator,
        tracer_pid=int(status.get("TracerPid", "0") or 0),
        kernel_thread=kernel_thread,
        exe=exe,
    )
