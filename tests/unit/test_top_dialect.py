"""Whether ``rest`` counts the top chunk, and free chunk bytes with top in both dialects.

glibc 2.31 added the top chunk to ``<total type="rest">`` as one extra block (BZ #24026,
malloc_info-format.md §2.3, §3); glibc 2.27-2.30 leave it out, and their dump has no other
trace of it. ``fixtures/dialects/glibc-2.30-no-top.xml`` is the real 2.36 dump
``threads-fragmented.xml`` as 2.30 prints the same heap (fixtures/README.md).
"""

from __future__ import annotations

from pathlib import Path

from memforensics.model.heap import Arena, HeapDump, SizeBucket
from memforensics.sources.malloc_info.malloc_xml import parse_dump

FIXTURES = Path(__file__).resolve().parent.parent.parent / "fixtures"


def _one(path: str) -> HeapDump:
    return parse_dump((FIXTURES / path).read_bytes(), name=path)


def test_the_230_fixture_is_the_236_dump_without_top_in_rest() -> None:
    new, old = _one("threads-fragmented.xml"), _one("dialects/glibc-2.30-no-top.xml")
    assert len(new.arenas) == len(old.arenas) == 16
    for a36, a30 in zip(new.arenas, old.arenas, strict=True):
        assert a36.top_bytes is not None
        assert (a30.rest_chunks, a30.rest_bytes) == (
            a36.rest_chunks - 1,
            a36.rest_bytes - a36.top_bytes,
        )
        assert tuple(a30.sizes) == tuple(a36.sizes)  # same lines, on the same line numbers
    assert old.rest_bytes == new.rest_bytes - sum(a.top_bytes or 0 for a in new.arenas)


def test_the_model_knows_whether_rest_counts_the_top() -> None:
    new, old = _one("threads-fragmented.xml"), _one("dialects/glibc-2.30-no-top.xml")
    assert new.rest_includes_top is True and old.rest_includes_top is False
    assert all(a.rest_includes_top for a in new.arenas)
    assert not any(a.rest_includes_top for a in old.arenas)
    assert all(a.top_bytes is None for a in old.arenas)
    for name in ("dialects/glibc-2.27-tab-junk.xml", "dialects/glibc-2.17-rhel7.xml"):
        assert _one(name).rest_includes_top is False, name
    for name in ("dialects/glibc-2.36-i386.xml", "dialects/glibc-2.44-no-fastbins.xml"):
        assert _one(name).rest_includes_top is True, name


def test_free_chunk_bytes_are_the_same_heap_in_both_dialects() -> None:
    """The bins' chunk bytes (PREV_INUSE artefact removed) do not depend on the dialect; the
    top is the dump's own on 2.31+, and unknown (None) on 2.27-2.30: a walk's top stands in."""
    new, old = _one("threads-fragmented.xml"), _one("dialects/glibc-2.30-no-top.xml")
    for a36, a30 in zip(new.arenas, old.arenas, strict=True):
        lines = [b for b in a36.sizes if not b.suspect]
        assert a36.free_chunk_bytes == sum(b.chunk_bytes for b in lines)
        assert a30.free_chunk_bytes == a36.free_chunk_bytes
        assert a36.top_bytes is not None
        assert a36.free_chunk_bytes_with_top == a36.free_chunk_bytes + a36.top_bytes
        assert a30.free_chunk_bytes_with_top is None
        # What residency_build's _xml_free_bytes is asked to compute with the walk's top:
        walked_top = a36.top_bytes
        assert a30.free_chunk_bytes + walked_top == a36.free_chunk_bytes_with_top
        # free = fast + rest as glibc prints it: the two dialects differ by exactly the top.
        assert a36.free_bytes - a30.free_bytes == a36.top_bytes


def test_free_chunk_bytes_leave_out_suspect_lines_and_the_prev_inuse_bit() -> None:
    fast, small = SizeBucket("fast", 33, 48, 96, 2), SizeBucket("bin", 1041, 1041, 3123, 3)
    # 2.31+: rest is the bins plus one block, the top of 500 bytes.
    arena = Arena(0, (fast, small), 2, 96, 3 + 1, 3123 + 500, 1 << 20, 1 << 20)
    assert arena.rest_includes_top and arena.top_bytes == 500
    assert arena.free_chunk_bytes == 96 + 3120
    assert arena.free_chunk_bytes_with_top == 96 + 3120 + 500
    garbage = SizeBucket("bin", 33, 33, 1 << 57, 10**12, suspect=True)
    flagged = Arena(0, (fast, small, garbage), 2, 96, 3, 3123, 1 << 20, 1 << 20)
    assert flagged.free_chunk_bytes == 96 + 3120
