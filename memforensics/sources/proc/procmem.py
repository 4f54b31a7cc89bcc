"""Read-only access to a live process's memory: /proc/PID/mem reads and /proc/PID/pagemap.

Nothing here stops the target. gdb/MI would send memory as hex text (a 7 MB malloc_info
document took seconds that way); a pread of /proc/PID/mem takes milliseconds and needs the
same right as a ptrace attach.

Invariant: reads go only to pages the pagemap says are present in RAM (bit 63). Reading any
other page through /proc/PID/mem changes the target: a swapped-out page (bit 62) is faulted
back in (its RSS grows, its swap shrinks), a never-touched page is mapped, and a page
registered with userfaultfd blocks the reader. So ``PageMap.readable`` is the present pages,
``read`` refuses a range holding any page that is not present, and ``read_present`` reads the
present pages of a range and leaves the others as zeros. process_vm_readv reads only pages
a held target's pagemap says it alone maps (the C copies, _procmem_read.h): it pins what it
reads, and a read-only pin of a present page the target shares copy-on-write with another
process (a forked server's heap) makes the kernel (5.19 and later) give the target a private
copy of it first: its memory would grow by the pages read.
"""

from __future__ import annotations

import functools
import itertools
import os
from pathlib import Path
from typing import Protocol

from memforensics.errors import (
    MemforensicsError,
    NoSuchProcessError,
    TargetError,
    TargetPermissionError,
)
from memforensics.sources.proc.pagemap_scan import residency_flags

# Where the per-process files are looked up: a seam for tests that need one file missing.
PROC_ROOT = Path("/proc")
# pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
_PRESENT_BIT = 63
_SWAPPED_BIT = 62
_PRESENT_TABLE = bytes(byte >> (_PRESENT_BIT - 56) & 1 for byte in range(256))
# Swapped and not present: in the swap area (reading it would bring it back into RAM).
_SWAPPED_TABLE = bytes(
    1 if byte >> (_SWAPPED_BIT - 56) & 1 and not byte >> (_PRESENT_BIT - 56) & 1 else 0
    for byte in range(256)
)
_READ_MAX_BYTES = 4 << 20  # read_present reads at most this much per preadv
# The end of x86-64 user space with 5-level page tables (57-bit): no mapping lies above.
USER_SPACE_END = 1 << 56


class PagemapUnavailableError(MemforensicsError):
    """Which pages are resident is unknown: /proc/PID/pagemap cannot be read."""


def _open(pid: int, name: str) -> int:
    path = PROC_ROOT / str(pid) / name
    try:
        return os.open(path, os.O_RDONLY)
    except (FileNotFoundError, ProcessLookupError) as exc:
        if name == "pagemap" and (PROC_ROOT / str(pid)).exists():
            raise PagemapUnavailableError(
                f"/proc/{pid}/pagemap is missing (kernel without CONFIG_PROC_PAGE_MONITOR): "
                "which heap pages are resident is unknown",
                pid=pid,
            ) from exc
        raise NoSuchProcessError(f"no process with PID {pid}", pid=pid) from exc
    except PermissionError as exc:
        raise TargetPermissionError(f"cannot read /proc/{pid}/{name}: permission denied") from exc


