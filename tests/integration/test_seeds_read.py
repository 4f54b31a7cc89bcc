"""The default read on the seeds' shape (issue 31), on glibc 2.31, 2.36 and 2.41: thread arenas
of tens of MiB, big free blocks trapped between live ones under a raised mmap threshold and
~3,000 small free chunks each (tests/targets/seeds_heap.c).

Such arenas are scouted before their stops (their lists followed from the running target), and
their stops copy only the pages the lists lie on. The oracle is the target's own malloc_info(0),
written through a FILE opened before its first allocation with a static buffer (so the heap
after it is the heap it describes): the read must equal it byte for byte, every arena must have
been scouted (the first alone, the others side by side), and the stops must have copied a small
share of the heap. Where the lists lie far apart (arenas of 512 MiB), the stops check the scout's
copy word by word instead of copying its pages again. A busy target (every worker replacing 256
small blocks a millisecond) is read too, never refused, every arena balanced against the same
read's residency. So is an
arena above the copies' budget whose lists lie on more pages than a scout of an arena that fits
the budget goes to (the spread shape): its scout goes on up to the budget, where giving up
would mean a refusal and a call.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memforensics.model import glibc
from memforensics.sources.glibc.glibc_walk import SCOUT_MAX_BYTES
from memforensics.sources.glibc.heapcopy import copy_budget_bytes
from memforensics.sources.glibc.list_sweep import SWEEP_MAX_CHUNKS
from tests.support.gcore import gcore
from tests.support.glibc_releases import build_target, command
from tests.support.measured import run_measured
from tests.support.targets import live_skip_reason, proc_status, running

_SKIP = live_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]

THREADS = 5
MIB_PER_ARENA = 40  # scouted: 32 MiB or more (heapmaps._SCOUT_MIN_BYTES)
TUNABLES = f"glibc.malloc.arena_max={THREADS + 1}:glibc.malloc.mmap_threshold={32 << 20}"


def _inspect(
    pid: int, *extra: str, command: str = "inspect", exit_code: int = 0
) -> tuple[dict[str, Any], str]:
    """``memforensics COMMAND --json EXTRA PID``: its document and stderr (``exit_code``
    asserted)."""
    done = subprocess.run(
        [sys.executable, "-m", "memforensics", command, "--json", *extra, str(pid)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == exit_code, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document, done.stderr


def _inspect_proved(pid: int, exit_code: int, attempts: int = 3) -> dict[str, Any]:
    """``inspect --json PID``'s document, its exit ``exit_code``, where the read was refused
    and the stand-in call's proof walked the lists. That walk holds every thread and is cut
    at the hold's bound: on a loaded host the proof may be cut (exit 3, nothing called), or
    the second walk that names a corrupt chunk (exit 8, the finding saying so); the read is
    then made again, at most ``attempts`` times."""
    for _ in range(attempts):
        done = subprocess.run(
            [sys.executable, "-m", "memforensics", "inspect", "--json", str(pid)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode == 3 and "walk was cut" in done.stderr:
            continue
        assert done.returncode == exit_code, done.stderr
        document: dict[str, Any] = json.loads(done.stdout)
        details = [f["detail"] for f in document.get("corruption") or ()]
        if any("did not finish" in detail for detail in details):
            continue
        return document
    raise AssertionError(f"the proof's walks were cut at every one of {attempts} reads")


def _assert_running(pid: int) -> None:
    fields = proc_status(pid)
    assert fields["TracerPid"] == "0" and fields["State"][0] not in "Tt", fields


def _read_idle(release: Any, tmp_path: Path, threads: int, mib: int) -> dict[str, Any]:
    """``inspect --read-only`` of an idle seeds target of ``threads`` arenas of ``mib`` MiB
    on ``release``: its document, once the rebuilt XML is asserted equal, byte for byte, to
    the target's own malloc_info and the target left running, untraced."""
    binary = build_target(release, "seeds_heap")
    own, rebuilt = tmp_path / "own.xml", tmp_path / "read.xml"
    argv = command(release, binary, [str(threads), str(mib), "0", str(own)])
    tunables = f"glibc.malloc.arena_max={threads + 1}:glibc.malloc.mmap_threshold={32 << 20}"
    with running(argv, env={"GLIBC_TUNABLES": tunables}, ready_timeout_seconds=120) as target:
        document, _ = _inspect(target.pid, "--read-only", "--save-xml", str(rebuilt))
        _assert_running(target.pid)
        assert target.alive()
    assert rebuilt.read_bytes() == own.read_bytes()
    return document


@pytest.mark.slow
def test_scouted_arenas_read_equal_the_targets_own_malloc_info(
    release: Any, tmp_path: Path
) -> None:
    document = _read_idle(release, tmp_path, THREADS, MIB_PER_ARENA)
    read = document["read_only"]
    assert read["scouted_arenas"] == THREADS
    # Its lists lie on 1 page in 9 or so: each stop copied those pages again rather than
    # check them word by word (glibc_walk._CHECK_MAX_PAGE_SHARE), and walked them there.
    assert read["scout_kept_arenas"] == read["walked_before_stop_arenas"] == 0, read
    thread_arena_bytes = sum(
        arena["system_bytes"] for arena in document["arenas"] if arena["index"] > 0
    )
    assert thread_arena_bytes >= THREADS * MIB_PER_ARENA << 20
    # Only the pages the lists lie on were copied in the stops (~1 page in 9 here), not the
    # arenas: what a stop costs follows the lists.
    assert 0 < read["stop_copy_bytes"] < thread_arena_bytes // 3, read


FAR_THREADS = 2
FAR_MIB_PER_ARENA = 512  # the same ~2,600 free chunks, on 1 page in 40 or fewer


@pytest.mark.slow
def test_lists_far_apart_are_checked_in_the_stop_word_by_word_not_copied_again(
    release: Any, tmp_path: Path
) -> None:
    """Arenas of 512 MiB whose lists lie on a few thousand pages scattered through them:
    each stop checks the words its walk reads in the scout's copy against the held target
    and, all equal, copies no page again. The document is still the target's own, byte
    for byte, and the stops read a few bytes a chunk, far less than the pages' 4 KiB."""
    document = _read_idle(release, tmp_path, FAR_THREADS, FAR_MIB_PER_ARENA)
    read = document["read_only"]
    assert read["scouted_arenas"] == FAR_THREADS
    assert read["scout_kept_arenas"] == FAR_THREADS, read
    # Each walked before its stop (prepare_stop), the stop only checking what that walk read.
    assert read["walked_before_stop_arenas"] == FAR_THREADS, read
    chunks = sum(arena["rest_chunks"] for arena in document["arenas"] if arena["index"] > 0)
    assert chunks >= FAR_THREADS * 2000, document["arenas"]
    # A page per chunk at most (each read from its first traced word to its last), not the
    # lists' pages as the copy reads them: 4 KiB each, a few chunks to a page.
    assert 0 < read["stop_copy_bytes"] < chunks * 1024, read


