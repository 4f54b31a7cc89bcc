"""Copy buffers cost the pages written and nothing more, whatever the system's transparent
huge page setting: the kernel's own word for each buffer's mapping (/proc/self/smaps: its
VmFlags carry ``nh``, MADV_NOHUGEPAGE, and a buffer written a byte every 2 MiB is resident by
those pages alone, none of them huge)."""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Callable
from pathlib import Path

import pytest

from memforensics.sources.glibc import heapcopy

PAGE = mmap.PAGESIZE
HUGE = 2 << 20


def _mapping(address: int) -> dict[str, str]:
    """The smaps fields of this process's mapping that starts at ``address``."""
    fields: dict[str, str] = {}
    found = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            if found:
                break
            found = int(head.split("-")[0], 16) == address
        elif found:
            name, _, value = line.partition(":")
            fields[name] = value.strip()
    assert fields, f"no mapping starts at {address:#x}"
    return fields


@pytest.mark.parametrize(
    "take",
    [heapcopy.FreshBuffers(1 << 30).take, heapcopy.BufferPool(1 << 30).take, heapcopy.copy_buffer],
    ids=["fresh (scouted copies)", "pooled (whole and block-by-block copies)", "copy_buffer"],
)
def test_a_copy_buffer_is_never_backed_by_huge_pages(take: Callable[[int], mmap.mmap]) -> None:
    buffer = take(64 << 20)
    view = ctypes.c_char.from_buffer(buffer)
    try:
        # (mmap hands back 4 KiB-aligned room; a huge page needs a 2 MiB-aligned stretch of it,
        # which a 64 MiB mapping always holds.)
        address = ctypes.addressof(view)
        for offset in range(0, len(buffer), HUGE):
            buffer[offset] = 1
        fields = _mapping(address)
        assert "nh" in fields["VmFlags"].split()
        assert fields["AnonHugePages"] == "0 kB"
        assert fields["Rss"] == f"{len(buffer) // HUGE * PAGE // 1024} kB"
    finally:
        del view
        buffer.close()
