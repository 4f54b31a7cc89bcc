"""Why a ptrace attach failed, named from what /proc says: the process gone or a zombie,
another tracer, Yama's ptrace_scope, a missing CAP_SYS_PTRACE (in a container or not),
another user, else a seccomp or LSM policy."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from memforensics.errors import (
    MemforensicsError,
    NoSuchProcessError,
    TargetError,
    TargetPermissionError,
)
from memforensics.sources.proc.process_facts import describe_pid, read_process
from memforensics.sources.proc.procfs import status_fields

# Bit of CAP_SYS_PTRACE in the capability masks of /proc/PID/status (linux/capability.h).
_CAP_SYS_PTRACE_BIT = 19


@dataclass(frozen=True, slots=True)
class _Capabilities:
    effective: int
    bounding: int


def _own_capabilities() -> _Capabilities:
    status = status_fields(os.getpid())
    return _Capabilities(
        effective=int(status.get("CapEff", "0"), 16), bounding=int(status.get("CapBnd", "0"), 16)
    )


def _ptrace_scope() -> int | None:
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        return None


def _in_container() -> bool:
    if Path("/.dockerenv").exists() or Path("/run/.containerenv").exists():
        return True
    with contextlib.suppress(OSError):
        cgroup = Path("/proc/1/cgroup").read_text()
        return any(word in cgroup for word in ("docker", "kubepods", "containerd", "libpod"))
    return False


def diagnose_attach_failure(pid: int, gdb_message: str, *, tool: str = "gdb") -> MemforensicsError:
    """Turn a failed ptrace attach into the error that names its real cause.

    Gone -> NoSuchProcessError; zombie -> TargetError; otherwise TargetPermissionError naming
    the first cause that applies: another tracer, Yama's ptrace_scope, a missing
    CAP_SYS_PTRACE (with the container hint), another user. gdb says "No such process" also
    when Yama refuses and /proc/PID exists, so that message alone proves nothing.
    ``tool`` names who reported ``gdb_message`` where the error quotes it ("gdb said: …").
    """
    try:
        facts = read_process(pid)
    except NoSuchProcessError:
        return NoSuchProcessError(
            f"PID {pid} exited before memforensics could attach",
            hint="check the PID with `ps -p PID`; a short-lived process cannot be inspected",
        )
    except TargetPermissionError as exc:
        return exc
    label = f"PID {pid} ({facts.name})"
    if facts.state in ("Z", "X"):
        return TargetError(f"{label} exited (zombie) before memforensics could attach")
    gdb_said = gdb_message.strip().splitlines()[-1] if gdb_message.strip() else "refused"
    prefix = f"cannot attach to {label}: "
    if facts.tracer_pid:
        return TargetPermissionError(
            f"{prefix}already traced by TracerPid {describe_pid(facts.tracer_pid)}",
            hint="detach the other debugger or tracer (gdb, strace, a profiler) and retry",
        )
    caps = _own_capabilities()
    has_ptrace_cap = bool(caps.effective >> _CAP_SYS_PTRACE_BIT & 1)
    scope = _ptrace_scope()
    my_uid = os.geteuid()
    sudo_hint = "run as root with `sudo -E memforensics …` (keeps your environment)"
    if scope is not None and scope >= 3:
        return TargetPermissionError(
            f"{prefix}kernel.yama.ptrace_scope is 3: ptrace attach is disabled until reboot",
            hint="no user can attach on this boot; reboot with ptrace_scope < 3",
        )
    if scope == 2 and not has_ptrace_cap:
        return TargetPermissionError(
            f"{prefix}kernel.yama.ptrace_scope is 2: only CAP_SYS_PTRACE may attach",
            hint=sudo_hint,
        )
    if not has_ptrace_cap and facts.uid is not None and facts.uid != my_uid:
        if my_uid == 0:
            # Root without the capability: dropped by a container runtime, setpriv, capsh.
            return TargetPermissionError(
                f"{prefix}it runs as uid {facts.uid} and this root has no CAP_SYS_PTRACE",
                hint="grant CAP_SYS_PTRACE (in a container: `docker run --cap-add=SYS_PTRACE`)",
            )
        return TargetPermissionError(
            f"{prefix}it runs as uid {facts.uid}, you are uid {my_uid}",
            hint=f"{sudo_hint}, or run as the target's user",
        )
    if scope == 1 and not has_ptrace_cap:
        return TargetPermissionError(
            f"{prefix}kernel.yama.ptrace_scope is 1: only a parent may attach to its children",
            hint=f"{sudo_hint}, or `sysctl kernel.yama.ptrace_scope=0`",
        )
    scope_text = "absent on this kernel" if scope is None else str(scope)
    if not has_ptrace_cap:
        bounded_out = not caps.bounding >> _CAP_SYS_PTRACE_BIT & 1
        container = _in_container() or bounded_out
        hint = (
            "in a container, start it with `docker run --cap-add=SYS_PTRACE` (and a seccomp "
            "profile that allows ptrace)"
            if container
            else sudo_hint
        )
        return TargetPermissionError(
            f"{prefix}missing CAP_SYS_PTRACE (ptrace_scope {scope_text}); {tool} said: {gdb_said}",
            hint=hint,
        )
    hint = (
        "a container runtime's seccomp profile may block ptrace: "
        "`docker run --cap-add=SYS_PTRACE --security-opt seccomp=unconfined`"
        if _in_container()
        else "check for a seccomp or LSM policy (SELinux, AppArmor) denying ptrace"
    )
    return TargetPermissionError(
        f"{prefix}ptrace refused although you have CAP_SYS_PTRACE (ptrace_scope {scope_text});"
        f" {tool} said: {gdb_said}",
        hint=hint,
    )
