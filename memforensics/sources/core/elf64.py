"""ELF64 little-endian structures read from bytes: the file header, program headers, notes and
the GNU build-id, for core files and for the libraries they mapped.

Layouts are those of the System V gABI (Elf64_Ehdr, Elf64_Phdr, Elf64_Nhdr) as Linux writes
them. Every offset and size read from a file is checked against the bytes actually there
before use: a hostile or cut file yields a refusal or ``None``, never an IndexError or a
read far past the data.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

ELF_MAGIC = b"\x7fELF"
ELFCLASS32 = 1
ELFCLASS64 = 2
ELFDATA2LSB = 1
EM_X86_64 = 62
ET_EXEC = 2
ET_DYN = 3
ET_CORE = 4
PT_LOAD = 1
PT_NOTE = 4
PF_X = 1
PF_W = 2
PF_R = 4
PN_XNUM = 0xFFFF  # e_phnum when the real count sits in section header 0's sh_info
NT_GNU_BUILD_ID = 3

EHDR = struct.Struct("<16sHHIQQQIHHHHHH")  # Elf64_Ehdr, 64 bytes
PHDR = struct.Struct("<IIQQQQQQ")  # Elf64_Phdr, 56 bytes
_SHDR_INFO = struct.Struct("<I")  # sh_info of Elf64_Shdr, at offset 44 of its 64 bytes
_SHDR_BYTES = 64
_NHDR = struct.Struct("<III")  # namesz, descsz, type
# A build-id note is tiny; a PT_NOTE larger than this in a library is not worth reading.
_MAX_NOTE_SEGMENT_BYTES = 1 << 20
_MAX_PHNUM_FOR_BUILD_ID = 256  # libraries have ~12 program headers; cores are not read here


class ElfFormatError(ValueError):
    """The bytes are not the ELF64 structure they claim to be (message: what is wrong)."""


@dataclass(frozen=True)
class ElfHeader:
    """The identifying fields of an ELF file header, and where its program headers are."""

    elf_class: int  # ELFCLASS32 or ELFCLASS64
    data_encoding: int  # ELFDATA2LSB = little-endian
    file_type: int  # e_type: ET_EXEC, ET_DYN, ET_CORE …
    machine: int  # e_machine: EM_X86_64 …
    phoff: int
    phentsize: int
    phnum: int  # e_phnum as written (PN_XNUM: see program_header_count)
    shoff: int


@dataclass(frozen=True)
class ProgramHeader:
    """One Elf64_Phdr."""

    type: int
    flags: int
    offset: int
    vaddr: int
    filesz: int
    memsz: int
    align: int


@dataclass(frozen=True)
class Note:
    """One note: its owner's name (without the NUL), type and descriptor bytes."""

    name: bytes
    type: int
    desc: bytes


def identify(data: bytes) -> ElfHeader:
    """The header of ``data`` (at least its first 64 bytes), whatever its class and machine;
    ElfFormatError when it is no ELF file at all. Fields past e_ident are read as ELF64 and
    are meaningful only when ``elf_class`` is ELFCLASS64 and the encoding little-endian."""
    if len(data) < 16 or data[:4] != ELF_MAGIC:
        raise ElfFormatError("not an ELF file (no \\x7fELF magic at its start)")
    if len(data) < EHDR.size:
        raise ElfFormatError(f"too short for an ELF header ({len(data)} bytes)")
    ident, e_type, machine, _v, _entry, phoff, shoff, _fl, _eh, phentsize, phnum, *_ = (
        EHDR.unpack_from(data)
    )
    return ElfHeader(
        elf_class=ident[4],
        data_encoding=ident[5],
        file_type=e_type,
        machine=machine,
        phoff=phoff,
        phentsize=phentsize,
        phnum=phnum,
        shoff=shoff,
    )


def program_header_count(header: ElfHeader, read: Callable[[int, int], bytes | None]) -> int:
    """The number of program headers: e_phnum, or section 0's sh_info when e_phnum is
    PN_XNUM (the kernel writes that for cores of processes with 65,535 mappings or more)."""
    if header.phnum != PN_XNUM:
        return header.phnum
    raw = read(header.shoff, _SHDR_BYTES) if header.shoff else None
    if raw is None or len(raw) < _SHDR_BYTES:
        raise ElfFormatError("e_phnum is PN_XNUM but section header 0 is missing")
    (count,) = _SHDR_INFO.unpack_from(raw, 44)
    return int(count)


