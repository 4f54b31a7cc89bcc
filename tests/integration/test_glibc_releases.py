"""`inspect` and `trim` on Debian 11's glibc 2.31 and Debian 13's 2.41, beside this machine's
own 2.36, as a user runs them, with every figure checked against an oracle that is not
memforensics' code: glibc's own malloc_info XML read here with lxml, and the kernel's RSS.

The target (tests/targets/freed_arenas.c) is the classic case, 200,000 x 1 KiB written and
all freed but the last, plus three thread arenas with fragmented frees, then idle. It is
built against each release's tree and run through that release's loader
(tests/support/glibc_releases.py, which fetches the trees once per cache directory).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lxml import etree

from tests.support.called_compare import assert_equal_but_the_callers_arena, heaps
from tests.support.glibc_releases import (
    RELEASES,
    GlibcRelease,
    build_target,
    command,
    release_tree,
    skip_reason,
)
from tests.support.targets import Target, live_skip_reason, running

_SKIP = live_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]

MEMFORENSICS = [sys.executable, "-m", "memforensics"]
# The gdb path: its safe point and call on each release (the memory read is test_read_only's).
GDB_INSPECT = [*MEMFORENSICS, "inspect", "--gdb", "gdb"]
CLI_TIMEOUT_SECONDS = 120
MIB = 1024 * 1024
# 200,000 x 1 KiB in the main arena, all freed but the last; 3 threads x 3,000 blocks.
TARGET_ARGS = ("200000", "1024", "3", "3000")
MEASURED_SHARE_MIN = 0.90  # an idle target: nearly all free bytes read from the free lists
TRIM_TOLERANCE = 0.10  # the RSS drop against the forecast and against the reported release
NANOSLEEP, CLOCK_NANOSLEEP = "35", "230"  # x86-64 system call numbers, /proc/PID/syscall


@pytest.fixture(scope="session", params=RELEASES, ids=[f"glibc-{v}" for v in RELEASES])
def glibc(request: pytest.FixtureRequest) -> GlibcRelease:
    """Each release once per session: fetched and unpacked on the first run, then cached."""
    release = release_tree(request.param)
    if release is None:
        pytest.skip(f"glibc {request.param}: {skip_reason(request.param)}")
    return release


@contextlib.contextmanager
def freed_arenas(release: GlibcRelease) -> Iterator[Target]:
    """tests/targets/freed_arenas.c on ``release``, killed by its PID in ``finally``."""
    binary = build_target(release, "freed_arenas")
    with running(command(release, binary, TARGET_ARGS), ready_timeout_seconds=60) as target:
        yield target


def _status(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def _rss_bytes(pid: int) -> int:
    """Rss of /proc/PID/smaps_rollup: the kernel's page-table walk, exact."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Rss:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no Rss in /proc/{pid}/smaps_rollup")


def _assert_untouched(target: Target, status: dict[str, str], after: str) -> None:
    """Alive, not traced, not stopped: what every command must leave behind."""
    assert target.alive(), f"the target died after {after}"
    assert status["TracerPid"] == "0", f"still traced after {after}: {status['TracerPid']}"
    assert status["State"][0] not in ("T", "t"), f"left stopped after {after}: {status['State']}"


@dataclass(frozen=True)
class XmlArena:
    """One <heap> of glibc's malloc_info, read here with lxml."""

    nr: int
    fast_bytes: int
    fast_chunks: int
    rest_bytes: int
    rest_chunks: int
    system_bytes: int
    line_bytes: int  # the <size>/<unsorted> lines: every binned chunk, not the top
    line_chunks: int

    @property
    def free_bytes(self) -> int:
        return self.fast_bytes + self.rest_bytes


def xml_arenas(data: bytes) -> list[XmlArena]:
    root = etree.fromstring(data)
    assert root.tag == "malloc"
    arenas = []
    for heap in root.findall("heap"):
        totals = {t.get("type"): t for t in heap.findall("total")}
        system = {s.get("type"): int(s.get("size", "0")) for s in heap.findall("system")}
        sizes = heap.find("sizes")
        lines = list(sizes) if sizes is not None else []
        arenas.append(
            XmlArena(
                nr=int(heap.get("nr", "-1")),
                fast_bytes=int(totals["fast"].get("size", "0")),
                fast_chunks=int(totals["fast"].get("count", "0")),
                rest_bytes=int(totals["rest"].get("size", "0")),
                rest_chunks=int(totals["rest"].get("count", "0")),
                system_bytes=system["current"],
                line_bytes=sum(int(line.get("total", "0")) for line in lines),
                line_chunks=sum(int(line.get("count", "0")) for line in lines),
            )
        )
    return arenas


