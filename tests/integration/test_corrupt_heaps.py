"""Corrupt heaps, as a user meets them: `inspect` and `trim` (their defaults) on targets that
corrupted their own free lists (tests/targets/corrupt_heap.c), on glibc 2.31, 2.36 and 2.41.

Oracles that are not memforensics' code: the target prints which arena it corrupted (its
malloc_state, found from its own unsorted bin) and what it wrote; after each command this
test itself reads /proc: the target alive, asleep (state S), untraced (TracerPid 0) in every
thread, and each arena's mutex word 0, read from /proc/PID/mem here. A fake `gdb` first on
PATH records any start of gdb: on a corrupt heap none may be started (malloc_info would be
called into it). Each command's own peak RSS comes from wait4.

The fuzzer: seeded random corruptions of free-chunk headers (size, fd, bk, fd_nextsize,
bk_nextsize set to random values, to other chunks, to small integers, to themselves), seven
per target process (one per thread arena) plus an intact main arena: 203 seeds in the default
run, 1,001 more under `slow`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from memforensics.model import corruption as checks
from memforensics.model.heapscan import HeapScan
from memforensics.sources.glibc.arena_hold import StopBatches
from memforensics.sources.glibc.heapcopy import copy_budget_bytes
from memforensics.sources.glibc.heapmaps import scan_heap
from memforensics.sources.glibc.libc_elf import load_libc_image
from tests.support.glibc_releases import RELEASES, GlibcRelease, build_target, command, release_tree
from tests.support.glibc_releases import skip_reason as release_skip_reason
from tests.support.measured import Run, run_measured
from tests.support.schema import missing_keys
from tests.support.targets import Target, in_cgroup, live_skip_reason, memory_cgroup, running

_SKIP = live_skip_reason()
pytestmark = [pytest.mark.integration, pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")]

DEADLINE_SECONDS = 30.0  # the bound on each command
PEAK_RSS_MAX_KIB = 200 * 1024
EXIT_CORRUPT = 8
TUNABLES = {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}  # frees reach the bins
NAMED = ("cycle", "self", "unmapped", "fastloop", "largeloop", "topsize", "badsize", "zerosize")
SEEDS_PER_TARGET = 7  # one per thread arena: 8 arenas fit the arena limit of any machine
DEFAULT_SEEDS = range(1, 204)  # 29 targets x 7
SLOW_SEEDS = range(1000, 2001)
KNOWN_CHECKS = {
    value for name, value in vars(checks).items() if name.isupper() and isinstance(value, str)
}


@dataclass
class Corrupted:
    """What the target says it did: arena number -> (its malloc_state, what was corrupted)."""

    arenas: dict[int, int]
    corrupted: dict[int, str]


@pytest.fixture
def fake_gdb() -> Iterator[tuple[Path, Path]]:
    """A directory whose `gdb` records that it ran (and fails), and the record's path."""
    with tempfile.TemporaryDirectory(prefix="corrupt-heaps-") as folder:
        record = Path(folder) / "gdb-started"
        gdb = Path(folder) / "gdb"
        gdb.write_text(f'#!/bin/sh\necho "$@" >> {record}\nexit 1\n')
        gdb.chmod(0o755)
        yield Path(folder), record


def _release(version: str) -> GlibcRelease:
    release = release_tree(version)
    if release is None:
        pytest.skip(f"glibc {version}: {release_skip_reason(version)}")
    return release


@contextlib.contextmanager
def corrupt_target(
    version: str, specs: list[str], pad_mib: int = 0, spread: int = 0
) -> Iterator[tuple[Target, Corrupted]]:
    """tests/targets/corrupt_heap.c with ``specs`` on ``version``, and what it says it did;
    ``pad_mib``: each arena holds that much live memory first (32 or more: it is scouted);
    ``spread``: then that many free chunks, each on a page of its own (CORRUPT_HEAP_SPREAD);
    a padded target runs in a memory cgroup of what it needs and 256 MiB more."""
    release = _release(version)
    binary = build_target(release, "corrupt_heap")
    env = dict(TUNABLES, CORRUPT_HEAP_PAD_MIB=str(pad_mib), CORRUPT_HEAP_SPREAD=str(spread))
    pad_mib += spread * 25 // 1024  # what the spread pairs take
    argv = command(release, binary, specs)
    group = memory_cgroup("memforensics-test-corrupt", (len(specs) * pad_mib + 256) << 20)
    if pad_mib and group is not None:
        argv = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group), *argv]
    try:
        with running(argv, env=env, ready_timeout_seconds=30) as target:
            yield target, _said(target.ready_line, len(specs))
    finally:
        if group is not None:
            with contextlib.suppress(OSError):
                group.rmdir()


