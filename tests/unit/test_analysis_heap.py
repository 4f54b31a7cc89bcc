"""Heap analysis, gates and diff on dumps built from glibc-shaped XML."""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memforensics.analysis.diff import diff_dumps
from memforensics.analysis.gates import check_gates
from memforensics.analysis.heap import PAGE_BYTES, analyze, histogram
from memforensics.model.heap import Arena, SizeBucket, bucket_columns
from memforensics.sources.malloc_info.malloc_xml import iter_dumps, parse_dump

FIXTURES = Path(__file__).resolve().parent.parent.parent / "fixtures"

MiB = 1 << 20


def arena_xml(
    index: int,
    *,
    system: int,
    buckets: list[tuple[int, int, int]],
    top: int = 0,
    fast: tuple[int, int] = (0, 0),
) -> str:
    """An arena as glibc 2.36 prints it; buckets are (chunk size, count, tag) regular bins."""
    lines = [f'<heap nr="{index}">', "<sizes>"]
    rest_count, rest_size = 1, top
    for size, count, _ in buckets:
        printed = size + 1  # PREV_INUSE
        lines.append(
            f'  <size from="{printed}" to="{printed}" total="{printed * count}" count="{count}"/>'
        )
        rest_count += count
        rest_size += printed * count
    lines += [
        "</sizes>",
        f'<total type="fast" count="{fast[0]}" size="{fast[1]}"/>',
        f'<total type="rest" count="{rest_count}" size="{rest_size}"/>',
        f'<system type="current" size="{system}"/>',
        f'<system type="max" size="{system}"/>',
        f'<aspace type="total" size="{system}"/>',
        f'<aspace type="mprotect" size="{system}"/>',
        "</heap>",
    ]
    return "\n".join(lines)


def dump_xml(arenas: list[str], *, mmap: tuple[int, int] = (0, 0)) -> bytes:
    body = "\n".join(arenas)
    # Totals are recomputed by parsing each arena; the top-level figures must agree.
    parsed = [
        parse_dump(
            f'<malloc version="1">\n{a}\n{_totals(0, 0, 0, 0, mmap)}</malloc>'.encode()
        ).arenas[0]
        for a in arenas
    ]
    fast = sum(a.fast_bytes or 0 for a in parsed)
    rest_c = sum(a.rest_chunks for a in parsed)
    rest = sum(a.rest_bytes for a in parsed)
    system = sum(a.system_bytes for a in parsed)
    totals = _totals(fast, rest_c, rest, system, mmap)
    return f'<malloc version="1">\n{body}\n{totals}</malloc>\n'.encode()


def _totals(fast: int, rest_c: int, rest: int, system: int, mmap: tuple[int, int]) -> str:
    return (
        f'<total type="fast" count="0" size="{fast}"/>\n'
        f'<total type="rest" count="{rest_c}" size="{rest}"/>\n'
        f'<total type="mmap" count="{mmap[0]}" size="{mmap[1]}"/>\n'
        f'<system type="current" size="{system}"/>\n<system type="max" size="{system}"/>\n'
        f'<aspace type="total" size="{system}"/>\n<aspace type="mprotect" size="{system}"/>\n'
    )


def codes(xml: bytes) -> set[str]:
    return {a.code for a in analyze(parse_dump(xml)).advice}


def test_figures_follow_design_definitions() -> None:
    xml = dump_xml([arena_xml(0, system=10 * MiB, buckets=[(1024, 100, 0)], top=MiB, fast=(3, 96))])
    analysis = analyze(parse_dump(xml))
    arena = analysis.arenas[0]
    assert arena.free_bytes == 96 + 1025 * 100 + MiB
    assert arena.in_use_bytes == 10 * MiB - arena.free_bytes
    assert arena.top_bytes == MiB
    assert abs(arena.free_ratio - arena.free_bytes / (10 * MiB)) < 1e-12


