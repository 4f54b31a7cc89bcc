"""The parser's behaviour pinned on every file in fixtures/: real glibc 2.36 dumps, published
dumps, hand-made dialects of other glibc versions and allocators, and broken/hostile input.

The numbers asserted here come from fixtures/README.md (how each file was made) and from
glibc's own arithmetic (malloc_info-format.md), not from running the parser: totals are sums
of arenas, 2.31+ counts the top chunk in ``rest`` as one extra block, fastbin lines have an
even ``to``, regular bins print odd sizes.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, cast

import pytest

from memforensics.errors import EXIT_INPUT, InputDataError
from memforensics.model.heap import Arena, HeapDump
from memforensics.sources.malloc_info.malloc_xml import iter_dumps, parse_dump

FIXTURES = Path(__file__).resolve().parent.parent.parent / "fixtures"

# Real glibc 2.36 dumps of processes that used glibc malloc (the preload ones did not).
REAL_GLIBC = (
    "threads-fragmented.xml",
    "arena-max-1.xml",
    "free-all-but-last-before-trim.xml",
    "free-all-but-last-after-trim.xml",
    "mmap-heavy.xml",
    "python3-idle.xml",
    "series-5.xml",
)
OTHER_ALLOCATOR = ("jemalloc-preload.xml", "tcmalloc-preload.xml")
KIB = 1024
MIB = 1024 * KIB


def _dumps(relpath: str) -> list[HeapDump]:
    return list(iter_dumps(FIXTURES / relpath))


def _one(relpath: str) -> HeapDump:
    dumps = _dumps(relpath)
    assert len(dumps) == 1, f"{relpath}: expected one document, got {len(dumps)}"
    return dumps[0]


def _fast(arena: Arena) -> list[int]:
    return [b.count for b in arena.sizes if b.kind == "fast"]


def _bins(arena: Arena) -> list[tuple[int, int]]:
    """(count, total_bytes) of every non-fastbin line: small, large and unsorted."""
    return [(b.count, b.total_bytes) for b in arena.sizes if b.kind != "fast"]


def _assert_totals_are_sums(dump: HeapDump) -> None:
    """glibc prints the process totals as sums of the per-arena numbers it printed."""
    arenas = dump.arenas
    assert dump.rest_chunks == sum(a.rest_chunks for a in arenas)
    assert dump.rest_bytes == sum(a.rest_bytes for a in arenas)
    assert dump.system_bytes == sum(a.system_bytes for a in arenas)
    assert dump.system_max_bytes == sum(a.system_max_bytes for a in arenas)
    if dump.fast_bytes is not None:
        assert dump.fast_chunks == sum(a.fast_chunks or 0 for a in arenas)
        assert dump.fast_bytes == sum(a.fast_bytes or 0 for a in arenas)
    assert dump.aspace_total_bytes == sum(a.aspace_total_bytes or 0 for a in arenas)
    assert dump.aspace_mprotect_bytes == sum(a.aspace_mprotect_bytes or 0 for a in arenas)


def _real_dumps() -> Iterator[tuple[str, HeapDump]]:
    for name in REAL_GLIBC:
        for dump in _dumps(name):
            yield f"{name}#{dump.sequence}", dump


# --------------------------------------------------------------------------------------------
# Real glibc 2.36 dumps: invariants that hold for every one


@pytest.mark.parametrize("name", REAL_GLIBC + OTHER_ALLOCATOR)
def test_real_dump_totals_equal_the_sum_of_its_arenas_to_the_byte(name: str) -> None:
    for dump in _dumps(name):
        _assert_totals_are_sums(dump)


def test_real_236_rest_count_is_one_top_chunk_plus_the_bins() -> None:
    """2.31+ adds top to rest as one block: rest.count == 1 + sum of bin counts, and
    rest.size - bin bytes is the top chunk, never negative."""
    checked = 0
    for where, dump in _real_dumps():
        for arena in dump.arenas:
            bins = _bins(arena)
            assert arena.rest_chunks == 1 + sum(c for c, _ in bins), (where, arena.index)
            assert arena.rest_bytes >= sum(t for _, t in bins), (where, arena.index)
            assert arena.top_bytes == arena.rest_bytes - sum(t for _, t in bins)
            checked += 1
    assert checked >= 16 + 1 + 2 + 1 + 1 + 5


def test_real_236_fast_totals_are_the_fastbin_lines() -> None:
    for where, dump in _real_dumps():
        assert dump.fast_bytes is not None, where
        for arena in dump.arenas:
            fast = [b for b in arena.sizes if b.kind == "fast"]
            assert arena.fast_chunks == sum(b.count for b in fast), (where, arena.index)
            assert arena.fast_bytes == sum(b.total_bytes for b in fast), (where, arena.index)


def test_real_236_bucket_lines_have_glibcs_shapes() -> None:
    """Fastbin lines: even ``to``, ``from == to - 15``; bin lines: odd sizes (PREV_INUSE)."""
    kinds: set[str] = set()
    for where, dump in _real_dumps():
        for arena in dump.arenas:
            for bucket in arena.sizes:
                kinds.add(bucket.kind)
                assert not bucket.suspect, (where, arena.index, bucket)
                assert bucket.count >= 1
                if bucket.kind == "fast":
                    assert bucket.to_bytes % 16 == 0
                    assert bucket.from_bytes == bucket.to_bytes - 15
                    assert bucket.total_bytes == bucket.count * bucket.to_bytes
                else:
                    assert bucket.from_bytes % 2 == 1 and bucket.to_bytes % 2 == 1
                    assert bucket.from_bytes <= bucket.to_bytes
                    # every chunk lies between from and to
                    assert bucket.count * bucket.from_bytes <= bucket.total_bytes
                    assert bucket.total_bytes <= bucket.count * bucket.to_bytes
                    assert bucket.chunk_bytes == bucket.total_bytes - bucket.count
    assert kinds == {"fast", "bin", "unsorted"}


@pytest.mark.parametrize("name", REAL_GLIBC)
def test_real_dump_has_236_metadata(name: str) -> None:
    for dump in _dumps(name):
        assert dump.version == "1"
        assert dump.mmap_chunks is not None and dump.mmap_bytes is not None
        assert not dump.all_zero
        assert [a.index for a in dump.arenas] == list(range(len(dump.arenas)))
        main = dump.arenas[0]
        # main arena: aspace is system_mem printed twice, and no subheaps line
        assert main.aspace_total_bytes == main.system_bytes == main.aspace_mprotect_bytes
        assert main.subheaps is None
        for arena in dump.arenas[1:]:
            assert arena.subheaps is not None and arena.subheaps >= 1
        for arena in dump.arenas:
            assert 0 <= arena.in_use_bytes <= arena.system_bytes <= arena.system_max_bytes
            assert not arena.suspect


# --------------------------------------------------------------------------------------------
# Real dumps: the facts each was made to show


def test_threads_fragmented_has_many_arenas_holding_free_memory() -> None:
    dump = _one("threads-fragmented.xml")
    # 24 threads on 2 cores: glibc caps arenas at 8 x cores = 16 (README)
    assert len(dump.arenas) == 16
    assert 0.4 <= dump.free_ratio <= 0.8
    fragmented = [a for a in dump.arenas[1:] if a.free_ratio >= 0.2]
    assert len(fragmented) >= 12
    # holes of many sizes: fastbins, dozens of small/large bins, and big free chunks
    busiest = max(dump.arenas[1:], key=lambda a: len(a.sizes))
    assert len(busiest.sizes) >= 40
    assert max(b.to_bytes for a in dump.arenas for b in a.sizes) >= 8 * KIB
    assert dump.free_bytes == sum(a.free_bytes for a in dump.arenas)
    assert dump.in_use_bytes == dump.system_bytes - dump.free_bytes


def test_arena_max_1_keeps_every_thread_in_the_main_arena() -> None:
    dump = _one("arena-max-1.xml")
    assert [a.index for a in dump.arenas] == [0]
    assert dump.arenas[0].subheaps is None
    # the same 24 threads' leftovers all in one arena: far more than an idle main arena
    assert dump.system_bytes >= 8 * MIB
    assert dump.free_bytes > MIB


def _readme_rss_kib() -> tuple[int, int]:
    readme = (FIXTURES / "README.md").read_text()
    match = re.search(r"VmRSS before trim: (\d+) KiB; after malloc_trim\(0\): (\d+) KiB", readme)
    assert match, "fixtures/README.md lost the RSS line of free-all-but-last"
    return int(match.group(1)), int(match.group(2))


def test_free_all_but_last_before_trim_is_almost_all_free() -> None:
    dump = _one("free-all-but-last-before-trim.xml")
    assert len(dump.arenas) == 1
    # 200,000 x 1 KiB = 195 MiB freed (less 7 in tcache), one coalesced chunk before the last
    assert dump.free_ratio > 0.99
    assert dump.free_bytes >= 190 * MIB
    largest = max(dump.arenas[0].sizes, key=lambda b: b.total_bytes)
    assert largest.count == 1 and largest.total_bytes >= 190 * MIB


def test_free_all_but_last_after_trim_keeps_rest_while_rss_dropped() -> None:
    """malloc_trim(0) MADV_DONTNEEDs free pages: the dump barely changes, RSS collapses."""
    before = _one("free-all-but-last-before-trim.xml")
    after = _one("free-all-but-last-after-trim.xml")
    assert after.rest_chunks == before.rest_chunks
    assert after.rest_bytes >= 0.99 * before.rest_bytes
    assert after.system_bytes <= before.system_bytes
    assert after.free_ratio > 0.99
    rss_before_kib, rss_after_kib = _readme_rss_kib()
    assert rss_before_kib >= 190 * KIB
    assert rss_after_kib * 10 < rss_before_kib


def test_mmap_heavy_counts_blocks_outside_the_arenas() -> None:
    dump = _one("mmap-heavy.xml")
    assert dump.mmap_chunks is not None and dump.mmap_bytes is not None
    assert dump.mmap_chunks >= 96
    assert dump.mmap_bytes >= 96 * 256 * KIB
    # mmapped chunks are not in any arena's system memory
    assert dump.mmap_bytes > 100 * dump.system_bytes


def test_python3_idle_is_a_real_small_heap() -> None:
    dump = _one("python3-idle.xml")
    assert len(dump.arenas) == 1
    assert dump.system_bytes > 0
    assert dump.mmap_chunks is not None and dump.mmap_chunks >= 1


def test_series_gives_every_dump_in_order() -> None:
    dumps = _dumps("series-5.xml")
    assert [d.sequence for d in dumps] == [0, 1, 2, 3, 4]
    lines = [d.line for d in dumps]
    assert lines[0] == 1 and lines == sorted(lines) and len(set(lines)) == 5
    # the program kept a third of every step's blocks: in-use grows step by step
    in_use = [d.in_use_bytes for d in dumps]
    assert in_use == sorted(in_use) and len(set(in_use)) == 5
    maxima = [d.system_max_bytes for d in dumps]
    assert maxima == sorted(maxima)  # a high-water mark never decreases


@pytest.mark.parametrize("name", OTHER_ALLOCATOR)
def test_preloaded_allocator_leaves_glibc_all_zero(name: str) -> None:
    dump = _one(name)
    assert dump.all_zero
    assert len(dump.arenas) == 1
    arena = dump.arenas[0]
    # glibc's never-used arena: a pseudo top chunk of size 0
    assert (arena.rest_chunks, arena.rest_bytes, arena.system_bytes) == (1, 0, 0)
    assert (dump.mmap_chunks, dump.mmap_bytes) == (0, 0)


def test_all_zero_is_false_for_every_real_glibc_dump() -> None:
    assert not any(dump.all_zero for _, dump in _real_dumps())


# --------------------------------------------------------------------------------------------
# Sources: path, str, bytes, a binary stream; parse_dump for exactly one document


def test_every_kind_of_source_gives_the_same_dumps() -> None:
    path = FIXTURES / "series-5.xml"
    data = path.read_bytes()
    from_path = list(iter_dumps(path))
    from_str = list(iter_dumps(str(path)))
    from_bytes = list(iter_dumps(data, name="series"))
    with path.open("rb") as stream:
        from_stream = list(iter_dumps(stream, name="series"))
    # a pipe delivers tiny reads: the streaming parser must not care where reads split
    from_trickle = list(iter_dumps(cast(BinaryIO, _Trickle(data)), name="series"))
    key = [(d.sequence, d.system_bytes, d.free_bytes, len(d.arenas)) for d in from_path]
    for other in (from_str, from_bytes, from_stream, from_trickle):
        assert [(d.sequence, d.system_bytes, d.free_bytes, len(d.arenas)) for d in other] == key


class _Trickle(io.RawIOBase):
    """A binary stream that returns at most 7 bytes per read, like a slow pipe."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        chunk = self._data[self._pos : self._pos + 7]
        buffer[: len(chunk)] = chunk
        self._pos += len(chunk)
        return len(chunk)


