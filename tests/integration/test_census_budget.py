"""A census bounded by a pause budget (`census --max-pause`, and `collect --census-top` within
its `--max-pause`): on a heap of 800 MiB, which a whole census stops for about a quarter of a
second in all (several times either budget here), the stops end at the budget (plus at most
one window's stop), and what was not read is reported, never counted in a type.

The oracle is a whole census of the same idle target, taken first: the bounded census's
live bytes are part of it, and the whole census's live bytes fit in the bounded census's
plus the bytes it says it did not read (conservation)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.targets import compile_target, live_skip_reason, proc_status, started_in_cgroup

_SKIP = live_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]

THREADS = 8
MIB_PER_ARENA = 100


@pytest.fixture(scope="module")
def big_heap() -> Iterator[int]:
    """seeds_heap: 8 idle thread arenas of 100 MiB, free chunks between live ones."""
    with started_in_cgroup(
        [str(compile_target("seeds_heap")), str(THREADS), str(MIB_PER_ARENA), "0"],
        group_name="memforensics-test-census-budget",
        limit_bytes=2 << 30,
        arena_max=THREADS + 1,
        tunables=f"glibc.malloc.mmap_threshold={32 << 20}",
    ) as pid:
        yield pid


@pytest.fixture(scope="module")
def whole_census(big_heap: int) -> dict[str, Any]:
    """An unbounded census of the idle target: the oracle both bounded runs are held to."""
    whole = _memforensics("census", "--json", str(big_heap))
    assert whole["read"]["unwalked_bytes"] == 0
    return whole


def _memforensics(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "memforensics", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def _assert_running(pid: int) -> None:
    fields = proc_status(pid)
    assert fields["TracerPid"] == "0" and fields["State"][0] not in "Tt", fields


@pytest.mark.slow
def test_census_stops_at_its_budget_and_counts_what_it_did_not_read(
    big_heap: int, whole_census: dict[str, Any]
) -> None:
    whole = whole_census
    budget_seconds = 0.025
    bounded = _memforensics("census", "--json", "--max-pause", "25ms", str(big_heap))
    _assert_running(big_heap)

    # The whole census needs several times the budget: the bound is what ends this one.
    assert whole["read"]["total_stop_seconds"] > 4 * budget_seconds, whole["read"]
    read = bounded["read"]
    assert read["total_stop_seconds"] <= budget_seconds + read["longest_stop_seconds"], read
    assert read["heaps_incomplete"] >= 1 and read["unwalked_bytes"] > 0, read
    assert any("pause budget" in note for note in read["notes"]), read["notes"]
    live_whole = whole["totals"]["live_bytes"]
    live_bounded = bounded["totals"]["live_bytes"]
    assert live_bounded < live_whole <= live_bounded + read["unwalked_bytes"]
    assert live_bounded == sum(t["bytes"] for t in bounded["types"])


@pytest.mark.slow
def test_collect_census_stays_within_max_pause(
    big_heap: int, whole_census: dict[str, Any], tmp_path: Path
) -> None:
    """collect's census takes what the inspection left of --max-pause: the run's stops sum
    to at most the budget and one census window's stop (a few ms; 25 ms allowed), and the
    heap it did not reach is exported as memforensics_census_unread_bytes."""
    max_pause_seconds = 0.12
    # The budget must be short of what the census alone needs, or it would read everything.
    assert whole_census["read"]["total_stop_seconds"] > 1.5 * max_pause_seconds, whole_census
    run = _memforensics(
        "collect",
        "--no-oom",
        "--read-only",
        "--census-top",
        "3",
        "--max-pause",
        "120ms",
        "--textfile-dir",
        str(tmp_path),
        "--state-dir",
        str(tmp_path),
        "--json",
        str(big_heap),
    )
    _assert_running(big_heap)
    (target,) = run["targets"]
    assert target["up"], target
    assert run["pause_used_seconds"] <= max_pause_seconds + 0.025, run["pause_used_seconds"]
    assert target["census"], "the inspection left no budget for the census"
    unread = target["census_unread_bytes"]
    assert unread > 0
    text = (tmp_path / "memforensics.prom").read_text()
    (series,) = [s for s in text.splitlines() if s.startswith("memforensics_census_unread_bytes{")]
    assert float(series.rsplit(" ", 1)[1]) == unread


MANY_THREADS = 300  # past arena_hold.STOP_SHARE_MIN_THREADS: each stop costs a hold of 300
BLOCKS = 600  # per thread: every other one freed, the rest filled with 'Z' (text)


@pytest.mark.slow
def test_census_of_many_small_arenas_copies_several_heaps_per_stop() -> None:
    """300 arenas of a few hundred KiB (many_arenas): each heap fits one window, so a stop
    copies the heaps that fit its budget and the walks follow it (a stop per heap, each
    holding all 300 threads, was the census's cost before). The census still counts exactly
    the blocks the target keeps, 300 per thread, as text."""
    with started_in_cgroup(
        [str(compile_target("many_arenas")), str(MANY_THREADS), str(BLOCKS)],
        group_name="memforensics-test-census-many",
        limit_bytes=1 << 30,
        arena_max=MANY_THREADS,
    ) as pid:
        census = _memforensics("census", "--json", str(pid))
        _assert_running(pid)
    read = census["read"]
    assert read["heaps"] >= MANY_THREADS and read["unwalked_bytes"] == 0, read
    assert read["stops"] <= read["heaps"] // 2, read
    text = next(t for t in census["types"] if t["name"] == "text")
    assert text["count"] == MANY_THREADS * BLOCKS // 2
