"""The searches of anonymous memory that no arena holds, on synthetic memory laid out as
glibc lays it out (a fake /proc/PID, tests/unit/test_page_selection.py): glibc's mmapped
chunks inside merged mappings, a main arena's segments mmapped when sbrk failed; and the
ELF class check that refuses 32-bit targets. The live cases are in
tests/integration/test_heap_layouts_live.py and tests/integration/test_target_32bit.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memforensics.sources.glibc import glibc_arenas
from memforensics.sources.glibc.glibc_arenas import ArenaState
from memforensics.sources.glibc.heap_search import (
    find_mmapped_chunks,
    main_arena_segments,
    subtract_spans,
)
from memforensics.sources.proc import procmem, target_check
from memforensics.sources.proc.procmem import ProcessMemoryReader
from tests.unit.test_page_selection import NONE, PAGE, PID, PRESENT, SWAPPED, FakeProcess


def test_subtract_spans() -> None:
    assert subtract_spans([(0, 100), (200, 300)], [(50, 60), (250, 400), (0, 10)]) == [
        (10, 50),
        (60, 100),
        (200, 250),
    ]


def test_mmapped_chunks_are_found_behind_other_memory_and_not_on_swapped_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One span as the kernel merges it: the program's own page, a chunk of 2 pages, a page
    that only looks like a header at an offset, a chunk of 1 page, a chunk whose header page
    is swapped (not read, so not found), then untouched memory."""
    monkeypatch.setattr(procmem, "PROC_ROOT", tmp_path)
    flags = [PRESENT] * 6 + [SWAPPED, PRESENT, NONE, NONE]
    fake = FakeProcess(tmp_path, flags)
    for page in range(len(flags)):
        fake.put(page * PAGE, 0x4141414141414141, 0x4242424242424242)  # no header
    fake.put(1 * PAGE, 0, 2 * PAGE | 2)
    fake.put(3 * PAGE + 16, 0, PAGE | 2)  # not at a page start: no mmapped chunk
    fake.put(4 * PAGE, 0, PAGE | 2)
    fake.put(5 * PAGE, 0, PAGE | 3)  # PREV_INUSE too: an arena's chunk, not an mmapped one
    fake.put(6 * PAGE, 0, 2 * PAGE | 2)  # swapped: its header is not read
    with ProcessMemoryReader(PID) as mem:
        chunks, complete = find_mmapped_chunks(mem, [(0, len(flags) * PAGE)], float("inf"))
    assert complete
    assert chunks == [(PAGE, 2 * PAGE), (4 * PAGE, PAGE)]


def test_a_main_arena_segment_is_found_from_a_bin_pointer_behind_other_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A span holding a foreign page, then a main-arena segment (two chunks and sysmalloc's
    two fenceposts at its end), then the segment holding the top: the first is found from
    a bin's pointer into it (a page at a time below it), the second right after it."""
    monkeypatch.setattr(procmem, "PROC_ROOT", tmp_path)
    fake = FakeProcess(tmp_path, [PRESENT] * 6)
    fake.put(0, 0x4141414141414141, 0x4242424242424242)
    segment = PAGE
    fake.put(segment, 0, 0x100 | 1)  # the segment's first chunk: in use
    free = segment + 0x100
    fake.put(free, 0, (2 * PAGE - 0x100 - 32) | 1)  # a free chunk in a bin
    fence = segment + 2 * PAGE - 32
    fake.put(fence, 2 * PAGE - 0x100 - 32, 16)  # PREV_INUSE clear: the chunk before is free
    fake.put(fence + 16, 0, 16 | 1)
    top = segment + 2 * PAGE
    fake.put(top, 0, 3 * PAGE | 1)
    bins = [0] * (2 * 127)
    bins[0] = bins[1] = free
    state = ArenaState(0x7F00_0000, top, 0x7F00_0000, 6 * PAGE, tuple(bins), (0,) * 10, 2)
    with ProcessMemoryReader(PID) as mem:
        found = main_arena_segments(mem, [(0, 6 * PAGE)], state, float("inf"))
    assert found == [(segment, segment + 2 * PAGE), (top, top + 3 * PAGE)]
    assert glibc_arenas.NONCONTIGUOUS_BIT & state.flags


def test_elf_class_of_a_32bit_and_a_64bit_header(tmp_path: Path) -> None:
    """The refusal of 32-bit targets reads EI_CLASS (check_target; live test in
    tests/integration/test_target_32bit.py)."""
    (tmp_path / "i386").write_bytes(b"\x7fELF\x01\x01\x01" + bytes(57))
    (tmp_path / "x86_64").write_bytes(b"\x7fELF\x02\x01\x01" + bytes(57))
    (tmp_path / "script").write_bytes(b"#!/bin/sh\n")
    assert target_check.elf_class(tmp_path / "i386") == target_check.ELFCLASS32
    assert target_check.elf_class(tmp_path / "x86_64") == 2
    assert target_check.elf_class(tmp_path / "script") is None
    assert target_check.elf_class(tmp_path / "missing") is None


def test_a_chunk_inside_a_segment_that_looks_like_its_first_is_not_taken_for_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread stack's page, then a segment: an in-use chunk of two pages whose last word
    is 0, then a free chunk at a page start (prev_size 0, PREV_INUSE: shaped like a first
    chunk) that a bin points at, then the fenceposts. The segment starts at the in-use
    chunk, not at the free one (the seed's nearest page), and is found once."""
    monkeypatch.setattr(procmem, "PROC_ROOT", tmp_path)
    fake = FakeProcess(tmp_path, [PRESENT] * 5)
    fake.put(0, 0x4141414141414141, 0x4242424242424242)
    segment = PAGE
    fake.put(segment, 0, 2 * PAGE | 1)
    fake.put(segment + 16, *([0x6161616161616161] * (2 * PAGE // 8 - 4)))
    fake.put(segment + 2 * PAGE - 16, 0, 0)  # the in-use chunk's last word; the next header
    free = segment + 2 * PAGE
    fake.put(free, 0, (PAGE - 32) | 1)
    fence = free + PAGE - 32
    fake.put(fence, PAGE - 32, 16)
    fake.put(fence + 16, 0, 16 | 1)
    bins = [0] * (2 * 127)
    bins[0] = bins[1] = free
    state = ArenaState(0x7F00_0000, 0x7E00_0000, 0x7F00_0000, 3 * PAGE, tuple(bins), (0,) * 10, 2)
    with ProcessMemoryReader(PID) as mem:
        found = main_arena_segments(mem, [(0, 5 * PAGE)], state, float("inf"))
    assert found == [(segment, segment + 3 * PAGE)]