def program_headers(table: bytes, count: int) -> list[ProgramHeader]:
    """``count`` Elf64_Phdr entries from the bytes of the table (checked to be long enough)."""
    if len(table) < count * PHDR.size:
        raise ElfFormatError(
            f"the program header table is cut short ({len(table)} of {count * PHDR.size} bytes)"
        )
    return [
        ProgramHeader(p_type, flags, offset, vaddr, filesz, memsz, align)
        for p_type, flags, offset, vaddr, _paddr, filesz, memsz, align in PHDR.iter_unpack(
            table[: count * PHDR.size]
        )
    ]


def parse_notes(data: bytes, align: int = 4) -> tuple[list[Note], bool]:
    """The notes in ``data`` and whether it parsed to its end.

    Name and descriptor are each padded to ``align`` bytes: 4 in cores and in most PT_NOTEs
    (the gABI says 8 for ELF64, but Linux and binutils use 4), 8 in a PT_NOTE whose p_align
    is 8 (.note.gnu.property). A header whose sizes run past the data ends the walk with
    False: what was read before it is kept.
    """
    notes: list[Note] = []
    at, end = 0, len(data)
    while at + _NHDR.size <= end:
        namesz, descsz, note_type = _NHDR.unpack_from(data, at)
        name_at = at + _NHDR.size
        desc_at = name_at + (namesz + align - 1) // align * align
        after = desc_at + (descsz + align - 1) // align * align
        if desc_at + descsz > end:
            return notes, False
        name = bytes(data[name_at : name_at + namesz]).rstrip(b"\0")
        notes.append(Note(name, note_type, bytes(data[desc_at : desc_at + descsz])))
        at = min(after, end)
    return notes, at == end or not any(data[at:end])


def _gnu_build_id(notes: list[Note]) -> bytes | None:
    for note in notes:
        if note.name == b"GNU" and note.type == NT_GNU_BUILD_ID and note.desc:
            return note.desc
    return None


def _image_build_id(read: Callable[[int, int], bytes | None], *, loaded: bool) -> bytes | None:
    """The GNU build-id of an ELF64 little-endian image read through ``read(at, size)``, ``at``
    counted from the image's start: its file offset 0 on disk, or where that offset 0 was
    mapped when ``loaded`` (then a PT_NOTE is found by p_vaddr, less the p_vaddr of the
    PT_LOAD at file offset 0, page-aligned: 0 for libraries and PIEs, 0x400000 for a classic
    executable)."""
    head = read(0, EHDR.size)
    if head is None:
        return None
    try:
        header = identify(head)
        if (
            header.elf_class != ELFCLASS64
            or header.data_encoding != ELFDATA2LSB
            or header.phentsize != PHDR.size
            or not 0 < header.phnum <= _MAX_PHNUM_FOR_BUILD_ID
        ):
            return None
        table = read(header.phoff, header.phnum * PHDR.size)
        if table is None:
            return None
        headers = program_headers(table, header.phnum)
    except ElfFormatError:
        return None
    origin = 0
    if loaded:
        first = [p.vaddr for p in headers if p.type == PT_LOAD and p.offset == 0]
        origin = first[0] & ~0xFFF if first else 0
    for phdr in headers:
        if phdr.type != PT_NOTE or not 0 < phdr.filesz <= _MAX_NOTE_SEGMENT_BYTES:
            continue
        where = phdr.vaddr - origin if loaded else phdr.offset
        data = read(where, phdr.filesz) if where >= 0 else None
        if data is None:
            continue
        found = _gnu_build_id(parse_notes(data, 8 if phdr.align == 8 else 4)[0])
        if found is not None:
            return found
    return None


def build_id(path: str | os.PathLike[str]) -> bytes | None:
    """The GNU build-id (NT_GNU_BUILD_ID note) of the ELF64 file at ``path``; None when the
    file cannot be read, is not ELF64 little-endian, or carries no build-id."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:

        def read(offset: int, size: int) -> bytes | None:
            with contextlib.suppress(OSError, OverflowError):
                data = os.pread(fd, size, offset)
                return data if len(data) == size else None
            return None

        return _image_build_id(read, loaded=False)
    finally:
        os.close(fd)


def loaded_build_id(read: Callable[[int, int], bytes | None], base: int) -> bytes | None:
    """The GNU build-id of an ELF64 image whose file offset 0 is mapped at ``base``, read
    through ``read(address, size)`` (a core's memory); None when its ELF header, program
    headers or note are not there (a core keeps them only if it dumped the first page)."""
    return _image_build_id(lambda at, size: read(base + at, size), loaded=True)