def _said(ready_line: str, n: int) -> Corrupted:
    """The target's own lines, repeated on its ready line after " ; "."""
    arenas: dict[int, int] = {}
    corrupted: dict[int, str] = {}
    for line in ready_line.split(" ; ")[1:]:
        if match := re.match(r"arena (\d+) (0x[0-9a-f]+)", line):
            arenas[int(match[1])] = int(match[2], 16)
        elif match := re.match(r"corrupted (\d+) (.*)", line):
            corrupted[int(match[1])] = match[2]
    assert len(arenas) == n, ready_line
    return Corrupted(arenas, corrupted)


def _run(args: list[str], path_first: Path) -> Run:
    """One memforensics command, its wall time and its own peak RSS."""
    env = dict(os.environ, PATH=f"{path_first}:{os.environ['PATH']}")
    return run_measured(args, timeout_seconds=DEADLINE_SECONDS + 30, env=env)


def _assert_left_intact(target: Target, said: Corrupted) -> None:
    """Alive, asleep and untraced in every thread; every arena's mutex free (read here)."""
    pid = target.pid
    assert target.proc.poll() is None, "the target died"
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = dict(
            line.split(":\t", 1)
            for line in (task / "status").read_text().splitlines()
            if ":\t" in line
        )
        assert status["State"].startswith("S"), (task.name, status["State"])
        assert status["TracerPid"].strip() == "0", (task.name, status["TracerPid"])
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for number, address in said.arenas.items():
            mem.seek(address)
            assert mem.read(4) == bytes(4), f"arena {number}'s mutex is held"


def _assert_sound_run(run: Run, expect_corrupt: bool) -> None:
    assert run.exit_code == (EXIT_CORRUPT if expect_corrupt else 0), (run.exit_code, run.stderr)
    assert run.seconds < DEADLINE_SECONDS, run.seconds
    assert run.peak_rss_kib <= PEAK_RSS_MAX_KIB, run.peak_rss_kib
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr, run.stderr


def _check_inspect(target: Target, said: Corrupted, fake: tuple[Path, Path]) -> dict[str, Any]:
    folder, record = fake
    run = _run(["inspect", "--json", str(target.pid)], folder)
    _assert_sound_run(run, bool(said.corrupted))
    assert not record.exists(), f"gdb was started: {record.read_text()}"
    _assert_left_intact(target, said)
    document = json.loads(run.stdout)
    if not said.corrupted:
        assert document["schema"] == "memforensics/heap/1"
        return document
    assert document["schema"] == "memforensics/heap-corrupt/1"
    assert missing_keys(document, "memforensics/heap-corrupt/1") == []
    found = {int(f["arena_address"], 16): f for f in document["corruption"]}
    for number, address in said.arenas.items():
        if number in said.corrupted:
            assert address in found, (number, said.corrupted[number], document["corruption"])
            assert found[address]["check"] in KNOWN_CHECKS
        else:
            assert address not in found, (number, found[address])
    # "complete": every bin read and none failed a check, so false exactly where the target
    # says it corrupted the arena (nothing here runs the read out of its time). Arena 0 is
    # main_arena, matched by that (the address the target derives for it from a freed
    # chunk's bk is 16 bytes off on glibc 2.41; it is never corrupted).
    numbers = {address: number for number, address in said.arenas.items()}
    complete = {
        0 if arena["is_main"] else numbers[int(arena["address"], 16)]: arena["complete"]
        for arena in document["arenas"]
    }
    assert complete == {number: number not in said.corrupted for number in said.arenas}, complete
    return document


