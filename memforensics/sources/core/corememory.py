"""A dead process's memory read from its core file, through the read API of
memforensics.sources.proc.procmem.ProcessMemoryReader.

The core is mmapped read-only, never read whole (cores run to many GB): a small read is a slice
of that mapping, copied once into the bytes returned; a read of _PREAD_MIN_BYTES or more is a
pread of the file into its buffer. The file's pages a slice maps count in our RSS, and a fault
may map many (the kernel's fault-around, or a whole large page-cache folio: ~26-180 KiB per
8-byte read here): every _LOOK_EVERY_SLICES slices our mapped file pages are looked up
(/proc/self/statm), and past _MAPPED_MAX_BYTES more than after the last drop every page of the
mapping is dropped again (the file's pages stay in the page cache), so that our memory stays
bounded whatever the core's size. The invariants mirror the live reader's:
a byte is "present" when the core holds it (its PT_LOAD's p_filesz covers it and the file is
long enough to hold it); ``read`` and ``read_into`` refuse a range with any byte that is not
present, ``read_present`` gives zeros for them, and ``pagemap`` says "present" for a page
only when every byte of it is. Nothing is ever swapped in a core.

Whether "present" means "was resident" depends on the writer: the kernel writes every page
of a dumped mapping (leaving holes in a sparse file for pages that were never touched, which
read as zeros), gdb's gcore writes whole mappings read through /proc/PID/mem. Neither is RSS.
"""

from __future__ import annotations

import bisect
import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

from memforensics.errors import InputDataError
from memforensics.sources.proc.procmem import PageMap

_PRESENT_ENTRY_TOP = bytes(0x80 if byte else 0 for byte in range(256))  # pagemap bit 63
_MAPPED_MAX_BYTES = 16 << 20  # the core's pages mapped before they are dropped
_LOOK_EVERY_SLICES = 32  # slices between two looks at our mapped file pages
_PREAD_MIN_BYTES = 64 << 10  # a read this long is a pread, not a slice of the mapping


@dataclass(frozen=True)
class CoreSegment:
    """One PT_LOAD: memory [start_address, end_address), its first present_bytes in the
    core at file_offset (fewer than p_filesz when the core was truncated)."""

    start_address: int
    end_address: int
    file_offset: int
    present_bytes: int
    flags: int  # p_flags: PF_R | PF_W | PF_X

    @property
    def present_end(self) -> int:
        return self.start_address + self.present_bytes


def _present_runs(segments: Sequence[CoreSegment]) -> list[tuple[int, int]]:
    """[start, end) runs of present bytes, adjacent segments' joined (a page may straddle)."""
    runs: list[tuple[int, int]] = []
    for segment in segments:
        if not segment.present_bytes:
            continue
        if runs and runs[-1][1] == segment.start_address:
            runs[-1] = (runs[-1][0], segment.present_end)
        else:
            runs.append((segment.start_address, segment.present_end))
    return runs


