"""Conservation and one definition per figure: every arena's free bytes in the dump are
measured, estimated or unaccounted, never silently anything else; the share is measured over
the dump's free bytes; advice and "free, released" come from measured bytes alone; the trim
figure follows glibc's systrim rules for the pad and the program break."""

from __future__ import annotations

from dataclasses import replace

from memforensics.analysis.residency import (
    residency_advice,
    residency_figures,
    waterfall,
)
from memforensics.analysis.residency_build import build_residency, conservation_tolerance_bytes
from memforensics.analysis.trim_forecast import forecast_trim
from memforensics.model import glibc
from memforensics.model.heap import SizeBucket
from memforensics.model.heapscan import ArenaScan
from memforensics.model.process import HeapSegment, ProcessMemory
from memforensics.sources.glibc.glibc_walk import resident_runs
from memforensics.sources.proc.procmem import PageMap
from tests.unit.test_residency import (
    MIB,
    PAGE,
    SMALL,
    UNSORTED,
    _arena,
    _dump,
    _scan,
    _scan_arena,
)

HEAP = 0x555555559000
BIG = SizeBucket("bin", 198 * MIB + 1, 198 * MIB + 1, 198 * MIB + 1, 1)  # one large chunk


def _memory(anon: int) -> ProcessMemory:
    return ProcessMemory(anon + MIB, anon, MIB, 0, 0, anon, anon)


def test_a_walk_that_missed_the_big_chunk_is_not_called_walked_nor_released() -> None:
    """The demo's case: the walk chose its bins from a state read before gdb's call sorted
    the 198 MiB chunk into a large bin, so it measured only the small stuff. The dump's
    difference is unaccounted: not "released", not "in use", and the share says how little
    was measured."""
    main = _arena(0, buckets=(SMALL, BIG), top=64 * 1024, system=200 * MIB)
    dump = _dump(main)
    measured = SMALL.chunk_bytes + 64 * 1024
    scan = _scan(
        _scan_arena(
            is_main=True,
            segments=(HeapSegment(HEAP, 200 * MIB, 200 * MIB),),
            free_bytes=measured,
            free_resident_bytes=measured,
            chunks=1001,
            top_bytes=64 * 1024,
            top_resident_bytes=64 * 1024,
        )
    )
    residency = build_residency(dump, scan)
    row = residency.arenas[0]
    assert row.free_method == "partial" and not row.balanced
    assert row.unaccounted_bytes == BIG.chunk_bytes
    assert row.dump_free_bytes == row.measured_free_bytes + row.estimated_free_bytes + (
        row.unaccounted_bytes
    )
    assert residency.measured_share == measured / row.dump_free_bytes < 0.01
    flow = waterfall(_memory(201 * MIB), dump, residency)
    assert flow.get("free_not_resident") == 0  # nothing measured is gone
    assert flow.get("free_unaccounted") == BIG.chunk_bytes
    assert any("out of balance" in note for note in residency.notes)
    codes = {a.code for a in residency_advice(dump, residency)}
    assert "free-not-resident" not in codes


def test_conservation_holds_for_every_row_whatever_the_walk_found() -> None:
    """measured + estimated + unaccounted = the dump's free bytes, arena by arena, for a walk
    that found less, exactly as much, more, or left bins unmeasured."""
    arena = _arena(1, buckets=(SMALL, UNSORTED), top=MIB, system=16 * MIB)
    dump_free = SMALL.chunk_bytes + UNSORTED.chunk_bytes + MIB
    cases = [
        {"free_bytes": dump_free},
        {"free_bytes": dump_free - MIB},
        {"free_bytes": dump_free + 3 * MIB},
        {"free_bytes": SMALL.chunk_bytes + MIB, "unmeasured_bins": (1,)},
        {"free_bytes": SMALL.chunk_bytes + MIB + 5 * MIB, "unmeasured_bins": (1,)},
        {"free_bytes": MIB, "unmeasured_bins": (1, 32)},
    ]
    main = _arena(0, buckets=(), top=MIB, system=MIB)
    for fields in cases:
        scan = _scan(
            _scan_arena(is_main=True, free_bytes=MIB, top_bytes=MIB),
            _scan_arena(top_bytes=MIB, **fields),
        )
        row = build_residency(_dump(main, arena), scan).arenas[1]
        assert row.dump_free_bytes == dump_free
        total = row.measured_free_bytes + row.estimated_free_bytes + row.unaccounted_bytes
        assert total == dump_free, fields
        assert row.estimated_free_bytes >= 0
        assert row.balanced == (
            abs(row.unaccounted_bytes) <= conservation_tolerance_bytes(dump_free)
        )
        assert 0.0 <= row.measured_share <= 1.0


