"""`diff` pairs arenas the way glibc numbers them: main with main, the others from the end.

glibc links a new arena right after main_arena (arena.c ``_int_new_arena``), and malloc_info
numbers arenas along ``main_arena.next``: the newest is 1 and every older one moves up one.
Between two dumps of one process, old arena k (k >= 1) is new arena k + (new − old count).
"""

from __future__ import annotations

from pathlib import Path

from memforensics.analysis.diff import diff_dumps
from memforensics.model.heap import HeapDump
from memforensics.sources.malloc_info.malloc_xml import iter_dumps

FIXTURES = Path(__file__).resolve().parent.parent.parent / "fixtures"
EARLIER = FIXTURES / "derived/threads-fragmented-one-arena-earlier.xml"
LATER = FIXTURES / "threads-fragmented.xml"


def _last(path: Path) -> HeapDump:
    return list(iter_dumps(path))[-1]


def _figures(dump: HeapDump, position: int) -> tuple[int, ...]:
    arena = dump.arenas[position]
    return (
        arena.fast_chunks or 0,
        arena.fast_bytes or 0,
        arena.rest_chunks,
        arena.rest_bytes,
        arena.system_bytes,
        arena.system_max_bytes,
    )


def test_the_earlier_fixture_is_the_later_dump_without_its_newest_arena() -> None:
    """fixtures/README.md: arena 1 of the real dump removed, the older ones numbered down."""
    earlier, later = _last(EARLIER), _last(LATER)
    assert [a.index for a in earlier.arenas] == list(range(15))
    assert _figures(earlier, 0) == _figures(later, 0)
    for k in range(1, 15):
        assert _figures(earlier, k) == _figures(later, k + 1)
    newest = later.arenas[1]
    assert earlier.system_bytes == later.system_bytes - newest.system_bytes
    assert earlier.rest_bytes == later.rest_bytes - newest.rest_bytes


def test_a_new_arena_is_new_and_the_older_arenas_are_unchanged() -> None:
    diff = diff_dumps(_last(EARLIER), _last(LATER))
    rows = [(d.old_index, d.new_index, d.change) for d in diff.arenas]
    assert rows == [
        (0, 0, "unchanged"),
        (None, 1, "appeared"),
        *[(k, k + 1, "unchanged") for k in range(1, 15)],
    ]
    appeared = diff.arenas[1]
    newest = _last(LATER).arenas[1]
    assert appeared.old is None and appeared.new is not None
    assert appeared.delta("system_bytes") == newest.system_bytes
    # What changed in total is exactly the new arena.
    assert diff.total_delta("system_bytes") == newest.system_bytes
    assert diff.total_delta("free_bytes") == newest.free_bytes
    assert all(d.delta("free_bytes") == 0 for d in diff.arenas if d.change == "unchanged")


def test_index_is_the_arena_number_in_new_and_in_old_where_it_vanished() -> None:
    forward = diff_dumps(_last(EARLIER), _last(LATER))
    assert [d.index for d in forward.arenas] == list(range(16))
    # NEW with fewer arenas (the arguments swapped, or another process): still aligned from
    # the end, so the arena missing from NEW is the newest of OLD.
    backward = diff_dumps(_last(LATER), _last(EARLIER))
    rows = [(d.old_index, d.new_index, d.change) for d in backward.arenas]
    assert rows[:3] == [(0, 0, "unchanged"), (1, None, "vanished"), (2, 1, "unchanged")]
    assert backward.arenas[1].index == 1
    assert any("fewer arenas" in note for note in backward.notes)
    assert forward.notes == ()


def test_identical_dumps_pair_every_arena_with_itself() -> None:
    dump = _last(LATER)
    diff = diff_dumps(dump, dump)
    assert [(d.old_index, d.new_index) for d in diff.arenas] == [(k, k) for k in range(16)]
    assert {d.change for d in diff.arenas} == {"unchanged"}
