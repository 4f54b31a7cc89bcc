"""Heap residency, the RSS waterfall and the trim forecast against real fragmented processes.

The target (tests/targets/proc_arenas.c) dumps malloc_info and runs malloc_trim itself on
signals, so these tests need no gdb: they check memforensics' /proc reading against what
glibc and the kernel report, and the forecast against the RSS the trim really released.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from memforensics.analysis.residency import residency_advice, waterfall
from memforensics.analysis.trim_forecast import forecast_trim
from memforensics.entry.readers.gdb import read_heap_residency
from memforensics.model.heap import HeapDump
from memforensics.render.process_json import residency_json, waterfall_json
from memforensics.sources.gdb.gdb_capture import capture_malloc_info
from memforensics.sources.malloc_info.malloc_xml import parse_dump
from memforensics.sources.proc import memory_figures, procfs, target_check
from memforensics.sources.proc.procmaps import read_maps
from tests.support.targets import Target, c_target, compile_target, have_cc, memory_cgroup, running

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not have_cc(), reason="no C compiler (cc) to build the target programs"),
]

MIB = 1024 * 1024
FORECAST_TOLERANCE = 0.25  # the bar: forecast within 25 % of the measured release
DEMO_LIMIT_BYTES = 512 * MIB  # the demo-size target runs in a memory cgroup this big


class Arenas:
    """A running proc_arenas target and its control directory."""

    def __init__(self, target: Target, control: Path) -> None:
        self.target = target
        self.control = control

    @property
    def pid(self) -> int:
        return self.target.pid

    def _await(self, name: str) -> str:
        path = self.control / name
        deadline = time.monotonic() + 30
        # The target creates the marker, then writes its line: wait for the whole line.
        while not (path.exists() and path.read_text().endswith("\n")):
            assert self.target.alive(), "target died"
            assert time.monotonic() < deadline, f"target wrote no {name}"
            time.sleep(0.005)
        text = path.read_text()
        path.unlink()
        return text

    def dump(self) -> HeapDump:
        """The target's own malloc_info, parsed."""
        os.kill(self.pid, signal.SIGUSR1)
        self._await("dump.done")
        return parse_dump((self.control / "dump.xml").read_bytes(), name=f"pid {self.pid}")

    def operations(self) -> int:
        """churn_arenas only: dump again; the marker carries the target's operation count."""
        os.kill(self.pid, signal.SIGUSR1)
        return int(self._await("dump.done"))

    def trim(self) -> int:
        """malloc_trim(0) in the target; its return value."""
        os.kill(self.pid, signal.SIGUSR2)
        return int(self._await("trim.done"))


@contextlib.contextmanager
def arenas_target(*args: str) -> Iterator[Arenas]:
    with tempfile.TemporaryDirectory() as tmp, c_target("proc_arenas", tmp, *args) as target:
        yield Arenas(target, Path(tmp))


def _memory_cgroup() -> Path | None:
    return memory_cgroup("memforensics-residency", DEMO_LIMIT_BYTES)


@contextlib.contextmanager
def limited_arenas_target(*args: str) -> Iterator[Arenas]:
    """proc_arenas inside a memory cgroup of DEMO_LIMIT_BYTES (a memory hog stays bounded)."""
    group = _memory_cgroup()
    if group is None:
        pytest.skip("cannot create a memory cgroup here to bound the demo-size target")
    binary = compile_target("proc_arenas")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            # The shell joins the cgroup, then execs the target: its memory is charged there.
            script = 'echo $$ > "$0/cgroup.procs" && exec "$@"'
            argv = ["sh", "-c", script, str(group), str(binary), tmp, *args]
            with running(argv) as target:
                yield Arenas(target, Path(tmp))
    finally:
        with contextlib.suppress(OSError):
            group.rmdir()


def _released_after_trim(arenas: Arenas) -> int:
    before = memory_figures.read_memory(arenas.pid).rss_bytes
    arenas.trim()
    after = memory_figures.read_memory(arenas.pid).rss_bytes
    assert before is not None and after is not None
    return before - after


