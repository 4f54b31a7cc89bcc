"""heapmaps.read_residency: heaps' pagemaps read two at a time where they are big, each heap
given its own: the same PageMaps as read one by one, on mappings of this process with a
different set of pages in RAM in each."""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import time

import pytest

from memforensics.sources.glibc import heapmaps
from memforensics.sources.glibc.glibc_arenas import Heap
from memforensics.sources.proc.procmem import ProcessMemoryReader

PAGE = mmap.PAGESIZE
PAGES = 1 << 15  # 128 MiB of address space each: four of them past the parallel threshold


def test_each_heap_gets_its_own_residency_read_two_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mappings = [mmap.mmap(-1, PAGES * PAGE, flags=mmap.MAP_PRIVATE) for _ in range(4)]
    try:
        for number, mapping in enumerate(mappings):
            for page in range(number, PAGES, 97 + number):  # each its own pattern
                mapping[page * PAGE] = 1
        starts = [ctypes.addressof(ctypes.c_char.from_buffer(m)) for m in mappings]
        heaps = [Heap(start, 0, PAGES * PAGE, PAGES * PAGE) for start in starts]
        assert len(heaps) * PAGES >= heapmaps._PARALLEL_RESIDENCY_PAGES
        threads: set[str] = set()
        # The first two reads wait for each other: they pass only if two threads read at once.
        together = threading.Barrier(2, timeout=10)
        with ProcessMemoryReader(os.getpid()) as mem:
            expected = [mem.pagemap(h.start, h.start + h.mprotect_bytes) for h in heaps]
            pagemap = mem.pagemap

            def noted(start: int, end: int) -> object:
                threads.add(threading.current_thread().name)
                if start in starts[:2]:
                    together.wait()
                return pagemap(start, end)

            monkeypatch.setattr(mem, "pagemap", noted)
            heapmaps.read_residency(mem, heaps)
        assert threads == {threading.current_thread().name, "pagemap"}, threads
        for heap, want in zip(heaps, expected, strict=True):
            assert heap.pages is not None
            assert heap.pages.readable == want.readable
            assert heap.pages.resident_pages == want.resident_pages > 0
        assert len({h.pages.resident_pages for h in heaps if h.pages}) == len(heaps)
    finally:
        for mapping in mappings:
            mapping.close()


def test_a_failed_read_raises_once_both_threads_are_done(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unreadable pagemap raises as it would one by one, and no reader thread is left."""
    heaps = [
        Heap(start, 0, PAGES * PAGE, PAGES * PAGE)
        for start in range(0, 4 * PAGES * PAGE, PAGES * PAGE)
    ]
    with ProcessMemoryReader(os.getpid()) as mem:

        def failing(start: int, end: int) -> object:
            if start == heaps[2].start:
                raise PermissionError("pagemap")
            time.sleep(0.01)
            return None

        monkeypatch.setattr(mem, "pagemap", failing)
        with pytest.raises(PermissionError):
            heapmaps.read_residency(mem, heaps)
    assert not [t for t in threading.enumerate() if t.name == "pagemap"]


def test_small_heaps_are_read_one_by_one_in_this_thread() -> None:
    mapping = mmap.mmap(-1, 8 * PAGE, flags=mmap.MAP_PRIVATE)
    try:
        mapping[0] = 1
        start = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
        heaps = [Heap(start, 0, 4 * PAGE, 4 * PAGE), Heap(start + 4 * PAGE, 0, PAGE, 4 * PAGE)]
        with ProcessMemoryReader(os.getpid()) as mem:
            heapmaps.read_residency(mem, heaps)
        assert [h.pages.resident_pages if h.pages else None for h in heaps] == [1, 0]
    finally:
        mapping.close()
