"""A shared object (or executable) as a process maps it: its function symbols, at the
addresses they have in that process.

Calls are made at these addresses, so they must come from the very file that is mapped:
the file is read through /proc/PID/root when its inode is the mapping's, else the mapped
image through /proc/PID/map_files (a file upgraded or deleted on disk since the process
started); when neither can be read the target is refused. The dynamic symbol table is
read always, the full one (.symtab) on request when the file keeps it (a statically linked
allocator in an unstripped executable is only named there).
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from memforensics.errors import NotGlibcMallocError, TargetError, TargetExitedError, ToolingError
from memforensics.sources.proc.procmaps import Mapping, read_maps_of
from memforensics.sources.proc.regular_file import read_regular

_STT_FUNC = 2
_STT_GNU_IFUNC = 10
_SHT_SYMTAB = 2
_SHT_DYNSYM = 11
_SHT_GNU_VERSYM = 0x6FFFFFFF
_PT_LOAD = 1
_VERSYM_HIDDEN = 0x8000
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym
_FUNCTION_KINDS = frozenset((_STT_FUNC, _STT_GNU_IFUNC))

Load = tuple[int, int, int, int]  # a PT_LOAD's (p_flags, p_offset, p_vaddr, p_filesz)


@dataclass(frozen=True)
class MappedFile:
    """The bytes of a file as one process maps it, and where its offset 0 is mapped."""

    path: str
    data: bytes
    base: int  # the mapping of file offset 0
    replaced_on_disk: bool  # read through map_files: the file at ``path`` is another one


@dataclass(frozen=True)
class FunctionSymbols:
    """Function symbols of one mapped file, at their addresses in the process."""

    bias: int  # the load bias: a symbol's value plus this is its address
    loads: tuple[Load, ...]
    symbols: tuple[tuple[int, int, str], ...]  # (address, size, name), sorted, all versions
    defaults: dict[str, int]  # name -> address of the default (not hidden) STT_FUNC version


def file_mapping(pid: int, path: str) -> Mapping:
    """The mapping of ``path``'s offset 0 in PID (its load address and inode)."""
    maps_any, mappings = read_maps_of(pid, path)
    if not maps_any:  # only a process that is exiting (its memory already gone) maps nothing
        raise TargetExitedError(f"PID {pid} exited while being inspected", pid=pid)
    for mapping in mappings:
        if mapping.offset_bytes == 0:
            return mapping
    raise NotGlibcMallocError(f"PID {pid} does not map {path}", pid=pid)


def _read_mapped_file(pid: int, mapping: Mapping) -> bytes:
    """The very file behind ``mapping``, through /proc/PID/map_files (needs CAP_SYS_ADMIN).

    The kernel keeps a replaced or deleted file alive while it is mapped; map_files opens
    that inode, not whatever now sits at the path. The inode is checked all the same.
    """
    entry = f"/proc/{pid}/map_files/{mapping.start_address:x}-{mapping.end_address:x}"
    return read_regular(entry, inode=mapping.inode)


def read_mapped_file(pid: int, path: str) -> MappedFile:
    """The file mapped into PID at ``path`` (see the module). TargetError when only another
    file than the mapped one could be read."""
    mapping = file_mapping(pid, path)
    # The mapped file itself first (map_files: that very inode, whatever the path now names);
    # else the path, as the target's root sees it, checked on the open descriptor: a regular
    # file of the mapping's inode, read within its size (regular_file), never a FIFO or a
    # device put there by the target, nor a symlink resolved against our root.
    with contextlib.suppress(OSError):
        return MappedFile(
            path, _read_mapped_file(pid, mapping), mapping.start_address, mapping.deleted
        )
    candidates = [Path(f"/proc/{pid}/root") / path.lstrip("/"), Path(path)]
    for candidate in candidates:
        with contextlib.suppress(OSError):
            if not mapping.deleted:
                data = read_regular(candidate, inode=mapping.inode)
                return MappedFile(path, data, mapping.start_address, False)
    try:
        data = _read_mapped_file(pid, mapping)
    except OSError as exc:
        why = exc.strerror or str(exc)
        if isinstance(exc, PermissionError):
            why = "reading /proc/PID/map_files needs root (CAP_SYS_ADMIN)"
        raise TargetError(
            f"{path}, mapped into PID {pid}, was replaced or deleted on disk since the "
            f"process started, and the mapped image cannot be read: {why}",
            hint="run as root to read the mapped image, or restart the process; calling "
            "into a different build would crash it",
            pid=pid,
        ) from exc
    return MappedFile(path, data, mapping.start_address, True)


def _table(data: bytes, section: Sequence[int]) -> memoryview:
    return memoryview(data)[section[4] : section[4] + section[5] // 24 * 24]


def function_symbols(
    data: bytes,
    base: int,
    path: str,
    wanted: frozenset[str] | None = None,
    *,
    full_table: bool = False,
) -> FunctionSymbols:
    """The function symbols of the ELF64 little-endian ``data`` mapped at ``base``; with
    ``wanted``, ``defaults`` names those only (``symbols`` keeps every function, for the
    code ranges); with ``full_table``, .symtab's as well (static functions too: a caller
    that derives code ranges from exported neighbours must not ask for them). ToolingError
    for what is not such a file; NotGlibcMallocError without a dynamic symbol table."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ToolingError(f"{path} is not a 64-bit little-endian ELF file; unsupported")
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    loads: list[Load] = []
    for i in range(phnum):
        p_type, p_flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + i * phentsize
        )
        if p_type == _PT_LOAD:
            loads.append((p_flags, p_offset, p_vaddr, p_filesz))
    bias = base - (min(load[2] for load in loads) & ~0xFFF) if loads else base
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    dynsym = next((s for s in sections if s[1] == _SHT_DYNSYM), None)
    if dynsym is None:
        raise NotGlibcMallocError(f"{path} has no dynamic symbol table")
    versym = next((s for s in sections if s[1] == _SHT_GNU_VERSYM), None)
    versions: Sequence[int] = ()
    if versym is not None:
        versions = memoryview(data)[versym[4] : versym[4] + dynsym[5] // 24 * 2].cast("H")
    symbols: dict[tuple[int, str], int] = {}
    defaults: dict[str, int] = {}
    name_end = data.index  # a name without its NUL is a broken file: ValueError
    tables = [(dynsym, versions)]
    if full_table:
        tables += [(s, ()) for s in sections if s[1] == _SHT_SYMTAB]
    for section, section_versions in tables:
        str_offset = sections[section[6]][4]
        # One pass with struct.iter_unpack (libc has ~3,000 dynamic symbols: a read of each
        # field by unpack_from cost 6.5 ms, before the attach, of every inspect).
        for i, (name_off, info, _other, shndx, value, size) in enumerate(
            _SYMBOL.iter_unpack(_table(data, section))
        ):
            kind = info & 0xF
            if kind not in _FUNCTION_KINDS or shndx == 0 or value == 0:
                continue
            begin = str_offset + name_off
            name = data[begin : name_end(b"\0", begin)].decode(errors="replace")
            start = value + bias
            symbols.setdefault((start, name), size)
            # A hidden version is an old compat symbol, not the default one a caller links to.
            hidden = bool(section_versions[i] & _VERSYM_HIDDEN) if section_versions else False
            if (wanted is None or name in wanted) and not hidden and kind == _STT_FUNC:
                defaults.setdefault(name, start)
    ordered = tuple(sorted((start, size, name) for (start, name), size in symbols.items()))
    return FunctionSymbols(bias=bias, loads=tuple(loads), symbols=ordered, defaults=defaults)
