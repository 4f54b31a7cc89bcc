"""The report of a corrupt heap (render.corruption): an arena is complete only where every
bin was read and none failed a check; one whose walk stopped early (the read's time ran out
in it) is not, though it names no bin."""

from __future__ import annotations

from memforensics.errors import HeapCorruptionError
from memforensics.model.corruption import HeapCorruption
from memforensics.render.corruption import corruption_document, corruption_html
from tests.support.heap_scans import arena_scan, heap_scan

_BAD = HeapCorruption(0x2000, "small bin 18", 0x2400, "smallbin double linked list", "bk", 1)


def _error() -> HeapCorruptionError:
    arenas = (
        arena_scan(0x1000, chunks=4, free_bytes=4096, bins=((18, 4, 4096),)),
        arena_scan(0x2000, unmeasured_bins=(18,), corruption=(_BAD,)),
        arena_scan(0x3000, budget_reached=True),  # its walk ran out of the read's time
        arena_scan(0x4000, walked=False),
    )
    scan = heap_scan(arenas, pid=42)
    return HeapCorruptionError("the heap is corrupt", (_BAD,), pid=42, partial=scan)


def test_an_arena_whose_walk_stopped_early_is_not_complete() -> None:
    document = corruption_document(_error())
    assert [a["complete"] for a in document["arenas"]] == [True, False, False, False]


def test_the_page_says_what_each_arena_left_unread() -> None:
    page = corruption_html(_error())
    rows = page.split("<tr>")[-4:]
    assert "<td>-</td>" in rows[0]
    assert "<td>18</td>" in rows[1]
    assert "the rest" in rows[2] and "<td>no</td>" in rows[2]
    assert "<td>all</td>" in rows[3]
