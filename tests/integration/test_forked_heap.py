"""Reading a forked server's heap changes nothing in it (DESIGN rule 7), on glibc 2.31, 2.36
and 2.41.

tests/targets/forked_heap.c forks once its heaps are built, so every heap page is shared
copy-on-write with a sleeping child, as a pre-forked server's (PostgreSQL's backends,
gunicorn's or uWSGI's preloaded workers, Redis while it saves). The oracle is the kernel's:
the target's private bytes (smaps_rollup's Private_Clean + Private_Dirty) before and after
each default read. A reader that pins the pages it reads (process_vm_readv) makes the kernel
give the target a private copy of each shared page it reads (Linux 5.19 and later): the
test first shows that one process_vm_readv of a few pages does so on this kernel, so the
oracle would see a read that did it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.glibc_releases import RELEASES, build_target, command, release_tree
from tests.support.glibc_releases import skip_reason as release_skip_reason
from tests.support.measured import run_measured
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
}


def _private_bytes(pid: int) -> int:
    """Private_Clean + Private_Dirty of ``pid``, from the kernel's smaps_rollup."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("Private_Clean", "Private_Dirty"):
            fields[name] = int(rest.split()[0]) * 1024
    return sum(fields.values())


def _vm_readv(pid: int, address: int, length: int) -> int:
    """One process_vm_readv of [address, address + length) of ``pid``: bytes read."""

    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]

    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(length)
    local, remote = IoVec(ctypes.cast(buffer, ctypes.c_void_p), length), IoVec(address, length)
    libc.process_vm_readv.restype = ctypes.c_ssize_t
    return int(
        libc.process_vm_readv(
            pid, ctypes.byref(local), ctypes.c_ulong(1), ctypes.byref(remote), ctypes.c_ulong(1), 0
        )
    )


def _kernel_unshares_on_pin() -> bool:
    """Linux 5.19 and later copy a shared anonymous page before a read-only pin of it."""
    major, minor = (int(part) for part in platform.release().split(".")[:2])
    return (major, minor) >= (5, 19)


@contextlib.contextmanager
def _forked(version: str) -> Iterator[Target]:
    """tests/targets/forked_heap.c run on glibc ``version``."""
    release = release_tree(version)
    if release is None:
        pytest.skip(f"glibc {version}: {release_skip_reason(version)}")
    with running(command(release, build_target(release, "forked_heap"))) as target:
        yield target


@pytest.mark.parametrize("version", RELEASES, ids=[f"glibc-{v}" for v in RELEASES])
def test_reading_a_forked_heap_copies_none_of_its_pages(version: str) -> None:
    """Each default read of the target (inspect, with its pins, census, trim's forecast)
    leaves its private bytes as they were: no shared page was copied for the read. The
    same target's private bytes grow by the pages one process_vm_readv reads."""
    with _forked(version) as target:
        _, child, block = target.ready_line.split()
        pid = target.pid
        assert os.path.exists(f"/proc/{int(child)}")
        page = os.sysconf("SC_PAGE_SIZE")
        for name, args in COMMANDS.items():
            before = _private_bytes(pid)
            run = run_measured([*args, str(pid)], timeout_seconds=120)
            after = _private_bytes(pid)
            assert run.exit_code == 0, (name, run.exit_code, run.stderr)
            assert "Traceback" not in run.stderr, run.stderr
            document = json.loads(run.stdout)
            if name == "inspect":
                # Read from memory, its main arena the way a big arena is (its scout):
                # the pages its lists lie on, not a whole copy.
                read = document["read_only"]
                assert read["source"] == "live" and read["scouted_arenas"] >= 1, read
            assert after - before <= SLACK_BYTES, (name, before, after)
        # The oracle sees a copy where one is made: a pinned read of live blocks' pages.
        start = (int(block, 16) + page - 1) // page * page
        before = _private_bytes(pid)
        assert _vm_readv(pid, start, PROBE_PAGES * page) == PROBE_PAGES * page
        grown = _private_bytes(pid) - before
        if _kernel_unshares_on_pin():
            # (A page of them may be private already: the parent's stdio buffer, written
            # after the fork, lies in the same heap.)
            assert grown >= PROBE_PAGES // 2 * page, grown