# A busy worker's frees and mallocs a millisecond (seeds_heap's SEEDS_CHURN): the target's
# own 256, and so many that each worker churns without a pause (five of them keep both CPUs
# of a small machine busy, so our reads outside the stops get what CPU is left).
CHURN_PER_MS = {"256 a ms": "256", "without a pause": "1000000"}


@pytest.mark.slow
@pytest.mark.parametrize("churn", list(CHURN_PER_MS))
def test_a_busy_seeds_target_is_read_without_a_fallback(churn: str) -> None:
    """Its lists move between the scout and the stop: the lists that left the scouted pages
    are scouted again in the stop, so every arena is read (no refusal, no stand-in call),
    each balanced against the same read's residency."""
    from tests.support.targets import compile_target

    binary = compile_target("seeds_heap")
    argv = [str(binary), str(THREADS), str(MIB_PER_ARENA), "1"]
    env = {"GLIBC_TUNABLES": TUNABLES, "SEEDS_CHURN": CHURN_PER_MS[churn]}
    with running(argv, env=env, ready_timeout_seconds=120) as target:
        for _ in range(3):
            document, stderr = _inspect(target.pid)
            assert document["fallback"] is None, stderr
            assert document["read_only"]["scouted_arenas"] == THREADS
            assert all(arena["balanced"] for arena in document["residency"]["arenas"])
            # The read's time grows with the heap it reads, 2 s a GiB on top of its base
            # (--timeout, 10 s by default, where longer than 3 s): a busy read that is only
            # slow goes on (and one that runs out of time ends with no call in its place).
            heap_bytes = sum(
                a["aspace_total_bytes"] or a["system_bytes"] for a in document["arenas"]
            )
            budget = document["residency"]["walk_budget_seconds"]
            assert budget >= 10.0 + 2.0 * heap_bytes / (1 << 30), (budget, heap_bytes)
        _assert_running(target.pid)
        assert target.alive()


MANY_THREADS = 1500  # the seeds' "hundreds of arenas": one arena per thread, as many threads


@pytest.mark.slow
def test_fifteen_hundred_arenas_of_as_many_threads_read_equal_their_own_malloc_info(
    release: Any, tmp_path: Path
) -> None:
    """1,500 arenas, each of its own thread (many_arenas: 300 free chunks each, then idle),
    read by the default way: every stop holds all 1,500 threads, which costs tens of ms to
    stop and to release, so the read takes seconds. It is read from memory all the same, never
    handed to the stand-in call, and equals the target's own malloc_info byte for byte (its
    document written once the heap was built, allocating nothing: MANY_ARENAS_XML)."""
    from tests.support.targets import started_in_cgroup

    own, rebuilt = tmp_path / "own.xml", tmp_path / "read.xml"
    argv = command(release, build_target(release, "many_arenas"), [str(MANY_THREADS), "600"])
    with started_in_cgroup(
        argv,
        group_name="memforensics-test-seeds-many-threads",
        limit_bytes=2 << 30,
        arena_max=MANY_THREADS,
        env={"MANY_ARENAS_XML": str(own)},
    ) as pid:
        document, stderr = _inspect(pid, "--save-xml", str(rebuilt))
        _assert_running(pid)
        threads = len(list(Path(f"/proc/{pid}/task").iterdir()))
        terminal = _stderr_on_a_terminal(
            [sys.executable, "-m", "memforensics", "inspect", "--json", str(pid)]
        )
    assert threads == MANY_THREADS + 2  # the workers, the ticker and the main thread
    assert document["fallback"] is None, stderr
    assert rebuilt.read_bytes() == own.read_bytes()
    assert len(document["arenas"]) == MANY_THREADS
    # A read of seconds says how far it got where stderr is a terminal (cli/progress.py), of
    # as many arenas as it reads, and erases its line at the end; not where it is a pipe.
    assert "reading PID" not in stderr
    shown = [
        (int(done.replace(",", "")), int(total.replace(",", "")))
        for done, total in re.findall(
            rf"reading PID {pid}'s heap: arena ([\d,]+) of ([\d,]+)", terminal
        )
    ]
    assert shown, terminal
    assert {total for _, total in shown} == {MANY_THREADS}
    assert [done for done, _ in shown] == sorted(done for done, _ in shown)
    assert terminal.endswith("\r\x1b[K")


def _stderr_on_a_terminal(argv: list[str]) -> str:
    """Run ``argv`` (to exit 0) with its stderr on a pseudo-terminal, stdout discarded: what
    the terminal was sent."""
    import os
    import pty

    main, secondary = pty.openpty()
    try:
        done = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=secondary)
        os.close(secondary)
        secondary = -1
        sent = bytearray()
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # (EIO: the process is gone, and with it the terminal's other end)
                break
            if not chunk:
                break
            sent += chunk
        assert done.wait(timeout=120) == 0, sent.decode(errors="replace")
    finally:
        os.close(main)
        if secondary >= 0:
            os.close(secondary)
    return sent.decode(errors="replace")


SPREAD_MIB = 320  # above the copies' budget (192 MiB at most)
RSS_BOUND_BYTES = 256 << 20  # issue 31: our peak RSS at any heap size


@pytest.mark.slow
@pytest.mark.parametrize("arena_max", [2, 1], ids=["thread-arena", "main-arena"])
def test_an_arena_above_the_copy_budget_with_widely_spread_lists_is_read(
    release: Any, tmp_path: Path, arena_max: int
) -> None:
    """One arena of 320 MiB, a free chunk every three pages: its lists lie on ~100 MiB of
    pages, past a budget-sized arena's scout (SCOUT_MAX_BYTES) and within the copies' budget.
    It is scouted and read in parts, one stop each (its lists lie on more pages than one stop
    copies), byte for byte the target's own malloc_info, with no stand-in call; and our own
    peak RSS, the kernel's figure, stays within 256 MiB. The worker's arena is a thread arena
    of 64 MiB heaps, or (arena_max 1) the main arena, one heap grown by sbrk."""
    assert copy_budget_bytes() < SPREAD_MIB << 20
    binary = build_target(release, "seeds_heap")
    own, rebuilt = tmp_path / "own.xml", tmp_path / "read.xml"
    argv = command(release, binary, ["spread", "1", str(SPREAD_MIB), str(own)])
    tunables = f"glibc.malloc.arena_max={arena_max}:glibc.malloc.mmap_threshold={32 << 20}"
    with running(argv, env={"GLIBC_TUNABLES": tunables}, ready_timeout_seconds=120) as target:
        run = run_measured(
            ["inspect", "--json", "--read-only", "--save-xml", str(rebuilt), str(target.pid)],
            timeout_seconds=120,
        )
        _assert_running(target.pid)
        assert target.alive()
    assert run.exit_code == 0, run.stderr
    assert rebuilt.read_bytes() == own.read_bytes()
    read = json.loads(run.stdout)["read_only"]
    assert read["scouted_arenas"] == 1
    assert SCOUT_MAX_BYTES < read["stop_copy_bytes"] < (SPREAD_MIB << 20) // 2, read
    # Its lists lie on more pages than one stop copies: read in parts, a stop each, and the
    # document is still the target's own, byte for byte.
    assert read["parted_arenas"] == 1 and read["arena_parts"] >= 3, read
    assert read["stops"] >= read["arena_parts"], read
    assert run.peak_rss_kib << 10 <= RSS_BOUND_BYTES, run.peak_rss_kib


