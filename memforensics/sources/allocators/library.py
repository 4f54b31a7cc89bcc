"""Where a foreign allocator lives in a process: which file holds its functions, their
addresses there, and the code that counts as "inside the allocator" for the safe moment.

A shared library (libjemalloc.so.2, libtcmalloc_minimal.so.4, libmimalloc.so.2, preloaded or
linked) is the allocator as a whole: every executable mapping of it is its code. A copy
linked into the executable is found by its functions' names (``mallctl``, ``je_mallctl``,
Rust's ``_rjem_mallctl``, tcmalloc's ``MallocExtension_GetNumericProperty``, mimalloc's
``mi_process_info``); it is named, but not called: its code cannot be told from the
program's around it, so no moment could be known to be outside it.
"""

from __future__ import annotations

import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path

from memforensics.errors import NotGlibcMallocError, TargetError, ToolingError
from memforensics.model.allocator import ForeignKind, ForeignLibrary
from memforensics.sources.proc.elf_dynsym import function_symbols, read_mapped_file
from memforensics.sources.proc.procmaps import read_maps

# The file-name prefixes of the shared libraries, and the kind each is.
LIBRARY_PREFIXES: tuple[tuple[str, ForeignKind], ...] = (
    ("libjemalloc", "jemalloc"),
    ("libtcmalloc", "tcmalloc"),
    ("libmimalloc", "mimalloc"),
)
# A function each allocator always exports, and the name prefixes of builds that rename them.
_MARKERS: tuple[tuple[ForeignKind, str, tuple[str, ...]], ...] = (
    ("jemalloc", "mallctl", ("", "je_", "_rjem_")),
    ("tcmalloc", "MallocExtension_GetNumericProperty", ("",)),
    ("mimalloc", "mi_process_info", ("",)),
)
_SHT_STRTAB = 3
_VERSION_PATTERNS: dict[ForeignKind, re.Pattern[bytes]] = {
    "jemalloc": re.compile(rb"\0(\d+\.\d+\.\d+)-\d+-g[0-9a-f]{40}\0"),
    "tcmalloc": re.compile(rb"\0gperftools (\d+\.\d+(?:\.\d+)?)\0"),
}


@dataclass(frozen=True)
class ForeignImage:
    """A foreign allocator's callable functions in one process, and its code."""

    library: ForeignLibrary
    functions: dict[str, int]  # name without prefix -> address in the process
    code: tuple[tuple[int, int], ...]  # [start, end) of each executable mapping
    version: str | None  # the release its file names, where it names one


def mapped_library(pid: int) -> ForeignLibrary | None:
    """The foreign allocator library mapped into PID, if any (the first one found)."""
    for mapping in read_maps(pid):
        base = os.path.basename(mapping.path)
        for prefix, kind in LIBRARY_PREFIXES:
            if base.startswith(prefix) and ".so" in base:
                return ForeignLibrary(kind=kind, path=mapping.path)
    return None


def _string_tables(data: mmap.mmap) -> list[tuple[int, int]]:
    """[start, end) of each SHT_STRTAB section of an ELF64 little-endian file; none for
    anything else (a file too short for what its header says included)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1 or len(data) < 64:
        return []
    shoff = int.from_bytes(data[0x28:0x30], "little")
    shentsize = int.from_bytes(data[0x3A:0x3C], "little")
    shnum = int.from_bytes(data[0x3C:0x3E], "little")
    tables = []
    for index in range(shnum):
        header = data[shoff + index * shentsize : shoff + (index + 1) * shentsize]
        if len(header) < 40:
            return []
        if int.from_bytes(header[4:8], "little") == _SHT_STRTAB:
            offset = int.from_bytes(header[24:32], "little")
            size = int.from_bytes(header[32:40], "little")
            tables.append((offset, min(offset + size, len(data))))
    return tables


def linked_copy(exe: Path) -> ForeignLibrary | None:
    """A foreign allocator linked into the executable ``exe`` (see the module): its marker
    function defined there; ``serves_malloc`` when it is not a prefixed copy and the
    executable defines malloc itself. None for anything else, an unreadable file included."""
    try:
        with exe.open("rb") as handle:
            if os.fstat(handle.fileno()).st_size == 0:
                return None
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                # Names first, in the string tables only (a cheap search, however big the
                # program); the symbol tables only where one is there.
                tables = _string_tables(data)
                named = [
                    (kind, prefix + name)
                    for kind, name, prefixes in _MARKERS
                    for prefix in prefixes
                    if any(
                        data.find(b"\0" + (prefix + name).encode() + b"\0", start, end) >= 0
                        for start, end in tables
                    )
                ]
                if not named:
                    return None
                wanted = frozenset(symbol for _, symbol in named) | {"malloc"}
                found = function_symbols(bytes(data), 0, str(exe), wanted, full_table=True)
    except (OSError, ValueError, NotGlibcMallocError, ToolingError):
        return None
    for kind, symbol in named:
        if symbol in found.defaults:  # defined here, not imported from a library
            prefix = symbol[: -len(next(n for k, n, _ in _MARKERS if k == kind))]
            return ForeignLibrary(
                kind=kind,
                path=str(exe),
                prefix=prefix,
                serves_malloc=not prefix and "malloc" in found.defaults,
            )
    return None


def load_foreign(pid: int, library: ForeignLibrary, names: frozenset[str]) -> ForeignImage:
    """The functions ``names`` (without prefix) of ``library`` as mapped in PID, and its
    code. NotGlibcMallocError when one is missing; TargetError for a copy linked into the
    executable (see the module)."""
    if not os.path.basename(library.path).startswith(tuple(p for p, _ in LIBRARY_PREFIXES)):
        raise TargetError(
            f"PID {pid}: {library.kind} is linked into {library.path}; its code cannot be told "
            "from the program's, so no safe moment for its own statistics calls can be found",
            hint=f"run it on the shared {library.kind} library (LD_PRELOAD) to inspect it",
            pid=pid,
        )
    mapped = read_mapped_file(pid, library.path)
    wanted = frozenset(library.prefix + name for name in names)
    found = function_symbols(mapped.data, mapped.base, library.path, wanted)
    missing = sorted(name for name in wanted if name not in found.defaults)
    if missing:
        raise NotGlibcMallocError(
            f"{library.path} does not export {', '.join(missing)}: not the {library.kind} "
            "this reads",
            pid=pid,
        )
    code = tuple(
        (m.start_address, m.end_address)
        for m in read_maps(pid)
        if m.path == library.path and "x" in m.perms
    )
    pattern = _VERSION_PATTERNS.get(library.kind)
    version = None
    if pattern is not None and (match := pattern.search(mapped.data)) is not None:
        version = match.group(1).decode()
    elif library.kind == "mimalloc":
        # libmimalloc.so.2 -> libmimalloc.so.2.0: the file name carries major.minor.
        real = os.path.basename(os.path.realpath(f"/proc/{pid}/root{library.path}"))
        version = real.split(".so.", 1)[1] if ".so." in real else None
    return ForeignImage(
        library=library,
        functions={name: found.defaults[library.prefix + name] for name in names},
        code=code,
        version=version,
    )
