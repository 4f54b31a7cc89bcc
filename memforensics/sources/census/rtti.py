"""C++ object types named from a target's memory by RTTI (Itanium C++ ABI, GCC and Clang):
vptr -> vtable[-1] -> type_info -> its mangled name, no symbols needed.

A word is taken as a vptr only when all of these hold (facts: docs/census.md):
- it is 8-aligned and lies in a read-only file-backed mapping (a vtable's .data.rel.ro);
- the vtable's offset-to-top (vtable[-2]) is 0 (a complete object's primary vptr: the
  most-derived class, also under multiple inheritance);
- vtable[-1], the type_info, lies in a read-only file-backed mapping too, and its own vptr
  is one of the C++ runtime's three type_info vtables (``__class_type_info``,
  ``__si_class_type_info``, ``__vmi_class_type_info``, each's address point: +16), found
  in libstdc++'s (or libc++abi's) dynamic symbols;
- its name (type_info + 8) is a NUL-terminated mangled type name of plausible characters.
The answer is cached per vptr, so the cost is one word per chunk; a word in no read-only
file mapping is rejected by one bisection without any read.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from pathlib import Path

from memforensics.sources.census.demangle import demangle_type
from memforensics.sources.census.filemem import FileBackedReads
from memforensics.sources.census.symbols import mapped_symbols
from memforensics.sources.proc.procmaps import Mapping
from memforensics.sources.proc.procmem import MemoryReader

TYPEINFO_VTABLES = frozenset(
    (
        "_ZTVN10__cxxabiv117__class_type_infoE",
        "_ZTVN10__cxxabiv120__si_class_type_infoE",
        "_ZTVN10__cxxabiv121__vmi_class_type_infoE",
    )
)
_ADDRESS_POINT = 16  # a vtable's address point: after offset-to-top and the type_info
_NAME_MAX = 1024
_NAME_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_*$.")
_CACHE_MAX = 1 << 18  # distinct words remembered (beyond, rejected words are re-checked)


class RttiResolver:
    """The C++ type named by a vptr, cached per vptr (see the module)."""

    def __init__(
        self,
        mem: MemoryReader | FileBackedReads,
        mappings: Sequence[Mapping],
        *,
        files: dict[str, Path] | None = None,
    ) -> None:
        self.mem = mem
        spans = sorted(
            (m.start_address, m.end_address)
            for m in mappings
            if m.file_backed and m.perms.startswith("r-")
        )
        self._starts = [s for s, _ in spans]
        self._ends = [e for _, e in spans]
        symbols: dict[str, int] = {}
        for library in ("libstdc++", "libc++abi", "libc++"):
            symbols.update(mapped_symbols(mappings, library, TYPEINFO_VTABLES, files=files))
        # An executable that links the runtime statically exports the vtables itself (or not).
        executable = [m for m in mappings if m.file_backed and m.offset_bytes == 0][:1]
        if executable:
            name = executable[0].path.rsplit("/", 1)[-1]
            symbols.update(mapped_symbols(executable, name, TYPEINFO_VTABLES, files=files))
        self.typeinfo_vptrs = frozenset(address + _ADDRESS_POINT for address in symbols.values())
        self._cache: dict[int, str | None] = {}

    @property
    def usable(self) -> bool:
        """The runtime's type_info vtables are known (else nothing is named C++)."""
        return bool(self.typeinfo_vptrs)

    def _readonly(self, address: int) -> bool:
        index = bisect.bisect_right(self._starts, address) - 1
        return index >= 0 and address + 8 <= self._ends[index]

    def name(self, vptr: int) -> str | None:
        """The demangled type whose vptr ``vptr`` is, or None when it is not one."""
        cached = self._cache.get(vptr, False)
        if cached is not False:
            return cached  # type: ignore[return-value]
        if vptr & 7 or not self._readonly(vptr):
            return None
        name = self._resolve(vptr)
        if len(self._cache) < _CACHE_MAX:
            self._cache[vptr] = name
        return name

    def _word(self, address: int) -> int | None:
        data = self.mem.read(address, 8)
        return None if data is None else int.from_bytes(data, "little")

    def _resolve(self, vptr: int) -> str | None:
        if not self.typeinfo_vptrs:
            return None
        head = self.mem.read(vptr - _ADDRESS_POINT, _ADDRESS_POINT)
        if head is None:
            return None
        offset_to_top = int.from_bytes(head[:8], "little")
        typeinfo = int.from_bytes(head[8:], "little")
        if offset_to_top != 0 or typeinfo & 7 or not self._readonly(typeinfo):
            return None
        words = self.mem.read(typeinfo, 16)
        if words is None or int.from_bytes(words[:8], "little") not in self.typeinfo_vptrs:
            return None
        name_address = int.from_bytes(words[8:], "little")
        raw = self._string(name_address)
        if not raw:
            return None
        return demangle_type(raw.lstrip("*"))

    def _string(self, address: int) -> str | None:
        """A NUL-terminated mangled name at ``address`` (read a page at a time)."""
        out = bytearray()
        page = self.mem.page_bytes
        while len(out) < _NAME_MAX:
            take = min(page - address % page, _NAME_MAX - len(out))
            data = self.mem.read(address, take)
            if data is None:
                return None
            end = data.find(0)
            out += data if end < 0 else data[:end]
            if end >= 0:
                break
            address += take
        else:
            return None
        if not out or not set(out) <= _NAME_BYTES:
            return None
        return out.decode("ascii")