def _check_trim(target: Target, said: Corrupted, fake: tuple[Path, Path]) -> None:
    folder, record = fake
    run = _run(["trim", str(target.pid)], folder)
    _assert_sound_run(run, bool(said.corrupted))
    assert not record.exists(), f"gdb was started: {record.read_text()}"
    if said.corrupted:
        assert "corrupt" in run.stderr, run.stderr
    _assert_left_intact(target, said)


@pytest.mark.parametrize("version", RELEASES, ids=[f"glibc-{v}" for v in RELEASES])
@pytest.mark.parametrize("half", [0, 1], ids=["cases-1", "cases-2"])
def test_named_corruptions_are_reported_never_called_into(
    version: str, half: int, fake_gdb: tuple[Path, Path]
) -> None:
    """The issue's cases, four per target (one per arena), beside an intact main arena."""
    specs = ["intact", *NAMED[half * 4 : half * 4 + 4]]
    with corrupt_target(version, specs) as (target, said):
        assert set(said.corrupted) == {1, 2, 3, 4}
        _check_inspect(target, said, fake_gdb)
        _check_trim(target, said, fake_gdb)


@pytest.mark.parametrize("version", RELEASES, ids=[f"glibc-{v}" for v in RELEASES])
def test_named_corruptions_in_scouted_arenas_are_reported(
    version: str, fake_gdb: tuple[Path, Path]
) -> None:
    """Arenas of 40 MiB, so their lists are scouted before their stops: the corruption meets
    the scout (followed from the running target, never trusted) and then the walk over the
    scouted copy, fails there and again from the held target, and is reported by glibc's
    checks as in a small arena. The intact control says the padded arenas were scouted."""
    with corrupt_target(version, ["intact"] * 3, pad_mib=40) as (target, said):
        run = _run(["inspect", "--json", str(target.pid)], fake_gdb[0])
        _assert_sound_run(run, False)
        assert json.loads(run.stdout)["read_only"]["scouted_arenas"] == 3
    for half in (0, 1):
        specs = ["intact", *NAMED[half * 4 : half * 4 + 4]]
        with corrupt_target(version, specs, pad_mib=40) as (target, said):
            _check_inspect(target, said, fake_gdb)
            _check_trim(target, said, fake_gdb)