@dataclass
class Inspected:
    """One `memforensics inspect --json --save-xml` of a freed_arenas target."""

    release: GlibcRelease
    target: Target
    done: subprocess.CompletedProcess[str]
    saved: Path
    status_after: dict[str, str]

    @property
    def document(self) -> dict[str, Any]:
        assert self.done.returncode == 0, (
            f"inspect on {self.release} exited {self.done.returncode}: {self.done.stderr}"
        )
        document: dict[str, Any] = json.loads(self.done.stdout)
        return document

    @property
    def xml(self) -> list[XmlArena]:
        assert self.document  # the command succeeded, so the XML was saved
        return xml_arenas(self.saved.read_bytes())


@pytest.fixture(scope="module")
def inspected(glibc: GlibcRelease, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inspected]:
    """One idle target per release and one inspection of it, shared by the checks below."""
    saved = tmp_path_factory.mktemp(f"glibc-{glibc.version}") / "dump.xml"
    with freed_arenas(glibc) as target:
        done = subprocess.run(
            [*GDB_INSPECT, "--json", "--save-xml", str(saved), str(target.pid)],
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_SECONDS,
            check=False,
        )
        status = _status(target.pid)
        yield Inspected(glibc, target, done, saved, status)


def test_target_runs_on_its_glibc(inspected: Inspected) -> None:
    """The target reports the release's glibc, maps the release's libc, and memforensics
    finds that libc and its version where it is mapped (a tree path for 2.31 and 2.41)."""
    release, target = inspected.release, inspected.target
    assert f"glibc={release.version} " in target.ready_line + " "
    maps = Path(f"/proc/{target.pid}/maps").read_text().splitlines()
    libcs = {
        line.split(None, 5)[5]
        for line in maps
        if len(line.split(None, 5)) == 6
        and Path(line.split(None, 5)[5]).name.startswith(("libc.so", "libc-"))
    }
    assert len(libcs) == 1, libcs
    libc = libcs.pop()
    assert release.owns(libc), f"{libc} is not {release}'s"
    process = inspected.document["process"]
    assert process["glibc_version"] == release.version
    assert process["libc_path"] == libc
    assert process["allocator"] == "glibc"


def test_json_arenas_equal_the_saved_xml(inspected: Inspected) -> None:
    """Per arena, the JSON's free and system bytes are what glibc's own XML says."""
    document, xml = inspected.document, inspected.xml
    assert len(xml) == 1 + 3  # the main arena and one per thread
    assert document["totals"]["arenas"] == len(xml) == len(document["arenas"])
    assert [a["index"] for a in document["arenas"]] == [a.nr for a in xml]
    for row, arena in zip(document["arenas"], xml, strict=True):
        assert row["free_bytes"] == arena.free_bytes, f"arena {arena.nr}"
        assert row["fast_bytes"] == arena.fast_bytes, f"arena {arena.nr}"
        assert row["rest_bytes"] == arena.rest_bytes, f"arena {arena.nr}"
        assert row["system_bytes"] == arena.system_bytes, f"arena {arena.nr}"
    assert document["totals"]["free_bytes"] == sum(a.free_bytes for a in xml)
    assert document["totals"]["system_bytes"] == sum(a.system_bytes for a in xml)
    assert xml[0].free_bytes > 190 * MIB  # the classic case: ~200 MB free in the main arena


def test_thread_arenas_are_reported_as_built(
    inspected: Inspected,
) -> None:
    """The three thread arenas were built alike, so glibc reports them alike, fastbins
    included, unless the inspection itself changed one: its calls must run in the main
    thread, which sleeps outside the allocator. (On 2.31 they run in a worker, whose arena
    the stream buffer's growth then consolidates: fastbins gone, runs merged.)"""
    threads, document = inspected.xml[1:], inspected.document
    assert all(a.fast_chunks > 0 for a in threads), threads
    figures = {(a.fast_bytes, a.fast_chunks, a.rest_bytes, a.rest_chunks) for a in threads}
    assert len(figures) == 1, threads
    assert document["safe_point"].startswith("thread 1 ")


def test_xml_rest_counts_each_arena_top(inspected: Inspected) -> None:
    """On all three releases (2.31 included) "rest" holds one chunk more than the bucket
    lines: the arena's top. For the thread arenas, which nothing touched since the dump,
    it is the top memforensics read from the arena's malloc_state."""
    residency = inspected.document["residency"]
    assert residency is not None, inspected.document.get("residency_error")
    for arena in inspected.xml:
        assert arena.fast_chunks + arena.rest_chunks == arena.line_chunks + 1, arena
        top = arena.free_bytes - arena.line_bytes
        assert top > 0, arena
        if arena.nr > 0:
            row = next(r for r in residency["arenas"] if r["index"] == arena.nr)
            assert row["top_bytes"] == top, f"arena {arena.nr}"


