"""malloc_info called without gdb against the target's own (sources.glibc.called_malloc_info):
equal arena by arena but for the calling thread's, which the calls' two small allocations
(the fmemopen FILE and its cookie) may change."""

from __future__ import annotations

import re

# The calls' own allocations in the caller's arena: the FILE (a ~0x110-byte chunk) and its
# cookie (a 48-byte chunk), taken from its free chunks (or its top) before malloc_info.
CALLS_BYTES = 1024


def heaps(xml: str) -> list[str]:
    return re.findall(r'<heap nr="\d+">.*?</heap>', xml, flags=re.DOTALL)


def _lines(text: str, *marks: str) -> list[str]:
    return [line for line in text.splitlines() if any(mark in line for mark in marks)]


def _free_bytes(heap: str) -> int:
    pattern = r'<total type="(?:fast|rest)" count="\d+" size="(\d+)"/>'
    return sum(int(size) for size in re.findall(pattern, heap))


def assert_equal_but_the_callers_arena(called: str, own: str) -> int:
    """Every arena of ``called`` equal line for line to ``own``'s but at most one, whose
    system and aspace figures are equal and whose free bytes are fewer by at most
    CALLS_BYTES; the mmap and system totals equal. Returns how many arenas were equal."""
    mine, theirs = heaps(called), heaps(own)
    assert len(mine) == len(theirs) >= 1
    differ = [i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b]
    assert len(differ) <= 1, differ
    for index in differ:
        marks = ("<system", "<aspace")
        assert _lines(mine[index], *marks) == _lines(theirs[index], *marks)
        taken = _free_bytes(theirs[index]) - _free_bytes(mine[index])
        assert 0 <= taken <= CALLS_BYTES, taken
    tail_marks = ('type="mmap"', "<system", "<aspace")
    tail = _lines(called.rsplit("</heap>", maxsplit=1)[-1], *tail_marks)
    assert tail == _lines(own.rsplit("</heap>", maxsplit=1)[-1], *tail_marks)
    return len(mine) - len(differ)