def _held_scan(pid: int) -> HeapScan:
    """scan_heap of ``pid`` in short stops (the default read's), with malloc_info's figures."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    libc_path = next(
        line.split()[-1] for line in maps if re.search(r"/libc(\.so\.6|-[\d.]+\.so)$", line)
    )
    batches = StopBatches(pid, libc=load_libc_image(pid, libc_path), single_threaded=False)
    try:
        return scan_heap(pid, libc_path=libc_path, figures=True, hold=batches)
    finally:
        batches.close()


@pytest.mark.parametrize("version", RELEASES, ids=[f"glibc-{v}" for v in RELEASES])
def test_named_corruptions_in_arenas_read_in_parts_are_reported(
    version: str, fake_gdb: tuple[Path, Path]
) -> None:
    """Arenas whose lists lie on more pages than one stop copies (6,000 free chunks, a page
    each, beside the named lists): read in parts, a run of bins per stop. Each corruption is
    met in the stop of the part holding its bin (the small bins' early, the large bin's
    last), and reported there as in a small arena; the intact arenas' parts report none.
    The control says the arenas were read in parts."""
    with corrupt_target(version, ["intact"] * 2, pad_mib=0, spread=6000) as (target, said):
        run = _run(["inspect", "--json", str(target.pid)], fake_gdb[0])
        _assert_sound_run(run, False)
        read = json.loads(run.stdout)["read_only"]
        assert read["parted_arenas"] == 2 and read["arena_parts"] >= 4, read
    specs = ["intact", "cycle", "largeloop", "badsize", "fastloop"]
    with corrupt_target(version, specs, pad_mib=0, spread=6000) as (target, said):
        assert set(said.corrupted) == {1, 2, 3, 4}
        _check_inspect(target, said, fake_gdb)
        # The read itself, in this process: each corrupt arena was read in parts, and its
        # corruption found in one of them.
        scan = _held_scan(target.pid)
        by_address = {arena.address: arena for arena in scan.arenas}
        for number in said.corrupted:
            arena = by_address[said.arenas[number]]
            assert len(arena.parts) >= 2 and arena.corruption, (number, arena.parts)
        _check_trim(target, said, fake_gdb)


@pytest.mark.parametrize("version", RELEASES, ids=[f"glibc-{v}" for v in RELEASES])
def test_corruptions_in_arenas_above_the_copy_budget_are_reported(
    version: str, fake_gdb: tuple[Path, Path]
) -> None:
    """Arenas of 256 MiB and more, above the copies' budget (never copied whole: scouted up
    to it, their scouted pages copied in their stops), each with one of the issue's
    corruptions: reported by glibc's checks as in a small arena, never called into, the
    target left intact, our peak RSS as bounded as for a small heap."""
    assert copy_budget_bytes() < 256 << 20
    specs = ["intact", "cycle", "largeloop"]
    with corrupt_target(version, specs, pad_mib=256) as (target, said):
        assert set(said.corrupted) == {1, 2}
        document = _check_inspect(target, said, fake_gdb)
        assert len(document["corruption"]) == 2
        _check_trim(target, said, fake_gdb)


@pytest.mark.slow
def test_corrupt_arenas_whose_last_part_is_relayed_keep_our_memory_bounded(
    fake_gdb: tuple[Path, Path],
) -> None:
    """Arenas of 100 MiB with 20,000 spread free chunks each (their lists on 80 MiB of
    pages: read in parts, the last one in relays), a named corruption in three of them.
    Each arena's scouted pages are given back once its last part is read, relayed or not
    (a relayed last part kept them: 90 MiB an arena, 490 MiB at 8 arenas): our peak RSS
    stays within the bound. In a 64 MiB memory cgroup our side is not killed either (the
    scouts take what the limit leaves them as they go, the relays' windows shrink) and
    reports the same arenas corrupt."""
    specs = ["intact", "cycle", "self", "intact", "unmapped", "intact"]
    with corrupt_target("2.36", specs, pad_mib=100, spread=20000) as (target, said):
        document = _check_inspect(target, said, fake_gdb)
        group = memory_cgroup("memforensics-test-corrupt-ours", 64 << 20)
        assert group is not None, "no memory cgroup can be made on this machine"
        try:
            argv = [sys.executable, "-m", "memforensics", "inspect", "--json", str(target.pid)]
            limited = subprocess.run(
                in_cgroup(group, argv), capture_output=True, text=True, timeout=300, check=False
            )
        finally:
            for _ in range(50):  # (a killed process leaves its cgroup a moment later)
                with contextlib.suppress(OSError):
                    group.rmdir()
                    break
                time.sleep(0.1)
        _assert_left_intact(target, said)
    assert limited.returncode == EXIT_CORRUPT, (limited.returncode, limited.stderr)
    found = {f["arena_address"] for f in json.loads(limited.stdout)["corruption"]}
    assert found == {f["arena_address"] for f in document["corruption"]}


@pytest.mark.parametrize("version", RELEASES, ids=[f"glibc-{v}" for v in RELEASES])
def test_an_intact_heap_is_not_reported_corrupt(version: str) -> None:
    """The control: four intact arenas. Here the real gdb is on PATH: on glibc 2.31 with
    tcache off the read does not find mp_ (its shape reads two ways) and falls back to gdb's
    malloc_info, which is allowed on a heap that is not corrupt."""
    with corrupt_target(version, ["intact"] * 4) as (target, said):
        assert not said.corrupted
        run = _run(["inspect", "--json", str(target.pid)], Path("/nonexistent"))
        _assert_sound_run(run, False)
        _assert_left_intact(target, said)
        document = json.loads(run.stdout)
        assert document["schema"] == "memforensics/heap/1"
        assert "corrupt" not in run.stderr


def _seed_batches(seeds: range) -> list[tuple[str, list[int]]]:
    batches = [
        list(seeds[i : i + SEEDS_PER_TARGET]) for i in range(0, len(seeds), SEEDS_PER_TARGET)
    ]
    return [(RELEASES[n % len(RELEASES)], batch) for n, batch in enumerate(batches)]


def _fuzz(version: str, batch: list[int], fake: tuple[Path, Path], *, trim: bool) -> None:
    specs = ["intact", *(str(seed) for seed in batch)]
    with corrupt_target(version, specs) as (target, said):
        assert set(said.corrupted) == set(range(1, len(specs))), said.corrupted
        _check_inspect(target, said, fake)
        if trim:
            _check_trim(target, said, fake)


@pytest.mark.parametrize(
    ("version", "batch"),
    _seed_batches(DEFAULT_SEEDS),
    ids=[f"glibc-{v}-seeds-{b[0]}-{b[-1]}" for v, b in _seed_batches(DEFAULT_SEEDS)],
)
def test_fuzzed_headers_are_reported(
    version: str, batch: list[int], fake_gdb: tuple[Path, Path]
) -> None:
    _fuzz(version, batch, fake_gdb, trim=batch[0] % 5 == 1)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("version", "batch"),
    _seed_batches(SLOW_SEEDS),
    ids=[f"glibc-{v}-seeds-{b[0]}-{b[-1]}" for v, b in _seed_batches(SLOW_SEEDS)],
)
def test_fuzzed_headers_are_reported_slow(
    version: str, batch: list[int], fake_gdb: tuple[Path, Path]
) -> None:
    _fuzz(version, batch, fake_gdb, trim=True)


@pytest.mark.parametrize("version", RELEASES, ids=[f"glibc-{v}" for v in RELEASES])
def test_gdb_given_is_refused_on_a_corrupt_heap_unless_the_risk_is_accepted(
    version: str, fake_gdb: tuple[Path, Path]
) -> None:
    """`--gdb` reads memory first: a corrupt heap is refused (exit 8) before gdb attaches
    (the fake gdb may be started to be checked, never given the target); with
    --accept-corrupt-heap-risk the gdb way goes ahead (here the fake gdb then fails)."""
    folder, record = fake_gdb
    gdb = str(folder / "gdb")
    with corrupt_target(version, ["intact", "cycle", "fastloop"]) as (target, said):
        pid = str(target.pid)
        for command_line in (["inspect", "--gdb", gdb, pid], ["trim", "--gdb", gdb, pid]):
            run = _run(command_line, folder)
            _assert_sound_run(run, True)
            assert "no call is made into a corrupt heap" in run.stderr, run.stderr
            started = record.read_text() if record.exists() else ""
            assert pid not in started and "attach" not in started, started
            _assert_left_intact(target, said)
        run = _run(["inspect", "--gdb", gdb, "--accept-corrupt-heap-risk", pid], folder)
        assert run.exit_code not in (0, EXIT_CORRUPT), run.stderr
        _assert_left_intact(target, said)


def test_a_corrupt_core_is_reported_within_bounds(
    tmp_path: Path, fake_gdb: tuple[Path, Path]
) -> None:
    """A core of a corrupt heap (gdb's gcore of the target) is bad input too: the same
    findings, exit 8, within the deadline and the RSS bound; nothing live is touched."""
    core = tmp_path / "corrupt.core"
    with corrupt_target(RELEASES[1], ["cycle", "topsize", "fastloop"]) as (target, said):
        from tests.support.gcore import gcore

        gcore(target.pid, core)
        binary = Path(os.readlink(f"/proc/{target.pid}/exe"))
    folder, _record = fake_gdb
    run = _run(["inspect", "--json", "--core", str(core), "--exe", str(binary)], folder)
    _assert_sound_run(run, True)
    document = json.loads(run.stdout)
    assert missing_keys(document, "memforensics/heap-corrupt/1") == []
    found = {int(f["arena_address"], 16) for f in document["corruption"]}
    assert set(said.arenas.values()) <= found, (said, document["corruption"])


def test_the_html_page_names_each_failed_check(tmp_path: Path, fake_gdb: tuple[Path, Path]) -> None:
    """`inspect --html FILE` on a corrupt heap writes the findings' page (exit 8)."""
    page = tmp_path / "heap.html"
    folder, record = fake_gdb
    with corrupt_target(RELEASES[1], ["intact", "cycle", "topsize"]) as (target, said):
        run = _run(["inspect", "--html", str(page), str(target.pid)], folder)
        _assert_sound_run(run, True)
        assert not record.exists()
        _assert_left_intact(target, said)
    text = page.read_text()
    assert "the heap is corrupt" in text
    for number in said.corrupted:
        assert f"{said.arenas[number]:#x}" in text  # each corrupted arena's row
    assert "malloc(): corrupted top size" in text
