"""The raw readers of /proc/PID: one file's text, stat's and status's fields, and the few
facts read straight from them (state, tracer, alive, kernel thread, the executable's path);
and the one machine-wide fact a read needs: how many tasks are runnable now.

Nothing here stops, signals or traces the target, nor interprets more than one file: the
facts built from several (sources.proc.process_facts), the allocator (allocator_detect), the
memory figures (memory_figures), the target check (target_check) and the attach diagnosis
(attach_diagnosis) read /proc through these.
"""

from __future__ import annotations

import os
from pathlib import Path

from memforensics.errors import MemforensicsError, NoSuchProcessError, TargetPermissionError

PROC = Path("/proc")
# PF_KTHREAD from include/linux/sched.h: the task is a kernel thread (no user memory at all).
_PF_KTHREAD = 0x00200000


def proc_path(pid: int, name: str) -> Path:
    """/proc/PID/NAME (under ``PROC``, which a test may point at a look-alike)."""
    return PROC / str(pid) / name


def read_text(pid: int, name: str) -> str:
    """Read /proc/PID/NAME, turning a vanished process into NoSuchProcessError."""
    try:
        return proc_path(pid, name).read_text(errors="replace")
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise NoSuchProcessError(f"no process with PID {pid}") from exc
    except PermissionError as exc:
        raise TargetPermissionError(f"cannot read /proc/{pid}/{name}: permission denied") from exc


def stat_fields(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after the command name (which may contain spaces and ')')."""
    stat = read_text(pid, "stat")
    return stat.rsplit(")", 1)[1].split()


def process_state(pid: int) -> str:
    """The one-letter state of PID from /proc/PID/stat: 'R', 'S', 'D', 'T', 't', 'Z', …"""
    return stat_fields(pid)[0]


def parse_status(text: str) -> dict[str, str]:
    """A /proc/PID/status text as ``{key: value}`` (values stripped)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def status_fields(pid: int) -> dict[str, str]:
    """/proc/PID/status as ``{key: value}`` (values stripped)."""
    return parse_status(read_text(pid, "status"))


def tracer_pid(pid: int) -> int:
    """The PID tracing PID now (TracerPid in /proc/PID/status), 0 for none."""
    return int(status_fields(pid).get("TracerPid", "0") or 0)


def is_kernel_thread(fields: list[str]) -> bool:
    """The process whose ``stat_fields`` these are is a kernel thread (PF_KTHREAD in its
    flags): it has no user memory."""
    # Field 9 of stat is `flags`; after splitting at ')' it is index 6.
    return bool(int(fields[6]) & _PF_KTHREAD)


def pid_alive(pid: int) -> bool:
    """PID exists and has not exited (a zombie or a dead task is not alive)."""
    try:
        state = process_state(pid)
    except MemforensicsError:
        return False
    return state not in ("Z", "X")


def exe_path(pid: int) -> str | None:
    """Where /proc/PID/exe points; None when it cannot be read (a deleted binary, no access).
    NoSuchProcessError when PID is gone."""
    try:
        return os.readlink(proc_path(pid, "exe"))
    except FileNotFoundError:
        if not proc_path(pid, "stat").exists():
            raise NoSuchProcessError(f"no process with PID {pid}") from None
        return None
    except OSError:
        return None


def runnable_tasks() -> int | None:
    """Tasks runnable on the machine at this instant, the caller's own thread among them
    (/proc/loadavg's fourth field, "runnable/total"); None where it cannot be read. Fewer
    than the CPUs one may run on means one of those CPUs is idle now."""
    try:
        return int((PROC / "loadavg").read_text().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None
