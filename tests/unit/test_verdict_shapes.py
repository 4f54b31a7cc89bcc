"""Verdicts over the whole RSS on synthetic series, one per shape: which waterfall line grows,
a step is not a trend, memory moving between mmap and the heap is not a leak, a trim's
sawtooth is not fragmentation; recordings without a waterfall keep the malloc_info figures."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from memforensics.analysis.fit import best_step, fit_line
from memforensics.analysis.trend import compute_trend
from memforensics.model.process import Waterfall, WaterfallLine
from memforensics.model.series import Sample
from memforensics.render.sample_json import sample_line
from memforensics.sources.files.recording import RecordingWriter, read_recording
from memforensics.sources.proc.runtime import detect_runtime, elf_section_names

MiB = 1 << 20
T0 = datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)
LINES = ("arena_in_use", "arena_free_resident", "mmap_chunks", "stacks", "other_anon")


def sample(
    i: int,
    *,
    arena: float = 10 * MiB,
    free_resident: float = 2 * MiB,
    mmap: float = 0,
    other: float = 5 * MiB,
    stacks: float = 64 * 1024,
    file: float = 4 * MiB,
    shmem: float = 0,
    malloc_free: float | None = None,
    runtime: str | None = None,
) -> Sample:
    """A heap sample at ``i`` seconds whose waterfall holds the given lines."""
    anon = arena + free_resident + mmap + stacks + other
    rss = anon + file + shmem
    values = dict(
        zip(LINES, (arena, free_resident, mmap, stacks, other), strict=True),
        rss=rss,
        file=file,
        shmem=shmem,
        anon=anon,
    )
    waterfall = Waterfall(
        lines=tuple(WaterfallLine(key, key, int(value), 1) for key, value in values.items())
    )
    free = free_resident if malloc_free is None else malloc_free
    return Sample(
        kind="heap",
        time=T0 + timedelta(seconds=i),
        pid=7,
        process="svc",
        rss_bytes=int(rss),
        anon_bytes=int(anon),
        totals={
            "in_use_bytes": int(arena),
            "free_bytes": int(free),
            "mmap_bytes": int(mmap),
            "system_bytes": int(arena + free),
        },
        free_resident_bytes=int(free_resident),
        waterfall=waterfall,
        runtime=runtime,
    )


def test_a_cpython_small_object_leak_is_outside_malloc_and_names_the_tool() -> None:
    """RSS +149 MiB in a few seconds, all of it in CPython's own arenas (other anonymous):
    the arenas stay flat, so the old verdict was stable."""
    samples = [sample(i, other=5 * MiB + i * 18.6 * MiB, runtime="cpython") for i in range(9)]
    trend = compute_trend(samples)
    assert trend.verdict == "outside-malloc-growing"
    assert trend.growing_lines == ("other_anon",)
    assert trend.runtime == "cpython"
    assert "other anonymous +" in trend.evidence[0]
    assert "tracemalloc" in trend.evidence[0] and "memray" in trend.evidence[0]
    assert trend.in_use is not None and not trend.in_use.growing


@pytest.mark.parametrize(
    ("runtime", "tool"),
    [("jvm", "NativeMemoryTracking"), ("go", "pprof"), ("node", "heap snapshot"), (None, "smaps")],
)
def test_outside_malloc_advice_follows_the_runtime(runtime: str | None, tool: str) -> None:
    samples = [sample(i, other=5 * MiB + i * 4 * MiB, runtime=runtime) for i in range(9)]
    trend = compute_trend(samples)
    assert trend.verdict == "outside-malloc-growing"
    assert tool in trend.evidence[0]


def test_a_leak_of_mmapped_blocks_is_mmap_growing() -> None:
    """256 KiB blocks above the mmap threshold: the arenas never see them."""
    samples = [sample(i, mmap=i * 2 * MiB) for i in range(9)]
    trend = compute_trend(samples)
    assert trend.verdict == "mmap-growing"
    assert trend.growing_lines == ("mmap_chunks",)
    assert trend.in_use is not None and not trend.in_use.growing


def test_memory_moving_from_mmap_to_the_heap_is_not_a_leak() -> None:
    """glibc's dynamic threshold rises: 40 MiB of live blocks move from mmapped chunks to the
    heap over the window. The arena's in use grows (the old verdict: in-use-growing); live
    memory, the two together, does not."""
    samples = [
        sample(i, arena=10 * MiB + i * 5 * MiB, mmap=40 * MiB - i * 5 * MiB) for i in range(9)
    ]
    trend = compute_trend(samples)
    assert trend.verdict == "stable"
    assert trend.arena_in_use is not None and trend.arena_in_use.growing
    assert trend.live is not None and not trend.live.growing
    assert any("blocks moved from mmap to the heap" in line for line in trend.evidence)


def test_a_single_step_is_not_a_trend() -> None:
    """The issue's 12-sample series: 40 MiB moves to the heap in one step with live memory
    constant (old verdict: in-use-growing, t = 5.7); and a step in live memory alone."""
    moved = [
        sample(i, arena=(50 if i >= 6 else 10) * MiB, mmap=(0 if i >= 6 else 40) * MiB)
        for i in range(12)
    ]
    assert compute_trend(moved).verdict == "stable"
    stepped = [sample(i, arena=(50 if i >= 6 else 10) * MiB) for i in range(12)]
    trend = compute_trend(stepped)
    assert trend.verdict == "stable"
    assert trend.live is not None and trend.live.step and not trend.live.growing
    assert trend.live.t_stat > 3  # it passes the t-test: only the step check stops it
    assert "arena_in_use" in trend.step_lines
    assert any("one step of +40.0 MiB" in line for line in trend.evidence)


def test_a_trim_sawtooth_is_not_free_growing() -> None:
    """Free chunks pile up in the bins (malloc_info's free grows: released pages stay
    counted), a periodic trim gives their pages back: free resident is a sawtooth."""
    samples = [
        sample(i, free_resident=(i % 3) * 3 * MiB, malloc_free=4 * MiB + i * 3 * MiB)
        for i in range(9)
    ]
    trend = compute_trend(samples)
    assert trend.free is not None and trend.free.growing  # what the old verdict read
    assert trend.free_resident is not None and not trend.free_resident.growing
    assert trend.verdict == "stable"


def test_free_resident_growth_is_fragmentation() -> None:
    samples = [sample(i, free_resident=2 * MiB + i * 3 * MiB) for i in range(9)]
    assert compute_trend(samples).verdict == "free-growing"


def test_a_leak_in_the_arenas_is_in_use_growing() -> None:
    samples = [sample(i, arena=10 * MiB + i * 2 * MiB, mmap=MiB) for i in range(9)]
    assert compute_trend(samples).verdict == "in-use-growing"


def test_rss_growing_with_no_line_explaining_it() -> None:
    """An older recording (no waterfall): heap flat, RSS climbing."""
    heap = [
        Sample(
            kind="heap",
            time=T0 + timedelta(seconds=i * 10),
            pid=7,
            process="svc",
            rss_bytes=None,
            totals={"in_use_bytes": 10 * MiB, "free_bytes": MiB},
        )
        for i in range(5)
    ]
    rss = [
        Sample(kind="rss", time=T0 + timedelta(seconds=i), pid=7, process="svc", rss_bytes=v)
        for i, v in enumerate(range(20 * MiB, 70 * MiB, MiB))
    ]
    trend = compute_trend([*heap, *rss])
    assert trend.verdict == "rss-growing"
    assert trend.figures == "malloc_info"
    assert "no RSS waterfall was recorded" in trend.evidence[0]


def test_a_leak_that_starts_late_in_the_window_is_still_found() -> None:
    """Flat for the first third, then a steady rise: a line fits better than one step."""
    samples = [sample(i, arena=10 * MiB + max(i - 3, 0) * 4 * MiB) for i in range(12)]
    assert compute_trend(samples).verdict == "in-use-growing"


def test_best_step_finds_the_split() -> None:
    residual, height = best_step([1.0, 1.0, 1.0, 5.0, 5.0])
    assert residual == pytest.approx(0.0, abs=1e-9) and height == pytest.approx(4.0)
    fit = fit_line([0, 1, 2, 3, 4, 5], [0, 0, 0, 10 * MiB, 10 * MiB, 10 * MiB], timed=True)
    assert fit is not None and fit.step and not fit.growing


def test_a_step_caught_once_on_its_way_is_still_one_step() -> None:
    """Nine samples a second apart; the 40 MiB jump took long enough for one sample to see
    it half done. Still one step; a ramp through the same values is a trend."""
    ys = [8 * MiB] * 4 + [28 * MiB] + [48 * MiB] * 4
    fit = fit_line(list(range(9)), ys, timed=True)
    assert fit is not None and fit.step and not fit.growing
    assert fit.step_bytes == pytest.approx(40 * MiB)
    ramp = fit_line(list(range(9)), [8 * MiB + i * 5 * MiB for i in range(9)], timed=True)
    assert ramp is not None and ramp.growing and not ramp.step
    # Caught below both levels it is no transition: not a step by that rule.
    dip = [8 * MiB] * 4 + [0] + [48 * MiB] * 4
    assert best_step(dip)[0] > 0


def test_old_recording_lines_load_without_the_new_keys(tmp_path: Path) -> None:
    """A heap line without ``runtime`` and a waterfall reads as before; one with it keeps it."""
    record = tmp_path / "old.jsonl"
    with RecordingWriter(record) as writer:
        for i in range(4):
            line = sample_line(sample(i, runtime="go"))
            if i < 2:
                del line["runtime"]
                line["waterfall"] = None
            writer.write(line)
    samples = read_recording(record).samples
    assert [s.runtime for s in samples] == [None, None, "go", "go"]
    trend = compute_trend(samples)
    assert trend.figures == "malloc_info" and trend.runtime == "go"
    assert trend.verdict == "stable"


def test_the_runtime_of_this_process_is_cpython() -> None:
    assert detect_runtime(os.getpid()) == "cpython"


def test_elf_sections_of_a_non_elf_file_are_none(tmp_path: Path) -> None:
    text = tmp_path / "script"
    text.write_text("#!/bin/sh\n")
    assert elf_section_names(text) == set()
    assert b".text" in elf_section_names(os.path.realpath("/proc/self/exe"))