@pytest.mark.slow
def test_a_part_whose_relay_gives_up_is_copied_in_one_stop_not_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spread arena of 320 MiB, read in parts, each part whose lists lie on more pages than
    a part's stop copies relayed: where such a relay gives up (here every part's, as when a
    busy arena's lists move under it), the part is copied in one stop from its scout's pages,
    a stop as long as those pages take, never swept in one stop (a walk of every heap of the
    arena: ~140 ms on a busy arena of 602 MiB). Oracles: the target's own malloc_info, byte
    for byte; the relays were asked for no sweep in one stop, and none was taken."""
    from memforensics.entry.readers.memory import inspect_read_only
    from memforensics.sources.glibc import bin_relay, heapmaps

    asked: list[tuple[object, bool]] = []

    def gives_up(*args: Any, **kwargs: Any) -> bin_relay.RelayRead:
        asked.append((kwargs.get("part"), kwargs["one_stop"]))
        read = bin_relay.RelayRead()
        read.gave_up = "its lists moved (made to give up by the test)"
        return read

    monkeypatch.setattr(heapmaps.bin_relay, "relay_arena", gives_up)
    own = tmp_path / "own.xml"
    with _spread_in_cgroup(1, own, "part-relay-gives-up", {}) as pid:
        inspection = inspect_read_only(pid, timeout_seconds=60)
        _assert_running(pid)
    assert inspection.capture.xml == own.read_bytes()
    read = inspection.read_only
    assert read is not None
    assert asked and all(part is not None and not one_stop for part, one_stop in asked), asked
    assert read.parted_arenas == 1 and read.arena_parts >= 3, read
    assert read.relayed_arenas == 0 and read.swept_in_one_stop_arenas == 0, read


_SCOUTED_MAIN = """
import time
blocks = [bytearray(8000) for _ in range(20000)]  # 160 MiB of main arena, every byte written
del blocks[::10]  # 2,000 free chunks between live ones: lists on 1 page in 20
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_scouted_main_arena_costs_our_memory_its_lists_not_its_size() -> None:
    """A 160 MiB main arena whose free chunks lie on a twentieth of its pages is scouted;
    no copy buffer the size of the arena is faulted in for it (one was, before its scout, and
    our peak RSS followed the heap's size: ~196 MiB). The kernel's figure of our peak RSS
    stays under half the arena."""
    from tests.support.targets import python_target

    with python_target(_SCOUTED_MAIN) as target:
        run = run_measured(
            ["inspect", "--json", "--read-only", str(target.pid)], timeout_seconds=120
        )
        _assert_running(target.pid)
        assert target.alive()
    assert run.exit_code == 0, run.stderr
    document = json.loads(run.stdout)
    assert document["read_only"]["scouted_arenas"] == 1
    main = next(arena for arena in document["arenas"] if arena["index"] == 0)
    assert main["system_bytes"] >= 150 << 20
    assert run.peak_rss_kib << 10 < main["system_bytes"] // 2, run.peak_rss_kib


@pytest.mark.slow
def test_arenas_whose_lists_lie_on_every_page_are_scouted_and_read_in_parts(
    tmp_path: Path,
) -> None:
    """Two arenas of 40 MiB whose lists lie on every page, read before a spread arena above
    the copies' budget: they are scouted too, and their stops copy those pages a part at a
    time, never an arena whole in one stop (that stop would last as long as the arena's size
    takes to copy); the spread one is scouted as ever, and the read equals the target's own
    malloc_info."""
    from tests.support.targets import compile_target

    binary = compile_target("seeds_heap")
    own, rebuilt = tmp_path / "own.xml", tmp_path / "read.xml"
    env = {
        "SEEDS_DENSE": "2",
        "SEEDS_DENSE_MIB": "40",  # scouted: 32 MiB or more (heapmaps._SCOUT_MIN_BYTES)
        "GLIBC_TUNABLES": f"glibc.malloc.arena_max=4:glibc.malloc.mmap_threshold={32 << 20}",
    }
    argv = [str(binary), "spread", "1", str(SPREAD_MIB), str(own)]
    with running(argv, env=env, ready_timeout_seconds=120) as target:
        document, _ = _inspect(target.pid, "--read-only", "--save-xml", str(rebuilt))
        _assert_running(target.pid)
    assert rebuilt.read_bytes() == own.read_bytes()
    read = document["read_only"]
    assert read["scouted_arenas"] == 3, read
    assert read["parted_arenas"] >= 2 and read["stops"] >= read["arena_parts"] >= 6, read
    sizes = sorted(arena["system_bytes"] for arena in document["arenas"] if arena["index"] > 0)
    assert len(sizes) == 3 and sizes[-1] > copy_budget_bytes() > sizes[1]


def _spread_in_cgroup(
    threads: int, own: Path, name: str, env: dict[str, str]
) -> contextlib.AbstractContextManager[int]:
    """seeds_heap's spread shape, ``threads`` arenas of SPREAD_MIB (and what ``env`` adds), in
    a memory cgroup of 3 GiB, its malloc_info written to ``own``: its PID."""
    from tests.support.targets import compile_target, started_in_cgroup

    return started_in_cgroup(
        [str(compile_target("seeds_heap")), "spread", str(threads), str(SPREAD_MIB), str(own)],
        group_name=f"memforensics-test-seeds-{name}",
        limit_bytes=3 << 30,
        arena_max=3,
        tunables=f"glibc.malloc.mmap_threshold={32 << 20}",
        env=env,
    )


