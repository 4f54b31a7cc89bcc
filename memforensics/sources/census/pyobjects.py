"""CPython objects named from a target's memory: ``ob_type`` -> ``tp_name``, validated through
the metatype, at the offsets CPython's GC header and pre-header put an object in its block.

Facts used (64-bit default builds, CPython 3.11-3.13; Include/object.h, cpython/object.h,
internal/pycore_object.h, checked on this machine's 3.11, 3.12 and 3.13 by the tests):
- ``ob_type`` at +8; a type's own ``ob_type`` is ``&PyType_Type`` (exported in the dynamic
  symbols of the python executable or libpython) or a metatype whose type is;
- ``PyTypeObject``: ``tp_name`` at +24, ``tp_basicsize`` at +32, ``tp_flags`` at +168;
- an object of a GC type (``Py_TPFLAGS_HAVE_GC``, bit 14) sits 16 bytes into its block
  (PyGC_Head); a type with a managed dict (3.11+: ``Py_TPFLAGS_MANAGED_DICT``, bit 4) or,
  3.12+, a managed weakref (bit 3) adds two words before that (the pre-header).
An object is taken at offset 0, 16 or 32 of a block only when its type validates and that
offset is the one the type's flags give. Types are cached by address.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from pathlib import Path

from memforensics.sources.census.filemem import FileBackedReads
from memforensics.sources.census.symbols import mapped_symbols
from memforensics.sources.proc.procmaps import Mapping
from memforensics.sources.proc.procmem import MemoryReader

_HAVE_GC = 1 << 14
_MANAGED_DICT = 1 << 4
_MANAGED_WEAKREF = 1 << 3  # 3.12+ (an unused bit before)
_TP_NAME = 24
_TP_BASICSIZE = 32
_TP_FLAGS = 168
_NAME_MAX = 256
_WANTED = frozenset(("PyType_Type", "Py_Version"))
_VERSION_RE = re.compile(r"(?:python|libpython)(3\.\d+)")
_CACHE_MAX = 1 << 18  # distinct words remembered (beyond, non-types are re-checked)
_NAME_BYTES = frozenset(range(0x21, 0x7F))
_SIX_WORDS = struct.Struct("<6Q")
# Reference counts stay far below this; 3.12 and 3.13 mark immortal objects with UINT_MAX.
_REFCOUNT_MAX = 1 << 33


class PythonTypes:
    """The CPython types of a process (see the module); ``usable`` False when it runs none."""

    def __init__(
        self,
        mem: MemoryReader | FileBackedReads,
        mappings: Sequence[Mapping],
        *,
        files: dict[str, Path] | None = None,
    ) -> None:
        self.mem = mem
        symbols: dict[str, int] = {}
        for match in ("libpython3", "python3"):
            symbols.update(mapped_symbols(mappings, match, _WANTED, files=files))
            if "PyType_Type" in symbols:
                break
        self.type_type = symbols.get("PyType_Type")
        self.version = ""
        version_at = symbols.get("Py_Version")
        word = self.mem.read(version_at, 8) if version_at is not None else None
        if word is not None:
            hexversion = int.from_bytes(word[:4], "little")
            self.version = f"{hexversion >> 24}.{(hexversion >> 16) & 0xFF}"
        if not self.version:
            for mapping in mappings:
                found = _VERSION_RE.search(mapping.path.rsplit("/", 1)[-1])
                if found:
                    self.version = found.group(1)
                    break
        self.preheader_flags = _MANAGED_DICT | (
            _MANAGED_WEAKREF if self.version not in ("3.10", "3.11") else 0
        )
        self._types: dict[int, tuple[str, int] | None] = {}
        self._metatypes: dict[int, bool] = {}

    @property
    def usable(self) -> bool:
        return self.type_type is not None

    @property
    def layout(self) -> str:
        managed = "managed dict" if self.version in ("3.10", "3.11") else "managed dict/weakref"
        return (
            f"cpython-{self.version or '?'} (ob_type at +8, GC header 16 B, "
            f"pre-header 16 B for {managed})"
        )

    def _is_metatype(self, address: int) -> bool:
        """``address`` is PyType_Type or a type whose own type is PyType_Type."""
        if address == self.type_type:
            return True
        known = self._metatypes.get(address)
        if known is not None:
            return known
        word = self.mem.read(address + 8, 8) if address % 8 == 0 else None
        answer = word is not None and int.from_bytes(word, "little") == self.type_type
        if len(self._metatypes) < 4096:
            self._metatypes[address] = answer
        return answer

    def type_of(self, address: int) -> tuple[str, int] | None:
        """(tp_name, the object's offset in its block) of the type at ``address``, or None
        when it is not a type."""
        known = self._types.get(address, False)
        if known is not False:
            return known  # type: ignore[return-value]
        answer = self._resolve(address)
        if len(self._types) < _CACHE_MAX:
            self._types[address] = answer
        return answer

    def _resolve(self, address: int) -> tuple[str, int] | None:
        if self.type_type is None or address % 8 or address < 0x10000:
            return None
        data = self.mem.read(address, _TP_FLAGS + 8)
        if data is None:
            return None
        metatype = int.from_bytes(data[8:16], "little")
        if not self._is_metatype(metatype):
            return None
        basicsize = int.from_bytes(data[_TP_BASICSIZE : _TP_BASICSIZE + 8], "little")
        flags = int.from_bytes(data[_TP_FLAGS : _TP_FLAGS + 8], "little")
        if not 16 <= basicsize <= 1 << 20:
            return None
        name = self._string(int.from_bytes(data[_TP_NAME : _TP_NAME + 8], "little"))
        if name is None:
            return None
        offset = (16 if flags & _HAVE_GC else 0) + (16 if flags & self.preheader_flags else 0)
        return name, offset

    def _string(self, address: int) -> str | None:
        page = self.mem.page_bytes
        take = min(_NAME_MAX, page - address % page)
        data = self.mem.read(address, take)
        if data is None:
            return None
        end = data.find(0)
        raw = data[:end] if end > 0 else b""
        if not raw or not set(raw) <= _NAME_BYTES:
            return None
        return raw.decode("ascii")

    def object_in(self, block: bytes | memoryview) -> str | None:
        """The tp_name of the CPython object that ``block`` (a chunk's data, a pymalloc
        block) holds, or None. A word that cannot be a reference count (0, or beyond
        _REFCOUNT_MAX: a pointer, text) rules its offset out without a read."""
        size = len(block)
        words = (
            _SIX_WORDS.unpack_from(block)
            if size >= 48
            else struct.unpack_from(f"<{size // 8}Q", block)
        )
        types = self._types
        for index in (0, 2, 4):
            if len(words) < index + 2:
                return None
            refcount = words[index]
            if refcount == 0 or refcount > _REFCOUNT_MAX:
                continue
            address = words[index + 1]
            found = types.get(address, False)
            if found is False:
                found = self.type_of(address)
            if found is not None and found[1] == index * 8:  # type: ignore[index]
                return found[0]  # type: ignore[index]
        return None
