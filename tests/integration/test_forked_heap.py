"""Reading a forked server's heap changes nothing in it (DESIGN rule 7), on glibc 2.31, 2.36
and 2.41.

tests/targets/forked_heap.c forks once its heaps are built, so every heap page is shared
copy-on-write with a sleeping child, as a pre-forked server's (PostgreSQL's backends,
gunicorn's or uWSGI's preloaded workers, Redis while it saves). The oracle is the kernel's:
the target's private bytes (smaps_rollup's Private_Clean + Private_Dirty) before and after
each default read. A reader that pins the pages it reads (process_vm_readv) makes the kernel
give the target a private copy of each shared page it reads (Linux 5.19 and later): the
tests show that one process_vm_readv of a few pages does so on this kernel, so the oracle
would see a read that did it. The target frees some blocks after the fork, so its heap holds
both kinds of page: shared, and its own since (which a held read may pin).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from memforensics.sources.glibc import heapcopy
from memforensics.sources.glibc.heapcopy import BufferPool, Segment, copy_into
from memforensics.sources.proc.procmaps import read_maps
from memforensics.sources.proc.procmem import ProcessMemoryReader
from tests.support.glibc_releases import RELEASES, build_target, command, release_tree
from tests.support.glibc_releases import skip_reason as release_skip_reason
from tests.support.measured import run_measured
from tests.support.private_pages import kernel_copies_on_pin, private_bytes, vm_readv
from tests.support.targets import Target, live_skip_reason, running

_SKIP = live_skip_reason()
pytestmark = [pytest.mark.integration, pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")]

PROBE_PAGES = 16  # pages one process_vm_readv reads to show the oracle sees a copy
SLACK_BYTES = 64 << 10  # what may change in a target that only sleeps (nothing, so far)
COMMANDS = {
    "inspect": ["inspect", "--json"],
    "inspect --pins": ["inspect", "--json", "--pins"],
    "census": ["census", "--json"],
    "trim --dry-run": ["trim", "--dry-run", "--json"],
    "watch": ["watch", "--interval", "0.2s", "--count", "2", "--census", "0.2s", "--json"],
    "collect": ["collect", "--no-oom", "--census-top", "5", "--json"],
}


@contextlib.contextmanager
def _forked(version: str) -> Iterator[Target]:
    """tests/targets/forked_heap.c run on glibc ``version``."""
    release = release_tree(version)
    if release is None:
        pytest.skip(f"glibc {version}: {release_skip_reason(version)}")
    with running(command(release, build_target(release, "forked_heap"))) as target:
        yield target


def _assert_pin_copies(pid: int, block: int) -> None:
    """One process_vm_readv of PROBE_PAGES pages of live blocks never written since the fork
    grows ``pid``'s private bytes (where the kernel copies on a pin): the oracle can see it."""
    page = os.sysconf("SC_PAGE_SIZE")
    start = (block + page - 1) // page * page
    before = private_bytes(pid)
    assert vm_readv(pid, start, PROBE_PAGES * page) == PROBE_PAGES * page
    grown = private_bytes(pid) - before
    if kernel_copies_on_pin():
        # (A page of them may be private already: the parent's stdio buffer, written after
        # the fork, lies in the same heap.)
        assert grown >= PROBE_PAGES // 2 * page, grown


@pytest.mark.skipif(not heapcopy.native_walk_available(), reason="the C copy is not built")
def test_a_held_copy_pins_only_the_pages_the_target_alone_maps() -> None:
    """The C copy of a held target (copy_into with held, as a stop copies a scouted arena's
    pages) over the whole main heap, shared and private pages mixed: the bytes /proc/PID/mem
    reads, and the target's private bytes as they were (the shared pages were not pinned)."""
    with _forked("2.36") as target:
        pid, block = target.pid, int(target.ready_line.split()[2], 16)
        heap = next(m for m in read_maps(pid) if m.path == "[heap]")
        pool = BufferPool()
        with ProcessMemoryReader(pid) as mem:
            pages = mem.pagemap(heap.start_address, heap.end_address)
            segment = Segment(heap.start_address, heap.end_address, pages, pool)
            try:
                os.kill(pid, signal.SIGSTOP)  # single-threaded: held still
                try:
                    before = private_bytes(pid)
                    assert copy_into(mem, segment, 0, segment.length, threads=2, held=True)
                    after = private_bytes(pid)
                    expected = mem.read_present(heap.start_address, segment.length)
                finally:
                    os.kill(pid, signal.SIGCONT)
                assert bytes(segment.view) == expected
            finally:
                segment.close(pool)
                pool.close()
        assert after - before <= SLACK_BYTES, (before, after)
        _assert_pin_copies(pid, block)


@pytest.mark.parametrize("version", RELEASES, ids=[f"glibc-{v}" for v in RELEASES])
def test_reading_a_forked_heap_copies_none_of_its_pages(version: str, tmp_path: Path) -> None:
    """Each default read of the target (inspect, with its pins, census, trim's forecast,
    watch's samples and censuses, collect's) leaves its private bytes as they were: no shared
    page was copied for the read. The same target's private bytes grow by the pages one
    process_vm_readv reads."""
    with _forked(version) as target:
        _, child, block = target.ready_line.split()
        pid = target.pid
        assert os.path.exists(f"/proc/{int(child)}")
        for name, args in COMMANDS.items():
            before = private_bytes(pid)
            folders = ["--textfile-dir", str(tmp_path), "--state-dir", str(tmp_path / "state")]
            argv = [*args, *(folders if name == "collect" else []), str(pid)]
            run = run_measured(argv, timeout_seconds=120)
            after = private_bytes(pid)
            assert run.exit_code == 0, (name, run.exit_code, run.stderr)
            assert "Traceback" not in run.stderr, run.stderr
            document = json.loads(run.stdout)
            if name == "inspect":
                # Read from memory, its main arena the way a big arena is (its scout):
                # the pages its lists lie on, not a whole copy.
                read = document["read_only"]
                assert read["source"] == "live" and read["scouted_arenas"] >= 1, read
            assert after - before <= SLACK_BYTES, (name, before, after)
        _assert_pin_copies(pid, int(block, 16))
