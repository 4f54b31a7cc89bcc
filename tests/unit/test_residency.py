"""The pure side of residency: waterfall arithmetic, advice, the XML trim estimate, renderers."""

from __future__ import annotations

from dataclasses import replace
from io import StringIO

import pytest
from rich.console import Console

from memforensics.analysis.heap import analyze
from memforensics.analysis.residency import one_verdict, residency_advice, waterfall
from memforensics.analysis.residency_build import build_residency
from memforensics.analysis.trim_forecast import estimate_arena_releasable, forecast_trim
from memforensics.model import glibc
from memforensics.model.heap import Arena, HeapDump, SizeBucket
from memforensics.model.heapscan import ArenaScan, HeapScan
from memforensics.model.process import (
    AllocatorInfo,
    ArenaResidency,
    HeapResidency,
    HeapSegment,
    ProcessFacts,
    ProcessMemory,
)
from memforensics.render.process import render_process_header, render_waterfall
from memforensics.render.process_json import process_json, residency_json, waterfall_json
from tests.support.heap_scans import arena_scan, heap_scan
from tests.support.schema import missing_keys

MIB = 1024 * 1024
PAGE = 4096


def _arena(index: int, *, buckets: tuple[SizeBucket, ...], top: int, system: int) -> Arena:
    rest = sum(b.total_bytes for b in buckets) + top
    return Arena(
        index=index,
        sizes=buckets,
        fast_chunks=0,
        fast_bytes=0,
        rest_chunks=1 + sum(b.count for b in buckets),
        rest_bytes=rest,
        system_bytes=system,
        system_max_bytes=system,
    )


def _dump(*arenas: Arena, mmap_bytes: int = 0) -> HeapDump:
    return HeapDump(
        version="1",
        arenas=arenas,
        fast_chunks=0,
        fast_bytes=0,
        rest_chunks=sum(a.rest_chunks for a in arenas),
        rest_bytes=sum(a.rest_bytes for a in arenas),
        mmap_chunks=1 if mmap_bytes else 0,
        mmap_bytes=mmap_bytes,
        system_bytes=sum(a.system_bytes for a in arenas),
        system_max_bytes=sum(a.system_bytes for a in arenas),
    )


def _residency(*rows: ArenaResidency, heap_resident: int, anon: int) -> HeapResidency:
    return HeapResidency(
        pid=1,
        page_bytes=PAGE,
        method="arena-chain",
        arenas=rows,
        heap_mapped_bytes=sum(r.mapped_bytes for r in rows),
        heap_resident_bytes=heap_resident,
        mmap_chunk_bytes=MIB,
        mmap_chunk_resident_bytes=MIB,
        stack_resident_bytes=64 * 1024,
        other_anon_resident_bytes=128 * 1024,
        anon_resident_bytes=anon,
    )


# One 200 MiB free chunk (odd bin values: glibc's PREV_INUSE artefact) and a 64 KiB top.
BIG = SizeBucket("unsorted", 200 * MIB + 1, 200 * MIB + 1, 200 * MIB + 1, 1)
DEMO_ARENA = _arena(0, buckets=(BIG,), top=64 * 1024, system=201 * MIB)


def test_estimate_counts_whole_pages_of_big_chunks_only() -> None:
    """A chunk under two pages yields nothing on average; a huge one ~ all its pages."""
    small = SizeBucket("bin", 1025, 1025, 1025 * 100, 100)
    assert (
        estimate_arena_releasable(
            _arena(1, buckets=(small,), top=0, system=MIB), 1.0, page_bytes=PAGE
        )
        == 0
    )
    big = estimate_arena_releasable(
        _arena(1, buckets=(BIG,), top=0, system=201 * MIB), 1.0, page_bytes=PAGE
    )
    assert 200 * MIB - 2 * PAGE <= big <= 200 * MIB
    # Half resident: half the release; the main arena's top adds its pages beyond MINSIZE.
    half = estimate_arena_releasable(DEMO_ARENA, 0.5, page_bytes=PAGE)
    assert abs(half - (big + 15 * PAGE) / 2) <= PAGE