def test_parse_dump_reads_exactly_one_document() -> None:
    data = (FIXTURES / "threads-fragmented.xml").read_bytes()
    dump = parse_dump(data, name="t.xml")
    assert len(dump.arenas) == 16
    assert dump.source == "t.xml"
    with pytest.raises(InputDataError):
        parse_dump((FIXTURES / "series-5.xml").read_bytes(), name="series")


# --------------------------------------------------------------------------------------------
# Published dumps


def test_mysql_manual_dump_with_elision_parses_as_one_arena() -> None:
    """The manual's ``:`` line stands for arenas it left out; the document stays well-formed."""
    dump = _one("published/mysql-refman-sighup-status.xml")
    assert len(dump.arenas) == 1
    arena = dump.arenas[0]
    assert (arena.fast_chunks, arena.fast_bytes) == (3, 128)
    assert (arena.rest_chunks, arena.rest_bytes) == (84, 195652)
    assert arena.system_bytes == 690774016
    assert len(arena.sizes) == 12
    assert [b.kind for b in arena.sizes[:2]] == ["fast", "fast"]
    assert arena.sizes[-1].kind == "unsorted"
    assert (dump.fast_chunks, dump.mmap_chunks, dump.mmap_bytes) == (85, 82, 939954176)
    # process totals cover arenas the manual elided
    assert dump.system_bytes > arena.system_bytes


