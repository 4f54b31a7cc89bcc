"""Which pages of a range are present in RAM, and which swapped out, from the kernel's
PAGEMAP_SCAN ioctl on /proc/PID/pagemap (Linux 6.7 and later): the pages come back as
regions of one kind each, not as one 8-byte entry a page.

Why: reading pagemap entries costs the kernel ~80 ns a resident page (it builds each entry,
looking at the page itself for flags we do not use), ~9 ms a GiB of resident heap; the scan
only looks at the page table entries, and on this machine's 8 x 1 GiB heaps it took a third
of the time (22-31 ms against 78-84 ms, the same 1,474,417 present pages). The kernel's
walk is the same one: a page is present (``PAGE_IS_PRESENT``: ``pte_present``, as the
entry's bit 63) or swapped (``PAGE_IS_SWAPPED``: a swap entry, as bit 62), whichever way it
is asked (fs/proc/task_mmu.c, ``pagemap_page_category`` and ``pte_to_pagemap_entry``).

Contract: ``residency_flags(fd, start, end, page_bytes)`` gives (present, swapped), one byte
per page of [start, end) (1 = so), exactly what the entries read for that range say; or None
where the scan cannot say it cheaply: a kernel without PAGEMAP_SCAN (``kernel_scans``, asked
once), an error of the ioctl (the caller's read of the entries reports it), or a residency
so scattered that its regions would cost more than the entries (fewer than
MIN_PAGES_PER_REGION pages a region in the first batch). Standard library only.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import threading

# _IOWR('f', 16, struct pm_scan_arg) (include/uapi/linux/fs.h): 96 bytes of arguments.
PAGEMAP_SCAN = (3 << 30) | (96 << 16) | (ord("f") << 8) | 16
PAGE_IS_PRESENT = 1 << 3
PAGE_IS_SWAPPED = 1 << 4
REGIONS_PER_CALL = 2048  # struct page_region (24 bytes) each: 48 KiB a call
# The first call's regions must cover at least this many pages each on average: else the
# residency alternates so often that one entry a page is the cheaper answer.
MIN_PAGES_PER_REGION = 16


class _ScanArgs(ctypes.Structure):
    """struct pm_scan_arg."""

    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "size",
            "flags",
            "start",
            "end",
            "walk_end",
            "vec",
            "vec_len",
            "max_pages",
            "category_inverted",
            "category_mask",
            "category_anyof_mask",
            "return_mask",
        )
    ]


_Regions = ctypes.c_uint64 * (3 * REGIONS_PER_CALL)  # (start, end, categories) each
_buffers = threading.local()  # each thread's regions buffer (read_residency uses two)
_kernel_scans: bool | None = None  # whether this kernel has the ioctl (asked once)


def kernel_scans() -> bool:
    """Whether this kernel has PAGEMAP_SCAN: asked once, of our own pagemap (an fd that
    is not a pagemap, a test's file in a fake /proc, says nothing of the kernel)."""
    global _kernel_scans
    if _kernel_scans is None:
        try:
            fd = os.open("/proc/self/pagemap", os.O_RDONLY)
        except OSError:
            _kernel_scans = False
        else:
            try:
                one = (ctypes.c_uint64 * 3)()
                _kernel_scans = _scan_once(fd, 0, 4096, _ScanArgs(), one) >= 0
            except OSError:
                _kernel_scans = False
            finally:
                os.close(fd)
    return _kernel_scans


def _scan_once(
    fd: int, start: int, end: int, args: _ScanArgs, regions: ctypes.Array[ctypes.c_uint64]
) -> int:
    """One PAGEMAP_SCAN call over [start, end) into ``regions`` (``args`` filled in)."""
    args.size = ctypes.sizeof(_ScanArgs)
    args.start, args.end = start, end
    args.vec = ctypes.addressof(regions)
    args.vec_len = ctypes.sizeof(regions) // 24
    args.category_anyof_mask = args.return_mask = PAGE_IS_PRESENT | PAGE_IS_SWAPPED
    return int(fcntl.ioctl(fd, PAGEMAP_SCAN, args))


def residency_flags(
    fd: int, start: int, end: int, page_bytes: int
) -> tuple[bytearray, bytearray] | None:
    """(present, swapped) of the pages of [start, end) (page-aligned), pagemap ``fd``'s
    process's, one byte per page; None where the scan cannot say (the module's contract)."""
    if end <= start or start % page_bytes or end % page_bytes or not kernel_scans():
        return None
    pages = (end - start) // page_bytes
    present, swapped = bytearray(pages), bytearray(pages)
    regions = getattr(_buffers, "regions", None)
    if regions is None:
        regions = _buffers.regions = _Regions()
    capacity = ctypes.sizeof(regions) // 24
    at, first = start, True
    while at < end:
        args = _ScanArgs()
        try:
            count = _scan_once(fd, at, end, args, regions)
        except OSError:
            return None
        walked_to = args.walk_end
        if count < 0 or count > capacity or not at < walked_to <= end:
            return None  # (not what the kernel's contract says: the entries are read)
        scattered = (walked_to - at) // page_bytes < MIN_PAGES_PER_REGION * count
        if first and count == capacity and scattered:
            return None
        first = False
        for index in range(count):
            low, high, kind = regions[3 * index : 3 * index + 3]
            if not at <= low < high <= walked_to:
                return None
            first_page, last_page = (low - start) // page_bytes, (high - start) // page_bytes
            flags = present if kind & PAGE_IS_PRESENT else swapped
            flags[first_page:last_page] = b"\x01" * (last_page - first_page)
        at = walked_to
    return present, swapped
