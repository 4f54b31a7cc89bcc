"""A core's memory, with the read-only file mappings a core leaves out (gdb's gcore and the
kernel skip unmodified file pages: .rodata, .text) read from the mapped files on disk: what
the type names of RTTI and of CPython's static types need. Only for reads of names and
tables, never for the heap (which a core always holds)."""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence
from pathlib import Path

from memforensics.sources.proc.procmaps import Mapping
from memforensics.sources.proc.procmem import MemoryReader


class FileBackedReads:
    """``read(address, length)`` from the core, else from the file behind a read-only
    file mapping (the file as checked by the core's build-ids: CoreFile.file_for)."""

    def __init__(
        self, mem: MemoryReader, mappings: Sequence[Mapping], files: dict[str, Path]
    ) -> None:
        self.mem = mem
        self.page_bytes = mem.page_bytes
        spans = sorted(
            (m.start_address, m.end_address, m.offset_bytes, files[m.path])
            for m in mappings
            if m.file_backed and not m.perms.startswith("rw") and m.path in files
        )
        self._spans = spans
        self._starts = [s[0] for s in spans]
        self._handles: dict[Path, int] = {}

    def read(self, address: int, length: int) -> bytes | None:
        data = self.mem.read(address, length)
        if data is not None:
            return data
        index = bisect.bisect_right(self._starts, address) - 1
        if index < 0:
            return None
        start, end, offset, path = self._spans[index]
        if address + length > end:
            return None
        fd = self._handles.get(path)
        if fd is None:
            try:
                fd = self._handles[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
        try:
            data = os.pread(fd, length, offset + address - start)
        except OSError:
            return None
        return data if len(data) == length else None

    def close(self) -> None:
        for fd in self._handles.values():
            os.close(fd)
        self._handles.clear()