def test_man_page_glibc_213_series_has_no_mmap_total() -> None:
    dumps = _dumps("published/man-malloc_info-glibc-2.13-series.xml")
    assert [len(d.arenas) for d in dumps] == [1, 2]
    assert all(d.mmap_chunks is None and d.mmap_bytes is None for d in dumps)
    assert dumps[1].system_bytes == 2113536
    for dump in dumps:
        _assert_totals_are_sums(dump)


def test_text_around_whole_documents_is_skipped() -> None:
    """A terminal session (prompts, the program's banners) around whole documents gives the
    documents: the same as ``gdb -batch … | memforensics parse -`` with gdb's own lines."""
    session = _dumps("published/man-malloc_info-glibc-2.13-session.txt")
    extracted = _dumps("published/man-malloc_info-glibc-2.13-series.xml")
    assert [(d.sequence, len(d.arenas), d.system_bytes) for d in session] == [
        (d.sequence, len(d.arenas), d.system_bytes) for d in extracted
    ]
    # lines count in the file as given, prompts included
    assert [d.line for d in session] == [5, 25]


@pytest.mark.parametrize(
    "name",
    [
        "published/algolia-2021-heap87-fragment.xml",
        "published/algolia-2021-totals-fragment.xml",
        "published/sonic-buildimage-28245-fragment.txt",
    ],
)
def test_published_fragments_without_a_malloc_root_are_refused(name: str) -> None:
    with pytest.raises(InputDataError) as caught:
        _dumps(name)
    assert caught.value.exit_code == EXIT_INPUT
    assert caught.value.line is not None and caught.value.line >= 1


