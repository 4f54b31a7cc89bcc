"""pagemap_scan: the kernel's PAGEMAP_SCAN read into one byte a page, against the pagemap
entries of the same pages read here (the oracle), on this process's own mappings; and where
the scan gives no answer (the caller then reads the entries)."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from memforensics.sources.proc import pagemap_scan
from memforensics.sources.proc.pagemap_scan import residency_flags
from memforensics.sources.proc.procmem import ProcessMemoryReader

PAGE = os.sysconf("SC_PAGE_SIZE")


def _entries_present(fd: int, start: int, pages: int) -> bytes:
    data = os.pread(fd, 8 * pages, 8 * (start // PAGE))
    return bytes(int.from_bytes(data[i : i + 8], "little") >> 63 for i in range(0, len(data), 8))


@pytest.fixture
def pagemap_fd() -> Iterator[int]:
    fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    try:
        yield fd
    finally:
        os.close(fd)


def _address(area: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(area))


def test_runs_of_touched_pages_come_back_as_the_entries_say(pagemap_fd: int) -> None:
    assert pagemap_scan.kernel_scans(), "this kernel (6.7+ needed) has no PAGEMAP_SCAN"
    pages = 256
    area = mmap.mmap(-1, pages * PAGE)
    try:
        start = _address(area)
        for first, count in ((0, 3), (10, 40), (100, 1), (200, 56)):  # runs, and holes
            for page in range(first, first + count):
                area[page * PAGE] = 1
        flags = residency_flags(pagemap_fd, start, start + pages * PAGE, PAGE)
        assert flags is not None
        present, swapped = flags
        assert bytes(present) == _entries_present(pagemap_fd, start, pages)
        assert present.count(1) == 3 + 40 + 1 + 56 and not any(swapped)
    finally:
        area.close()


def test_a_scattered_residency_is_left_to_the_entries(
    pagemap_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every other page touched: one region a page, more than the entries would cost."""
    assert pagemap_scan.kernel_scans(), "this kernel (6.7+ needed) has no PAGEMAP_SCAN"
    monkeypatch.setattr(pagemap_scan, "_Regions", ctypes.c_uint64 * 24)  # 8 regions a call
    monkeypatch.setattr(pagemap_scan, "_buffers", type(pagemap_scan._buffers)())
    pages = 64
    area = mmap.mmap(-1, pages * PAGE)
    try:
        start = _address(area)
        for page in range(0, pages, 2):
            area[page * PAGE] = 1
        assert residency_flags(pagemap_fd, start, start + pages * PAGE, PAGE) is None
        # Runs long enough: more calls than one, each taking its regions.
        for page in range(pages):
            area[page * PAGE] = 1
        flags = residency_flags(pagemap_fd, start, start + pages * PAGE, PAGE)
        assert flags is not None and bytes(flags[0]) == b"\x01" * pages
        # ProcessMemoryReader gives the same map either way.
        with ProcessMemoryReader(os.getpid()) as mem:
            assert mem.pagemap(start, start + pages * PAGE).present == b"\x01" * pages
    finally:
        area.close()


def test_a_kernel_without_the_scan_is_asked_once_and_the_entries_are_read(
    pagemap_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def no_such_ioctl(fd: int, request: int, arg: object) -> int:
        calls.append(request)
        raise OSError(errno.ENOTTY, "Inappropriate ioctl for device")

    monkeypatch.setattr(pagemap_scan, "_kernel_scans", None)
    monkeypatch.setattr(fcntl, "ioctl", no_such_ioctl)
    area = mmap.mmap(-1, 8 * PAGE)
    try:
        start = _address(area)
        area[0] = 1
        assert residency_flags(pagemap_fd, start, start + 8 * PAGE, PAGE) is None
        assert residency_flags(pagemap_fd, start, start + 8 * PAGE, PAGE) is None
        assert calls == [pagemap_scan.PAGEMAP_SCAN]  # (the probe of our own pagemap)
        assert not pagemap_scan.kernel_scans()
        with ProcessMemoryReader(os.getpid()) as mem:  # the entries, read instead
            pages = mem.pagemap(start, start + 8 * PAGE)
        assert pages.present == b"\x01" + bytes(7)
    finally:
        area.close()


def test_other_failures_and_unaligned_ranges_give_no_answer(
    pagemap_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert residency_flags(pagemap_fd, PAGE + 8, 4 * PAGE, PAGE) is None
    assert residency_flags(pagemap_fd, 4 * PAGE, 4 * PAGE, PAGE) is None

    def denied(fd: int, request: int, arg: object) -> int:
        raise OSError(errno.EPERM, "Operation not permitted")

    assert pagemap_scan.kernel_scans()
    monkeypatch.setattr(fcntl, "ioctl", denied)
    assert residency_flags(pagemap_fd, 0, 4 * PAGE, PAGE) is None
    monkeypatch.undo()
    assert residency_flags(pagemap_fd, 0, 4 * PAGE, PAGE) is not None  # (asked again)


def test_a_file_that_is_not_a_pagemap_says_nothing_of_the_kernel(tmp_path: Path) -> None:
    """A fake /proc's pagemap (a plain file) cannot be scanned: no answer for it, and the
    kernel's own pagemaps are still scanned."""
    fake = tmp_path / "pagemap"
    fake.write_bytes(bytes(8 * 4))
    fd = os.open(fake, os.O_RDONLY)
    try:
        assert residency_flags(fd, 0, 4 * PAGE, PAGE) is None
    finally:
        os.close(fd)
    assert pagemap_scan.kernel_scans()