class PageMap:
    """Which pages of [start, end) are present in RAM (the only ones that may be read), and
    which are swapped out, in one read."""

    def __init__(self, start: int, end: int, page_bytes: int, entries: bytes) -> None:
        """From pagemap ``entries`` (8 bytes a page; missing ones at the end: not present)."""
        pages = (end - start) // page_bytes
        # Flags sit in each little-endian entry's top byte: one C-speed pass per flag.
        top_bytes = entries[7::8] + bytes(pages - len(entries) // 8)
        self._set(
            start,
            end,
            page_bytes,
            top_bytes.translate(_PRESENT_TABLE),
            top_bytes.translate(_SWAPPED_TABLE),
        )

    @classmethod
    def from_flags(
        cls,
        start: int,
        end: int,
        page_bytes: int,
        present: bytes | bytearray,
        swapped: bytes | bytearray,
    ) -> PageMap:
        """From one byte a page of each: present (1 = in RAM) and swapped (1 = in swap)."""
        pagemap = cls.__new__(cls)
        pagemap._set(start, end, page_bytes, bytes(present), bytes(swapped))
        return pagemap

    def _set(self, start: int, end: int, page_bytes: int, present: bytes, swapped: bytes) -> None:
        self.start = start
        self.end = end
        self.page_bytes = page_bytes
        pages = (end - start) // page_bytes
        self.present = present  # one byte per page: 1 = in RAM
        # The pages a copy may read: the present ones, never a swapped one (the read would
        # fault it back into the target) nor a never-touched one (it would map a page).
        self.readable = present
        self.swapped = swapped  # 1 = in swap, not in RAM
        self.resident_pages = present.count(1)
        # The common case (a heap nobody trimmed) lets the walk skip page arithmetic.
        self.all_resident = pages > 0 and self.resident_pages == pages

    @functools.cached_property
    def prefix(self) -> list[int]:
        """prefix[i] = resident pages before page i: any span's count in two lookups. Made
        when first asked for (a gigabyte heap's costs ~10 ms; a held read rarely needs it)."""
        return [0, *itertools.accumulate(self.present)]

    def _pages(self, first: int, last: int) -> int:
        """Resident pages with index in [first, last)."""
        pages = len(self.present)
        first, last = max(first, 0), min(last, pages)
        if last <= first:
            return 0
        if "prefix" not in self.__dict__:  # a count in C until the sums are made
            return self.present.count(1, first, last)
        return self.prefix[last] - self.prefix[first]

    def resident_bytes(self, start: int, end: int) -> int:
        """Bytes of [start, end) lying on resident pages (partial pages count their part)."""
        start, end = max(start, self.start), min(end, self.end)
        if end <= start:
            return 0
        ps = self.page_bytes
        first = (start - self.start) // ps
        last = (end - 1 - self.start) // ps
        if first == last:
            return (end - start) * self._pages(first, first + 1)
        total = self._pages(first + 1, last) * ps
        total += (ps - (start - self.start) % ps) * self._pages(first, first + 1)
        total += ((end - self.start - 1) % ps + 1) * self._pages(last, last + 1)
        return total

    def whole_pages_resident_bytes(self, start: int, end: int) -> int:
        """Bytes of the resident pages lying wholly inside [start, end)."""
        ps = self.page_bytes
        first = (max(start, self.start) - self.start + ps - 1) // ps
        last = (min(end, self.end) - self.start) // ps
        return self._pages(first, last) * ps

    @property
    def total_resident_bytes(self) -> int:
        return self.resident_pages * self.page_bytes


class MemoryReader(Protocol):
    """What the heap's readers need of a memory: a live process's (ProcessMemoryReader) or a
    core file's (memforensics.sources.core.corefile). Pages that are not "present" are
    never read: a live process's not in RAM, a core's not dumped."""

    page_bytes: int

    def pagemap(self, start: int, end: int) -> PageMap: ...

    def readable(self, address: int) -> bool: ...

    def read(self, address: int, length: int) -> bytes | None: ...

    def read_present(self, address: int, length: int, present: bytes | None = None) -> bytes: ...

    def read_into(self, view: memoryview, address: int) -> bool: ...


class ProcessMemoryReader:
    """/proc/PID/mem and /proc/PID/pagemap of one process, opened once (close when done)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.page_bytes = os.sysconf("SC_PAGE_SIZE")
        self._mem_fd = _open(pid, "mem")
        try:
            self._pagemap_fd = _open(pid, "pagemap")
        except BaseException:
            os.close(self._mem_fd)
            raise

    @property
    def mem_fd(self) -> int:
        """The open /proc/PID/mem (for the copy in memforensics.sources.glibc.heapcopy)."""
        return self._mem_fd

    @property
    def pagemap_fd(self) -> int:
        """The open /proc/PID/pagemap (for a copy that checks its pages as it reads)."""
        return self._pagemap_fd

    def close(self) -> None:
        os.close(self._mem_fd)
        os.close(self._pagemap_fd)

    def __enter__(self) -> ProcessMemoryReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def pagemap(self, start: int, end: int) -> PageMap:
        """Residency of the pages of [start, end) (page-aligned): from the kernel's scan of
        its page tables (pagemap_scan, where it can say), else in one read of the entries.

        An unreadable range raises PagemapUnavailableError: unknown stays unknown, never
        "all resident" or "none resident".
        """
        pages = (end - start) // self.page_bytes
        if not 0 <= start <= end <= USER_SPACE_END:
            # Addresses come from the target: a range no process can map is never read
            # (nor a buffer sized by it allocated).
            raise PagemapUnavailableError(
                f"no process maps [{start:#x}, {end:#x}): which pages are resident is unknown",
                pid=self.pid,
            )
        flags = residency_flags(self._pagemap_fd, start, end, self.page_bytes)
        if flags is not None:
            return PageMap.from_flags(start, end, self.page_bytes, *flags)
        try:
            data = os.pread(self._pagemap_fd, 8 * pages, 8 * (start // self.page_bytes))
        except OSError as exc:
            raise PagemapUnavailableError(
                f"cannot read /proc/{self.pid}/pagemap at {start:#x}: {exc.strerror}; "
                "which heap pages are resident is unknown",
                pid=self.pid,
            ) from exc
        return PageMap(start, end, self.page_bytes, data[: len(data) - len(data) % 8])

    def _present_flags(self, address: int, length: int) -> bytes:
        """One byte per page of [address, address + length): 1 = present. A page whose
        entry cannot be read counts as not present (it is then not read)."""
        first = address // self.page_bytes
        last = (address + max(length, 1) - 1) // self.page_bytes
        try:
            entries = os.pread(self._pagemap_fd, 8 * (last - first + 1), 8 * first)
        except OSError:
            return bytes(last - first + 1)
        flags = entries[7 : len(entries) - len(entries) % 8 : 8].translate(_PRESENT_TABLE)
        return flags + bytes(last - first + 1 - len(flags))

    def readable(self, address: int) -> bool:
        """True when the page holding ``address`` is present in RAM (may be read)."""
        return self._present_flags(address, 1) == b"\x01"

    def read(self, address: int, length: int) -> bytes | None:
        """``length`` bytes at ``address``, or None when any page of them is not present in
        RAM (swapped out, never touched, unmapped) or cannot be read."""
        if 0 in self._present_flags(address, length):
            return None
        try:
            data = os.pread(self._mem_fd, length, address)
        except OSError:
            return None
        return data if len(data) == length else None

    def read_present(self, address: int, length: int, present: bytes | None = None) -> bytes:
        """The bytes of [address, address + length) on present pages, one read per run of
        them; every other byte (swapped, never touched, unmapped, unreadable) is zero.
        ``present``: the pages' flags when the caller has read them already (one byte per
        page from the one holding ``address``; 1 = present)."""
        flags = self._present_flags(address, length) if present is None else present
        buffer = bytearray(length)
        view = memoryview(buffer)
        page = self.page_bytes
        base = address // page * page
        index = 0
        while index < len(flags):
            begin = flags.find(1, index)
            if begin < 0:
                break
            stop = flags.find(0, begin)
            stop = len(flags) if stop < 0 else stop
            lo = max(base + begin * page, address) - address
            hi = min(base + stop * page, address + length) - address
            while lo < hi:
                piece = min(hi, lo + _READ_MAX_BYTES)
                try:
                    got = os.preadv(self._mem_fd, [view[lo:piece]], address + lo)
                except OSError:
                    got = 0
                if got <= 0:
                    view[lo:hi] = bytes(hi - lo)  # unmapped meanwhile: zeros
                    break
                lo += got
            index = stop
        return bytes(buffer)

    def read_into(self, view: memoryview, address: int) -> bool:
        """Fill ``view`` with the bytes at ``address`` in one read; False when it fell short
        or when any page of them is not present in RAM (then nothing is read)."""
        if 0 in self._present_flags(address, len(view)):
            return False
        try:
            return os.preadv(self._mem_fd, [view], address) == len(view)
        except OSError:
            return False


class TargetMemory:
    """An open /proc/PID/mem for the gdb session: ``read`` returns exactly the bytes asked
    for, or raises (the walk's ProcessMemoryReader instead skips what it cannot read)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd: int | None = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)

    def read(self, address: int, size_bytes: int) -> bytes:
        """``size_bytes`` bytes at ``address``, in one buffer (no hex, no re-joining)."""
        if self._fd is None:
            raise TargetError(f"memory of PID {self.pid} is closed", pid=self.pid)
        buffer = bytearray(size_bytes)
        view = memoryview(buffer)
        done = 0
        while done < size_bytes:
            try:
                got = os.preadv(self._fd, [view[done:]], address + done)
            except OSError as exc:
                raise TargetError(
                    f"cannot read {size_bytes} bytes at {address:#x} in PID {self.pid}: "
                    f"{exc.strerror}",
                    pid=self.pid,
                ) from exc
            if got <= 0:
                raise TargetError(
                    f"could read only {done} of {size_bytes} bytes at {address:#x} "
                    f"in PID {self.pid}",
                    pid=self.pid,
                )
            done += got
        return bytes(buffer)

    def close(self) -> None:
        """Close the file descriptor (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
