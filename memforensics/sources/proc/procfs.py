"""Process facts from /proc: identity, memory, allocator, and why an attach failed.

Nothing here stops, signals or traces the target: every figure comes from reading /proc.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from memforensics.errors import (
    MemforensicsError,
    NoSuchProcessError,
    NotGlibcMallocError,
    TargetError,
    TargetPermissionError,
    TargetStoppedError,
)
from memforensics.model.allocator import FOREIGN_KINDS, ForeignLibrary
from memforensics.model.process import AllocatorInfo, ProcessFacts, ProcessMemory
from memforensics.sources.allocators.library import LIBRARY_PREFIXES, linked_copy
from memforensics.sources.proc.binaries import scan_binary
from memforensics.sources.proc.procmaps import file_paths, mapped_file

PROC = Path("/proc")
# PF_KTHREAD from include/linux/sched.h: the task is a kernel thread (no user memory at all).
_PF_KTHREAD = 0x00200000
# Bit of CAP_SYS_PTRACE in the capability masks of /proc/PID/status (linux/capability.h).
_CAP_SYS_PTRACE_BIT = 19
_OLD_LIBC_NAME_RE = re.compile(r"libc-(\d+\.\d+(?:\.\d+)?)\.so")
_COMM_MAX_CHARS = 15  # TASK_COMM_LEN - 1
# e_ident of an ELF file: the magic, then EI_CLASS (1 = ELFCLASS32, 2 = ELFCLASS64).
_ELF_MAGIC = b"\x7fELF"
ELFCLASS32 = 1


def _proc(pid: int, name: str) -> Path:
    return PROC / str(pid) / name


def _read_text(pid: int, name: str) -> str:
    """Read /proc/PID/NAME, turning a vanished process into NoSuchProcessError."""
    try:
        return _proc(pid, name).read_text(errors="replace")
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise NoSuchProcessError(f"no process with PID {pid}") from exc
    except PermissionError as exc:
        raise TargetPermissionError(f"cannot read /proc/{pid}/{name}: permission denied") from exc


def _stat_fields(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after the command name (which may contain spaces and ')')."""
    stat = _read_text(pid, "stat")
    return stat.rsplit(")", 1)[1].split()


def process_state(pid: int) -> str:
    """The one-letter state of PID from /proc/PID/stat: 'R', 'S', 'D', 'T', 't', 'Z', …"""
    return _stat_fields(pid)[0]


def _status(pid: int) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in _read_text(pid, "status").splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def tracer_pid(pid: int) -> int:
    """The PID tracing PID now (TracerPid in /proc/PID/status), 0 for none."""
    return int(_status(pid).get("TracerPid", "0") or 0)


def _is_kernel_thread(pid: int) -> bool:
    # Field 9 of stat is `flags`; after splitting at ')' it is index 6.
    return bool(int(_stat_fields(pid)[6]) & _PF_KTHREAD)


