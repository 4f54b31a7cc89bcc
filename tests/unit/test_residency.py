"""The pure side of residency: waterfall arithmetic, advice, the XML trim estimate, renderers."""

from __future__ import annotations

from io import StringIO

from rich.console import Console

from memforensics.analysis.residency import residency_advice, waterfall
from memforensics.analysis.trim_forecast import estimate_arena_releasable, forecast_trim
from memforensics.model.heap import Arena, HeapDump, SizeBucket
from memforensics.model.process import (
    AllocatorInfo,
    ArenaResidency,
    HeapResidency,
    HeapSegment,
    ProcessFacts,
    ProcessMemory,
)
from memforensics.render.process import (
    process_json,
    render_process_header,
    render_waterfall,
    residency_json,
    waterfall_json,
)

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
    after = ArenaResidency(0, 0x1000, (HeapSegment(0, 201 * MIB, MIB),), 4096, "walked", 0)
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