def test_histogram_merges_arenas_and_splits_at_the_page() -> None:
    xml = dump_xml(
        [
            arena_xml(0, system=64 * MiB, buckets=[(1024, 10, 0), (8192, 4, 0)]),
            arena_xml(1, system=64 * MiB, buckets=[(1024, 5, 0), (PAGE_BYTES, 2, 0)]),
        ]
    )
    rows = analyze(parse_dump(xml)).histogram
    by_from = {r.from_bytes: r for r in rows}
    small = next(r for r in rows if r.from_bytes <= 1024 <= (r.to_bytes or 1 << 62))
    assert small.chunks == 15 and small.bytes == 15 * 1024  # PREV_INUSE artefact removed
    assert not small.page_or_larger
    page_rows = [r for r in rows if r.page_or_larger]
    assert sum(r.chunks for r in page_rows) == 6
    assert sum(r.bytes for r in page_rows) == 4 * 8192 + 2 * PAGE_BYTES
    assert PAGE_BYTES in by_from


def test_advice_many_arenas_half_free() -> None:
    arenas = [arena_xml(i, system=8 * MiB, buckets=[(2048, 2200, 0)]) for i in range(10)]
    assert "many-arenas-high-free" in codes(dump_xml(arenas))
    few = [arena_xml(i, system=8 * MiB, buckets=[(2048, 2200, 0)]) for i in range(3)]
    assert "many-arenas-high-free" not in codes(dump_xml(few))


def test_advice_trim_versus_small_chunks() -> None:
    big_free = dump_xml([arena_xml(0, system=256 * MiB, buckets=[(64 * 1024, 1000, 0)])])
    assert "trim-would-release" in codes(big_free)
    assert "small-free-chunks" not in codes(big_free)
    small_free = dump_xml([arena_xml(0, system=256 * MiB, buckets=[(512, 100_000, 0)])])
    assert "small-free-chunks" in codes(small_free)
    assert "trim-would-release" not in codes(small_free)


def test_advice_mmap_heavy_and_mostly_used() -> None:
    xml = dump_xml([arena_xml(0, system=4 * MiB, buckets=[])], mmap=(300, 300 * MiB))
    found = codes(xml)
    assert "mmap-heavy" in found and "heap-mostly-used" in found


def test_advice_all_zero_dump_names_another_allocator() -> None:
    xml = dump_xml([arena_xml(0, system=0, buckets=[])])
    assert codes(xml) == {"glibc-malloc-unused"}


def test_gates_name_arena_and_value_and_skip_tiny_arenas() -> None:
    xml = dump_xml(
        [
            arena_xml(0, system=200 * 1024, buckets=[(1024, 150, 0)]),  # tiny: 75% free, not judged
            arena_xml(1, system=8 * MiB, buckets=[(4096, 1500, 0)]),  # 73% free
            arena_xml(2, system=8 * MiB, buckets=[(4096, 100, 0)]),
        ]
    )
    dump = parse_dump(xml)
    found = check_gates(dump, max_free_ratio=0.5)
    assert [(v.gate, v.arena_index) for v in found] == [("max-free-ratio", 1)]
    assert "arena 1: free ratio 0.73 > 0.50" in found[0].message
    assert check_gates(dump, max_free_ratio=0.9) == ()
    (over,) = check_gates(dump, max_free_bytes=MiB)
    assert over.arena_index is None and over.value == dump.free_bytes
    assert check_gates(dump, max_arenas=3) == ()
    assert check_gates(dump, max_arenas=2)[0].message == "arenas: 3 > 2"