def test_forecast_prefers_measured_arenas_and_reports_gone_free() -> None:
    """Measured arenas use the walk; after a trim nothing is resident, so ~0 is forecast."""
    dump = _dump(DEMO_ARENA)
    before = ArenaResidency(
        0, 0x1000, (HeapSegment(0, 201 * MIB, 201 * MIB),), 200 * MIB, "walked", 199 * MIB
    )
    fc = forecast_trim(
        dump, _residency(before, heap_resident=201 * MIB, anon=203 * MIB), page_bytes=PAGE
    )
    assert fc.measured and fc.releasable_bytes == 199 * MIB
    after = ArenaResidency(
        0,
        0x1000,
        (HeapSegment(0, 201 * MIB, MIB),),
        4096,
        "walked",
        0,
        measured_free_bytes=200 * MIB + 64 * 1024,
        measured_resident_bytes=4096,
        dump_free_bytes=200 * MIB + 64 * 1024,
    )
    fc = forecast_trim(dump, _residency(after, heap_resident=MIB, anon=3 * MIB), page_bytes=PAGE)
    assert fc.releasable_bytes == 0
    assert fc.free_not_resident_bytes is not None
    assert fc.free_not_resident_bytes > 199 * MIB
    # Not walked: the XML estimate, scaled by the measured resident share of the free bytes.
    unwalked = ArenaResidency(0, None, (HeapSegment(0, 201 * MIB, MIB),), 4096, "estimate")
    fc = forecast_trim(dump, _residency(unwalked, heap_resident=MIB, anon=3 * MIB), page_bytes=PAGE)
    assert not fc.measured and fc.releasable_bytes < 64 * 1024
    assert any("estimated from the XML" in note for note in fc.notes)


def test_waterfall_parts_sum_to_anonymous_and_advice() -> None:
    dump = _dump(DEMO_ARENA, mmap_bytes=MIB)
    row = ArenaResidency(
        0, 0x1000, (HeapSegment(0, 201 * MIB, 201 * MIB),), 200 * MIB, "walked", 199 * MIB, 1
    )
    residency = _residency(row, heap_resident=201 * MIB, anon=202 * MIB + 192 * 1024)
    memory = ProcessMemory(
        rss_bytes=210 * MIB,
        anon_bytes=203 * MIB,
        file_bytes=7 * MIB,
        shmem_bytes=0,
        swap_bytes=0,
        pss_bytes=209 * MIB,
        uss_bytes=205 * MIB,
    )
    wf = waterfall(memory, dump, residency)
    assert wf.get("arena_in_use") == MIB
    assert wf.get("arena_free_resident") == 200 * MIB
    # Each part comes from its own source figure, not from the others.
    assert wf.get("mmap_chunks") == MIB  # the walk's resident mmapped chunks
    assert (wf.get("stacks"), wf.get("other_anon")) == (64 * 1024, 128 * 1024)
    # The parts classify the anonymous pages of one smaps/pagemap pass, so what stays
    # unexplained is exactly how far the rollup read (another instant) differs from that pass.
    assert memory.anon_bytes is not None
    assert wf.get("unexplained") == memory.anon_bytes - residency.anon_resident_bytes
    codes = [a.code for a in residency_advice(dump, residency)]
    assert codes == ["trim-would-release"]


def test_unknown_anonymous_gives_unknown_unexplained_not_zero() -> None:
    dump = _dump(DEMO_ARENA)
    row = ArenaResidency(0, None, (HeapSegment(0, 201 * MIB, MIB),), None, "estimate")
    memory = ProcessMemory(None, None, None, None, None, None, None)
    wf = waterfall(memory, dump, _residency(row, heap_resident=MIB, anon=MIB))
    assert wf.get("unexplained") is None
    assert wf.get("rss") is None
    assert any(line.estimate for line in wf.lines if line.key == "arena_free_resident")