def test_residency_measures_most_free_bytes(inspected: Inspected) -> None:
    """At least 90 % of the dump's free bytes (fast + rest, from the XML) are measured."""
    residency = inspected.document["residency"]
    assert residency is not None, inspected.document.get("residency_error")
    dump_free = sum(a.free_bytes for a in inspected.xml)
    measured = residency["measured_free_bytes"]
    print(
        f"{inspected.release}: {len(inspected.xml)} arenas, dump free {dump_free:,} B, "
        f"measured {measured:,} B ({measured / dump_free:.1%}), method {residency['method']}"
    )
    assert residency["method"] == "arena-chain"
    assert measured >= MEASURED_SHARE_MIN * dump_free


def test_idle_heap_is_walked_whole(inspected: Inspected) -> None:
    """Nothing moves in an idle target: every bin of every arena is read, none estimated."""
    residency = inspected.document["residency"]
    assert residency is not None, inspected.document.get("residency_error")
    rows = {r["index"]: (r["free_method"], r["estimated_bins"]) for r in residency["arenas"]}
    assert rows == {a.nr: ("walked", []) for a in inspected.xml}
    assert residency["estimated_free_bytes"] == 0


def test_inspect_leaves_the_target_running(inspected: Inspected) -> None:
    assert inspected.document["process"]["pid"] == inspected.target.pid
    _assert_untouched(inspected.target, inspected.status_after, "inspect")
    _assert_untouched(inspected.target, _status(inspected.target.pid), "inspect (later)")


def test_sleeping_single_threaded_target_is_inspected(
    glibc: GlibcRelease,
) -> None:
    """A single-threaded process blocked in sleep() (the kernel says which system call) is
    at a safe point: inspect succeeds and calls from it."""
    binary = build_target(glibc, "freed_arenas")
    with running(command(glibc, binary, ("2000", "1024", "0", "0"))) as target:
        deadline = time.monotonic() + 10
        while (syscall := _syscall(target.pid)) not in (NANOSLEEP, CLOCK_NANOSLEEP):
            assert time.monotonic() < deadline, f"not asleep: /proc/PID/syscall says {syscall}"
            time.sleep(0.01)
        done = subprocess.run(
            [
                *MEMFORENSICS,
                "inspect",
                "--gdb",
                "gdb",
                "--json",
                "--timeout",
                "5s",
                str(target.pid),
            ],
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_SECONDS,
            check=False,
        )
        _assert_untouched(target, _status(target.pid), "inspect")
        assert done.returncode == 0, f"inspect on {glibc} exited {done.returncode}: {done.stderr}"
        document = json.loads(done.stdout)
        assert document["totals"]["arenas"] == 1
        assert document["safe_point"].startswith("thread 1 ")


def _syscall(pid: int) -> str:
    """The system call the (single) thread is blocked in, as /proc/PID/syscall numbers it."""
    return Path(f"/proc/{pid}/syscall").read_text().split()[0]


def _heap_rss_bytes(pid: int) -> int:
    """Rss of the [heap] mappings (the main arena's memory from brk), from /proc/PID/smaps."""
    total, in_heap = 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if line[:1] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
            in_heap = line.rstrip().endswith("[heap]")
        elif in_heap and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def test_trim_release_matches_the_rss_drop(glibc: GlibcRelease) -> None:
    """The RSS the kernel loses over `memforensics trim` is within 10 % of the forecast and
    of the release the tool reports."""
    with freed_arenas(glibc) as target:
        before, heap_before = _rss_bytes(target.pid), _heap_rss_bytes(target.pid)
        done = subprocess.run(
            [*MEMFORENSICS, "trim", "--json", str(target.pid)],
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_SECONDS,
            check=False,
        )
        status = _status(target.pid)
        after, heap_after = _rss_bytes(target.pid), _heap_rss_bytes(target.pid)
        assert done.returncode == 0, f"trim on {glibc} exited {done.returncode}: {done.stderr}"
        _assert_untouched(target, status, "trim")
        document = json.loads(done.stdout)
        drop = before - after
        forecast, released = document["forecast_bytes"], document["released_bytes"]
        arenas = {a["index"]: a["releasable_bytes"] for a in document["forecast_arenas"]}
        print(
            f"{glibc}: RSS {before:,} -> {after:,} B, drop {drop:,} B; forecast "
            f"{forecast:,} B ({'measured' if document['forecast_measured'] else 'partly est.'}),"
            f" released {released:,} B; main arena: forecast {arenas[0]:,} B, [heap] drop "
            f"{heap_before - heap_after:,} B; thread arenas forecast {sorted(arenas.items())[1:]}"
        )
        assert document["trimmed"] and document["trim_called"]
        assert drop > 190 * MIB  # the classic case gives its ~200 MB back
        assert abs(drop - forecast) <= TRIM_TOLERANCE * forecast
        assert abs(drop - released) <= TRIM_TOLERANCE * released
        # The main arena alone (one free chunk, no fastbins to merge first): to the page.
        assert abs((heap_before - heap_after) - arenas[0]) <= 16 * 4096


