"""The core file reader on files that are not what they claim, and on small cores built here
byte by byte to the ELF and Linux layouts (the real cores, from gdb and the kernel, are in
tests/integration/test_corefile_live.py).

Each refusal is invalid input (exit 7) with a one-line message and a hint; a truncated core is
read as far as it goes, with a warning.
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from memforensics.errors import EXIT_INPUT, InputDataError
from memforensics.sources.core.corefile import CoreFile
from memforensics.sources.core.elf64 import build_id, parse_notes

PAGE = 4096
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")


@dataclass
class Load:
    """A PT_LOAD to build: its address, the bytes written, its size in memory."""

    vaddr: int
    data: bytes
    memsz: int = 0
    flags: int = 6  # PF_R | PF_W

    def __post_init__(self) -> None:
        self.memsz = self.memsz or len(self.data)


def note(name: bytes, note_type: int, desc: bytes) -> bytes:
    """One note, name and descriptor each padded to 4 bytes."""
    namesz = len(name) + 1
    body = name + b"\0" * (1 + -namesz % 4) + desc + b"\0" * (-len(desc) % 4)
    return struct.pack("<III", namesz, len(desc), note_type) + body


def prstatus(tid: int, rsp: int = 0x7FFF0000, fs_base: int = 0x1234) -> bytes:
    regs = [0] * 27
    regs[19], regs[21] = rsp, fs_base  # rsp, fs_base in struct user_regs_struct
    head = struct.pack("<iiih2xQQiiii", 11, 0, 0, 11, 0, 0, tid, 1, tid, tid)
    return head + bytes(64) + struct.pack("<27Q", *regs) + bytes(8)


def prpsinfo(pid: int, fname: bytes, psargs: bytes) -> bytes:
    return struct.pack(
        "<bcbb4xQIIiiii16s80s", 0, b"S", 0, 0, 0, 1000, 1000, pid, 1, pid, pid, fname, psargs
    )


def file_note(entries: list[tuple[int, int, int, str]]) -> bytes:
    table = b"".join(struct.pack("<QQQ", s, e, off // PAGE) for s, e, off, _ in entries)
    names = b"".join(path.encode() + b"\0" for *_, path in entries)
    return struct.pack("<QQ", len(entries), PAGE) + table + names


def auxv(pairs: dict[int, int]) -> bytes:
    return b"".join(struct.pack("<QQ", k, v) for k, v in [*pairs.items(), (0, 0)])


@dataclass
class CoreImage:
    """An ELF64 x86-64 core, laid out as the kernel does: header, program headers, notes,
    then each PT_LOAD's bytes."""

    loads: list[Load] = field(default_factory=list)
    notes: bytes = b""
    with_note_segment: bool = True
    extended_count: bool = False  # e_phnum = PN_XNUM, the count in section header 0

    def build(self) -> bytes:
        count = len(self.loads) + (1 if self.with_note_segment else 0)
        phoff = _EHDR.size
        data_at = phoff + count * _PHDR.size
        headers = []
        if self.with_note_segment:
            headers.append(_PHDR.pack(4, 4, data_at, 0, 0, len(self.notes), 0, 4))
        at = data_at + len(self.notes)
        for load in self.loads:
            headers.append(
                _PHDR.pack(1, load.flags, at, load.vaddr, 0, len(load.data), load.memsz, PAGE)
            )
            at += len(load.data)
        body = b"".join(headers) + self.notes + b"".join(load.data for load in self.loads)
        shoff, phnum, shnum = 0, count, 0
        section = b""
        if self.extended_count:
            shoff, phnum, shnum = _EHDR.size + len(body), 0xFFFF, 1
            section = struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, count, 0, 0)
        ident = b"\x7fELF\x02\x01\x01" + bytes(9)
        header = _EHDR.pack(ident, 4, 62, 1, 0, phoff, shoff, 0, 64, 56, phnum, 64, shnum, 0)
        return header + body + section


