"""Which loop walks a window: the C one wherever every page of the window is in RAM, even when
a page elsewhere in the heap is not (a main heap's top is often partly untouched): one absent
page must not send every window of a gigabyte heap to the Python loop. The chunks visited are
the same either way.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

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


def _walk(absent_page: int | None) -> tuple[list[int], list[str]]:
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
    walk._native_headers = lambda w, at: (loops.append("C"), native(w, at))[1]  # type: ignore[method-assign]
    walk._python_headers = lambda w, at: (loops.append("Python"), python(w, at))[1]  # type: ignore[method-assign]
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