def test_renderers_and_json() -> None:
    facts = ProcessFacts(
        pid=4242,
        name="svc",
        cmdline=("/usr/bin/svc", "--serve"),
        uid=1000,
        threads=16,
        state="S",
        allocator=AllocatorInfo("glibc", "glibc malloc (libc.so.6)", "/lib/libc.so.6", "2.36"),
        tracer_pid=0,
    )
    memory = ProcessMemory(210 * MIB, 203 * MIB, 7 * MIB, 0, 0, 209 * MIB, 205 * MIB)
    row = ArenaResidency(
        0, 0x1000, (HeapSegment(0x5000, 201 * MIB, 201 * MIB),), 200 * MIB, "walked", 199 * MIB, 1
    )
    residency = _residency(row, heap_resident=201 * MIB, anon=203 * MIB)
    wf = waterfall(memory, _dump(DEMO_ARENA), residency)
    out = StringIO()
    console = Console(file=out, width=100, color_system=None)
    console.print(render_process_header(facts, memory, pause_seconds=0.014))
    console.print(render_waterfall(wf))
    text = out.getvalue()
    assert "PID 4242 svc" in text and "paused 14 ms" in text and "glibc 2.36" in text
    assert "RSS 210.0 MiB" in text
    assert "Where the RSS went" in text
    assert "arenas: free, resident" in text and "200.0 MiB" in text and "95%" in text
    assert "not in RSS" in text
    doc = process_json(facts, memory)
    assert doc["pid"] == 4242 and doc["rss_bytes"] == 210 * MIB and doc["anon_bytes"] == 203 * MIB
    assert doc["glibc_version"] == "2.36" and doc["allocator"] == "glibc"
    wdoc = waterfall_json(wf)
    assert wdoc["arena_free_resident_bytes"] == 200 * MIB
    assert all(isinstance(line["bytes"], int) for line in wdoc["lines"])
    rdoc = residency_json(residency)
    assert rdoc["arenas"][0]["trimmable_bytes"] == 199 * MIB
    assert rdoc["arenas"][0]["segments"][0]["start"] == "0x5000"


def test_after_a_trim_the_report_gives_one_verdict_from_the_residency() -> None:
    """Bug (issue 9): after a trim, inspect said both "99 MiB ... malloc_trim returns their
    whole pages" (from the XML) and "99 MiB of it is no longer resident" (from the
    residency). With a residency the trim verdict comes from it alone."""
    big = SizeBucket("unsorted", 99 * MIB + 1, 99 * MIB + 1, 99 * MIB + 1, 1)
    dump = _dump(_arena(0, buckets=(big,), top=64 * 1024, system=100 * MIB))
    after_trim = ArenaResidency(
        0,
        0x1000,
        (HeapSegment(0, 100 * MIB, MIB),),
        64 * 1024,
        "walked",
        0,
        measured_free_bytes=99 * MIB + 64 * 1024,
    )
    residency = _residency(after_trim, heap_resident=MIB, anon=2 * MIB)
    xml_codes = [a.code for a in analyze(dump).advice]
    assert "trim-would-release" in xml_codes  # the XML alone cannot know the pages are gone
    codes = [a.code for a in one_verdict(analyze(dump).advice, residency_advice(dump, residency))]
    assert "free-not-resident" in codes
    assert "trim-would-release" not in codes
    # Without a residency the XML's verdict stands (one source, still one verdict).
    assert one_verdict(analyze(dump).advice, None) == analyze(dump).advice
    # Before a trim, the residency says "would release" and the XML's copy is dropped.
    before = ArenaResidency(
        0, 0x1000, (HeapSegment(0, 100 * MIB, 100 * MIB),), 99 * MIB, "walked", 98 * MIB
    )
    both = one_verdict(
        analyze(dump).advice,
        residency_advice(dump, _residency(before, heap_resident=100 * MIB, anon=101 * MIB)),
    )
    assert [a.code for a in both].count("trim-would-release") == 1
    # "Free memory in chunks too small to trim": the XML's small-free-chunks cannot know
    # which pages are resident; with a residency only free-resident-fragmented may say it.
    small = SizeBucket("bin", 513, 513, 513 * 80_000, 80_000)
    fragmented = _dump(_arena(0, buckets=(small,), top=0, system=80 * MIB))
    assert "small-free-chunks" in [a.code for a in analyze(fragmented).advice]
    gone = ArenaResidency(0, 0x1000, (HeapSegment(0, 80 * MIB, MIB),), 0, "walked", 0)
    verdict = one_verdict(
        analyze(fragmented).advice,
        residency_advice(fragmented, _residency(gone, heap_resident=MIB, anon=2 * MIB)),
    )
    assert "small-free-chunks" not in [a.code for a in verdict]


def _scan_arena(**fields: object) -> ArenaScan:
    segments = (HeapSegment(0x7F0000000000, 8 * MIB, 8 * MIB),)
    return arena_scan(0x7F0000000030, **{"system_bytes": 8 * MIB, "segments": segments, **fields})


def _scan(*arenas: ArenaScan, chained: bool = True, budget: float = 3.0) -> HeapScan:
    resident_bytes = sum(s.resident_bytes for a in arenas for s in a.segments)
    return heap_scan(
        arenas,
        page_bytes=PAGE,
        chained=chained,
        heap_mapped_bytes=sum(s.mapped_bytes for a in arenas for s in a.segments),
        heap_resident_bytes=resident_bytes,
        anon_resident_bytes=resident_bytes,
        walk_seconds=0.5,
        walk_budget_seconds=budget,
    )