# --------------------------------------------------------------------------------------------
# Hand-made dialects


def test_glibc_212_nested_parses_with_garbage_unsorted_flagged_suspect() -> None:
    dump = _one("dialects/glibc-2.12-nested.xml")
    assert len(dump.arenas) == 2
    assert dump.mmap_chunks is None and dump.mmap_bytes is None
    garbage_arena, clean_arena = dump.arenas
    assert garbage_arena.suspect and not clean_arena.suspect
    unsorted = [b for b in garbage_arena.sizes if b.kind == "unsorted"]
    assert len(unsorted) == 1 and unsorted[0].suspect
    assert unsorted[0].count == 140737354101600
    # the old code added the garbage into rest: parsed, not fatal, and taken back out of it
    assert garbage_arena.implausible == (unsorted[0],) and garbage_arena.implausible_in_rest
    assert garbage_arena.rest_chunks == sum(c for c, _ in _bins(garbage_arena)) - unsorted[0].count
    # no top chunk in rest before 2.31
    assert garbage_arena.top_bytes is None and clean_arena.top_bytes is None
    assert [b.kind for b in garbage_arena.sizes[:3]] == ["fast", "fast", "fast"]
    _assert_totals_are_sums(dump)


def test_rhel7_217_has_mmap_total_and_no_top() -> None:
    dump = _one("dialects/glibc-2.17-rhel7.xml")
    assert len(dump.arenas) == 3
    assert (dump.mmap_chunks, dump.mmap_bytes) == (3, 3268608)
    assert not any(a.suspect for a in dump.arenas)
    for arena in dump.arenas:
        assert arena.rest_chunks == sum(c for c, _ in _bins(arena))
        assert arena.subheaps is None
    assert (dump.arenas[2].rest_chunks, dump.arenas[2].rest_bytes) == (0, 0)
    _assert_totals_are_sums(dump)