def _basic_notes() -> bytes:
    return (
        note(b"CORE", 1, prstatus(4242))
        + note(b"CORE", 3, prpsinfo(4242, b"target", b"target --serve"))
        + note(b"LINUX", 0x202, b"\x01\x02\x03")  # 6-byte name and 3-byte desc: both padded
        + note(b"CORE", 1, prstatus(4243))
        + note(b"CORE", 6, auxv({6: PAGE}))
        + note(b"CORE", 0x46494C45, file_note([(0x400000, 0x402000, 0, "/srv/target")]))
    )


def _write(tmp_path: Path, data: bytes, name: str = "core") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _refusal(path: Path) -> InputDataError:
    with pytest.raises(InputDataError) as caught:
        CoreFile(path)
    error = caught.value
    assert error.exit_code == EXIT_INPUT
    assert "\n" not in str(error) and error.hint
    assert str(path) in str(error)
    return error


def test_a_text_file_is_not_an_elf_core(tmp_path: Path) -> None:
    path = _write(tmp_path, b"Segmentation fault (core dumped)\n" * 4)
    assert "not an ELF file" in str(_refusal(path))


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    assert "not an ELF file" in str(_refusal(_write(tmp_path, b"")))


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputDataError, match="cannot read"):
        CoreFile(tmp_path / "nothing-here")


def test_an_executable_is_not_a_core() -> None:
    """The Python interpreter running this test: a real ELF, but ET_EXEC/ET_DYN."""
    error = _refusal(Path(sys.executable).resolve())
    assert "not a core file" in str(error)


def test_a_32_bit_core_is_refused(tmp_path: Path) -> None:
    """An ELF32 i386 core header (Elf32_Ehdr: 52 bytes), as a 32-bit process's core starts."""
    ident = b"\x7fELF\x01\x01\x01" + bytes(9)
    header = struct.pack("<16sHHIIIIIHHHHHH", ident, 4, 3, 1, 0, 52, 0, 0, 52, 32, 1, 40, 0, 0)
    error = _refusal(_write(tmp_path, header + bytes(32)))
    assert "32-bit" in str(error)


def test_a_core_of_another_machine_is_refused(tmp_path: Path) -> None:
    data = bytearray(CoreImage(notes=_basic_notes()).build())
    struct.pack_into("<H", data, 18, 183)  # e_machine = EM_AARCH64
    assert "AArch64" in str(_refusal(_write(tmp_path, bytes(data))))


def test_a_big_endian_file_is_refused(tmp_path: Path) -> None:
    data = bytearray(CoreImage(notes=_basic_notes()).build())
    data[5] = 2  # ELFDATA2MSB
    assert "little-endian" in str(_refusal(_write(tmp_path, bytes(data))))


def test_a_core_without_notes_is_refused(tmp_path: Path) -> None:
    image = CoreImage(loads=[Load(0x10000, b"x" * PAGE)], with_note_segment=False)
    assert "no PT_NOTE" in str(_refusal(_write(tmp_path, image.build())))


def test_program_headers_past_the_end_are_refused(tmp_path: Path) -> None:
    data = CoreImage(loads=[Load(0x10000, b"x" * PAGE)], notes=_basic_notes()).build()
    assert "program headers" in str(_refusal(_write(tmp_path, data[:100])))


def test_overlapping_segments_are_refused(tmp_path: Path) -> None:
    image = CoreImage(
        loads=[Load(0x10000, b"a" * 2 * PAGE), Load(0x11000, b"b" * PAGE)], notes=_basic_notes()
    )
    assert "overlap" in str(_refusal(_write(tmp_path, image.build())))


def test_the_notes_are_decoded_at_their_4_byte_alignment(tmp_path: Path) -> None:
    image = CoreImage(loads=[Load(0x400000, b"E" * PAGE, 2 * PAGE, 4)], notes=_basic_notes())
    with CoreFile(_write(tmp_path, image.build())) as core:
        assert core.warnings == []
        assert core.pid == 4242
        assert [t.tid for t in core.threads] == [4242, 4243]
        assert core.threads[0].rsp == 0x7FFF0000 and core.threads[0].fs_base == 0x1234
        assert core.process is not None
        assert (core.process.fname, core.process.psargs) == ("target", "target --serve")
        assert core.page_bytes == PAGE
        assert [(f.start_address, f.end_address, f.path) for f in core.files] == [
            (0x400000, 0x402000, "/srv/target")
        ]
        maps = core.mappings()
        assert [(m.start_address, m.end_address, m.perms, m.path) for m in maps] == [
            (0x400000, 0x402000, "r--p", "/srv/target")
        ]
        assert not maps[0].anonymous and maps[0].inode != 0
        assert not core.written_by_gdb