SMALL = SizeBucket("bin", 513, 513, 513 * 1000, 1000)  # bin 32
LARGE = SizeBucket("bin", 20481, 24577, 22529 * 100, 100)  # one large bin
UNSORTED = SizeBucket("unsorted", 33, 9000, 4 * MIB + 50, 50)


def test_a_moving_bin_is_estimated_alone_and_the_share_is_reported() -> None:
    """One bin of one arena kept moving: that bin (and only it) comes from the XML's line
    for it; the rest of the arena and the other arenas stay measured."""
    arena1 = _arena(1, buckets=(SMALL, LARGE, UNSORTED), top=MIB, system=8 * MIB)
    arena2 = _arena(2, buckets=(SMALL,), top=MIB, system=8 * MIB)
    main = _arena(0, buckets=(), top=MIB, system=8 * MIB)
    dump = _dump(main, arena1, arena2)
    measured1 = SMALL.chunk_bytes + LARGE.chunk_bytes + MIB
    scan = _scan(
        _scan_arena(is_main=True, free_bytes=MIB, free_resident_bytes=MIB, top_bytes=MIB),
        _scan_arena(
            free_bytes=measured1,
            free_resident_bytes=measured1,
            trimmable_bytes=1234 * PAGE,
            chunks=1100,
            unmeasured_bins=(1,),
            retries=4,
            top_bytes=MIB,
            top_resident_bytes=MIB,
        ),
        _scan_arena(
            free_bytes=SMALL.chunk_bytes + MIB,
            free_resident_bytes=SMALL.chunk_bytes + MIB,
            chunks=1000,
            top_bytes=MIB,
        ),
    )
    residency = build_residency(dump, scan)
    assert residency.method == "arena-chain"
    row1 = residency.arena(1)
    assert row1 is not None and row1.free_method == "partial"
    assert row1.estimated_bins == (1,)
    assert row1.estimated_free_bytes == UNSORTED.chunk_bytes
    assert row1.measured_free_bytes == measured1
    # Fully resident arena: the estimated part is taken as resident too.
    assert row1.free_resident_bytes == measured1 + UNSORTED.chunk_bytes
    assert row1.trimmable_bytes is not None and row1.trimmable_bytes > 1234 * PAGE
    assert row1.estimated_trimmable_bytes == row1.trimmable_bytes - 1234 * PAGE
    assert [r.free_method for r in residency.arenas] == ["walked", "partial", "walked"]
    total = residency.measured_free_bytes + residency.estimated_free_bytes
    assert residency.estimated_free_bytes == UNSORTED.chunk_bytes
    assert residency.measured_share == pytest.approx(1 - UNSORTED.chunk_bytes / total)
    assert any("1 arena partly estimated" in note for note in residency.notes)
    forecast = forecast_trim(dump, residency, page_bytes=PAGE)
    assert not forecast.measured
    assert forecast.estimated_bytes == row1.estimated_trimmable_bytes
    assert forecast.measured_share == residency.measured_share
    assert any(note.startswith("error bar:") for note in forecast.notes)


def test_many_arenas_out_of_budget_give_one_note_not_one_each() -> None:
    """Issue 10: 1,146 arenas whose walk ran out of time are one note, not 1,146."""
    arenas = [_arena(0, buckets=(), top=MIB, system=8 * MIB)]
    scans = [_scan_arena(is_main=True, free_bytes=MIB, top_bytes=MIB)]
    for index in range(1, 1501):
        arenas.append(_arena(index, buckets=(SMALL,), top=0, system=8 * MIB))
        late = index > 354
        scans.append(
            _scan_arena(
                free_bytes=0 if late else SMALL.chunk_bytes,
                free_resident_bytes=0 if late else SMALL.chunk_bytes,
                unmeasured_bins=(32,) if late else (),
                budget_reached=late,
            )
        )
    residency = build_residency(_dump(*arenas), _scan(*scans, budget=2.5))
    budget_notes = [n for n in residency.notes if "budget" in n]
    assert budget_notes == ["1,146 arenas estimated: walk budget of 2.5 s reached"]
    assert residency.measured_share == pytest.approx(
        (MIB + 354 * SMALL.chunk_bytes) / (MIB + 1500 * SMALL.chunk_bytes)
    )