def test_diff_pairs_main_with_main_and_the_others_from_the_end() -> None:
    """glibc's new arena is 1 and pushes the older ones up: old 1 is new 2."""
    old = parse_dump(
        dump_xml([arena_xml(0, system=MiB, buckets=[]), arena_xml(1, system=MiB, buckets=[])])
    )
    new = parse_dump(
        dump_xml(
            [
                arena_xml(0, system=MiB, buckets=[]),
                arena_xml(1, system=3 * MiB, buckets=[(1024, 10, 0)]),
                arena_xml(2, system=MiB, buckets=[]),
            ]
        )
    )
    diff = diff_dumps(old, new)
    assert [(d.old_index, d.new_index, d.change) for d in diff.arenas] == [
        (0, 0, "unchanged"),
        (None, 1, "appeared"),
        (1, 2, "unchanged"),
    ]
    assert [d.index for d in diff.arenas] == [0, 1, 2]
    assert diff.arenas[1].old is None and diff.arenas[1].delta("system_bytes") == 3 * MiB
    assert diff.arenas[2].delta("system_bytes") == 0
    assert diff.total_delta("system_bytes") == 3 * MiB
    back = diff_dumps(new, old)
    assert [(d.old_index, d.new_index, d.change) for d in back.arenas][1] == (1, None, "vanished")


# ------------------------------------------------------------------------------------------
# The column-wise histogram and bin sums against a plain per-bucket reading of the same lines.

_LIMITS = (64, 128, 256, 512, 1024, PAGE_BYTES - 1, 16 << 10, 64 << 10, 256 << 10, MiB)


def _reference_histogram(arenas: Iterable[Arena]) -> list[tuple[int, int, int]]:
    """(class index, chunks, bytes): one bucket at a time, as the docs define it."""
    chunks = [0] * (len(_LIMITS) + 1)
    sizes = [0] * (len(_LIMITS) + 1)
    for arena in arenas:
        for bucket in arena.sizes:
            if bucket.suspect or bucket.count == 0:
                continue
            mean = bucket.chunk_bytes // bucket.count
            position = next((i for i, lim in enumerate(_LIMITS) if mean <= lim), len(_LIMITS))
            chunks[position] += bucket.count
            sizes[position] += bucket.chunk_bytes
    return [(i, c, b) for i, (c, b) in enumerate(zip(chunks, sizes, strict=True)) if c]


def _as_triples(arenas: Iterable[Arena]) -> list[tuple[int, int, int]]:
    rows = histogram(arenas)
    starts = [1] + [lim + 1 for lim in _LIMITS]
    return [(starts.index(r.from_bytes), r.chunks, r.bytes) for r in rows]


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.xml")))
def test_histogram_matches_a_per_bucket_reading_on_every_fixture(name: str) -> None:
    for dump in iter_dumps(FIXTURES / name):
        assert _as_triples(dump.arenas) == _reference_histogram(dump.arenas)
        for arena in dump.arenas:
            bins = [b for b in arena.sizes if b.kind != "fast"]
            assert bucket_columns(arena.sizes).bin_sums() == (
                sum(b.count for b in bins),
                sum(b.total_bytes for b in bins),
            )


_BUCKET = st.builds(
    SizeBucket,
    kind=st.sampled_from(["fast", "bin", "unsorted"]),
    from_bytes=st.integers(0, 1 << 22),
    to_bytes=st.integers(0, 1 << 22),
    total_bytes=st.one_of(st.integers(0, 1 << 40), st.just(1 << 57)),
    count=st.one_of(st.integers(0, 5000), st.just(10**10)),
    suspect=st.booleans(),
)


@given(st.lists(st.lists(_BUCKET, max_size=40), max_size=6))
@settings(max_examples=200, deadline=None)
def test_histogram_matches_a_per_bucket_reading_on_any_buckets(
    tables: list[list[SizeBucket]],
) -> None:
    """Odd and even sizes, empty and suspect lines, totals below the count: same answer."""
    arenas = [Arena(i, tuple(t), None, None, 0, 0, 0, 0) for i, t in enumerate(tables)]
    assert _as_triples(arenas) == _reference_histogram(arenas)


# ------------------------------------------------------------------------------------------
# Big dumps: numpy (one vectorised pass) and the per-arena path give the same report.


