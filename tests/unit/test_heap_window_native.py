"""Which loop walks a window: the C one wherever every page of the window is in RAM, even when
a page elsewhere in the heap is not (a main heap's top is often partly untouched): one absent
page must not send every window of a gigabyte heap to the Python loop. The chunks visited are
the same either way.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import pytest

from memforensics.sources.glibc import heap_window
from memforensics.sources.glibc.heap_lists import Tcache
from memforensics.sources.glibc.heap_window import ChunkRef, HeapWalk
from memforensics.sources.proc.procmem import PageMap

START = 0x5555_0000_0000
PAGE = 4096
CHUNK_BYTES = 1008
CHUNKS = 3000  # about 2.9 MiB: three windows of 1 MiB
PRESENT = 1 << 63


class _Memory:
    """The heap's bytes; a page the pagemap says is absent reads as zeros."""

    page_bytes = PAGE

    def __init__(self, heap: bytearray) -> None:
        self.heap = heap

    def read_present(self, address: int, length: int, present: bytes | None = None) -> bytes:
        return bytes(self.heap[address - START : address - START + length])


def _walk(
    absent_page: int | None, python_from: list[int] | None = None
) -> tuple[list[int], list[str]]:
    """The chunks visited by a walk of the laid-out heap (the page ``absent_page`` not in
    RAM), and the loop that walked each window's headers (the address each Python loop
    began at appended to ``python_from``)."""
    heap = bytearray(CHUNKS * CHUNK_BYTES + PAGE)  # (the last page: past the chunks)
    for i in range(CHUNKS):
        struct.pack_into("<QQ", heap, i * CHUNK_BYTES, 0, CHUNK_BYTES | 1)
    pages = len(heap) // PAGE
    entries = b"".join(
        struct.pack("<Q", 0 if page == absent_page else PRESENT) for page in range(pages)
    )
    pagemap = PageMap(START, START + pages * PAGE, PAGE, entries)
    visited: list[int] = []
    loops: list[str] = []

    def visit(
        ref: ChunkRef,
        view: memoryview,
        base: int,
        addresses: Sequence[int],
        sizes: Sequence[int],
        states: bytes | bytearray,
    ) -> None:
        visited.extend(addresses)

    walk = HeapWalk(
        _Memory(heap),  # type: ignore[arg-type]
        ChunkRef(0, 0, pagemap),
        START,
        START + CHUNKS * CHUNK_BYTES,
        lambda: START + (CHUNKS - 1) * CHUNK_BYTES,  # the last chunk is the arena's top
        set(),
        Tcache(keys=set(), structs=set()),
        visit,
        keep=True,
        retry=True,
    )
    native, python = walk._native_headers, walk._python_headers

    def in_c(w: Any, at: int) -> tuple[int, int]:
        loops.append("C")
        return native(w, at)

    def in_python(w: Any, at: int) -> tuple[int, int]:
        loops.append("Python")
        if python_from is not None:
            python_from.append(at)
        return python(w, at)

    walk._native_headers = in_c  # type: ignore[method-assign]
    walk._python_headers = in_python  # type: ignore[method-assign]
    while not walk.done:
        window = walk.read_window()
        if window is None:
            break
        walk.walk_window(*window)
    return visited, loops


def test_an_absent_page_in_the_last_window_leaves_the_others_to_the_c_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if heap_window._native is None:
        pytest.fail("the C loop (_heapwindow) is not built: setup.py build_ext")
    monkeypatch.setattr(heap_window, "WINDOW_SECONDS", 0.0)  # one piece per window
    every, every_loops = _walk(None)
    # The page holding the top's last bytes: in the last window, past every header.
    visited, loops = _walk(absent_page=CHUNKS * CHUNK_BYTES // PAGE)
    assert every_loops and set(every_loops) == {"C"}
    # The absent page lies in the last window only: the windows before it are the C loop's.
    assert loops[: len(loops) - 1] and set(loops[: len(loops) - 1]) == {"C"}, loops
    # The same chunks, but the top, whose end lies on the absent page.
    assert sorted(visited) == sorted(every)[: len(visited)] and len(visited) == len(every) - 1


def test_a_window_with_a_page_not_in_ram_is_walked_in_c_up_to_that_page(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A page not in RAM in the middle of a window (a header on it: the walk stops there): the
    headers before it are the C loop's, the Python loop takes over from the chunk whose next
    header lies on it, and the chunks visited are those the Python loop alone visits."""
    if heap_window._native is None:
        pytest.fail("the C loop (_heapwindow) is not built: setup.py build_ext")
    monkeypatch.setattr(heap_window, "WINDOW_SECONDS", 0.0)  # one piece per window
    absent = CHUNKS * CHUNK_BYTES // PAGE // 2  # halfway up the heap: inside a window
    python_from: list[int] = []
    visited, loops = _walk(absent_page=absent, python_from=python_from)
    monkeypatch.setattr(heap_window, "_native", None)
    python_alone, python_loops = _walk(absent_page=absent)
    assert set(python_loops) == {"Python"}
    assert visited == python_alone
    # The walk stops at the header on that page: the last chunk visited ends on it or before.
    assert visited and max(visited) < START + (absent + 1) * PAGE, hex(max(visited))
    assert max(visited) + 2 * CHUNK_BYTES > START + absent * PAGE
    # The window with the page: the C loop first, then the Python loop from the chunk whose
    # next header lies on that page, nothing after it.
    assert loops[-2:] == ["C", "Python"] and set(loops[:-2]) == {"C"}, loops
    assert len(python_from) == 1 and python_from[0] > START + absent * PAGE - CHUNK_BYTES - 16