def test_arenas_matched_in_malloc_info_order() -> None:
    """Each dump arena gets its own heap: mapped bytes equal that arena's system bytes.

    Worker t allocates t times as much, so every arena has a different size and a wrong
    order (malloc_info numbers the newest arena 1) would show as a mismatch.
    """
    with arenas_target("4", "300", "1024", "runs", "0", "scaled") as arenas:
        dump = arenas.dump()
        residency = read_heap_residency(arenas.pid, dump)
        assert residency.method == "arena-chain"
        assert len(dump.arenas) == 5
        assert len({a.system_bytes for a in dump.arenas[1:]}) == 4
        for arena in dump.arenas:
            row = residency.arena(arena.index)
            assert row is not None
            assert row.mapped_bytes >= arena.system_bytes if arena.index == 0 else True
            if arena.index:
                assert row.mapped_bytes == arena.system_bytes
                assert row.address is not None and row.address % (64 * MIB) == 0x30
            assert 0 < row.resident_bytes <= row.mapped_bytes + 4096
            assert row.free_method == "walked"
            # Every binned chunk was written before it was freed: all still resident (the top
            # may hold pages never touched).
            assert row.free_resident_bytes is not None and row.top_bytes is not None
            binned_resident = row.free_resident_bytes - (row.top_resident_bytes or 0)
            assert binned_resident == pytest.approx(arena.free_bytes - row.top_bytes, rel=0.05)


def test_multi_arena_forecast_matches_measured_release() -> None:
    """Fragmented arenas (runs of 15 free buffers): forecast within 25 % of the RSS drop,
    and a second trim forecasts and releases about nothing."""
    with arenas_target("6", "3000", "1024", "runs", "2") as arenas:
        dump = arenas.dump()
        residency = read_heap_residency(arenas.pid, dump)
        forecast = forecast_trim(dump, residency, page_bytes=residency.page_bytes)
        assert forecast.measured
        assert len(forecast.arenas) == 7
        released = _released_after_trim(arenas)
        assert released > 10 * MIB
        assert abs(forecast.releasable_bytes - released) <= FORECAST_TOLERANCE * released

        dump = arenas.dump()
        residency = read_heap_residency(arenas.pid, dump)
        again = forecast_trim(dump, residency, page_bytes=residency.page_bytes)
        assert again.releasable_bytes <= MIB // 4
        assert _released_after_trim(arenas) <= MIB // 4
        # malloc_info still counts the released pages as free: they are "not resident" now.
        assert again.free_not_resident_bytes is not None
        assert again.free_not_resident_bytes >= released * 0.9


def test_xml_estimate_within_tolerance_on_multi_arena_target() -> None:
    """Without the walk (XML buckets x resident share) the estimate still lands within 25 %."""
    with arenas_target("6", "3000", "1024", "runs", "0") as arenas:
        dump = arenas.dump()
        residency = read_heap_residency(arenas.pid, dump)
        unwalked = replace(
            residency, arenas=tuple(replace(a, trimmable_bytes=None) for a in residency.arenas)
        )
        estimate = forecast_trim(dump, unwalked, page_bytes=residency.page_bytes)
        assert not estimate.measured
        released = _released_after_trim(arenas)
        assert abs(estimate.releasable_bytes - released) <= FORECAST_TOLERANCE * released