class CoreMemory:
    """The memory of a core file, read like a live process's (close when done).

    ``segments`` must be sorted by address and must not overlap (CoreFile checks both).
    """

    def __init__(
        self, path: str | os.PathLike[str], segments: Sequence[CoreSegment], page_bytes: int
    ) -> None:
        self.path = os.fspath(path)
        self.page_bytes = page_bytes
        try:
            self._file = open(self.path, "rb")  # noqa: SIM115 (kept: the long reads' preads)
        except OSError as exc:
            raise InputDataError(f"cannot map the core: {exc}", source=self.path) from None
        try:
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            self._file.close()
            raise InputDataError(f"cannot map the core: {exc}", source=self.path) from None
        self._slices = 0
        self._file_base_bytes = _mapped_file_bytes() or 0  # ours when the core's were last dropped
        # Present bytes end where the mapping does too, should the file have shrunk since
        # its segments were measured: no slice may come back short.
        mapped = len(self._map)
        self.segments = tuple(
            s
            if s.file_offset + s.present_bytes <= mapped
            else replace(s, present_bytes=max(mapped - s.file_offset, 0))
            for s in segments
        )
        self._starts = [s.start_address for s in self.segments]
        self._present_ends = [s.present_end for s in self.segments]
        self._offsets = [s.file_offset for s in self.segments]
        self._runs = _present_runs(self.segments)
        self._run_starts = [start for start, _ in self._runs]
        self._closed = False

    def close(self) -> None:
        """Release the mapping (idempotent); reads after it raise ValueError."""
        if not self._closed:
            self._closed = True
            self._map.close()
            self._file.close()

    def __enter__(self) -> CoreMemory:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def forget_mapped(self) -> None:
        """Drop every page of the core mapped now from our memory (before work that needs
        the room: the pages stay in the page cache, and later reads map them again)."""
        self._map.madvise(mmap.MADV_DONTNEED)
        self._file_base_bytes = _mapped_file_bytes() or 0

    def _slice(self, at: int, length: int) -> bytes:
        """File bytes [at, at + length): a slice of the mapping, or a pread where long."""
        if length >= _PREAD_MIN_BYTES:
            return _pread(self._file.fileno(), length, at)
        self._slices += 1
        if self._slices % _LOOK_EVERY_SLICES == 0:
            now = _mapped_file_bytes()
            if now is None or now > self._file_base_bytes + _MAPPED_MAX_BYTES:
                self.forget_mapped()
        return self._map[at : at + length]

    def readable(self, address: int) -> bool:
        """True when the byte at ``address`` is in the core."""
        index = bisect.bisect_right(self._starts, address) - 1
        return index >= 0 and address < self._present_ends[index]

    def _spans(self, address: int, length: int) -> list[tuple[int, int]] | None:
        """(file offset, bytes) pieces holding [address, address + length), one per segment
        it runs through; None when any byte of it is not in the core."""
        index = bisect.bisect_right(self._starts, address) - 1
        if index < 0 or address >= self._present_ends[index]:
            return None
        spans = []
        while True:
            take = min(length, self._present_ends[index] - address)
            spans.append((self._offsets[index] + address - self._starts[index], take))
            address, length = address + take, length - take
            if length <= 0:
                return spans
            # Go on only into a segment starting right here: after a segment cut short (a
            # truncated core) or at a gap between mappings, the next byte is not in the core.
            index += 1
            if (
                index == len(self._starts)
                or self._starts[index] != address
                or self._present_ends[index] == address
            ):
                return None

    def read(self, address: int, length: int) -> bytes | None:
        """``length`` bytes at ``address``, or None when any of them is not in the core.
        A range running on into the next PT_LOAD is read across both when they touch."""
        index = bisect.bisect_right(self._starts, address) - 1
        if index >= 0 and address + length <= self._present_ends[index]:
            # The common case, inlined (reads of a few bytes come by the million): one slice
            # of the mmap is one copy, cheaper than bytes() of a memoryview slice.
            return self._slice(self._offsets[index] + address - self._starts[index], length)
        spans = self._spans(address, length)
        if spans is None:
            return None
        return b"".join(self._slice(at, size) for at, size in spans)

    def read_into(self, view: memoryview, address: int) -> bool:
        """Fill ``view`` with the bytes at ``address``, read from the file (a pread each piece);
        False (``view`` left as it was) when any of them is not in the core."""
        target = view if view.format == "B" and view.ndim == 1 else view.cast("B")
        spans = self._spans(address, len(target))
        if spans is None:
            return False
        done = 0
        for at, size in spans:
            _pread_into(self._file.fileno(), target[done : done + size], at)
            done += size
        return True

    def read_present(self, address: int, length: int, present: bytes | None = None) -> bytes:
        """The bytes of [address, address + length) that are in the core; every other byte
        is zero. ``present``: page flags (one byte per page from the one holding
        ``address``; 1 = read it) the caller already has; pages flagged 0 are left zero."""
        if present is None:
            whole = self.read(address, length)
            if whole is not None:  # the common case: one copy, no zero-filled buffer first
                return whole
        buffer = bytearray(length)
        end = address + length
        index = max(bisect.bisect_right(self._starts, address) - 1, 0)
        while index < len(self._starts) and self._starts[index] < end:
            lo = max(self._starts[index], address)
            hi = min(self._present_ends[index], end)
            if lo < hi:
                at = self._offsets[index] + lo - self._starts[index]
                into = memoryview(buffer)[lo - address : hi - address]
                _pread_into(self._file.fileno(), into, at)
            index += 1
        if present is not None:  # blank each run of pages flagged 0
            page = self.page_bytes
            base = address // page * page
            flags = bytes(present)
            stop = 0
            while (begin := flags.find(0, stop)) >= 0:
                stop = flags.find(1, begin)
                stop = len(flags) if stop < 0 else stop
                lo = max(base + begin * page, address) - address
                hi = min(base + stop * page, end) - address
                if lo < hi:
                    buffer[lo:hi] = bytes(hi - lo)
        return bytes(buffer)

    def pagemap(self, start: int, end: int) -> PageMap:
        """Which pages of [start, end) (page-aligned) are wholly in the core, as a PageMap."""
        page = self.page_bytes
        pages = max(end - start, 0) // page
        flags = bytearray(pages)
        index = max(bisect.bisect_right(self._run_starts, start) - 1, 0)
        while index < len(self._runs) and self._runs[index][0] < end:
            run_start, run_end = self._runs[index]
            first = (max(run_start, start) - start + page - 1) // page
            last = min((min(run_end, end) - start) // page, pages)
            if first < last:
                flags[first:last] = b"\x01" * (last - first)
            index += 1
        entries = bytearray(8 * pages)
        entries[7::8] = flags.translate(_PRESENT_ENTRY_TOP)
        return PageMap(start, end, page, bytes(entries))


def _pread_into(fd: int, into: memoryview, at: int) -> None:
    """``into`` filled from file offset ``at``; what the file no longer holds (it shrank
    since it was opened) reads as zeros."""
    done = 0
    while done < len(into):
        got = os.preadv(fd, [into[done:]], at + done)
        if got <= 0:
            into[done:] = bytes(len(into) - done)
            return
        done += got


def _pread(fd: int, length: int, at: int) -> bytes:
    """``length`` bytes of the file from offset ``at`` (_pread_into's zeros past its end)."""
    data = os.pread(fd, length, at)
    if len(data) == length:
        return data
    buffer = bytearray(data) + bytes(length - len(data))
    _pread_into(fd, memoryview(buffer)[len(data) :], at + len(data))
    return bytes(buffer)


def _mapped_file_bytes() -> int | None:
    """Our resident pages of file mappings (and shared memory): /proc/self/statm's third
    field; None where it cannot be read (then the mapping is dropped at every look)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[2]) * mmap.PAGESIZE
    except (OSError, ValueError, IndexError):
        return None
