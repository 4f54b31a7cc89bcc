"""A small arena read inside a stop: its lists read lazily up to HELD_LAZY_MAX_CHUNKS chunks,
the rest over a whole copy. Wherever that cut falls, the read is the whole copy's read.

The oracle is the same read with the cap at 0 (every list over a whole copy, the path the
release tests in test_read_only.py hold equal to the target's own malloc_info): the
malloc_info document and every arena's residency figures must not change with the cap.
"""

from __future__ import annotations

import collections

import pytest

from memforensics.entry.readers.memory import inspect_read_only
from memforensics.sources.glibc import glibc_walk
from tests.support.residency_figures import walk_figures
from tests.support.targets import compile_target, ptrace_skip_reason, running

_SKIP = ptrace_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]


def _figures(pid: int) -> tuple[bytes, list[tuple[object, ...]]]:
    inspection = inspect_read_only(pid)
    assert inspection.residency is not None
    return inspection.capture.xml, walk_figures(inspection.residency)


@pytest.mark.parametrize(("shape", "seed"), [("small", 12), ("unsorted", 14), ("random", 21)])
def test_the_lazy_read_equals_the_whole_copys_wherever_it_is_cut(
    shape: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = compile_target("heap_shapes")
    rounds: collections.Counter[str] = collections.Counter()
    prefetch = glibc_walk.ArenaWalker._prefetch

    def counted_prefetch(walker: glibc_walk.ArenaWalker) -> None:
        rounds["whole"] += 1
        prefetch(walker)

    monkeypatch.setattr(glibc_walk.ArenaWalker, "_prefetch", counted_prefetch)
    with running([str(binary), str(seed), shape, "-"], ready_timeout_seconds=60) as target:
        monkeypatch.setattr(glibc_walk, "HELD_LAZY_MAX_CHUNKS", 0)
        whole = _figures(target.pid)
        assert rounds["whole"] >= 1, "the cap at 0 read no whole copy"
        assert sum(row[2] for row in whole[1]) > 3  # lists to cut
        for cap in (1, 3, 256):
            monkeypatch.setattr(glibc_walk, "HELD_LAZY_MAX_CHUNKS", cap)
            rounds.clear()
            assert _figures(target.pid) == whole, f"cap {cap}"
            if cap == 1:
                assert rounds["whole"] >= 1, "a cap of one chunk left no list to the whole copy"