def test_demo_case_forecast_and_after_trim_waterfall() -> None:
    """200,000 x 1 KiB written then all freed but the last: ~200 MB resident free -> a few MB.

    Before: the waterfall puts almost all anonymous memory in "free, resident" and the
    forecast is within 25 % of the release. After: the free bytes are still in malloc_info
    but no longer resident, and the advice says they are not reclaimable.
    """
    with limited_arenas_target("0", "200000", "1024", "allbutlast", "0") as arenas:
        dump = arenas.dump()
        memory = memory_figures.read_memory(arenas.pid)
        residency = read_heap_residency(arenas.pid, dump)
        wf = waterfall(memory, dump, residency)
        assert (wf.get("arena_free_resident") or 0) > 190 * MIB
        forecast = forecast_trim(dump, residency, page_bytes=residency.page_bytes)
        assert forecast.measured
        assert [a.code for a in residency_advice(dump, residency)] == ["trim-would-release"]

        released = _released_after_trim(arenas)
        assert released > 190 * MIB
        assert abs(forecast.releasable_bytes - released) <= FORECAST_TOLERANCE * released

        after_dump = arenas.dump()
        after_memory = memory_figures.read_memory(arenas.pid)
        assert after_memory.rss_bytes is not None and after_memory.rss_bytes < 16 * MIB
        assert after_dump.free_bytes > 190 * MIB  # glibc still calls it free
        after = read_heap_residency(arenas.pid, after_dump)
        after_wf = waterfall(after_memory, after_dump, after)
        assert (after_wf.get("arena_free_resident") or 0) < 2 * MIB
        assert (after_wf.get("free_not_resident") or 0) > 190 * MIB
        codes = [a.code for a in residency_advice(after_dump, after)]
        assert "free-not-resident" in codes and "trim-would-release" not in codes
        assert forecast_trim(after_dump, after, page_bytes=4096).releasable_bytes < MIB


def test_waterfall_adds_up_to_anonymous_rss() -> None:
    """Idle target: the anonymous parts sum to smaps_rollup's Anonymous; mmapped chunks and
    thread stacks are found; JSON carries every line as *_bytes."""
    with arenas_target("3", "2000", "1024", "alternate", "3") as arenas:
        dump = arenas.dump()
        memory = memory_figures.read_memory(arenas.pid)
        residency = read_heap_residency(arenas.pid, dump)
        wf = waterfall(memory, dump, residency)
        assert memory.anon_bytes is not None and memory.rss_bytes is not None
        parts = [
            "arena_in_use",
            "arena_free_resident",
            "mmap_chunks",
            "stacks",
            "other_anon",
            "unexplained",
        ]
        assert sum(wf.get(k) or 0 for k in parts) == memory.anon_bytes
        assert abs(wf.get("unexplained") or 0) <= 0.05 * memory.anon_bytes
        assert (wf.get("file") or 0) + (wf.get("shmem") or 0) + memory.anon_bytes == (
            memory.rss_bytes
        )
        assert residency.mmap_chunk_bytes == dump.mmap_bytes  # 3 live 1 MiB blocks
        assert residency.mmap_chunk_resident_bytes == dump.mmap_bytes
        assert residency.stack_resident_bytes >= 4 * 4096  # main + 3 thread stacks
        assert residency.heap_resident_bytes <= residency.heap_mapped_bytes
        document = waterfall_json(wf)
        assert document["rss_bytes"] == memory.rss_bytes
        assert {line["key"] for line in document["lines"]} >= {*parts, "rss", "anon", "file"}
        res_doc = residency_json(residency)
        assert res_doc["method"] == "arena-chain"
        assert [a["index"] for a in res_doc["arenas"]] == [a.index for a in dump.arenas]


def test_dump_from_another_moment_falls_back_and_says_so() -> None:
    """A dump that does not fit the process (other arena count) is not matched by chain."""
    with (
        arenas_target("2", "200", "1024", "none") as small,
        arenas_target("4", "200", "1024", "none") as large,
    ):
        foreign = small.dump()
        residency = read_heap_residency(large.pid, foreign)
        assert residency.method != "arena-chain"
        assert any("3 arenas" in note or "5 arenas" in note for note in residency.notes)
        assert residency.heap_resident_bytes > 0


def _gdb_dump(pid: int) -> HeapDump:
    """malloc_info of ``pid`` as glibc writes it, taken at a safe point through gdb."""
    return parse_dump(capture_malloc_info(pid, timeout_seconds=30).xml, name=f"pid {pid}")


