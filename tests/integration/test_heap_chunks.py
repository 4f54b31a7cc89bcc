"""The chunk walk (sources.glibc.heap_chunks) against the target's own account of its heap.

The oracle is tests/targets/chunk_oracle.c: it writes every pointer it holds (with
malloc_usable_size, glibc's own word for the chunk's size) and every pointer it freed. Each
live pointer must be a LIVE chunk of exactly usable + 8 bytes (or one of the mmapped chunks),
each freed one FREE, FAST or TCACHE (or merged into a neighbour); the chunks must tile each
heap from its first chunk to its top; tcache off (GLIBC_TUNABLES) leaves no TCACHE chunk. The
same walk of a gcore of the target gives the same chunks.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path

import pytest

from memforensics.model.chunks import ChunkState, ProcessChunks
from memforensics.sources.glibc.heap_chunks import walk_core_chunks, walk_process_chunks
from tests.support.gcore import gcore
from tests.support.glibc_releases import (
    RELEASES,
    build_target,
    command,
    release_tree,
    skip_reason,
)
from tests.support.targets import c_target, live_skip_reason, ptrace_skip_reason, running

_SKIP = ptrace_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]


def _oracle(path: Path) -> tuple[dict[int, int], list[int], dict[int, int]]:
    live: dict[int, int] = {}
    freed: list[int] = []
    big: dict[int, int] = {}
    for line in path.read_text().splitlines():
        kind, pointer, *rest = line.split()
        chunk = int(pointer, 16) - 16
        if kind == "L":
            live[chunk] = int(rest[0]) + 8
        elif kind == "M":
            big[chunk] = int(rest[0])
        else:
            freed.append(chunk)
    return live, freed, big


def _check_tiling(walked: ProcessChunks) -> None:
    for heap in walked.heaps:
        assert heap.complete, (heap.arena, heap.stop_reason)
        assert heap.chunk_count == len(heap.addresses)
        for i in range(len(heap.addresses) - 1):
            assert heap.addresses[i] + heap.sizes[i] == heap.addresses[i + 1]
        assert heap.addresses[0] == heap.start
        assert heap.states[-1] == ChunkState.TOP, heap.arena
        assert bytes(heap.states).count(ChunkState.TOP) == 1


def _check_against(walked: ProcessChunks, oracle: Path) -> collections.Counter[str]:
    live, freed, big = _oracle(oracle)
    chunks = {
        address: (size, state)
        for heap in walked.heaps
        for address, size, state in zip(heap.addresses, heap.sizes, heap.states, strict=True)
    }
    mmapped = dict(walked.mmapped)
    for chunk, size in live.items():
        assert chunks.get(chunk) == (size, ChunkState.LIVE), hex(chunk)
    for chunk, usable in big.items():
        if chunk in mmapped:
            assert mmapped[chunk] == usable + 16
        else:
            assert chunks.get(chunk) == (usable + 8, ChunkState.LIVE)
    seen: collections.Counter[str] = collections.Counter()
    for chunk in freed:
        got = chunks.get(chunk)
        state = ChunkState(got[1]).name if got else "merged"
        seen[state] += 1
    assert seen["LIVE"] == 0, seen
    assert seen["TOP"] == 0, seen
    return seen


def test_live_walk_matches_what_the_target_allocated(tmp_path: Path) -> None:
    oracle = tmp_path / "pointers.txt"
    with c_target("chunk_oracle", str(oracle)) as target:
        stops: list[float] = []
        walked = walk_process_chunks(target.pid, stops_seconds=stops)
        assert target.alive() and target.settled_state() == "S"
    assert len(walked.heaps) == 4  # the main heap and three thread arenas
    _check_tiling(walked)
    seen = _check_against(walked, oracle)
    assert seen["TCACHE"] > 0 and seen["FREE"] > 0
    assert walked.tcache_keys >= 1
    # Every arena's first thread's tcache_perthread_struct is its first chunk.
    for heap in walked.heaps:
        assert heap.states[0] == ChunkState.BOOKKEEPING
    assert stops and max(stops) < 0.1


def test_tcache_off_leaves_no_tcache_chunk(tmp_path: Path) -> None:
    oracle = tmp_path / "pointers.txt"
    env = {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}
    with c_target("chunk_oracle", str(oracle), env=env) as target:
        walked = walk_process_chunks(target.pid)
    _check_tiling(walked)
    seen = _check_against(walked, oracle)
    assert seen["TCACHE"] == 0 and seen["FAST"] > 0


def test_keep_false_counts_the_same_and_visits_every_chunk(tmp_path: Path) -> None:
    oracle = tmp_path / "pointers.txt"
    visited: collections.Counter[int] = collections.Counter()

    def visit(ref, view, base, addresses, sizes, states) -> None:  # type: ignore[no-untyped-def]
        for address, state in zip(addresses, states, strict=True):
            assert address - base < len(view) or address == base
            visited[state] += 1

    with c_target("chunk_oracle", str(oracle)) as target:
        kept = walk_process_chunks(target.pid)
        counted = walk_process_chunks(target.pid, keep=False, visit=visit)
    for a, b in zip(kept.heaps, counted.heaps, strict=True):
        assert a.chunk_count == b.chunk_count and not b.addresses
        assert a.walked_end == b.walked_end
    every = collections.Counter(s for heap in kept.heaps for s in heap.states)
    every[ChunkState.LIVE] += len(kept.mmapped)
    assert visited == every


@pytest.mark.skipif(live_skip_reason() is not None, reason=str(live_skip_reason()))
def test_core_walk_equals_the_live_walk(tmp_path: Path) -> None:
    oracle = tmp_path / "pointers.txt"
    core = tmp_path / "core"
    with c_target("chunk_oracle", str(oracle)) as target:
        live = walk_process_chunks(target.pid)
        gcore(target.pid, core)
    dead = walk_core_chunks(str(core))
    _check_tiling(dead)
    _check_against(dead, oracle)
    assert [(h.arena, h.start, bytes(h.states)) for h in live.heaps] == [
        (h.arena, h.start, bytes(h.states)) for h in dead.heaps
    ]
    assert sorted(live.mmapped) == sorted(dead.mmapped)


@pytest.mark.parametrize("version", RELEASES)
def test_walk_on_each_glibc_release(tmp_path: Path, version: str) -> None:
    """2.31 (tcache key = the owning struct, no safe-linking), 2.36 and 2.41 (a random key,
    safe-linked fastbins), each target run through its release's own loader."""
    release = release_tree(version)
    if release is None:
        pytest.skip(f"glibc {version}: {skip_reason(version)}")
    oracle = tmp_path / "pointers.txt"
    binary = build_target(release, "chunk_oracle")
    with running(command(release, binary, [str(oracle)])) as target:
        walked = walk_process_chunks(target.pid)
    _check_tiling(walked)
    seen = _check_against(walked, oracle)
    assert seen["TCACHE"] > 0 and seen["FREE"] > 0, seen


def test_c_and_python_window_walks_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The optional C loop (_heapwindow.c) and the Python one walk the same chunks."""
    from memforensics.sources.glibc import heap_window

    if os.environ.get("MEMFORENSICS_PURE_PYTHON"):
        pytest.skip("MEMFORENSICS_PURE_PYTHON keeps the C loop out: nothing to compare")
    assert heap_window._native is not None, "the C loop is not built (setup.py build_ext)"
    oracle = tmp_path / "pointers.txt"
    with c_target("chunk_oracle", str(oracle)) as target:
        in_c = walk_process_chunks(target.pid)
        monkeypatch.setattr(heap_window, "_native", None)
        in_python = walk_process_chunks(target.pid)
    for a, b in zip(in_c.heaps, in_python.heaps, strict=True):
        assert (a.addresses, a.sizes, a.states) == (b.addresses, b.sizes, b.states)
    _check_against(in_c, oracle)
