"""ELF core files of x86-64 Linux processes (written by the kernel or by gdb's gcore): the
threads, mapped files and memory of a dead process, read without loading the core.

``CoreFile(path)`` checks the headers and decodes the notes when opened and refuses, as
invalid input (exit 7), what is no x86-64 ELF64 little-endian ET_CORE file with a PT_NOTE;
the memory is an mmap of the file (``memory()``), so a core of many GB costs address space,
not RAM. A truncated core (the kernel stops at RLIMIT_CORE, a disk fills) is kept as far as
it goes, with a "truncated" entry in ``warnings``; its bytes past the end read as absent.

Invariants: the PT_LOAD segments kept are sorted, non-overlapping, with p_filesz <= p_memsz
and within the 64-bit address space, so that a read never lands in the wrong segment; a
segment's present bytes never run past the end of the file.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

from memforensics.errors import InputDataError
from memforensics.sources.core import coremaps
from memforensics.sources.core.corememory import CoreMemory, CoreSegment
from memforensics.sources.core.corenotes import (
    AT_ENTRY,
    AT_EXECFN,
    AT_PAGESZ,
    AT_PHDR,
    AT_SYSINFO_EHDR,
    MappedFile,
    ProcessInfo,
    ThreadStatus,
    decode_notes,
)
from memforensics.sources.core.elf64 import (
    EHDR,
    ELFCLASS32,
    ELFCLASS64,
    ELFDATA2LSB,
    EM_X86_64,
    ET_CORE,
    ET_DYN,
    ET_EXEC,
    PHDR,
    PT_LOAD,
    PT_NOTE,
    ElfFormatError,
    ElfHeader,
    Note,
    ProgramHeader,
    build_id,
    identify,
    loaded_build_id,
    parse_notes,
    program_header_count,
    program_headers,
)
from memforensics.sources.proc.procmaps import Mapping

WarningKind = Literal[
    "truncated", "notes_truncated", "notes_malformed", "build_id_mismatch", "build_id_unchecked"
]
_HINT = (
    "give a core of an x86-64 Linux process, written by the kernel (core_pattern) or by gdb's gcore"
)
_DEFAULT_PAGE_BYTES = 4096
_ADDRESS_LIMIT = 1 << 64
_MAX_NOTES_BYTES = 256 << 20  # NT_FILE of 100,000 mappings is ~10 MB; more is not a core
_MACHINES = {3: "i386", 40: "ARM", 183: "AArch64", 243: "RISC-V", 21: "PowerPC64", 22: "s390"}


@dataclass(frozen=True)
class CoreWarning:
    """Something the core lacks or contradicts, said once; the reading went on."""

    kind: WarningKind
    message: str


def _refuse(source: str, what: str, hint: str = _HINT) -> InputDataError:
    return InputDataError(what, source=source, hint=hint)


def _check_header(source: str, header: ElfHeader) -> None:
    """Refuse anything but an x86-64 ELF64 little-endian core."""
    if header.elf_class == ELFCLASS32:
        raise _refuse(source, "a 32-bit ELF file; only cores of 64-bit x86-64 processes are read")
    if header.elf_class != ELFCLASS64 or header.data_encoding != ELFDATA2LSB:
        raise _refuse(source, "not a little-endian ELF64 file; only x86-64 cores are read")
    if header.machine != EM_X86_64:
        machine = _MACHINES.get(header.machine, f"e_machine {header.machine}")
        raise _refuse(source, f"an ELF file for {machine}, not x86-64; only x86-64 is read")
    if header.file_type in (ET_EXEC, ET_DYN):
        raise _refuse(
            source,
            "an executable or shared library, not a core file",
            hint="give the core file as the core, and the program it ran as the executable",
        )
    if header.file_type != ET_CORE:
        raise _refuse(source, f"an ELF file of type {header.file_type}, not a core (ET_CORE)")
    if header.phentsize != PHDR.size:
        raise _refuse(source, f"program headers of {header.phentsize} bytes, not 56: malformed")


def _segments(
    source: str, headers: list[ProgramHeader], file_bytes: int
) -> tuple[list[CoreSegment], int]:
    """The PT_LOADs as CoreSegments, sorted and checked (see the module's invariants), and
    how many of their p_filesz bytes lie past the end of the file."""
    segments = []
    missing_bytes = 0
    for phdr in headers:
        if phdr.type != PT_LOAD or phdr.memsz == 0:
            continue
        if phdr.filesz > phdr.memsz or phdr.vaddr + phdr.memsz > _ADDRESS_LIMIT:
            raise _refuse(source, f"a malformed PT_LOAD at {phdr.vaddr:#x}")
        present = min(phdr.filesz, max(file_bytes - phdr.offset, 0))
        missing_bytes += phdr.filesz - present
        segments.append(
            CoreSegment(phdr.vaddr, phdr.vaddr + phdr.memsz, phdr.offset, present, phdr.flags)
        )
    segments.sort(key=lambda s: s.start_address)
    for before, after in itertools.pairwise(segments):
        if after.start_address < before.end_address:
            raise _refuse(source, f"PT_LOAD segments overlap at {after.start_address:#x}")
    return segments, missing_bytes


def _read_notes(
    source: str,
    headers: list[ProgramHeader],
    read: Callable[[int, int], bytes | None],
    file_bytes: int,
) -> tuple[list[Note], bool]:
    """Every note the PT_NOTE segments still hold, and whether they are all whole (a
    truncated core keeps the notes before its end)."""
    note_headers = [h for h in headers if h.type == PT_NOTE]
    if not note_headers:
        raise _refuse(source, "no PT_NOTE segment: no threads, no mapped files; not a core")
    notes: list[Note] = []
    complete = True
    for phdr in note_headers:
        size = min(phdr.filesz, max(file_bytes - phdr.offset, 0), _MAX_NOTES_BYTES)
        found, whole = parse_notes(read(phdr.offset, size) or b"")
        notes.extend(found)
        complete = complete and whole and size == phdr.filesz
    if not notes:
        raise _refuse(
            source,
            "its notes are missing, cut off by truncation (gdb's gcore writes them at the end "
            "of the file): which threads and files the process had is unknown",
            hint="take the core again with room (disk space, RLIMIT_CORE) for all of it",
        )
    return notes, complete


class CoreFile:
    """One core file, opened and checked (a context manager; ``close()`` when done).

    ``warnings`` lists, once each, what the core lacks or contradicts (truncation, notes
    cut short, a build-id mismatch found by ``file_for``); it may grow as methods are used.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.source = str(path)
        self.warnings: list[CoreWarning] = []
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise InputDataError(
                f"cannot read: {exc.strerror or exc}", source=self.source
            ) from None
        try:
            self._parse(fd)
        finally:
            os.close(fd)
        self._memory = CoreMemory(self.path, self.segments, self.page_bytes)
        self._elf_loads: dict[str, tuple[int, list[ProgramHeader]] | None] = {}

    def _parse(self, fd: int) -> None:
        self.file_bytes = os.fstat(fd).st_size

        def read(offset: int, size: int) -> bytes | None:
            if offset < 0 or size < 0 or offset + size > self.file_bytes:
                return None
            data = os.pread(fd, size, offset)
            return data if len(data) == size else None

        try:
            header = identify(os.pread(fd, EHDR.size, 0))
            _check_header(self.source, header)
            count = program_header_count(header, read)
            table = read(header.phoff, count * PHDR.size)
            if table is None:
                raise ElfFormatError("truncated: its program headers run past the end of it")
            headers = program_headers(table, count)
        except ElfFormatError as exc:
            raise _refuse(self.source, str(exc)) from None
        self.segments, missing_bytes = _segments(self.source, headers, self.file_bytes)
        if missing_bytes:
            self._warn(
                "truncated",
                f"the core is truncated: {missing_bytes} bytes of the memory it holds are past "
                f"the end of the file ({self.file_bytes} bytes) and read as absent",
            )
        notes, complete = _read_notes(self.source, headers, read, self.file_bytes)
        if not complete:
            self._warn("notes_truncated", "the core's notes are cut short: some are missing")
        self.notes = decode_notes(notes)
        for problem in self.notes.problems:
            self._warn("notes_malformed", f"the core has {problem}")
        self.page_bytes = next(
            (
                size
                for size in (self.notes.auxv.get(AT_PAGESZ), self.notes.file_page_bytes)
                if size and size & (size - 1) == 0 and 4096 <= size <= 1 << 30
            ),
            _DEFAULT_PAGE_BYTES,
        )

    def _warn(self, kind: WarningKind, message: str) -> None:
        warning = CoreWarning(kind, message)
        if warning not in self.warnings:
            self.warnings.append(warning)

    def close(self) -> None:
        """Release the core's mapping (memory() readers have their own)."""
        self._memory.close()

    def __enter__(self) -> CoreFile:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # What the notes say.

    @property
    def threads(self) -> tuple[ThreadStatus, ...]:
        """Every thread (NT_PRSTATUS), the one that dumped (or gdb's current one) first."""
        return self.notes.threads

    @property
    def process(self) -> ProcessInfo | None:
        return self.notes.process

    @property
    def pid(self) -> int | None:
        """The process id: NT_PRPSINFO's, else the first thread's (the kernel writes the
        crashing thread first, so that is the pid only when the main thread crashed)."""
        if self.notes.process is not None:
            return self.notes.process.pid
        return self.notes.threads[0].tid if self.notes.threads else None

    @property
    def files(self) -> tuple[MappedFile, ...]:
        """The NT_FILE entries: every file-backed mapping, in address order."""
        return self.notes.files

    @property
    def auxv(self) -> dict[int, int]:
        return self.notes.auxv

    @property
    def written_by_gdb(self) -> bool:
        """True for a core from gdb's gcore (it adds a "GDB" note), False for the kernel's."""
        return self.notes.written_by_gdb

    def _file_at(self, address: int | None) -> MappedFile | None:
        if not address:
            return None
        return next((f for f in self.files if f.start_address <= address < f.end_address), None)

    @cached_property
    def executable_path(self) -> str | None:
        """The program's path: the mapped file holding its program headers (AT_PHDR) or
        entry point (AT_ENTRY), else the AT_EXECFN string; None when the core has none."""
        for key in (AT_PHDR, AT_ENTRY):
            entry = self._file_at(self.auxv.get(key))
            if entry is not None:
                return entry.path
        return self.execfn

    @cached_property
    def execfn(self) -> str | None:
        """The AT_EXECFN string (the path execve was given), when its stack page is in the
        core."""
        address = self.auxv.get(AT_EXECFN)
        if not address:
            return None
        raw = self._memory.read_present(address, 4096)
        if not self._memory.readable(address) or b"\0" not in raw:
            return None
        return os.fsdecode(raw.split(b"\0", 1)[0])

    # Mappings.

    @cached_property
    def _mappings(self) -> list[Mapping]:
        names: list[tuple[int, str]] = [(coremaps.VSYSCALL_ADDRESS, "[vsyscall]")]
        if self.auxv.get(AT_SYSINFO_EHDR):
            names.append((self.auxv[AT_SYSINFO_EHDR], "[vdso]"))
        main = next((t for t in self.threads if t.tid == self.pid), None)
        stack_address = self.auxv.get(AT_EXECFN) or (main.rsp if main else 0)
        if stack_address:
            names.append((stack_address, "[stack]"))
        return coremaps.core_mappings(
            self.segments, self.files, names=names, file_perms=self._file_perms
        )

    def mappings(self) -> list[Mapping]:
        """The dead process's mappings as /proc/PID/maps listed them, as far as the core can
        tell: see memforensics.sources.core.coremaps for what it cannot."""
        return list(self._mappings)

    def _file_perms(self, entry: MappedFile, address: int) -> str:
        """Permissions of file-backed memory no PT_LOAD covers: those of the mapped ELF's own
        PT_LOAD holding it, read from the ELF's first page when the core kept it; else
        'r--p', the usual case of a data file mapped to be read."""
        loads = self._loaded_elf(entry.path)
        if loads:
            origin, headers = loads
            for phdr in headers:
                low = phdr.vaddr & ~(self.page_bytes - 1)
                if low <= address - origin < phdr.vaddr + phdr.memsz:
                    return coremaps.perms_text(phdr.flags)
        return "r--p"

    def _loaded_elf(self, path: str) -> tuple[int, list[ProgramHeader]] | None:
        """(load bias, PT_LOADs) of the ELF file ``path`` as mapped, read from its first page
        in the core; None when that page is not there or holds no ELF64 header."""
        if path not in self._elf_loads:
            self._elf_loads[path] = self._read_loaded_elf(path)
        return self._elf_loads[path]

    def _read_loaded_elf(self, path: str) -> tuple[int, list[ProgramHeader]] | None:
        base = self._file_base(path)
        head = self._memory.read(base, EHDR.size) if base is not None else None
        if base is None or head is None:
            return None
        try:
            header = identify(head)
            if header.elf_class != ELFCLASS64 or header.phentsize != PHDR.size:
                return None
            table = self._memory.read(base + header.phoff, header.phnum * PHDR.size)
            if table is None:
                return None
            loads = [p for p in program_headers(table, header.phnum) if p.type == PT_LOAD]
        except ElfFormatError:
            return None
        first = [p.vaddr for p in loads if p.offset == 0]
        return base - (first[0] & ~(self.page_bytes - 1) if first else 0), loads

    def _file_base(self, path: str) -> int | None:
        """Where the file ``path``'s offset 0 was mapped, if it was."""
        return next(
            (f.start_address for f in self.files if f.path == path and f.offset_bytes == 0),
            None,
        )

    @cached_property
    def heap_range_hint(self) -> tuple[int, int] | None:
        """[start, end) of the mapping that most likely was [heap] (a guess: see
        coremaps.heap_range_hint); None when there is no likely one."""
        return coremaps.heap_range_hint(self._mappings, self.executable_path)

    @property
    def program_break_hint(self) -> int | None:
        """The program break (brk) as far as the core tells: the end of the likely [heap]
        mapping, i.e. brk rounded up to a page; None when there is no likely one."""
        heap = self.heap_range_hint
        return heap[1] if heap else None

    # Memory and files.

    def memory(self) -> CoreMemory:
        """A reader of the core's memory with ProcessMemoryReader's API, on its own mapping
        of the file (close it when done; it outlives this CoreFile's close)."""
        return CoreMemory(self.path, self.segments, self.page_bytes)

    def mapped_build_id(self, path: str) -> bytes | None:
        """The GNU build-id of the file ``path`` as it was mapped, read from the core (when
        the core holds the ELF's first page: gdb's gcore and the kernel's default
        coredump_filter keep it); None otherwise."""
        base = self._file_base(path)
        return None if base is None else loaded_build_id(self._memory.read, base)

    def file_for(self, path: str, sysroot: str | os.PathLike[str] | None = None) -> Path | None:
        """Where the mapped file ``path`` is to be found now: under ``sysroot`` when given
        (the dead machine's files copied there; no falling back to this machine's), else at
        ``path``. None when nothing is there.

        The file found is checked against the core by GNU build-id: a mismatch (another build
        of the library, e.g. upgraded since the process started) adds a "build_id_mismatch"
        warning, a check that could not be made a "build_id_unchecked" one; the path is
        returned either way, and the caller decides.
        """
        candidate = Path(sysroot) / path.lstrip("/") if sysroot is not None else Path(path)
        if not candidate.is_file():
            return None
        in_core, on_disk = self.mapped_build_id(path), build_id(candidate)
        if in_core is not None and on_disk is not None and in_core != on_disk:
            self._warn(
                "build_id_mismatch",
                f"{candidate} is not the file the process mapped as {path}: build-id "
                f"{on_disk.hex()} on disk, {in_core.hex()} in the core",
            )
        elif in_core is None or on_disk is None:
            where = "the core" if in_core is None else str(candidate)
            self._warn(
                "build_id_unchecked",
                f"{candidate} could not be checked against the core: no build-id in {where}",
            )
        return candidate