def _unsorted_in_cgroup(
    name: str,
    *shape: str,
    env: dict[str, str] | None = None,
    limit_bytes: int = 2 << 30,
    arena_max: int = 2,
    ready: list[str] | None = None,
) -> contextlib.AbstractContextManager[int]:
    """seeds_heap's unsorted shape (``shape``: BLOCKS [ORDER]) with ``env`` added, in a memory
    cgroup of ``limit_bytes``: its PID (its ready line appended to ``ready``)."""
    from tests.support.targets import compile_target, started_in_cgroup

    return started_in_cgroup(
        [str(compile_target("seeds_heap")), "unsorted", *shape],
        group_name=f"memforensics-test-seeds-{name}",
        limit_bytes=limit_bytes,
        arena_max=arena_max,
        env=env,
        ready=ready,
    )


@pytest.mark.slow
def test_a_dense_arena_and_a_spread_one_above_the_budget_stay_within_our_memory_bound(
    tmp_path: Path,
) -> None:
    """A dense arena of 150 MiB (lists on every page: its scout holds as many pages as a
    whole copy would) is read before a spread arena above the copies' budget, whose scout
    needs most of the budget. Both are scouted, and what the first holds is given up before
    the second's scout, rather than leave it 64 MiB and a refusal. Oracles: the target's own
    malloc_info, byte for byte, and the kernel's figure of our peak RSS (within 256 MiB: the
    two scouts' pages never add up)."""
    own, rebuilt = tmp_path / "own.xml", tmp_path / "read.xml"
    with _spread_in_cgroup(1, own, "kept", {"SEEDS_DENSE": "1", "SEEDS_DENSE_MIB": "150"}) as pid:
        run = run_measured(
            ["inspect", "--json", "--read-only", "--save-xml", str(rebuilt), str(pid)],
            timeout_seconds=120,
        )
        _assert_running(pid)
    assert run.exit_code == 0, run.stderr
    assert rebuilt.read_bytes() == own.read_bytes()
    document = json.loads(run.stdout)
    sizes = sorted(arena["system_bytes"] for arena in document["arenas"] if arena["index"] > 0)
    assert len(sizes) == 2 and sizes[1] > copy_budget_bytes() > sizes[0] > 128 << 20, sizes
    assert document["read_only"]["scouted_arenas"] == 2, document["read_only"]
    assert run.peak_rss_kib << 10 <= RSS_BOUND_BYTES, run.peak_rss_kib


@pytest.mark.slow
def test_a_main_arena_whose_scattered_list_outgrows_the_budget_is_swept() -> None:
    """2 million free chunks in the main arena's unsorted bin (the target's own count, on its
    ready line), scattered over ~800 MiB: the list leads over more pages than the copies'
    budget, so its scout gives up on its page budget; its relay gives up after its first
    short stretch (a read per chunk: consecutive chunks lie megabytes apart); and the list is
    read by a sweep of the heap (list_sweep). The main arena is walked, with malloc_info's
    figures, and the target runs on untraced. (Its figures against the target's own
    malloc_info: test_a_main_arena_list_past_the_budget_in_a_scattered_order_is_read_by_a_sweep.)"""
    from memforensics.sources.glibc.arena_hold import StopBatches
    from memforensics.sources.glibc.heapmaps import scan_heap
    from memforensics.sources.glibc.libc_elf import load_libc_image

    with _unsorted_in_cgroup("outgrown", "4000000") as pid:
        maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        libc_path = next(line.split()[-1] for line in maps if "/libc.so.6" in line)
        heap_bytes = sum(
            int(hi, 16) - int(lo, 16)
            for line in maps
            if line.endswith("[heap]")
            for lo, hi in [line.split()[0].split("-")]
        )
        batches = StopBatches(pid, libc=load_libc_image(pid, libc_path), single_threaded=False)
        try:
            scan = scan_heap(pid, libc_path=libc_path, figures=True, hold=batches)
        finally:
            batches.close()
        _assert_running(pid)
    # The kernel's word: the list's chunks lie on a heap far past what a read may copy.
    assert heap_bytes > 2 * copy_budget_bytes(), heap_bytes
    main = next(arena for arena in scan.arenas if arena.is_main)
    assert main.walked and main.swept and main.relay_stops >= 2, main.relay_stops
    assert not main.lists_too_long and main.figures is not None
    assert main.chunks >= 1_999_000, main.chunks  # (2 million less the few tcache holds)


@pytest.mark.slow
@pytest.mark.parametrize("sort", ["", "1"], ids=["as-freed", "sorted-into-small-bins"])
def test_a_main_arena_list_past_the_budget_in_address_order_is_read_in_relays(
    release: Any, tmp_path: Path, sort: str
) -> None:
    """2 million free chunks in the main arena's unsorted bin, freed in address order over
    ~800 MiB: the list leads past the copies' budget (its scout gives up), so it is read in
    relays (bin_relay): followed in the held target a stretch per stop, from where the last
    stretch left it. The document equals the target's own malloc_info byte for byte (written
    through a FILE opened before the heap was built: it allocates nothing), `--read-only`
    exits 0 (nothing was called), the list took several stops, and the target runs on
    untraced. Sorted into their 9 small bins (SEEDS_SORT; glibc 2.41 leaves them so
    unsorted), the 9 lists interleave through the whole heap: followed side by side, the
    relay reads each page about once, not once a list (the stops' copied bytes against the
    heap's). (The same list in a scattered order is swept:
    test_a_main_arena_list_past_the_budget_in_a_scattered_order_is_read_by_a_sweep.)"""
    from tests.support.targets import started_in_cgroup

    binary = build_target(release, "seeds_heap")
    own, rebuilt = tmp_path / "own.xml", tmp_path / "read.xml"
    argv = command(release, binary, ["unsorted", "4000000", "ordered", str(own)])
    with started_in_cgroup(
        argv,
        group_name="memforensics-test-seeds-relay",
        limit_bytes=2 << 30,
        arena_max=2,
        env={"SEEDS_SORT": sort} if sort else None,
    ) as pid:
        document, _ = _inspect(pid, "--read-only", "--save-xml", str(rebuilt))
        _assert_running(pid)
    assert rebuilt.read_bytes() == own.read_bytes()
    read = document["read_only"]
    assert read["relayed_arenas"] == 1 and read["relay_stops"] > 1, read
    main = next(arena for arena in document["arenas"] if arena["index"] == 0)
    assert main["system_bytes"] > 2 * copy_budget_bytes(), main
    if sort:
        assert re.search(r'<size from="\d+" to="\d+" total="\d+" count="2\d{5}"/>', own.read_text())
    assert read["stop_copy_bytes"] < 2 * main["system_bytes"], read