def test_glibc_227_tab_junk_indentation_is_just_whitespace() -> None:
    raw = (FIXTURES / "dialects/glibc-2.27-tab-junk.xml").read_text()
    assert "\t" * 7 + " " * 8 + "<size" in raw
    dump = _one("dialects/glibc-2.27-tab-junk.xml")
    main, second, third = dump.arenas
    assert [b.kind for b in main.sizes] == ["fast"] * 3 + ["bin"] * 3 + ["unsorted"]
    assert (second.subheaps, third.subheaps) == (1, 2)
    assert second.system_max_bytes > second.system_bytes
    assert (third.rest_chunks, third.rest_bytes) == (0, 0)
    for arena in dump.arenas:
        assert arena.rest_chunks == sum(c for c, _ in _bins(arena))  # top not counted
    _assert_totals_are_sums(dump)


def test_32bit_dump_has_16_byte_chunks_and_1mib_subheaps() -> None:
    dump = _one("dialects/glibc-2.36-i386.xml")
    main, second = dump.arenas
    first_fast = main.sizes[0]
    assert (first_fast.kind, first_fast.from_bytes, first_fast.to_bytes) == ("fast", 1, 16)
    sixteen = [b for b in main.sizes if b.kind == "bin" and b.from_bytes == 17]
    assert len(sixteen) == 1 and sixteen[0].to_bytes == 17
    assert sixteen[0].chunk_bytes == 16 * sixteen[0].count
    assert second.subheaps == 37
    assert second.aspace_total_bytes is not None
    assert second.aspace_total_bytes <= second.subheaps * MIB
    assert second.top_bytes == 20472
    _assert_totals_are_sums(dump)


def test_glibc_after_243_without_fastbins_has_no_fast_totals() -> None:
    dump = _one("dialects/glibc-2.44-no-fastbins.xml")
    assert dump.fast_chunks is None and dump.fast_bytes is None
    for arena in dump.arenas:
        assert arena.fast_chunks is None and arena.fast_bytes is None
        assert not any(b.kind == "fast" for b in arena.sizes)
        assert arena.free_bytes == arena.rest_bytes
    assert dump.free_bytes == dump.rest_bytes == 933950
    assert [a.top_bytes for a in dump.arenas] == [123904, 132768]
    _assert_totals_are_sums(dump)


def test_unused_arena_is_zero_but_the_dump_is_not() -> None:
    dump = _one("dialects/unused-arena.xml")
    unused, used = dump.arenas
    assert (unused.rest_chunks, unused.rest_bytes, unused.system_bytes) == (1, 0, 0)
    assert unused.free_ratio == 0.0 and unused.in_use_bytes == 0
    assert used.system_bytes == 135168
    assert not dump.all_zero
    _assert_totals_are_sums(dump)


def test_unknown_attributes_and_elements_are_kept_not_fatal() -> None:
    dump = _one("dialects/future-extras.xml")
    assert len(dump.arenas) == 2
    _assert_totals_are_sums(dump)
    dump_extra = " ".join(f"{k}={v}" for k, v in dump.extra)
    arena_extra = " ".join(f"{k}={v}" for k, v in dump.arenas[0].extra)
    assert "pid" in dump_extra and "4242" in dump_extra
    assert "arena-stats" in dump_extra
    assert "numa-node" in arena_extra
    assert "tcache" in arena_extra
    assert "hugepages" in " ".join(k for k, _ in dump.arenas[1].extra)
    # the known numbers are unaffected by the extras
    assert dump.arenas[0].sizes[0].count == 2
    assert dump.arenas[0].top_bytes == 133288


@pytest.mark.parametrize(
    ("name", "allocator"),
    [("dialects/jemalloc-1.xml", "jemalloc"), ("dialects/hardened_malloc-1.xml", "hardened")],
)
def test_other_allocators_documents_are_refused_by_name(name: str, allocator: str) -> None:
    with pytest.raises(InputDataError) as caught:
        _dumps(name)
    assert allocator in str(caught.value)
    assert caught.value.line == 1
    assert caught.value.exit_code == EXIT_INPUT