def test_notes_cut_short_keep_those_before(tmp_path: Path) -> None:
    notes = _basic_notes()
    found, whole = parse_notes(notes[:-10])
    assert not whole
    assert [n.type for n in found] == [1, 3, 0x202, 1, 6]


def test_many_program_headers_use_the_extended_count(tmp_path: Path) -> None:
    """e_phnum = PN_XNUM: the kernel's way to write more than 65,534 segments."""
    image = CoreImage(
        loads=[Load(0x10000, b"a" * PAGE), Load(0x20000, b"b" * PAGE)],
        notes=_basic_notes(),
        extended_count=True,
    )
    with CoreFile(_write(tmp_path, image.build())) as core:
        assert len(core.segments) == 2


def test_reads_cross_adjacent_segments_and_stop_at_gaps(tmp_path: Path) -> None:
    image = CoreImage(
        loads=[
            Load(0x10000, b"a" * PAGE),
            Load(0x11000, b"b" * PAGE),
            Load(0x12000, b"", PAGE),  # in memory, not in the core (p_filesz 0)
            Load(0x20000, b"c" * PAGE),
        ],
        notes=_basic_notes(),
    )
    with CoreFile(_write(tmp_path, image.build())) as core, core.memory() as memory:
        assert memory.read(0x10FFE, 4) == b"aabb"
        assert memory.read(0x11FFE, 4) is None  # runs into the segment with no bytes
        assert memory.read(0x1FFFF, 2) is None  # starts in a gap
        assert memory.readable(0x11FFF) and not memory.readable(0x12000)
        buffer = bytearray(4)
        assert memory.read_into(memoryview(buffer), 0x10FFE) and buffer == b"aabb"
        assert not memory.read_into(memoryview(buffer), 0x11FFE) and buffer == b"aabb"
        assert memory.read_present(0x11FFE, 4) == b"bb\0\0"
        assert memory.read_present(0x10000, 2 * PAGE, present=b"\x00\x01") == bytes(PAGE) + (
            b"b" * PAGE
        )
        pages = memory.pagemap(0x10000, 0x21000)
        assert pages.present[:3] == b"\x01\x01\x00" and pages.present[16] == 1
        assert pages.total_resident_bytes == 3 * PAGE and not any(pages.swapped)
        mapped = [(m.start_address, m.end_address) for m in core.mappings()]
        assert (0x12000, 0x13000) in mapped


def test_a_truncated_core_is_read_as_far_as_it_goes(tmp_path: Path) -> None:
    image = CoreImage(
        loads=[Load(0x10000, b"a" * PAGE), Load(0x20000, b"b" * 2 * PAGE)], notes=_basic_notes()
    )
    data = image.build()
    with CoreFile(_write(tmp_path, data[: -PAGE - 100])) as core, core.memory() as memory:
        assert [w.kind for w in core.warnings] == ["truncated"]
        assert "truncated" in core.warnings[0].message
        assert memory.read(0x20000, PAGE - 100) == b"b" * (PAGE - 100)
        assert memory.read(0x20000, PAGE) is None
        assert memory.read_present(0x20F00, 0x200) == b"b" * 0x9C + bytes(0x164)
        assert memory.pagemap(0x20000, 0x22000).present == b"\x00\x00"
        assert len(core.threads) == 2


def test_build_id_of_files_that_are_not_elf(tmp_path: Path) -> None:
    assert build_id(_write(tmp_path, b"#!/bin/sh\n", "script")) is None
    assert build_id(tmp_path / "missing") is None
