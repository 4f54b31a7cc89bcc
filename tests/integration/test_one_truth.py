"""Live figures against oracles that are not the code that computed them: malloc_info's own
free bytes (the dump's totals), the kernel's RSS before and after a trim, and conservation.

The README's case with a main loop that keeps allocating: the early scan begins before gdb's
call sorts the unsorted bin, so the bins it walks must come from each snapshot it reads, and
a walk that misses the dump's free bytes must be read again, never called "walked".
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.targets import c_target, needs_live

pytestmark = [pytest.mark.integration, needs_live]

MIB = 1024 * 1024
INSPECTS = 6


def _cli(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "memforensics", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def _vm_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_classic_case_in_a_busy_loop_is_measured_against_the_dump_and_the_kernel() -> None:
    with c_target("classic_loop", "200000", "1024") as target:
        for _ in range(INSPECTS):
            document = _cli("inspect", "--json", str(target.pid))
            free = document["totals"]["free_bytes"]  # malloc_info's own fast + rest
            residency = document["residency"]
            measured = residency["measured_free_bytes"]
            assert free > 190 * MIB
            oracle_share = min(measured, free) / free
            assert oracle_share >= 0.9, residency["notes"]
            # Never a share above what was measured of the dump.
            assert residency["measured_share"] <= oracle_share + 0.01
            waterfall = document["waterfall"]
            # The 198 MiB chunk is resident: it is not "released".
            assert waterfall["arena_free_resident_bytes"] > 190 * MIB
            assert waterfall["free_not_resident_bytes"] < 8 * MIB
            for arena in residency["arenas"]:
                total = (
                    arena["measured_free_bytes"]
                    + arena["estimated_free_bytes"]
                    + arena["unaccounted_bytes"]
                )
                assert total == arena["dump_free_bytes"]
            time.sleep(0.1)
        before = _vm_rss_bytes(target.pid)
        trim = _cli("trim", "--json", str(target.pid))
        time.sleep(0.2)
        released = before - _vm_rss_bytes(target.pid)
        assert released > 190 * MIB
        assert abs(trim["forecast_bytes"] - released) <= 0.1 * released
        # What was called not resident plus what the trim released never exceeds the free total.
        assert waterfall["free_not_resident_bytes"] + released <= free + 4 * MIB


def test_pad_is_honoured_by_the_forecast() -> None:
    """trim --pad keeps that much of the main arena's top (glibc's systrim): a 40 MiB resident
    top trimmed with a 32 MiB pad gives back about 8 MiB, and the forecast says about 8 MiB,
    checked against the kernel's RSS."""
    env = {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=4294967296"}
    with c_target("classic_loop", "40960", "1024", "top", env=env) as target:
        before = _vm_rss_bytes(target.pid)
        trim = _cli("trim", "--json", "--pad", "32MiB", str(target.pid))
        time.sleep(0.2)
        released = before - _vm_rss_bytes(target.pid)
        assert 6 * MIB <= released <= 10 * MIB, released
        assert abs(trim["forecast_bytes"] - released) <= 0.1 * released + 64 * 1024


def test_a_single_threaded_heap_is_read_at_the_moment_of_its_dump() -> None:
    """A single-threaded target churning its heap: the read made while gdb still holds its
    only thread, right after malloc_info, sees the heap the dump describes, so every arena
    balances with the dump (conservation, the dump being glibc's own figures)."""
    from memforensics.analysis.residency_build import build_residency
    from memforensics.entry.readers.gdb import inspect_process
    from memforensics.model.heapscan import HeapScan

    with c_target("classic_loop", "20000", "1024") as target:
        for _ in range(4):
            inspection = inspect_process(
                target.pid, timeout_seconds=30, gdb_path=None, allow_stopped=False
            )
            held = inspection.capture.held_result
            assert isinstance(held, HeapScan)
            residency = build_residency(inspection.analysis.dump, held)
            for arena in residency.arenas:
                assert arena.balanced and arena.free_method == "walked", arena
            assert residency.measured_share >= 0.99


def test_a_python_main_heap_over_64_mib_is_measured_whole() -> None:
    """CPython's big objects come from malloc's main arena: a [heap] past 64 MiB with half its
    blocks freed is measured against the dump's own free bytes, balanced, and its waterfall
    adds up to the kernel's anonymous memory within what changed between the reads."""
    code = (
        "import time\n"
        "junk = [bytearray(3000) for _ in range(40000)]\n"
        "del junk[::2]\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    from tests.support.targets import python_target

    with python_target(code) as target:
        document = _cli("inspect", "--json", str(target.pid))
        free = document["totals"]["free_bytes"]
        residency = document["residency"]
        main = residency["arenas"][0]
        assert main["mapped_bytes"] > 64 * MIB
        assert free > 50 * MIB
        assert min(residency["measured_free_bytes"], free) / free >= 0.9
        assert main["balanced"] and main["free_method"] == "walked"
        waterfall = document["waterfall"]
        parts = sum(
            waterfall[f"{key}_bytes"]
            for key in (
                "arena_in_use",
                "arena_free_resident",
                "mmap_chunks",
                "stacks",
                "other_anon",
            )
        )
        assert abs(document["process"]["anon_bytes"] - parts) <= 2 * MIB