def test_the_share_never_exceeds_what_was_measured_of_the_dump() -> None:
    """A surplus in one arena does not hide a shortfall in another."""
    main = _arena(0, buckets=(SMALL,), top=MIB, system=8 * MIB)
    other = _arena(1, buckets=(SMALL,), top=MIB, system=8 * MIB)
    per_arena = SMALL.chunk_bytes + MIB
    scan = _scan(
        _scan_arena(is_main=True, free_bytes=3 * per_arena, top_bytes=MIB),  # found more
        _scan_arena(free_bytes=MIB, top_bytes=MIB),  # found only its top
    )
    residency = build_residency(_dump(main, other), scan)
    assert residency.measured_share == (per_arena + MIB) / (2 * per_arena)
    assert residency_figures(_dump(main, other), residency).measured_share < 1.0


def test_estimated_bins_take_the_heaps_residency_when_few_bytes_were_measured() -> None:
    """One resident chunk walked is no sample for 4 MiB of unmeasured bins: their residency
    follows the arena's heap pages, not that chunk."""
    arena = _arena(1, buckets=(SMALL, UNSORTED), top=0, system=16 * MIB)
    scan = _scan(
        _scan_arena(is_main=True, free_bytes=0),
        _scan_arena(
            segments=(HeapSegment(0x7F0000000000, 16 * MIB, 4 * MIB),),  # a quarter resident
            free_bytes=SMALL.chunk_bytes,
            free_resident_bytes=SMALL.chunk_bytes,
            unmeasured_bins=(1,),
        ),
    )
    row = build_residency(_dump(_arena(0, buckets=(), top=0, system=MIB), arena), scan).arenas[1]
    assert row.estimated_free_bytes == UNSORTED.chunk_bytes
    assert row.free_resident_bytes == SMALL.chunk_bytes + UNSORTED.chunk_bytes // 4


def _top_scan(top: int, *, resident: bool = True) -> ArenaScan:
    runs = ((HEAP, HEAP + top),) if resident else ()
    return _scan_arena(
        is_main=True,
        segments=(HeapSegment(HEAP, top, top if resident else 0),),
        free_bytes=top,
        free_resident_bytes=top if resident else 0,
        top_bytes=top,
        top_resident_bytes=top if resident else 0,
        top_address=HEAP,
        top_resident_runs=runs,
    )


def test_the_pad_is_kept_by_the_forecast_as_systrim_keeps_it() -> None:
    """A 40 MiB resident main top trimmed with pad 32 MiB gives back about 8 MiB, not 40."""
    top = 40 * MIB
    dump = _dump(_arena(0, buckets=(), top=top, system=top))
    for pad, expected in ((0, glibc.systrim_release_bytes(top, PAGE)), (32 * MIB, None)):
        residency = build_residency(dump, _scan(_top_scan(top)), pad_bytes=pad)
        forecast = forecast_trim(dump, residency, page_bytes=PAGE, pad_bytes=pad)
        want = expected if expected is not None else (top - glibc.MINSIZE - 1 - pad) // PAGE * PAGE
        assert forecast.releasable_bytes == want
        assert residency.pad_bytes == pad
    assert 8 * MIB - 2 * PAGE <= want <= 8 * MIB
    assert glibc.systrim_release_bytes(top, PAGE, top) == 0