@pytest.mark.slow
def test_a_main_arena_list_past_the_budget_in_a_scattered_order_is_read_by_a_sweep(
    release: Any, tmp_path: Path
) -> None:
    """The same 2 million chunks freed in a scattered order (consecutive chunks megabytes
    apart): the relay gives up after its first short stretch (a read per chunk), and the
    list is read by a sweep of the heap (list_sweep: every header walked window by window in
    stops, the links checked in our memory). The document equals the target's own
    malloc_info byte for byte, `--read-only` exits 0 (nothing was called), and our own peak
    RSS stays within 256 MiB. The same heap saved in a core (gdb's gcore) reads the same with
    `--core`, within the same bound: its walk keeps fewer pages than the list leads to, and
    the list is swept from the core (no stops there)."""
    from memforensics.sources.glibc.heapmaps import CORE_COPY_MAX_BYTES
    from tests.support.targets import started_in_cgroup

    binary = build_target(release, "seeds_heap")
    own, rebuilt = tmp_path / "own.xml", tmp_path / "read.xml"
    core, from_core = tmp_path / "swept.core", tmp_path / "core.xml"
    argv = command(release, binary, ["unsorted", "4000000", "scattered", str(own)])
    try:
        with started_in_cgroup(
            argv, group_name="memforensics-test-seeds-sweep", limit_bytes=2 << 30, arena_max=2
        ) as pid:
            run = run_measured(
                ["inspect", "--json", "--read-only", "--save-xml", str(rebuilt), str(pid)],
                timeout_seconds=120,
            )
            _assert_running(pid)
            gcore(pid, core)
        core_run = run_measured(
            ["inspect", "--json", "--save-xml", str(from_core), "--core", str(core)],
            timeout_seconds=180,
        )
    finally:
        core.unlink(missing_ok=True)  # (~800 MiB: not left to pytest's kept folders)
    assert run.exit_code == 0, run.stderr
    assert rebuilt.read_bytes() == own.read_bytes()
    read = json.loads(run.stdout)["read_only"]
    assert read["relayed_arenas"] == 1 and read["swept_arenas"] == 1, read
    assert run.peak_rss_kib << 10 <= RSS_BOUND_BYTES, run.peak_rss_kib
    assert core_run.exit_code == 0, core_run.stderr
    assert from_core.read_bytes() == own.read_bytes()
    main = json.loads(core_run.stdout)["arenas"][0]
    assert main["system_bytes"] > 2 * CORE_COPY_MAX_BYTES, main  # (past what its walk keeps)
    assert core_run.peak_rss_kib << 10 <= RSS_BOUND_BYTES, core_run.peak_rss_kib


def _heap_element(xml: bytes, number: int) -> bytes:
    """The <heap nr="NUMBER"> element of a malloc_info document, as its bytes."""
    found = re.search(rb'<heap nr="%d">.*?</heap>' % number, xml, re.DOTALL)
    assert found is not None, xml[:200]
    return found.group(0)


@pytest.mark.slow
def test_a_thread_arena_list_past_the_budget_is_swept_as_gdbs_malloc_info_reads_it(
    tmp_path: Path,
) -> None:
    """A thread arena of ~256 MiB in 64 MiB sub-heaps (many_arenas: one worker, 4 million
    blocks of 24-88 bytes, every other one freed): its lists lead past the copies' budget
    and their chunks lie apart, so they are swept, across sub-heaps and their fenceposts.
    Oracle: the gdb path's malloc_info document (gdb's own allocation lands in the main
    arena, the calling thread's): the thread arena's <heap> is the same, byte for byte. The
    same heap saved by gcore (before gdb's call) and read with `--core`: the thread arena,
    past what a core's walk keeps, is swept from the core (no stops), its <heap> the same
    again, within our memory bound."""
    from tests.support.gdb_binary import use_test_gdb
    from tests.support.targets import compile_target, started_in_cgroup

    use_test_gdb()
    binary = compile_target("many_arenas")
    rebuilt, by_gdb = tmp_path / "read.xml", tmp_path / "gdb.xml"
    core, from_core = tmp_path / "thread.core", tmp_path / "core.xml"
    try:
        with started_in_cgroup(
            [str(binary), "1", "4000000", "88"],
            group_name="memforensics-test-seeds-sweep-thread",
            limit_bytes=2 << 30,
            arena_max=2,
        ) as pid:
            document, _ = _inspect(pid, "--read-only", "--save-xml", str(rebuilt))
            gcore(pid, core)
            _inspect(pid, "--gdb", "gdb", "--save-xml", str(by_gdb))
            _assert_running(pid)
        core_run = run_measured(
            ["inspect", "--json", "--save-xml", str(from_core), "--core", str(core)],
            timeout_seconds=180,
        )
    finally:
        core.unlink(missing_ok=True)  # (~400 MiB: not left to pytest's kept folders)
    read = document["read_only"]
    assert read["swept_arenas"] == 1, read
    thread_arena = next(arena for arena in document["arenas"] if arena["index"] == 1)
    assert thread_arena["system_bytes"] > copy_budget_bytes(), thread_arena
    assert _heap_element(rebuilt.read_bytes(), 1) == _heap_element(by_gdb.read_bytes(), 1)
    assert core_run.exit_code == 0, core_run.stderr
    core_read = json.loads(core_run.stdout)["read_only"]
    assert core_read["swept_arenas"] == 1, core_read
    assert _heap_element(from_core.read_bytes(), 1) == _heap_element(by_gdb.read_bytes(), 1)
    assert core_run.peak_rss_kib << 10 <= RSS_BOUND_BYTES, core_run.peak_rss_kib


@pytest.mark.slow
def test_a_thread_arena_past_what_a_sweep_keeps_is_proved_then_called(tmp_path: Path) -> None:
    """many_arenas: one thread arena of ~490 MiB in 64 MiB sub-heaps, 4 million blocks freed:
    more free chunks than a sweep keeps, so the read is refused, and the stand-in call proves
    that arena's lists first, across its sub-heaps (found from its top through heap_info's
    prev links, as malloc_info sums them), then is made. Oracle: the gdb path's malloc_info:
    the thread arena's <heap> the same, byte for byte (the call's own FILE lands in the main
    arena, the calling thread's)."""
    from tests.support.gdb_binary import use_test_gdb
    from tests.support.targets import compile_target, started_in_cgroup

    use_test_gdb()
    called, by_gdb = tmp_path / "called.xml", tmp_path / "gdb.xml"
    with started_in_cgroup(
        [str(compile_target("many_arenas")), "1", "8000000", "88"],
        group_name="memforensics-test-seeds-proof-thread",
        limit_bytes=3 << 30,
        arena_max=2,
    ) as pid:
        document, _ = _inspect(pid, "--save-xml", str(called))
        _inspect(pid, "--gdb", "gdb", "--save-xml", str(by_gdb))
        _assert_running(pid)
    assert document["fallback"]["way"] == "call", document["fallback"]
    assert "arena 1 (which the read could not follow) proved" in document["safe_point"]
    thread_arena = next(arena for arena in document["arenas"] if arena["index"] == 1)
    assert thread_arena["system_bytes"] > 4 * glibc.HEAP_MAX_BYTES, thread_arena
    assert _heap_element(called.read_bytes(), 1) == _heap_element(by_gdb.read_bytes(), 1)


