"""Which pages of a target the residency walk reads, on a synthetic /proc/PID: a ``mem`` file
whose offsets are addresses and a ``pagemap`` written here (bit 63 present, bit 62 swapped,
Documentation/admin-guide/mm/pagemap.rst). Nothing may be read from a page that is not
present: reading a swapped page through /proc/PID/mem would fault it back into the target.
The live case (real swap) is tests/integration/test_swapped_pages_live.py.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from memforensics.sources.glibc import heapcopy
from memforensics.sources.glibc.heapcopy import BufferPool, Segment, copy_into
from memforensics.sources.proc import procmem
from memforensics.sources.proc.procmem import PageMap, ProcessMemoryReader

PAGE = os.sysconf("SC_PAGE_SIZE")
PID = 4_000_001  # a directory name under the fake /proc, no real process
PRESENT, SWAPPED, NONE = 1 << 63, 1 << 62, 0


class FakeProcess:
    """A fake /proc/PID: page i of ``mem`` filled with byte i + 1 unless written otherwise."""

    def __init__(self, root: Path, flags: list[int]) -> None:
        self.root = root
        self.dir = root / str(PID)
        self.dir.mkdir()
        self.memory = bytearray(b"".join(bytes([i + 1]) * PAGE for i in range(len(flags))))
        self.flags = flags
        self.flush()

    def put(self, address: int, *words: int) -> None:
        struct.pack_into(f"<{len(words)}Q", self.memory, address, *words)
        self.flush()

    def flush(self) -> None:
        (self.dir / "mem").write_bytes(bytes(self.memory))
        (self.dir / "pagemap").write_bytes(b"".join(f.to_bytes(8, "little") for f in self.flags))


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeProcess]:
    monkeypatch.setattr(procmem, "PROC_ROOT", tmp_path)
    yield FakeProcess(tmp_path, [PRESENT, SWAPPED, NONE, PRESENT, SWAPPED, PRESENT])


def _page(i: int) -> bytes:
    return bytes([i + 1]) * PAGE


def test_a_swapped_page_is_not_readable_in_the_page_map(fake: FakeProcess) -> None:
    with ProcessMemoryReader(PID) as mem:
        pages = mem.pagemap(0, 6 * PAGE)
    assert pages.present == bytes([1, 0, 0, 1, 0, 1])
    assert pages.readable == pages.present  # never a swapped page, never an untouched one
    assert pages.swapped == bytes([0, 1, 0, 0, 1, 0])
    assert pages.total_resident_bytes == 3 * PAGE


def test_reads_refuse_a_range_holding_a_page_that_is_not_present(fake: FakeProcess) -> None:
    with ProcessMemoryReader(PID) as mem:
        assert mem.read(0, 16) == _page(0)[:16]
        assert mem.read(3 * PAGE + 8, PAGE - 8) == _page(3)[8:]
        assert mem.read(PAGE, 16) is None  # swapped
        assert mem.read(2 * PAGE, 16) is None  # never touched
        assert mem.read(PAGE - 8, 16) is None  # starts present, runs onto a swapped page
        assert [mem.readable(i * PAGE) for i in range(6)] == [1, 0, 0, 1, 0, 1]
        view = memoryview(bytearray(32))
        assert not mem.read_into(view, PAGE - 16)
        assert mem.read_present(0, 6 * PAGE) == b"".join(
            _page(i) if i in (0, 3, 5) else bytes(PAGE) for i in range(6)
        )
        assert mem.read_present(PAGE - 8, 16) == _page(0)[:8] + bytes(8)


@pytest.mark.parametrize("native", [False, True], ids=["python-copy", "c-copy"])
def test_the_copy_reads_only_present_pages(
    fake: FakeProcess, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy's read plan: present pages are read, swapped and untouched ones read as
    zeros in the copy without a read."""
    if native and heapcopy.native_loop() is None:
        pytest.skip("the C copy is not in use (not built here, or MEMFORENSICS_PURE_PYTHON)")
    if not native:
        monkeypatch.setattr(heapcopy, "_native", None)
    pool = BufferPool()
    with ProcessMemoryReader(PID) as mem:
        segment = Segment(0, 6 * PAGE, mem.pagemap(0, 6 * PAGE), pool)
        try:
            segment.view[:] = b"\xee" * len(segment.view)
            assert copy_into(mem, segment, 0, segment.length)
            copied = bytes(segment.view)
        finally:
            segment.close(pool)
            pool.close()
    assert copied == b"".join(_page(i) if i in (0, 3, 5) else bytes(PAGE) for i in range(6))


def test_page_map_of_swapped_entries_counts_them_as_not_resident() -> None:
    entries = b"".join(f.to_bytes(8, "little") for f in (PRESENT, SWAPPED, SWAPPED, PRESENT))
    pages = PageMap(0x10000, 0x10000 + 4 * PAGE, PAGE, entries)
    assert pages.resident_bytes(0x10000 + 100, 0x10000 + 4 * PAGE) == 2 * PAGE - 100
    assert pages.whole_pages_resident_bytes(0x10000, 0x10000 + 3 * PAGE) == PAGE


def test_a_pool_shrunk_keeps_its_smallest_buffers_within_the_bound() -> None:
    """BufferPool.shrink unmaps the biggest kept buffers first, down to the bytes asked."""
    page = 4096
    pool = BufferPool(copy_max_bytes=64 * page)
    buffers = [pool.take(pages * page) for pages in (1, 8, 2, 16)]
    for buffer in buffers:
        pool.give(buffer)
    assert pool.kept_bytes == 27 * page
    pool.shrink(11 * page)
    assert pool.kept_bytes == 11 * page  # the 16-page buffer went: 1 + 8 + 2 fit
    pool.shrink(10 * page)
    assert pool.kept_bytes == 3 * page  # then the 8-page one
    assert buffers[3].closed and buffers[1].closed
    assert not buffers[0].closed and not buffers[2].closed
    pool.shrink(0)
    assert pool.kept_bytes == 0 and all(buffer.closed for buffer in buffers)
    pool.close()


@pytest.mark.parametrize("shrunk_bytes", [4 * PAGE, 3 * PAGE + PAGE // 2])
def test_a_copy_whose_heap_shrank_and_grew_back_reads_zeros_where_it_grew(
    shrunk_bytes: int,
) -> None:
    """Segment.resize: a heap that shrinks and then grows back within one copy's life (two
    parts of an arena's read) has the bytes it grew by read as zeros, not those copied there
    before it shrank; what it kept is kept."""
    start = 0x10000

    def resident(length: int) -> PageMap:
        entries = PRESENT.to_bytes(8, "little") * (length // PAGE)
        return PageMap(start, start + length, PAGE, entries)

    pool = BufferPool()
    segment = Segment(start, start + 8 * PAGE, resident(8 * PAGE), pool)
    try:
        segment.view[:] = b"\xee" * len(segment.view)  # what the copy held before the shrink
        segment.resize(start + shrunk_bytes, resident(shrunk_bytes))
        segment.resize(start + 8 * PAGE, resident(8 * PAGE))
        grown = bytes(segment.view)
        assert grown[:shrunk_bytes] == b"\xee" * shrunk_bytes
        assert grown[shrunk_bytes:] == bytes(8 * PAGE - shrunk_bytes)
    finally:
        segment.close(pool)
        pool.close()