def test_a_released_top_forecasts_nothing() -> None:
    top = 40 * MIB
    dump = _dump(_arena(0, buckets=(), top=top, system=top))
    residency = build_residency(dump, _scan(_top_scan(top, resident=False)))
    assert forecast_trim(dump, residency, page_bytes=PAGE).releasable_bytes == 0
    assert residency_figures(dump, residency).free_released_bytes == top


def test_a_thread_arenas_resident_top_is_not_called_fragmentation() -> None:
    """malloc_trim leaves a thread arena's top (only free() shrinks it), and it is no hole
    between live blocks: one story, the same in every output."""
    top = 60 * MIB
    dump = _dump(
        _arena(0, buckets=(), top=0, system=MIB), _arena(1, buckets=(), top=top, system=64 * MIB)
    )
    scan = _scan(
        _scan_arena(is_main=True, free_bytes=0),
        _scan_arena(
            segments=(HeapSegment(0x7F0000000000, 64 * MIB, 64 * MIB),),
            free_bytes=top,
            free_resident_bytes=top,
            top_bytes=top,
            top_resident_bytes=top,
            chunks=1,
        ),
    )
    residency = build_residency(dump, scan)
    codes = {a.code for a in residency_advice(dump, residency)}
    assert "free-resident-fragmented" not in codes and "trim-would-release" not in codes
    assert "thread-arena-tops" in codes
    assert residency_figures(dump, residency).trimmable_bytes == 0
    assert forecast_trim(dump, residency, page_bytes=PAGE).releasable_bytes == 0


def test_every_waterfall_line_says_how_it_was_obtained() -> None:
    main = _arena(0, buckets=(SMALL,), top=MIB, system=8 * MIB)
    scan = _scan(_scan_arena(is_main=True, free_bytes=SMALL.chunk_bytes + MIB, top_bytes=MIB))
    flow = waterfall(_memory(9 * MIB), _dump(main), build_residency(_dump(main), scan))
    kinds = {line.key: line.kind for line in flow.lines}
    assert kinds["arena_in_use"] == "difference" and kinds["other_anon"] == "difference"
    assert kinds["arena_free_resident"] == "measured" and kinds["rss"] == "measured"
    assert set(kinds.values()) <= {"measured", "estimated", "difference"}


def test_resident_runs_list_the_present_pages_of_a_span() -> None:
    """The top's runs come from pagemap's present bits, whole pages inside the span only."""
    present = [1, 1, 0, 1, 0, 0, 1, 1]
    entries = b"".join((1 << 63 if p else 0).to_bytes(8, "little") for p in present)
    pages = PageMap(HEAP, HEAP + 8 * PAGE, PAGE, entries)
    runs = resident_runs(pages, HEAP + 100, HEAP + 8 * PAGE, 16)
    assert runs == (
        (HEAP + PAGE, HEAP + 2 * PAGE),
        (HEAP + 3 * PAGE, HEAP + 4 * PAGE),
        (HEAP + 6 * PAGE, HEAP + 8 * PAGE),
    )
    assert resident_runs(pages, HEAP, HEAP + 8 * PAGE, 2) is None
    assert glibc.runs_bytes_within(runs or (), HEAP + 7 * PAGE, HEAP + 8 * PAGE) == PAGE


def test_a_top_away_from_the_program_break_is_not_trimmable() -> None:
    """systrim shrinks the heap only when the top ends at the break: a main arena that fell
    back to mmap keeps its top, and the forecast says so."""
    top = 40 * MIB
    dump = _dump(_arena(0, buckets=(), top=top, system=top))
    at_brk = build_residency(dump, _scan(_top_scan(top)))
    assert forecast_trim(dump, at_brk, page_bytes=PAGE).releasable_bytes > 39 * MIB
    away = build_residency(dump, _scan(replace(_top_scan(top), top_at_brk=False)))
    assert forecast_trim(dump, away, page_bytes=PAGE).releasable_bytes == 0
    assert away.arenas[0].top_at_brk is False