def test_malloc_info_called_without_gdb_equals_the_targets_own(
    glibc: GlibcRelease, tmp_path: Path
) -> None:
    """The default's stand-in for a refused read (sources.glibc.called_malloc_info) on each
    release: fmemopen's FILE found through that libc's _IO_list_all, its cookie recognised,
    the document the target's own but for the calling thread's arena; the maps as before."""
    from memforensics.entry.readers.call import call_malloc_info
    from memforensics.sources.proc import target_check

    binary = build_target(glibc, "heap_shapes")
    own = tmp_path / "own.xml"
    with running(
        command(glibc, binary, ["31", "threads", str(own)]), ready_timeout_seconds=60
    ) as target:
        maps_before = Path(f"/proc/{target.pid}/maps").read_text()
        facts = target_check.check_target(target.pid)
        called = call_malloc_info(target.pid, facts, 10.0)
        assert Path(f"/proc/{target.pid}/maps").read_text() == maps_before
        _assert_untouched(target, _status(target.pid), "malloc_info called without gdb")
    assert len(heaps(own.read_text())) >= 3
    assert_equal_but_the_callers_arena(called.xml.decode(), own.read_text())


def test_the_arenas_looked_at_before_a_call_are_every_arena(
    glibc: GlibcRelease, tmp_path: Path
) -> None:
    """heapmaps.arena_addresses (the arenas whose mutexes a call waits for: the gdb path and
    the calls without gdb look at them first) on each release: as many as the target's own
    malloc_info has heaps, in the order and at the addresses of the full read."""
    from memforensics.sources.glibc.heapmaps import arena_addresses, scan_heap
    from memforensics.sources.proc import target_check

    binary = build_target(glibc, "heap_shapes")
    own = tmp_path / "own.xml"
    with running(
        command(glibc, binary, ["31", "threads", str(own)]), ready_timeout_seconds=60
    ) as target:
        libc = target_check.check_target(target.pid).libc_path
        looked_at = arena_addresses(target.pid, libc)
        read = [arena.address for arena in scan_heap(target.pid, libc_path=libc).arenas]
    assert len(heaps(own.read_text())) >= 3
    assert len(looked_at) == len(heaps(own.read_text()))
    assert looked_at == read


def test_the_chunk_walk_begins_where_mallocs_first_sbrk_did(
    glibc: GlibcRelease, tmp_path: Path
) -> None:
    """With GLIBC_TUNABLES set, glibc < 2.34's ld.so copies it with sbrk before malloc's
    first sbrk: [heap] then begins with that text (2.31), and a walk from [heap]'s start
    ended there (the census and the pins lost the whole main heap). The walk (census, pins,
    sweeps) begins at mp_'s sbrk_base. Oracle: the target's own malloc_info, written once the
    heap was built: the main heap's free, fastbin and top chunks add up to arena 0's fast and
    rest bytes."""
    from memforensics.model.chunks import ChunkState
    from memforensics.sources.glibc.heap_chunks import walk_process_chunks

    binary = build_target(glibc, "heap_shapes")
    own = tmp_path / "own.xml"
    with running(
        command(glibc, binary, ["31", "threads", str(own)]),
        env={"GLIBC_TUNABLES": "glibc.malloc.arena_max=64"},
        ready_timeout_seconds=60,
    ) as target:
        maps = Path(f"/proc/{target.pid}/maps").read_text().splitlines()
        heap_start = next(int(line.split("-")[0], 16) for line in maps if line.endswith("[heap]"))
        walked = walk_process_chunks(target.pid)
        _assert_untouched(target, _status(target.pid), "the chunk walk")
    main = next(h for h in walked.heaps if h.arena == 0)
    assert main.complete, main.stop_reason
    if glibc.version == "2.31":
        assert main.start > heap_start  # the loader's copy of GLIBC_TUNABLES comes first
    unused = {ChunkState.FREE, ChunkState.FAST, ChunkState.TOP}
    pairs = list(zip(main.sizes, main.states, strict=True))
    free = sum(size for size, state in pairs if state in unused)
    # malloc_info totals a bin's chunks by their size words, flags and all (chunksize_nomask):
    # PREV_INUSE is set on every binned chunk (two free chunks never lie side by side).
    binned = sum(1 for _, state in pairs if state == ChunkState.FREE)
    assert binned > 0
    assert free + binned == xml_arenas(own.read_bytes())[0].free_bytes
