"""The report of a corrupt heap (render.corruption): an arena is complete only where every
bin was read and none failed a check; one whose walk stopped early (the read's time ran out
in it) is not, though it names no bin."""

from __future__ import annotations

from memforensics.errors import HeapCorruptionError
from memforensics.model.corruption import HeapCorruption
from memforensics.model.heapscan import ArenaScan, HeapScan
from memforensics.render.corruption import corruption_document, corruption_html

_BAD = HeapCorruption(0x2000, "small bin 18", 0x2400, "smallbin double linked list", "bk", 1)


def _arena(address: int, **fields: object) -> ArenaScan:
    base: dict[str, object] = {
        "address": address,
        "is_main": False,
        "system_bytes": 1 << 20,
        "layout_ok": True,
        "segments": (),
        "walked": True,
    }
    return ArenaScan(**{**base, **fields})  # type: ignore[arg-type]


def _error() -> HeapCorruptionError:
    arenas = (
        _arena(0x1000, chunks=4, free_bytes=4096, bins=((18, 4, 4096),)),
        _arena(0x2000, unmeasured_bins=(18,), corruption=(_BAD,)),
        _arena(0x3000, budget_reached=True),  # its walk ran out of the read's time
        _arena(0x4000, walked=False),
    )
    scan = HeapScan(
        pid=42,
        page_bytes=4096,
        chained=True,
        arenas=arenas,
        heap_mapped_bytes=0,
        heap_resident_bytes=0,
        mmap_chunks=0,
        mmap_chunk_bytes=0,
        mmap_chunk_resident_bytes=0,
        stack_resident_bytes=0,
        anon_resident_bytes=0,
        walk_seconds=0.0,
        walk_budget_seconds=1.0,
    )
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