# --------------------------------------------------------------------------------------------
# Broken and hostile: InputDataError with the file and the line of the fault

# (file, line of the fault, a word the message must contain); None: any line >= 1
BAD_INPUTS: list[tuple[str, int | None, str]] = [
    ("broken/empty.xml", 1, ""),
    ("broken/binary-garbage.bin", 1, ""),
    ("broken/truncated.xml", None, ""),
    ("broken/svg.xml", None, "svg"),
    ("broken/missing-attribute.xml", 7, "size"),
    ("broken/non-numeric.xml", 8, "198.4MiB"),
    ("broken/negative.xml", 6, "-3"),
    ("broken/unknown-version.xml", 1, "version"),
    ("hostile/billion-laughs.xml", None, ""),
    ("hostile/xxe-file.xml", None, ""),
    ("hostile/xxe-http.xml", None, ""),
    ("hostile/external-dtd-http.xml", None, ""),
    ("hostile/parameter-entity-http.xml", None, ""),
    ("hostile/deep-nesting.xml", None, ""),
    ("hostile/huge-attribute.xml", 9, ""),
    ("hostile/over-2-64.xml", 8, ""),
]


@pytest.mark.parametrize(("name", "line", "word"), BAD_INPUTS)
def test_bad_input_raises_input_data_error_with_file_and_line(
    name: str, line: int | None, word: str
) -> None:
    path = FIXTURES / name
    with pytest.raises(InputDataError) as caught:
        list(iter_dumps(path))
    err = caught.value
    assert err.exit_code == EXIT_INPUT
    assert err.source is not None and err.source.endswith(path.name)
    assert err.line is not None and err.line >= 1
    if line is not None:
        assert err.line == line, str(err)
    assert word in str(err)
    # one line: the CLI prints it as `error: FILE:LINE: what`
    assert "\n" not in err.message
    assert len(err.message) < 400


def test_truncated_file_blames_its_end() -> None:
    path = FIXTURES / "broken/truncated.xml"
    last_line = path.read_text().count("\n") + 1
    with pytest.raises(InputDataError) as caught:
        list(iter_dumps(path))
    assert caught.value.line is not None
    assert last_line - 2 <= caught.value.line <= last_line


def test_truncated_series_yields_the_whole_dumps_before_failing() -> None:
    """Streaming: the first document is complete and reaches the caller before the error."""
    seen: list[HeapDump] = []
    with pytest.raises(InputDataError) as caught:
        seen.extend(iter_dumps(FIXTURES / "broken/series-truncated.xml"))
    assert [d.sequence for d in seen] == [0]
    complete = _dumps("series-5.xml")[0]
    assert seen[0].system_bytes == complete.system_bytes
    assert caught.value.line is not None and caught.value.line > seen[0].line


def test_hostile_messages_never_carry_passwd_text() -> None:
    passwd_lines = [ln for ln in Path("/etc/passwd").read_text().splitlines() if len(ln) > 8]
    assert passwd_lines, "this machine has an /etc/passwd to leak"
    with pytest.raises(InputDataError) as caught:
        list(iter_dumps(FIXTURES / "hostile/xxe-file.xml"))
    text = f"{caught.value.message} {caught.value.hint}"
    assert not any(line in text for line in passwd_lines)
    assert "root:" not in text


# --------------------------------------------------------------------------------------------
# The script that made the real fixtures still makes them


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build the programs")
def test_make_fixtures_rebuilds_real_dumps_of_the_same_shape(tmp_path: Path) -> None:
    script = FIXTURES.parent / "scripts" / "make_fixtures.py"
    only = ["--only", "series", "--only", "arena-max-1"]
    proc = subprocess.run(
        [sys.executable, str(script), *only, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "series-5.xml" in proc.stdout and "arena-max-1.xml" in proc.stdout
    rebuilt = list(iter_dumps(tmp_path / "series-5.xml"))
    assert [d.sequence for d in rebuilt] == [0, 1, 2, 3, 4]
    assert [len(d.arenas) for d in list(iter_dumps(tmp_path / "arena-max-1.xml"))] == [1]
    for dump in rebuilt:
        _assert_totals_are_sums(dump)
