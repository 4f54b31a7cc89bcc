"""The notes of an x86-64 Linux core decoded: threads (NT_PRSTATUS), the process
(NT_PRPSINFO), mapped files (NT_FILE) and the auxiliary vector (NT_AUXV).

Layouts are the kernel's (include/uapi/linux/elfcore.h, fs/binfmt_elf.c fill_files_note) for
x86-64; gdb's gcore writes the same structures. Notes are looked up by owner and type
together: type numbers are per owner (type 3 is NT_PRPSINFO from "CORE" but the build-id from
"GNU"), and "LINUX" notes (XSAVE state, TLS) carry nothing needed here. A note of the right
owner and type but the wrong size is reported in ``problems``, not guessed at.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from memforensics.sources.core.elf64 import Note
from memforensics.sources.gdb.user_regs import USER_REGS

NT_PRSTATUS = 1
NT_PRPSINFO = 3
NT_AUXV = 6
NT_FILE = 0x46494C45  # "FILE"
AT_NULL = 0
AT_PHDR = 3
AT_PAGESZ = 6
AT_ENTRY = 9
AT_EXECFN = 31
AT_SYSINFO_EHDR = 33
CORE_OWNER = b"CORE"
GDB_OWNER = b"GDB"  # gdb's gcore adds its target description under this owner

# struct elf_prstatus on x86-64: siginfo (3 ints), pr_cursig (short + pad), pr_sigpend,
# pr_sighold, pr_pid, pr_ppid, pr_pgrp, pr_sid, four timevals, then pr_reg (27 longs) and
# pr_fpvalid: 336 bytes.
_PRSTATUS_BYTES = 336
_PRSTATUS_HEAD = struct.Struct("<iiih2xQQiiii")
_PRSTATUS_REGS_AT = 112
_PRSTATUS_REGS = struct.Struct(f"<{len(USER_REGS)}Q")
# struct elf_prpsinfo on x86-64: state, sname, zomb, nice, pad, pr_flag, uid and gid (32-bit
# on x86-64), pid, ppid, pgrp, sid, pr_fname[16], pr_psargs[80]: 136 bytes.
_PRPSINFO = struct.Struct("<bcbb4xQIIiiii16s80s")
_DELETED_SUFFIX = " (deleted)"


@dataclass(frozen=True)
class ThreadStatus:
    """One thread as NT_PRSTATUS saw it."""

    tid: int  # pr_pid: the thread's id (the process id only for the main thread)
    signal: int  # pr_cursig: the signal that stopped or killed it (0 for none)
    registers: Mapping[str, int] = field(repr=False)  # struct user_regs_struct by name

    @property
    def rip(self) -> int:
        return self.registers["rip"]

    @property
    def rsp(self) -> int:
        return self.registers["rsp"]

    @property
    def fs_base(self) -> int:
        """The thread pointer (glibc's struct pthread; its TLS, the tcache pointer, below)."""
        return self.registers["fs_base"]


@dataclass(frozen=True)
class ProcessInfo:
    """The process as NT_PRPSINFO saw it."""

    pid: int  # the thread group id
    ppid: int
    uid: int
    gid: int
    state: str  # one letter, as ps shows it: R, S, D, T, Z …
    fname: str  # the command name (comm), at most 15 characters
    psargs: str  # the command line, arguments joined by spaces, cut at 79 characters


@dataclass(frozen=True)
class MappedFile:
    """One NT_FILE entry: a file mapped at [start_address, end_address)."""

    start_address: int
    end_address: int
    offset_bytes: int  # the file offset mapped at start_address
    path: str  # as the process saw it, without " (deleted)"
    deleted: bool  # the file was removed or replaced on disk while mapped


@dataclass(frozen=True)
class CoreNotes:
    """What a core's notes say about the dead process."""

    threads: tuple[ThreadStatus, ...]  # in note order: the dumping thread first
    process: ProcessInfo | None
    files: tuple[MappedFile, ...]  # in address order
    file_page_bytes: int | None  # NT_FILE's page size
    auxv: dict[int, int] = field(default_factory=dict)  # a_type -> a_val, first of each
    written_by_gdb: bool = False
    problems: tuple[str, ...] = ()  # notes that were there but could not be decoded


def _text(raw: bytes) -> str:
    return os.fsdecode(raw.split(b"\0", 1)[0])


def decode_prstatus(desc: bytes) -> ThreadStatus | None:
    """NT_PRSTATUS of an x86-64 thread; None when the size is not x86-64's."""
    if len(desc) != _PRSTATUS_BYTES:
        return None
    _signo, _code, _errno, cursig, _pend, _hold, tid, _ppid, _pgrp, _sid = (
        _PRSTATUS_HEAD.unpack_from(desc)
    )
    values = _PRSTATUS_REGS.unpack_from(desc, _PRSTATUS_REGS_AT)
    return ThreadStatus(tid=tid, signal=cursig, registers=dict(zip(USER_REGS, values, strict=True)))


def decode_prpsinfo(desc: bytes) -> ProcessInfo | None:
    """NT_PRPSINFO of an x86-64 process; None when the size is not x86-64's."""
    if len(desc) != _PRPSINFO.size:
        return None
    _st, sname, _zomb, _nice, _flag, uid, gid, pid, ppid, _pgrp, _sid, fname, psargs = (
        _PRPSINFO.unpack(desc)
    )
    return ProcessInfo(
        pid=pid,
        ppid=ppid,
        uid=uid,
        gid=gid,
        state=sname.decode("latin-1"),
        fname=_text(fname),
        psargs=_text(psargs).rstrip(),
    )


def decode_file_note(desc: bytes) -> tuple[list[MappedFile], int] | None:
    """NT_FILE: (entries in address order, page size); None when malformed.

    Layout: count and page_size (longs), count triples (start, end, file offset in pages),
    then count NUL-terminated paths.
    """
    if len(desc) < 16:
        return None
    count, page_bytes = struct.unpack_from("<QQ", desc)
    table_end = 16 + 24 * count
    if table_end > len(desc) or page_bytes == 0:
        return None
    names = desc[table_end:].split(b"\0")
    if len(names) < count + 1:  # every path ends in a NUL, so one more piece than paths
        return None
    entries = []
    for index, (start, end, page_offset) in enumerate(
        struct.iter_unpack("<QQQ", desc[16:table_end])
    ):
        if end <= start:
            return None
        path = os.fsdecode(names[index])
        deleted = path.endswith(_DELETED_SUFFIX)
        entries.append(
            MappedFile(
                start_address=start,
                end_address=end,
                offset_bytes=page_offset * page_bytes,
                path=path.removesuffix(_DELETED_SUFFIX),
                deleted=deleted,
            )
        )
    entries.sort(key=lambda entry: entry.start_address)
    return entries, page_bytes


def decode_auxv(desc: bytes) -> dict[int, int]:
    """NT_AUXV: the first value of each a_type, up to AT_NULL."""
    aux: dict[int, int] = {}
    for a_type, a_val in struct.iter_unpack("<QQ", desc[: len(desc) // 16 * 16]):
        if a_type == AT_NULL:
            break
        aux.setdefault(a_type, a_val)
    return aux


def decode_notes(notes: Iterable[Note]) -> CoreNotes:
    """The threads, process, files and auxv of a core's notes (see the module's docstring)."""
    threads: list[ThreadStatus] = []
    process: ProcessInfo | None = None
    files: list[MappedFile] = []
    file_page_bytes: int | None = None
    aux: dict[int, int] = {}
    by_gdb = False
    problems: list[str] = []
    for note in notes:
        if note.name == GDB_OWNER:
            by_gdb = True
        if note.name != CORE_OWNER:
            continue
        if note.type == NT_PRSTATUS:
            thread = decode_prstatus(note.desc)
            if thread is None:
                problems.append(f"NT_PRSTATUS of {len(note.desc)} bytes (x86-64's has 336)")
            else:
                threads.append(thread)
        elif note.type == NT_PRPSINFO and process is None:
            process = decode_prpsinfo(note.desc)
            if process is None:
                problems.append(f"NT_PRPSINFO of {len(note.desc)} bytes (x86-64's has 136)")
        elif note.type == NT_FILE and not files:
            decoded = decode_file_note(note.desc)
            if decoded is None:
                problems.append("a malformed NT_FILE note (the mapped files are unknown)")
            else:
                files, file_page_bytes = decoded
        elif note.type == NT_AUXV and not aux:
            aux = decode_auxv(note.desc)
    return CoreNotes(
        threads=tuple(threads),
        process=process,
        files=tuple(files),
        file_page_bytes=file_page_bytes,
        auxv=aux,
        written_by_gdb=by_gdb,
        problems=tuple(problems),
    )
