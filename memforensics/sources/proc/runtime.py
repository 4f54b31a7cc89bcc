"""Which language runtime a process runs on, told from the process itself: its executable's
name, the libraries it maps, and for Go its executable's ELF sections.

- CPython: ``libpython3*.so`` mapped, or an executable named ``python``, ``python3``,
  ``python3.12``, …;
- a JVM: ``libjvm.so`` mapped (HotSpot: OpenJDK and its builds);
- Node.js: ``libnode.so`` mapped, or an executable named ``node`` or ``nodejs``;
- Go: an executable with a ``.go.buildinfo`` or ``.note.go.buildid`` section.

Anything unreadable means "not known" (None), never an error: the runtime only names the tool
to use next.
"""

from __future__ import annotations

import os
import re
import struct

from memforensics.errors import MemforensicsError
from memforensics.sources.proc.procmaps import read_maps

_PYTHON_EXE = re.compile(r"^python(\d+(\.\d+)?)?[dmu]*$")
_LIBPYTHON = re.compile(r"^libpython\d[\d.]*[dmu]*\.so")
_GO_SECTIONS = frozenset({b".go.buildinfo", b".note.go.buildid"})
# Section headers are read only from an executable of sane size (a Go binary's sections are
# few dozen; a corrupt header must not make us read gigabytes).
_MAX_SECTIONS = 4096
_MAX_NAMES = 1 << 20


def _mapped_names(pid: int) -> set[str]:
    """Base names of the files mapped into ``pid``."""
    try:
        mappings = read_maps(pid)
    except (MemforensicsError, OSError):
        return set()
    return {os.path.basename(m.path) for m in mappings if m.file_backed}


def elf_section_names(path: str | os.PathLike[str]) -> set[bytes]:
    """The section names of an ELF file (64- or 32-bit, either byte order); empty if not ELF."""
    try:
        with open(path, "rb") as handle:
            ident = handle.read(64)
            if len(ident) < 52 or ident[:4] != b"\x7fELF":
                return set()
            wide = ident[4] == 2
            order = "<" if ident[5] == 1 else ">"
            if wide:
                (shoff,) = struct.unpack_from(order + "Q", ident, 0x28)
                entsize, count, names_index = struct.unpack_from(order + "HHH", ident, 0x3A)
            else:
                (shoff,) = struct.unpack_from(order + "I", ident, 0x20)
                entsize, count, names_index = struct.unpack_from(order + "HHH", ident, 0x2E)
            if not shoff or not count or count > _MAX_SECTIONS or names_index >= count:
                return set()
            handle.seek(shoff)
            table = handle.read(entsize * count)
            if len(table) < entsize * count:
                return set()

            def header(index: int) -> tuple[int, int, int]:
                """(name offset, file offset, size) of one section header."""
                base = index * entsize
                if wide:
                    name, offset, size = (
                        struct.unpack_from(order + "I", table, base)[0],
                        struct.unpack_from(order + "Q", table, base + 0x18)[0],
                        struct.unpack_from(order + "Q", table, base + 0x20)[0],
                    )
                else:
                    name, offset, size = (
                        struct.unpack_from(order + "I", table, base)[0],
                        struct.unpack_from(order + "I", table, base + 0x10)[0],
                        struct.unpack_from(order + "I", table, base + 0x14)[0],
                    )
                return name, offset, size

            _, names_offset, names_size = header(names_index)
            handle.seek(names_offset)
            strings = handle.read(min(names_size, _MAX_NAMES))
    except (OSError, struct.error):
        return set()
    found = set()
    for index in range(count):
        name_offset = header(index)[0]
        if name_offset < len(strings):
            end = strings.find(b"\0", name_offset)
            found.add(strings[name_offset : end if end >= 0 else len(strings)])
    return found


def detect_runtime(pid: int) -> str | None:
    """``"cpython"``, ``"jvm"``, ``"node"``, ``"go"`` or None when none can be told."""
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)"))
    except OSError:
        exe = ""
    mapped = _mapped_names(pid)
    if "libjvm.so" in mapped:
        return "jvm"
    if _PYTHON_EXE.match(exe) or any(_LIBPYTHON.match(name) for name in mapped):
        return "cpython"
    if exe in ("node", "nodejs") or any(name.startswith("libnode.so") for name in mapped):
        return "node"
    if exe and elf_section_names(f"/proc/{pid}/exe") & _GO_SECTIONS:
        return "go"
    return None