def _process_name(pid: int) -> str:
    """The process's name as ps shows it; the kernel cuts comm at 15 characters, so a name of
    that length is completed from argv[0] when that starts with it (psutil's rule)."""
    name = _read_text(pid, "comm").strip()
    if len(name) >= _COMM_MAX_CHARS:
        with contextlib.suppress(OSError):
            argv0 = _proc(pid, "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
            full = os.path.basename(argv0)
            if full.startswith(name):
                return full
    return name


def _maps_paths(pid: int) -> list[str]:
    """Distinct file paths mapped into PID, in address order."""
    return file_paths(_read_text(pid, "maps"))


def _libc_file(pid: int, path: str) -> tuple[Path, int | None]:
    """The mapped libc itself (map_files), else its path in the target's root, and the
    mapping's inode: scan_binary opens it as hostile input and checks that inode."""
    return mapped_file(pid, path)


def _readable(path: Path) -> bool:
    return os.access(path, os.R_OK)


def _glibc_version(pid: int, libc_path: str) -> str | None:
    old_name = _OLD_LIBC_NAME_RE.search(os.path.basename(libc_path))
    if old_name:
        return old_name.group(1)
    where, inode = _libc_file(pid, libc_path)
    return scan_binary(where, inode=inode)[1]


def _is_glibc_libc(path: str) -> bool:
    base = os.path.basename(path)
    return base.startswith("libc.so") or bool(_OLD_LIBC_NAME_RE.match(base))


def detect_allocator(pid: int) -> AllocatorInfo:
    """Which allocator serves PID: glibc, or what replaces it (musl, jemalloc, tcmalloc, static).

    Decided from the libraries in /proc/PID/maps; a binary mapping no shared libc at all is
    static, and its /proc/PID/exe is searched for glibc's banner to say which libc it carries.
    """
    paths = _maps_paths(pid)
    for path in paths:
        base = os.path.basename(path)
        for prefix, kind in LIBRARY_PREFIXES:
            if base.startswith(prefix) and ".so" in base:
                libc = next((p for p in paths if _is_glibc_libc(p)), None)
                return AllocatorInfo(
                    kind=kind,
                    detail=f"{kind} ({path}) replaces glibc malloc",
                    libc_path=libc,
                    glibc_version=_glibc_version(pid, libc) if libc else None,
                    foreign=ForeignLibrary(kind=kind, path=path),
                )
    for path in paths:
        base = os.path.basename(path)
        # Debian's musl maps /usr/lib/x86_64-linux-musl/libc.so; Alpine's ld-musl-x86_64.so.1.
        if base.startswith(("ld-musl-", "libc.musl-")) or (
            base.startswith("libc.so") and "musl" in path
        ):
            return AllocatorInfo(kind="musl", detail=f"musl libc ({path})", libc_path=path)
    libc_path = next((p for p in paths if _is_glibc_libc(p)), None)
    if libc_path is not None:
        version = _glibc_version(pid, libc_path)
        if version is None and _readable(_libc_file(pid, libc_path)[0]):
            return AllocatorInfo(
                kind="unknown",
                detail=f"{libc_path} is not glibc (no glibc version banner in it)",
                libc_path=libc_path,
            )
        found = linked_copy(_proc(pid, "exe"))
        if found is not None:
            program = _exe_path(pid) or found.path
            found = ForeignLibrary(found.kind, program, found.prefix, found.serves_malloc)
            if found.serves_malloc:
                return AllocatorInfo(
                    kind=found.kind,
                    detail=f"{found.kind} linked into {program} replaces glibc malloc",
                    libc_path=libc_path,
                    glibc_version=version,
                    foreign=found,
                )
        prefixed = f"{found.prefix}-prefixed " if found is not None and found.prefix else ""
        beside = f"; beside it {prefixed}{found.kind} in {found.path}" if found else ""
        return AllocatorInfo(
            kind="glibc",
            detail=f"glibc malloc ({libc_path}){beside}",
            libc_path=libc_path,
            glibc_version=version,
            foreign=found,
        )
    interpreter = next((p for p in paths if os.path.basename(p).startswith("ld-linux")), None)
    if interpreter is not None:
        return AllocatorInfo(kind="unknown", detail=f"dynamic binary without a libc ({paths[0]})")
    exe = _exe_path(pid)
    has_glibc, version = scan_binary(_proc(pid, "exe")) if exe is not None else (False, None)
    if has_glibc:
        linked = f"glibc {version}" if version else "glibc"
        detail = f"static binary {exe} ({linked} linked in, no shared libc for gdb to load)"
    else:
        detail = f"static binary {exe or '(unknown)'} without a shared libc"
    return AllocatorInfo(kind="static", detail=detail, glibc_version=version)


def _exe_path(pid: int) -> str | None:
    try:
        return os.readlink(_proc(pid, "exe"))
    except FileNotFoundError:
        if not _proc(pid, "stat").exists():
            raise NoSuchProcessError(f"no process with PID {pid}") from None
        return None
    except OSError:
        return None


def elf_class(path: Path) -> int | None:
    """EI_CLASS of the ELF file at ``path`` (ELFCLASS32 = 1, ELFCLASS64 = 2), or None when
    it cannot be read or is no ELF file."""
    try:
        with path.open("rb") as handle:
            ident = handle.read(5)
    except OSError:
        return None
    return ident[4] if len(ident) == 5 and ident.startswith(_ELF_MAGIC) else None


def pid_alive(pid: int) -> bool:
    """PID exists and has not exited (a zombie or a dead task is not alive)."""
    try:
        state = process_state(pid)
    except MemforensicsError:
        return False
    return state not in ("Z", "X")


def read_process(pid: int, *, allocator: AllocatorInfo | None = None) -> ProcessFacts:
    """Identity, state, tracer and allocator of PID, from /proc (never stops it).
    ``allocator``: what detect_allocator already gave for this PID, kept rather than looked
    for again (it reads the maps and libc: tens of ms for a process of thousands of threads)."""
    status = _status(pid)
    state = _stat_fields(pid)[0]
    kernel_thread = _is_kernel_thread(pid)
    name = _process_name(pid)
    cmdline = tuple(
        arg for arg in _read_text(pid, "cmdline").split("\0") if arg
    )  # zombies and kernel threads have none
    uid_field = status.get("Uid", "").split()
    threads_field = status.get("Threads")
    if kernel_thread or state in ("Z", "X"):
        # Their maps are empty; there is no allocator to look for.
        allocator = AllocatorInfo(kind="unknown", detail="no user memory")
        exe = None
    elif allocator is not None:
        exe = _exe_path(pid)
    else:
        try:
            allocator = detect_allocator(pid)
        except TargetPermissionError:
            # Another user's maps are unreadable without CAP_SYS_PTRACE; the facts still help
            # diagnose_attach_failure, and check_target re-raises the permission error.
            allocator = AllocatorInfo(kind="unknown", detail=f"/proc/{pid}/maps not readable")
        exe = _exe_path(pid)
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


def _describe_pid(pid: int) -> str:
    try:
        return f"{pid} ({_process_name(pid)})"
    except MemforensicsError:
        return str(pid)


def check_target(
    pid: int, *, allow_stopped: bool = False, foreign_ok: bool = False
) -> ProcessFacts:
    """Refuse what cannot be inspected safely, else return the facts of PID.

    Raises NoSuchProcessError; TargetError for ourselves, a zombie, a kernel thread, a
    32-bit program (ELFCLASS32 executable: only 64-bit glibc layouts are read) or a process
    stopped by someone else (unless ``allow_stopped``); TargetPermissionError when another
    tracer holds it; NotGlibcMallocError naming the allocator that was found, unless
    ``foreign_ok`` and it is jemalloc, tcmalloc or mimalloc beside a glibc libc (whose
    ``__restore_rt`` their calls return through).
    """
    if pid <= 0:
        raise NoSuchProcessError(f"no process with PID {pid}")
    if pid == os.getpid():
        raise TargetError(
            f"PID {pid} is memforensics itself", hint="point memforensics at another process"
        )
    facts = read_process(pid)
    label = f"PID {pid} ({facts.name})"
    if facts.state in ("Z", "X"):
        raise TargetError(
            f"{label} is a zombie: it has exited and holds no memory",
            hint="its parent has not reaped it yet; look at the parent (ps -o ppid= -p PID)",
        )
    if facts.kernel_thread:
        raise TargetError(
            f"{label} is a kernel thread: it has no user-space heap",
            hint="pick a user-space process (ps -u USER lists them)",
        )
    if facts.tracer_pid:
        raise TargetPermissionError(
            f"{label} is already traced by TracerPid {_describe_pid(facts.tracer_pid)}",
            hint="detach the other debugger or tracer (gdb, strace, a profiler) and retry",
        )
    if facts.state in ("T", "t") and not allow_stopped:
        raise TargetStoppedError(
            f"{label} is stopped (state {facts.state}) by someone else", pid=pid
        )
    try:
        os.readlink(_proc(pid, "exe"))
    except PermissionError:
        # Reading exe needs the same ptrace access check, in its weaker "read" mode: if even
        # that is refused, an attach will be too. Say why now instead of after gdb fails.
        raise diagnose_attach_failure(pid, f"/proc/{pid}/exe: Permission denied") from None
    except OSError:
        pass  # no exe (deleted binary, exited): the checks below and the attach decide
    if elf_class(_proc(pid, "exe")) == ELFCLASS32:
        # glibc's 32-bit layout (4-byte words, 1 MiB sub-heaps) would be read wrong.
        raise TargetError(
            f"{label} is a 32-bit program ({facts.exe or 'its executable'} is ELFCLASS32): "
            "memforensics reads only 64-bit glibc heaps",
            hint="a 32-bit program can print its own heap with malloc_info(0, stdout); "
            "memforensics inspects 64-bit processes (x86-64, aarch64)",
            pid=pid,
        )
    if facts.allocator.kind == "unknown" and facts.allocator.detail.endswith("not readable"):
        detect_allocator(pid)  # raises the TargetPermissionError with its own message
    allocator = facts.allocator
    if foreign_ok and allocator.kind in FOREIGN_KINDS and allocator.libc_path is not None:
        return facts
    if not allocator.is_glibc_malloc:
        raise NotGlibcMallocError(f"{label} does not use glibc malloc: {allocator.detail}")
    return facts


def _kib_fields(text: str, *, summed: bool = False) -> dict[str, int]:
    """``Key: N kB`` lines as bytes; ``summed`` adds up repeated keys (smaps' mappings)."""
    fields: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            previous = fields.get(key.strip(), 0) if summed else 0
            fields[key.strip()] = previous + int(parts[0]) * 1024
    return fields


def read_memory(pid: int) -> ProcessMemory:
    """RSS, anonymous, file, shmem, swap, PSS and USS bytes of PID.

    smaps_rollup walks the page tables, so its Rss/Anonymous are exact where /proc/PID/status
    holds per-CPU counter approximations; shmem comes from status (rollup has no RSS split for
    it) and file-backed is what remains. USS = private clean + private dirty, as psutil counts it.
    """
    status = _kib_fields(_read_text(pid, "status"))
    try:
        rollup = _kib_fields(_read_text(pid, "smaps_rollup"))
    except TargetPermissionError:
        rollup = {}
    except NoSuchProcessError:
        # status was read, so the process exists: this kernel has no smaps_rollup (< 4.14);
        # smaps has the same fields per mapping, and the rollup is their sum.
        rollup = _kib_fields(_read_text(pid, "smaps"), summed=True)
    rss = rollup.get("Rss", status.get("VmRSS"))
    anon = rollup.get("Anonymous", status.get("RssAnon"))
    shmem = status.get("RssShmem")
    file_backed: int | None = None
    if rss is not None and anon is not None:
        file_backed = max(rss - anon - (shmem or 0), 0)
    uss: int | None = None
    if "Private_Clean" in rollup and "Private_Dirty" in rollup:
        uss = rollup["Private_Clean"] + rollup["Private_Dirty"]
    return ProcessMemory(
        rss_bytes=rss,
        anon_bytes=anon,
        file_bytes=file_backed,
        shmem_bytes=shmem,
        swap_bytes=rollup.get("Swap", status.get("VmSwap")),
        pss_bytes=rollup.get("Pss"),
        uss_bytes=uss,
    )


@dataclass(frozen=True, slots=True)
class _Capabilities:
    effective: int
    bounding: int


def _own_capabilities() -> _Capabilities:
    status = _status(os.getpid())
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
            f"{prefix}already traced by TracerPid {_describe_pid(facts.tracer_pid)}",
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