def _big_dump_xml(arenas: int, *, suspect_arena: int | None = None) -> bytes:
    """``arenas`` glibc-2.36-shaped arenas of 126 lines each (fast, small, large, unsorted)."""
    rng = random.Random(7)
    out = ['<malloc version="1">']
    for nr in range(arenas):
        lines = []
        bins_count = bins_bytes = fast_count = fast_bytes = 0
        for chunk in range(32, 129, 16):  # fastbins: even `to`
            count = rng.randint(1, 50)
            lines.append((chunk - 15, chunk, chunk * count, count))
            fast_count, fast_bytes = fast_count + count, fast_bytes + chunk * count
        for chunk in range(32, 32 + 16 * 118, 16):  # regular bins: odd (PREV_INUSE)
            count = rng.randint(1, 30)
            low = high = chunk + 1 if chunk < 1024 else chunk * 3 + 1
            if chunk >= 1024:
                high = low + 4096 * rng.randint(0, 8)
            total = low * count + rng.randint(0, high - low) if count else 0
            lines.append((low, high, total, count))
            bins_count, bins_bytes = bins_count + count, bins_bytes + total
        count = rng.randint(1, 5)
        unsorted = (49, 200001, 49 * count + 199952, count)
        if nr == suspect_arena:
            unsorted = (49, 200001, 49 * count, 10**12)  # old glibc's uninitialised slot
        bins_count, bins_bytes = bins_count + unsorted[3], bins_bytes + unsorted[2]
        top = rng.randrange(0, 1 << 20, 16)
        system = (fast_bytes + bins_bytes + top) * 2
        out.append(f'<heap nr="{nr}">\n<sizes>')
        out += [f'  <size from="{a}" to="{b}" total="{c}" count="{d}"/>' for a, b, c, d in lines]
        low, high, total, count = unsorted
        out.append(f'  <unsorted from="{low}" to="{high}" total="{total}" count="{count}"/>')
        out += [
            "</sizes>",
            f'<total type="fast" count="{fast_count}" size="{fast_bytes}"/>',
            f'<total type="rest" count="{bins_count + 1}" size="{bins_bytes + top}"/>',
            f'<system type="current" size="{system}"/>',
            f'<system type="max" size="{system}"/>',
            "</heap>",
        ]
    out += [
        '<total type="fast" count="0" size="0"/>',
        '<total type="rest" count="0" size="0"/>',
        '<system type="current" size="0"/>',
        '<system type="max" size="0"/>',
        "</malloc>",
    ]
    return "\n".join(out).encode()


def _without_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    from memforensics.analysis import bucket_arrays
    from memforensics.sources.malloc_info import malloc_buckets

    monkeypatch.setattr(malloc_buckets, "numpy_module", lambda: None)
    monkeypatch.setattr(bucket_arrays, "numpy_module", lambda: None)


@pytest.mark.parametrize("suspect_arena", [None, 3])
def test_big_dump_report_is_the_same_with_and_without_numpy(
    monkeypatch: pytest.MonkeyPatch, suspect_arena: int | None
) -> None:
    from memforensics.analysis.bucket_arrays import MIN_TEXT_BYTES, dump_sums
    from memforensics.render.heap_json import heap_document
    from memforensics.render.jsondoc import write_json

    pytest.importorskip("numpy", reason="the vectorised path needs numpy")
    # 126 lines of ~50 bytes each per arena: enough arenas to pass the threshold.
    xml = _big_dump_xml(MIN_TEXT_BYTES // (126 * 45) + 5, suspect_arena=suspect_arena)

    def report() -> tuple[object, str]:
        analysis = analyze(parse_dump(xml))
        pieces: list[str] = []
        write_json(heap_document(analysis), pieces.append)
        return (analysis.arenas, analysis.histogram, analysis.advice), "".join(pieces)

    dump = parse_dump(xml)
    vectorised = dump_sums(dump.arenas, _LIMITS)
    assert (vectorised is None) == (suspect_arena is not None)  # suspect: the exact path
    with_numpy = report()
    with monkeypatch.context() as patch:
        _without_numpy(patch)
        assert dump_sums(parse_dump(xml).arenas, _LIMITS) is None
        without = report()
    assert with_numpy == without
    # And both agree with the per-bucket reading of the docs.
    assert _as_triples(dump.arenas) == _reference_histogram(dump.arenas)
