"""Addresses of named data symbols (vtables, type objects) of a file as a process maps it, from
the file's dynamic symbol table: no debug information, stripped binaries included."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

from memforensics.sources.proc.procmaps import Mapping

_SHT_DYNSYM = 11
_PT_LOAD = 1
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym
_MAX_FILE_BYTES = 512 << 20  # a shared object bigger than this is not read


def dynamic_symbols(data: bytes, base: int, wanted: frozenset[str]) -> dict[str, int]:
    """name -> address (in a process mapping ``data``'s offset 0 at ``base``) of the
    ``wanted`` dynamic symbols of the ELF64 little-endian file ``data``; {} for what is not
    such a file or has none of them."""
    try:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            return {}
        phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
        vaddrs = []
        for i in range(min(phnum, 256)):
            p_type, _flags, _offset, p_vaddr = struct.unpack_from(
                "<IIQQ", data, phoff + i * phentsize
            )
            if p_type == _PT_LOAD:
                vaddrs.append(p_vaddr)
        bias = base - (min(vaddrs) & ~0xFFF) if vaddrs else base
        sections = [
            struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
            for i in range(min(shnum, 4096))
        ]
        found: dict[str, int] = {}
        for section in sections:
            if section[1] != _SHT_DYNSYM:
                continue
            strings = sections[section[6]][4]
            table = memoryview(data)[section[4] : section[4] + section[5] // 24 * 24]
            for name_off, _info, _other, shndx, value, _size in _SYMBOL.iter_unpack(table):
                if shndx == 0 or value == 0:
                    continue
                begin = strings + name_off
                end = data.find(b"\0", begin, begin + 512)
                name = data[begin:end].decode(errors="replace") if end > 0 else ""
                if name in wanted:
                    found.setdefault(name, value + bias)
        return found
    except (struct.error, IndexError):
        return {}


def mapped_symbols(
    mappings: Sequence[Mapping],
    matches: str,
    wanted: frozenset[str],
    *,
    files: dict[str, Path] | None = None,
) -> dict[str, int]:
    """The ``wanted`` dynamic symbols of every mapped file whose name contains ``matches``,
    at their addresses in the process. A file is read at ``files[path]`` when given (a
    core's files on disk), else at its path."""
    found: dict[str, int] = {}
    seen: set[str] = set()
    for mapping in mappings:
        path = mapping.path
        if not mapping.file_backed or mapping.offset_bytes or path in seen:
            continue
        if matches not in path.rsplit("/", 1)[-1]:
            continue
        seen.add(path)
        where = (files or {}).get(path, Path(path))
        try:
            if where.stat().st_size > _MAX_FILE_BYTES:
                continue
            data = where.read_bytes()
        except OSError:
            continue
        for name, address in dynamic_symbols(data, mapping.start_address, wanted).items():
            found.setdefault(name, address)
    return found