def test_single_arena_python_process() -> None:
    """A plain Python process (main arena only, many small objects) is located and walked."""
    code = (
        "import time\n"
        "junk = [bytearray(3000) for _ in range(3000)]\n"
        "del junk[::2]\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    with running([sys.executable, "-c", code]) as target:
        facts = target_check.check_target(target.pid)
        assert facts.allocator.kind == "glibc"
        dump = _gdb_dump(target.pid)
        residency = read_heap_residency(target.pid, dump, libc_path=facts.libc_path)
        row = residency.arena(0)
        assert row is not None and row.address is not None
        assert row.walked_chunks > 0 and row.free_method == "walked"
        # An idle process: the walk finds malloc_info's own free bytes (conservation).
        assert (
            row.balanced
            and row.measured_free_bytes + row.estimated_free_bytes + (row.unaccounted_bytes)
            == row.dump_free_bytes
        )
        assert row.resident_bytes > 3000 * 1500


def test_busy_target_reads_are_safe_and_consistent() -> None:
    """Arenas churning under the reads: every read succeeds, figures stay within bounds,
    lists caught mid-change fall back to estimates, and the target keeps running."""
    with arenas_target("3", "2000", "1024", "runs", "0", "busy") as arenas:
        dump = arenas.dump()
        methods = set()
        for _ in range(20):
            residency = read_heap_residency(arenas.pid, dump)
            assert residency.method in ("arena-chain", "system-mem", "totals")
            for row in residency.arenas:
                methods.add(row.free_method)
                assert row.free_resident_bytes is not None
                assert row.free_resident_bytes >= 0
                assert row.resident_bytes <= row.mapped_bytes + 64 * MIB
                if row.trimmable_bytes is not None:
                    assert row.trimmable_bytes <= row.resident_bytes
            forecast = forecast_trim(dump, residency, page_bytes=residency.page_bytes)
            assert forecast.releasable_bytes >= 0
            assert procfs.process_state(arenas.pid) in "RS"
        assert methods <= {"walked", "partial", "estimate"}
        assert arenas.target.alive()
        assert arenas.dump().arenas  # still answers: not corrupted, not stuck


@contextlib.contextmanager
def churning_target(*args: str) -> Iterator[Arenas]:
    """tests/targets/churn_arenas.c: threads churning a small working set over a fragmented
    heap (same signal protocol as proc_arenas)."""
    with tempfile.TemporaryDirectory() as tmp, c_target("churn_arenas", tmp, *args) as target:
        yield Arenas(target, Path(tmp))


BUSY_REPORTS = 5
BUSY_MEASURED_SHARE = 0.90  # issue 11: >= 90 % of the free bytes measured in most reports
# The walk's time budget is about waiting, not about a moving heap: on a loaded CI machine it
# would stop the walk before the heap's motion is what the test looks at.
BUSY_BUDGET_SECONDS = 60.0


@pytest.mark.slow
def test_busy_service_free_bytes_are_mostly_measured() -> None:
    """Four threads churn malloc/free over fragmented arenas while the residency is read:
    arenas are matched one by one, lists caught moving are read again, and at least 90 %
    of the free bytes are measured in most reports (before issue 11: 0.2 %, every busy
    arena went to the estimate). The target verifies its blocks and keeps working."""
    with churning_target("4", "20000", "256") as busy:
        shares = []
        for _ in range(BUSY_REPORTS):
            dump = busy.dump()
            residency = read_heap_residency(busy.pid, dump, budget_seconds=BUSY_BUDGET_SECONDS)
            assert residency.method == "arena-chain"
            assert len(residency.arenas) == len(dump.arenas) == 5
            shares.append(residency.measured_share)
            total = residency.measured_free_bytes + residency.estimated_free_bytes
            # What the walk found and what the XML says differ only by what moved meanwhile.
            assert total == pytest.approx(dump.free_bytes, rel=0.1)
            for row in residency.arenas:
                assert row.free_method in ("walked", "partial")
                assert row.measured_free_bytes > 0
            assert len(residency.notes) <= 3  # one line per reason, not one per arena
        assert sorted(shares)[BUSY_REPORTS // 2] >= BUSY_MEASURED_SHARE, shares
        operations_before = busy.operations()
        deadline = time.monotonic() + 30
        while busy.operations() <= operations_before:  # still churning, not stuck
            assert busy.target.alive() and time.monotonic() < deadline


@pytest.mark.slow
def test_busy_service_trim_forecast_is_within_a_quarter_of_the_release() -> None:
    """The forecast, read while the threads churn, is within 25 % of what malloc_trim then
    releases: the big free chunks holding whole pages stay put while the small ones move."""
    with churning_target("4", "20000", "256") as busy:
        dump = busy.dump()
        residency = read_heap_residency(busy.pid, dump, budget_seconds=BUSY_BUDGET_SECONDS)
        forecast = forecast_trim(dump, residency, page_bytes=residency.page_bytes)
        # One report: mostly measured (the 90 % bar over several reports is the test above).
        assert forecast.measured_share >= 0.5
        released = _released_after_trim(busy)
        assert released > 8 * MIB
        assert abs(forecast.releasable_bytes - released) <= FORECAST_TOLERANCE * released
        if not forecast.measured:
            assert any(note.startswith("error bar:") for note in forecast.notes)
        assert busy.target.alive()


def test_fastbins_are_walked_through_safe_linking() -> None:
    """64-byte blocks freed every other one fill the fastbins (glibc >= 2.32 stores their
    links mangled as (address >> 12) ^ fd): they are walked, not taken from the XML, and
    the walk finds the bytes malloc_info counts."""
    with arenas_target("2", "2000", "64", "alternate") as arenas:
        dump = arenas.dump()
        residency = read_heap_residency(arenas.pid, dump)
        assert (dump.fast_bytes or 0) > 100_000
        assert residency.estimated_free_bytes == 0 and residency.measured_share == 1.0
        for arena in dump.arenas:
            row = residency.arena(arena.index)
            assert row is not None and row.free_method == "walked"
            if arena.fast_chunks:
                assert row.walked_chunks >= arena.fast_chunks
            # Regular bins print sizes with PREV_INUSE (+1 per chunk); fastbins do not.
            assert arena.free_bytes - arena.rest_chunks <= row.measured_free_bytes
            assert row.measured_free_bytes <= arena.free_bytes


def test_forked_child_whose_heap_shows_as_two_mappings_is_walked_whole() -> None:
    """A forked child that grew its heap (every PostgreSQL backend) shows [heap] as two
    adjacent mappings; free chunks straddle them. Before, only the first was the main heap,
    so every list leaving it read as inconsistent: 0.5 % of a backend's free bytes were
    measured under pgbench. The heap is one, and it is walked whole."""
    code = (
        "import os, sys, time\n"
        "keep = [bytearray(3000) for _ in range(2000)]\n"
        "if os.fork() == 0:\n"
        "    more = [bytearray(3000) for _ in range(6000)]\n"
        "    del more[::2]\n"
        "    print('ready', os.getpid(), flush=True)\n"
        "    time.sleep(120)\n"
        "    os._exit(0)\n"
        "os.wait()\n"
    )
    with running([sys.executable, "-c", code]) as parent:
        child = int(parent.ready_line.split()[-1])
        try:
            heaps = [m for m in read_maps(child) if m.path == "[heap]"]
            assert len(heaps) >= 2, "precondition: the kernel split the child's heap"
            facts = target_check.check_target(child)
            dump = _gdb_dump(child)
            row = read_heap_residency(child, dump, libc_path=facts.libc_path).arena(0)
            assert row is not None and row.free_method == "walked" and not row.estimated_bins
            assert row.balanced
            assert row.walked_chunks >= 2000
            assert row.mapped_bytes == heaps[-1].end_address - heaps[0].start_address
        finally:
            os.kill(child, signal.SIGKILL)
