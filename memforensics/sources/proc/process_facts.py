"""Who a process is and what state it is in, read from /proc as one ProcessFacts: its name,
command line, uid, threads, state, tracer, executable and allocator (never stopping it);
read once, and brought up to date after a read from one status text (``facts_after``)."""

from __future__ import annotations

import os
from dataclasses import replace

from memforensics.errors import MemforensicsError, TargetPermissionError
from memforensics.model.process import AllocatorInfo, ProcessFacts
from memforensics.sources.proc.allocator_detect import detect_allocator
from memforensics.sources.proc.procfs import (
    exe_path,
    is_kernel_thread,
    parse_status,
    proc_path,
    read_text,
    stat_fields,
    status_fields,
)

_COMM_MAX_CHARS = 15  # TASK_COMM_LEN - 1


def process_name(pid: int, *, cmdline: str | None = None) -> str:
    """The process's name as ps shows it; the kernel cuts comm at 15 characters, so a name of
    that length is completed from argv[0] when that starts with it (psutil's rule).
    ``cmdline``: the text of /proc/PID/cmdline where the caller has read it already."""
    name = read_text(pid, "comm").strip()
    if len(name) < _COMM_MAX_CHARS:
        return name
    if cmdline is None:
        try:
            cmdline = proc_path(pid, "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return name
    full = os.path.basename(cmdline.split("\0", 1)[0])
    return full if full.startswith(name) else name


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
    stat = stat_fields(pid)  # one read for the state and the flags
    state = stat[0]
    kernel_thread = is_kernel_thread(stat)
    cmdline_text = read_text(pid, "cmdline")  # one read for the arguments and the name
    name = process_name(pid, cmdline=cmdline_text)
    cmdline = tuple(arg for arg in cmdline_text.split("\0") if arg)  # none: zombie, kthread
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
        uid=_effective_uid(status),
        threads=int(threads_field) if threads_field else None,
        state=state,
        allocator=allocator,
        tracer_pid=int(status.get("TracerPid", "0") or 0),
        kernel_thread=kernel_thread,
        exe=exe,
    )


def _effective_uid(status: dict[str, str]) -> int | None:
    uid_field = status.get("Uid", "").split()  # real, effective, saved, filesystem
    return int(uid_field[1]) if len(uid_field) > 1 else None


def facts_after(facts: ProcessFacts, status: str) -> ProcessFacts:
    """``facts`` (read_process's or check_target's) as of ``status``, a /proc/PID/status text
    read since: what moves while a process runs (its state, threads, tracer, uid) is taken
    from it (status's State is stat's letter), what does not without an exec (its name,
    command line, executable, allocator) is kept. A process that has exited meanwhile is
    read again whole, as read_process sees one."""
    fields = parse_status(status)
    state = fields.get("State", "")[:1]
    if not state or state in ("Z", "X"):
        return read_process(facts.pid, allocator=facts.allocator)
    threads_field = fields.get("Threads")
    return replace(
        facts,
        uid=_effective_uid(fields),
        threads=int(threads_field) if threads_field else None,
        state=state,
        tracer_pid=int(fields.get("TracerPid", "0") or 0),
    )