def test_arenas_pair_one_by_one_when_the_chain_does_not_fit() -> None:
    """No usable chain: each arena pairs by its own system_mem; one that finds no partner
    is estimated alone instead of sending the whole process to totals."""
    main = _arena(0, buckets=(), top=MIB, system=8 * MIB)
    a1 = _arena(1, buckets=(SMALL,), top=0, system=8 * MIB)
    a2 = _arena(2, buckets=(SMALL,), top=0, system=12 * MIB)
    scan = _scan(
        _scan_arena(is_main=True, free_bytes=MIB, top_bytes=MIB),
        _scan_arena(system_bytes=8 * MIB, free_bytes=SMALL.chunk_bytes),
        _scan_arena(system_bytes=16 * MIB, free_bytes=SMALL.chunk_bytes),  # grew since the dump
        chained=False,
    )
    residency = build_residency(_dump(main, a1, a2), scan)
    assert residency.method == "system-mem"
    assert [r.free_method for r in residency.arenas] == ["walked", "walked", "estimate"]
    # Estimated in chunk bytes, without the +1 per chunk regular bins print.
    assert residency.estimated_free_bytes == SMALL.chunk_bytes == a2.free_bytes - SMALL.count


def test_measured_share_is_one_without_free_bytes() -> None:
    residency = _residency(heap_resident=0, anon=0)
    assert residency.measured_free_bytes == residency.estimated_free_bytes == 0
    assert residency.measured_share == 1.0


def test_forecast_without_residency_says_residency_is_unknown() -> None:
    """Unreadable pagemap: no residency; the forecast is the XML's, labelled as such."""
    forecast = forecast_trim(_dump(DEMO_ARENA), None, page_bytes=PAGE)
    assert not forecast.measured and forecast.free_not_resident_bytes is None
    assert forecast.releasable_bytes == forecast.estimated_bytes > 199 * MIB
    assert any("resident is unknown" in note for note in forecast.notes)


def test_residency_json_has_the_documented_keys() -> None:
    """docs/json.md's residency keys block against the real renderer's output."""
    row = ArenaResidency(
        0,
        0x1000,
        (HeapSegment(0x5000, 8 * MIB, 8 * MIB),),
        MIB,
        "partial",
        0,
        measured_free_bytes=3 * MIB,
        estimated_free_bytes=MIB,
        estimated_bins=(1,),
        dump_free_bytes=4 * MIB,
    )
    residency = replace(
        _residency(row, heap_resident=8 * MIB, anon=9 * MIB),
        measured_free_bytes=3 * MIB,
        estimated_free_bytes=MIB,
        dump_free_bytes=4 * MIB,
    )
    document = {"residency": residency_json(residency)}
    assert missing_keys(document, "memforensics/heap/1#residency") == []
    assert document["residency"]["measured_share"] == 0.75
    assert document["residency"]["arenas"][0]["estimated_bins"] == [1]


def test_glibc_bins_follow_mallocs_index_macros() -> None:
    """bin_index is glibc's smallbin_index/largebin_index_64; the ranges tile the sizes."""
    assert [glibc.bin_index(s) for s in (32, 48, 1008, 1024, 1087, 1088, 3072)] == [
        2,
        3,
        63,
        64,
        64,
        65,
        96,
    ]
    assert glibc.bin_index(3136) == 97 and glibc.bin_index(1 << 20) == 126
    previous_high = glibc.bin_size_range(63)[1]
    for index in range(64, 127):
        low, high = glibc.bin_size_range(index)
        assert low == previous_high + 1 if index > 64 else low == 1024
        assert glibc.bin_index(low) == index == glibc.bin_index(high & ~15)
        previous_high = high
    # Where glibc's largebin_index_64 changes branch (worked out by hand from its macro):
    # bin 120 is shared by two branches and begins in the first.
    assert [glibc.bin_size_range(i)[0] for i in (96, 97, 111, 112, 120, 121, 124, 126)] == [
        3072,
        3136,
        10240,
        10752,
        40960,
        65536,
        163840,
        524288,
    ]
    assert glibc.bin_size_range(126)[1] == 1 << 62
    assert glibc.systrim_release_bytes(64 * 1024, PAGE) == 15 * PAGE
    assert glibc.mtrim_span(0x1000, 3 * PAGE, PAGE) == (0x2000, 0x4000)