@pytest.mark.slow
@pytest.mark.parametrize("order", ["ordered", "scattered"])
def test_a_corrupt_long_list_is_reported_never_called_into(order: str) -> None:
    """The same list of 2 million with one chunk's bk overwritten halfway down: in address
    order, the relay's stretch that reaches it reads it in its own stop, with the arena
    unlocked; scattered, the sweep finds the link broken and looks at it again in one stop.
    Either way the list is corrupt there, not moving (rule 8): `inspect` reports it in the
    unsorted bin of the main arena with glibc's words and exits 8; nothing is called (no
    fallback), and the target runs on untraced."""
    with _unsorted_in_cgroup("relay-corrupt", "4000000", order, env={"SEEDS_CORRUPT": "1"}) as pid:
        document, _ = _inspect(pid, exit_code=8)
        _assert_running(pid)
    assert document["schema"] == "memforensics/heap-corrupt/1"
    findings = document["corruption"]
    assert [f["bin"] for f in findings] == ["unsorted"], findings
    assert findings[0]["check"] == "malloc(): unsorted double linked list corrupted", findings


@pytest.mark.slow
def test_a_corrupt_list_among_lists_followed_side_by_side_is_reported_never_called_into() -> None:
    """The same 2 million in address order, sorted into their 9 small bins (SEEDS_SORT), the
    bk of one chunk halfway down overwritten: the relay follows the 9 lists side by side, and
    the one that reaches it names it in its own bin with glibc's words; `inspect` exits 8,
    nothing is called, and the target runs on untraced. Its bin is worked out here from the
    target's block sizes (136 + (i % 9) * 16 bytes asked for block i) as glibc sizes chunks."""
    env = {"SEEDS_CORRUPT": "1", "SEEDS_SORT": "1"}
    with _unsorted_in_cgroup("relay-corrupt-sorted", "4000000", "ordered", env=env) as pid:
        document, _ = _inspect(pid, exit_code=8)
        _assert_running(pid)
    assert document["schema"] == "memforensics/heap-corrupt/1"
    block = 2 * (2_000_000 // 2) + 1  # seeds_heap.c's corrupted block: halfway, freed
    chunk_bytes = (136 + block % 9 * 16 + 8 + 15) & ~15
    findings = document["corruption"]
    assert [f["bin"] for f in findings] == [f"small bin {chunk_bytes // 16}"], findings
    assert findings[0]["check"] == "malloc(): smallbin double linked list corrupted", findings


@pytest.mark.slow
def test_a_broken_header_under_a_swept_list_is_reported_never_called_into() -> None:
    """The scattered 2-million-chunk list (read by a sweep of the heap's headers) with the
    size word of a live block halfway up the heap overwritten, as an overrun of the block
    before it would: no list is broken, but the sweep cannot walk past that header. Read
    again from the window before in one stop, with the arena unchanged since, it is a
    corruption (rule 8), not a heap caught moving: `inspect` names that chunk with glibc's
    words and exits 8; before, the sweep gave up and the default called the stand-in
    malloc_info into the corrupt heap. The target runs on untraced."""
    ready: list[str] = []
    with _unsorted_in_cgroup(
        "sweep-corrupt", "4000000", "scattered", env={"SEEDS_CORRUPT": "2"}, ready=ready
    ) as pid:
        document, _ = _inspect(pid, exit_code=8)
        _assert_running(pid)
    corrupt = int(ready[0].split("corrupt=")[1].split()[0], 16)
    assert document["schema"] == "memforensics/heap-corrupt/1"
    assert not document["called_into_target"], document
    findings = document["corruption"]
    assert [(f["arena"], f["bin"]) for f in findings] == [(0, "heap")], findings
    assert int(findings[0]["chunk_address"], 16) == corrupt, findings
    assert findings[0]["check"] == "corrupted size vs. prev_size", findings


# Unsorted chunks past what a sweep keeps: the read is refused, and malloc_info would be called.
_PAST_THE_SWEEP_BLOCKS = 2 * (SWEEP_MAX_CHUNKS + 100_000)


def _past_the_sweep(
    release: Any, corrupt: str, ready: list[str]
) -> contextlib.AbstractContextManager[int]:
    """3.1 million scattered unsorted chunks (more than a sweep keeps) on ``release``, with
    seeds_heap's SEEDS_CORRUPT=``corrupt`` ("0": none), in a memory cgroup."""
    from tests.support.targets import started_in_cgroup

    binary = build_target(release, "seeds_heap")
    argv = command(release, binary, ["unsorted", str(_PAST_THE_SWEEP_BLOCKS), "scattered"])
    return started_in_cgroup(
        argv,
        group_name=f"memforensics-test-seeds-proof-{corrupt}",
        limit_bytes=3 << 30,
        arena_max=2,
        env={"SEEDS_CORRUPT": corrupt},
        ready=ready,
    )


@pytest.mark.slow
@pytest.mark.parametrize("corrupt", ["0", "3"], ids=["whole", "fd-loops"])
def test_a_list_no_read_could_follow_is_proved_before_malloc_info_is_called(
    release: Any, corrupt: str
) -> None:
    """3.1 million scattered unsorted chunks, more than a sweep keeps: the read is refused
    and the default's stand-in is malloc_info called in the target, whose loop over a list
    checks nothing. Whole, the list is proved in the call's own hold and the call made
    (exit 0; the safe point says so). With one chunk's fd overwritten halfway down by the
    list's first chunk (the list loops without its head), malloc_info's loop would never
    end: before, the default called it anyway, and the call spun in the target for ever
    holding main_arena's lock (exit 6). Now `inspect` exits 8 naming that chunk, nothing
    called. Oracles: the chunk the target itself overwrote (its ready line); after,
    main_arena's mutex word read from the target's memory is 0, its main thread sleeps in
    pause() (no call running), and it is untraced."""
    ready: list[str] = []
    with _past_the_sweep(release, corrupt, ready) as pid:
        document = _inspect_proved(pid, 0 if corrupt == "0" else 8)
        _assert_running(pid)
        state = proc_status(pid)["State"]
        if corrupt == "0":
            assert document["fallback"]["way"] == "call", document["fallback"]
            assert "arena 0 (which the read could not follow) proved" in document["safe_point"]
            return
        findings = document["corruption"]
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
            mem.seek(int(findings[0]["arena_address"], 16))
            mutex = int.from_bytes(mem.read(4), "little")
    assert mutex == 0, f"main_arena's lock is held: {mutex:#x}"
    assert state.startswith("S"), state
    corrupted = int(ready[0].split("corrupt=")[1].split()[0], 16)
    assert document["schema"] == "memforensics/heap-corrupt/1"
    assert int(findings[0]["chunk_address"], 16) == corrupted, findings
    # Its bin: the unsorted one; from 2.41 glibc bins such a freed chunk at once in its size's
    # small bin (seeds_heap.c's block sizes: 136 + (i % 9) * 16 bytes asked for block i).
    block = 2 * (_PAST_THE_SWEEP_BLOCKS // 4) + 1
    chunk_bytes = (136 + block % 9 * 16 + 8 + 15) & ~15
    binned = tuple(int(part) for part in release.version.split(".")[:2]) >= (2, 41)
    expected = (
        (f"small bin {chunk_bytes // 16}", "smallbin") if binned else ("unsorted", "unsorted")
    )
    assert [(f["arena"], f["bin"]) for f in findings] == [(0, expected[0])], findings
    check = f"malloc(): {expected[1]} double linked list corrupted"
    assert findings[0]["check"] == check, findings


@pytest.mark.slow
def test_a_bk_overwritten_in_a_list_no_read_could_follow_is_named_before_any_call() -> None:
    """The same 3.1 million with the bk of that chunk overwritten instead (malloc_info,
    following fd, would have ended and reported a corrupt heap as if whole: before, the
    default did so, exit 0): the proof names that chunk, exit 8, nothing called."""
    ready: list[str] = []
    with _unsorted_in_cgroup(
        "proof-bk",
        str(_PAST_THE_SWEEP_BLOCKS),
        "scattered",
        env={"SEEDS_CORRUPT": "1"},
        limit_bytes=3 << 30,
        ready=ready,
    ) as pid:
        document = _inspect_proved(pid, 8)
        _assert_running(pid)
    corrupted = int(ready[0].split("corrupt=")[1].split()[0], 16)
    findings = document["corruption"]
    assert [(f["arena"], f["bin"]) for f in findings] == [(0, "unsorted")], findings
    assert int(findings[0]["chunk_address"], 16) == corrupted, findings


def _small_bins(xml: bytes) -> list[dict[int, tuple[int, int]]]:
    """Per <heap> of a malloc_info document: chunk size -> (bytes, chunks) of its small bins
    (chunks under 1 KiB), and its system bytes under key 0."""
    from lxml import etree

    heaps = []
    for heap in etree.fromstring(xml).iter("heap"):
        lines = {
            int(size.get("from") or 0): (int(size.get("total") or 0), int(size.get("count") or 0))
            for size in heap.iter("size")
            if int(size.get("to") or 0) < 1024
        }
        current = next(s for s in heap.iter("system") if s.get("type") == "current")
        lines[0] = (int(current.get("size") or 0), 0)
        heaps.append(lines)
    return heaps


@pytest.mark.slow
def test_arenas_above_the_budget_that_keep_growing_are_read(tmp_path: Path) -> None:
    """Two spread arenas above the copies' budget whose threads keep allocating blocks no free
    chunk fits (80 KiB every 2 ms, SEEDS_GROW_MIB): their heaps grow, and new heaps are
    added, between each scout and its stop. The scouted copies are kept (the grown parts
    are scouted again in the stop), so every read is made, none refused, and no stand-in call
    (before: refused 4 reads of 4). Oracle: the target's own malloc_info, written as it
    started to grow (its unsorted bin sorted first). Growth takes no free chunk; it adds one
    free chunk only where a new heap is begun (what the old one's top had left), so each
    arena's small-bin lines in our reads hold every chunk of its own, and at most one more
    per 64 MiB its system bytes grew by (and one)."""
    own = tmp_path / "own.xml"
    with _spread_in_cgroup(2, own, "grow", {"SEEDS_GROW_MIB": "600"}) as pid:
        for number, flags in enumerate((["--read-only"], [], ["--read-only"])):
            rebuilt = tmp_path / f"read-{number}.xml"
            document, stderr = _inspect(pid, *flags, "--save-xml", str(rebuilt))
            assert document["fallback"] is None, stderr
            assert document["read_only"]["scouted_arenas"] == 2
            # (Their lists lie on more pages than one stop copies: each read in parts, its
            # heaps growing between the parts' stops too.)
            assert document["read_only"]["parted_arenas"] == 2, document["read_only"]
            for read, before in zip(
                _small_bins(rebuilt.read_bytes())[1:],
                _small_bins(own.read_bytes())[1:],
                strict=True,
            ):
                assert len(before) > 20
                grown_bytes = read.pop(0)[0] - before.pop(0)[0]
                extra = sum(read.values(), (0, 0))[1] - sum(before.values(), (0, 0))[1]
                for size, (total, count) in before.items():
                    assert read[size][0] >= total and read[size][1] >= count, size
                assert 0 <= extra <= 1 + grown_bytes // glibc.HEAP_MAX_BYTES, (extra, grown_bytes)
        _assert_running(pid)
        grown = [arena["system_bytes"] for arena in document["arenas"] if arena["index"] > 0]
    assert min(grown) > (SPREAD_MIB + 32) << 20, grown  # they did grow meanwhile


def _rss_bytes(pid: int) -> int:
    """VmRSS of /proc/PID/status, read here: the kernel's figure, not the tool's."""
    return int(proc_status(pid)["VmRSS"].split()[0]) * 1024


@pytest.mark.slow
def test_trim_on_the_32_x_100_mib_shape_forecasts_what_the_kernel_sees_released() -> None:
    """Issue 31: trim on 32 thread arenas of 100 MiB (2/3 of their big blocks freed between
    live ones) forecasts within 10 % of the RSS the kernel shows released, read by this test
    before and after (the tool's own before/after figures are not the oracle)."""
    from tests.support.targets import compile_target, started_in_cgroup

    binary = compile_target("seeds_heap")
    with started_in_cgroup(
        [str(binary), "32", "100", "0"],
        group_name="memforensics-test-seeds-trim",
        limit_bytes=5 << 30,
        arena_max=33,
        tunables=f"glibc.malloc.mmap_threshold={32 << 20}",
    ) as pid:
        before = _rss_bytes(pid)
        document, _ = _inspect(pid, command="trim")
        after = _rss_bytes(pid)
        _assert_running(pid)
    forecast = document["forecast_bytes"]
    released = before - after
    assert released > 1 << 30, (before, after)
    assert abs(forecast - released) <= 0.10 * released, (forecast, released)


@pytest.mark.slow
@pytest.mark.parametrize("order", ["ordered", "scattered"])
def test_a_list_read_in_relays_or_swept_forecasts_what_trim_releases(order: str) -> None:
    """The residency of lists too long for the copies: 60,000 free chunks of ~6 KiB in the
    main arena's unsorted bin (every other one of 120,000 blocks freed, in address order: read
    in relays; scattered: swept), on more pages than the copies' budget. Oracle: the kernel.
    The read's trimmable bytes (each chunk's resident whole pages inside its mtrim span) are
    what `trim` then releases, by the RSS this test reads before and after (within 2 %); read
    again after it, those pages are measured not resident and nothing is left to trim."""
    with _unsorted_in_cgroup(
        "list-trim", "120000", order, env={"SEEDS_BLOCK_BYTES": "6000"}, limit_bytes=3 << 30
    ) as pid:
        first, _ = _inspect(pid, "--read-only")
        before = _rss_bytes(pid)
        _inspect(pid, command="trim")
        after = _rss_bytes(pid)
        second, _ = _inspect(pid, "--read-only")
        _assert_running(pid)
    read = first["read_only"]
    assert (read["relayed_arenas"], read["swept_arenas"]) == (1, int(order == "scattered")), read
    released = before - after
    assert released > 100 << 20, (before, after)
    forecast = first["residency"]["trimmable_bytes"]
    again = second["residency"]
    gone = again["measured_not_resident_bytes"] - first["residency"]["measured_not_resident_bytes"]
    print(f"{order}: released {released:,} B, forecast {forecast:,} B, measured gone {gone:,} B")
    assert abs(forecast - released) <= 0.02 * released, (forecast, released)
    assert again["trimmable_bytes"] <= 0.01 * released, again["trimmable_bytes"]
    assert abs(gone - released) <= 0.02 * released, (gone, released)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["main-arena", "thread-arena"])
def test_a_busy_arena_of_two_million_free_chunks_is_read_in_one_stop_never_called(
    where: str,
) -> None:
    """The 2-million-chunk list with a thread churning small blocks in the same arena
    (main_arena, arena_max=1; or a thread arena of 64 MiB sub-heaps, where the thread that
    freed the list churns): its first mallocs sort the list into the small bins, then it takes from
    them and gives back. The lists change between any two stops: the relay restarts, and the
    sweep sees the bins' heads move at its first windows (before, a read of this target
    reported "free list inconsistent while held" and exited 8, and later the default stood
    in with the malloc_info call). The arena is then swept in one stop of every thread: its
    figures are read from memory, with no call (`--read-only` too), the free chunks those
    the target freed (2,000,000 of 144-272 bytes, give or take what the churning thread
    holds: its ring of 512), and the stop the read names as its longest is that sweep's.
    A sample of `watch` is refused instead (no stop that long at every sample). The target
    runs on untraced."""
    in_thread = where == "thread-arena"
    env = {"SEEDS_UNSORTED_BUSY": "1", **({"SEEDS_UNSORTED_THREAD": "1"} if in_thread else {})}
    with _unsorted_in_cgroup(
        f"busy-2m-{where}", "4000000", env=env, arena_max=2 if in_thread else 1
    ) as pid:
        for extra in ((), ("--read-only",)):
            document, stderr = _inspect(pid, *extra)
            assert document["fallback"] is None, (document["fallback"], stderr)
            read = document["read_only"]
            assert read["swept_in_one_stop_arenas"] == 1, read
            assert read["swept_arenas"] == 1, read
            swept = document["arenas"][int(in_thread)]
            assert swept["rest_bytes"] > 2_000_000 * 144, swept  # (the list's arena)
            # (That stop copied the whole heap: the arena's system bytes, malloc_info's.)
            assert read["stop_copy_bytes"] >= swept["system_bytes"], read
            assert "swept in one stop" in document["safe_point"], document["safe_point"]
            totals = document["totals"]
            assert abs(totals["rest_chunks"] - 2_000_000) <= 2 * 512, totals
            assert 2_000_000 * 144 <= totals["rest_bytes"] <= 2_000_000 * 272, totals
        # A sample of `watch` (or `collect`) takes no such stop: at every sample it would
        # hold the process a third of a second; the sample is refused, saying why.
        sample = subprocess.run(
            [sys.executable, "-m", "memforensics", "watch", "--count", "1", "--json", str(pid)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert sample.returncode == 3, sample.stderr
        assert "changed between the sweep's stops" in sample.stderr, sample.stderr
        _assert_running(pid)


@pytest.mark.slow
def test_lists_seen_moving_are_swept_in_one_stop_as_the_targets_own_malloc_info(
    release: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-stop sweep's figures, against the target's own malloc_info: the scattered
    2-million-chunk list of an idle target, its sweep in several stops made to say the lists
    moved (as a busy arena's does), so that the arena is swept again in one stop of every
    thread. The document equals the target's own malloc_info byte for byte, on each glibc."""
    from memforensics.entry.readers.memory import inspect_read_only
    from memforensics.sources.glibc import list_sweep
    from tests.support.targets import started_in_cgroup

    seen: list[int] = []

    def moved(*args: object, **kwargs: object) -> str:
        seen.append(1)
        return list_sweep.MOVED_WHY

    monkeypatch.setattr(list_sweep, "sweep_lists", moved)
    binary = build_target(release, "seeds_heap")
    own = tmp_path / "own.xml"
    argv = command(release, binary, ["unsorted", "4000000", "scattered", str(own)])
    with started_in_cgroup(
        argv, group_name="memforensics-test-one-stop", limit_bytes=2 << 30, arena_max=2
    ) as pid:
        inspection = inspect_read_only(pid, timeout_seconds=60)
        _assert_running(pid)
    assert seen, "the sweep in several stops was not reached"
    assert inspection.capture.xml == own.read_bytes()
    assert "swept in one stop" in inspection.capture.safe_point


@pytest.mark.slow
def test_a_one_stop_sweep_is_not_tried_past_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The busy 2-million-chunk arena (~0.8 GiB in RAM) with the one stop's bound set at
    0.1 s (100 MiB of heap at the rate it is judged by): the read does not hold the target
    for it, and its refusal says why."""
    from memforensics.entry.readers.memory import inspect_read_only
    from memforensics.errors import ReadOnlyRefusedError
    from memforensics.sources.glibc import bin_relay

    monkeypatch.setattr(bin_relay, "ONE_STOP_MAX_SECONDS", 0.1)
    with _unsorted_in_cgroup(
        "busy-2m-bound", "4000000", env={"SEEDS_UNSORTED_BUSY": "1"}, arena_max=1
    ) as pid:
        with pytest.raises(ReadOnlyRefusedError) as refused:
            inspect_read_only(pid, timeout_seconds=60)
        _assert_running(pid)
    assert "not swept in one stop" in refused.value.message, refused.value.message
    assert "would hold every thread past 0.1 s" in refused.value.message
