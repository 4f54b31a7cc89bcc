"""What cannot be inspected safely, refused before anything touches the target: no such
process, ourselves, a zombie, a kernel thread, a process traced or stopped by someone else,
one we may not trace, a 32-bit program, an allocator other than glibc's malloc."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from memforensics.errors import (
    NoSuchProcessError,
    NotGlibcMallocError,
    TargetError,
    TargetPermissionError,
    TargetStoppedError,
)
from memforensics.model.allocator import FOREIGN_KINDS
from memforensics.model.process import ProcessFacts
from memforensics.sources.proc.allocator_detect import detect_allocator
from memforensics.sources.proc.attach_diagnosis import diagnose_attach_failure
from memforensics.sources.proc.process_facts import describe_pid, read_process
from memforensics.sources.proc.procfs import proc_path

# e_ident of an ELF file: the magic, then EI_CLASS (1 = ELFCLASS32, 2 = ELFCLASS64).
_ELF_MAGIC = b"\x7fELF"
ELFCLASS32 = 1
ELFCLASS64 = 2


def elf_class(path: Path) -> int | None:
    """EI_CLASS of the ELF file at ``path`` (ELFCLASS32 = 1, ELFCLASS64 = 2), or None when
    it cannot be read or is no ELF file."""
    try:
        with path.open("rb") as handle:
            ident = handle.read(5)
    except OSError:
        return None
    return ident[4] if len(ident) == 5 and ident.startswith(_ELF_MAGIC) else None


def _refuse_unreadable_exe(pid: int, facts: ProcessFacts) -> None:
    """Reading exe needs the same ptrace access check, in its weaker "read" mode: if even that
    is refused, an attach will be too. Say why now instead of after gdb fails. Where
    ``facts.exe`` is known, read_process has read the link already; only an unknown one is
    read again, to tell a refusal from no exe."""
    if facts.exe is not None:
        return
    try:
        os.readlink(proc_path(pid, "exe"))
    except PermissionError:
        raise diagnose_attach_failure(pid, f"/proc/{pid}/exe: Permission denied") from None
    except OSError:
        pass  # no exe (deleted binary, exited): the checks below and the attach decide


def check_target(
    pid: int, *, allow_stopped: bool = False, foreign_ok: bool = False
) -> ProcessFacts:
    """Refuse what cannot be inspected safely, else return the facts of PID.

    Raises NoSuchProcessError; TargetError for ourselves, a zombie, a kernel thread, a
    32-bit program (ELFCLASS32 executable: only 64-bit glibc layouts are read) or a process
    stopped by someone else (unless ``allow_stopped``); TargetPermissionError when another
    tracer holds it; NotGlibcMallocError naming the allocator that was found, unless
    ``foreign_ok`` and it is jemalloc, tcmalloc or mimalloc beside a glibc libc (whose
    ``__restore_rt`` their calls return through). The facts returned carry the executable's
    ELF class (``elf_class``) read for the 32-bit refusal.
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
            f"{label} is already traced by TracerPid {describe_pid(facts.tracer_pid)}",
            hint="detach the other debugger or tracer (gdb, strace, a profiler) and retry",
        )
    if facts.state in ("T", "t") and not allow_stopped:
        raise TargetStoppedError(
            f"{label} is stopped (state {facts.state}) by someone else", pid=pid
        )
    _refuse_unreadable_exe(pid, facts)
    exe_class = elf_class(proc_path(pid, "exe"))
    if exe_class == ELFCLASS32:
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
    facts = replace(facts, elf_class=exe_class)  # handed down: the heap read needs it too
    allocator = facts.allocator
    if foreign_ok and allocator.kind in FOREIGN_KINDS and allocator.libc_path is not None:
        return facts
    if allocator.glibc_linked_in:
        # (glibc's malloc, in the executable's own data: neither located nor callable here.)
        raise NotGlibcMallocError(
            f"{label} is a {allocator.detail}",
            hint="the program itself can print its heap with malloc_info(0, stdout)",
            pid=pid,
        )
    if not allocator.is_glibc_malloc:
        raise NotGlibcMallocError(f"{label} does not use glibc malloc: {allocator.detail}")
    return facts
