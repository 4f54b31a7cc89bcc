"""The default read on held-out heaps of the seeds' shape (issue 31's "held-out targets"): a
shape drawn afresh each session, so that no read was tuned on it, on glibc 2.31, 2.36 and 2.41.

seeds_heap builds it (tests/support/held_out.py): 4 to 10 thread arenas of 100 MiB to 1 GiB
(at most 2.5 GiB in all), big blocks trapped between live ones under a raised mmap threshold,
1,000 to 9,000 small chunks freed per arena, 10 to 40 % of the bytes in small blocks, and
sizes in an order of its own. The shape is named in every failure, and
MEMFORENSICS_HELD_OUT_SEED=N draws it again.

The oracle is the target's own malloc_info(0), written through a FILE opened before its first
allocation with a static buffer (nothing allocated by the writing): on an idle heap the
default read (not --read-only: the way a user reads) must equal it byte for byte, make no
call in its place, and keep memforensics' own peak RSS (the kernel's, wait4) within 256 MiB.
The same idle heap saved in a core (gdb's gcore) and read with `--core` must equal it too,
within the same peak RSS. A busy one (each worker replacing 256 small blocks a millisecond) is
read with no call in its place, every arena balanced against the same read's residency.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.gcore import gcore
from tests.support.glibc_releases import build_target, command
from tests.support.held_out import HeldOut
from tests.support.measured import run_measured
from tests.support.targets import live_skip_reason, proc_status, started_in_cgroup

_SKIP = live_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]

RSS_BOUND_BYTES = 256 << 20  # issue 31: our peak RSS at any heap size
SHAPE = HeldOut.of_session()


def _target(release: Any, own: Path | None, busy: bool, name: str) -> Any:
    """The held-out target on ``release`` in a memory cgroup of its heap and 1 GiB: its PID."""
    binary = build_target(release, "seeds_heap")
    return started_in_cgroup(
        command(release, binary, [*SHAPE.args(busy=busy), *([str(own)] if own else [])]),
        group_name=f"memforensics-test-held-out-{name}",
        limit_bytes=(SHAPE.threads * SHAPE.mib_per_arena << 20) + (1 << 30),
        arena_max=SHAPE.threads + 1,
        tunables=f"glibc.malloc.mmap_threshold={32 << 20}",
        env=SHAPE.env(),
    )


def _inspect(pid: int | str, *extra: str) -> tuple[dict[str, Any], int]:
    """The default ``inspect --json EXTRA PID``: its document and its peak RSS in bytes."""
    run = run_measured(["inspect", "--json", *extra, str(pid)], timeout_seconds=180)
    assert run.exit_code == 0, f"{SHAPE}: {run.stderr}"
    document: dict[str, Any] = json.loads(run.stdout)
    assert document["fallback"] is None, f"{SHAPE}: {document['fallback']}"
    return document, run.peak_rss_kib << 10


def _left_running(pid: int) -> None:
    fields = proc_status(pid)
    assert fields["TracerPid"] == "0" and fields["State"][0] not in "Tt", (str(SHAPE), fields)


def test_an_idle_held_out_heap_reads_as_its_own_malloc_info(release: Any, tmp_path: Path) -> None:
    own, rebuilt = tmp_path / "own.xml", tmp_path / "read.xml"
    core, from_core = tmp_path / "held-out.core", tmp_path / "core.xml"
    try:
        with _target(release, own, busy=False, name="idle") as pid:
            document, peak_rss_bytes = _inspect(pid, "--save-xml", str(rebuilt))
            _left_running(pid)
            gcore(pid, core)
        # The same heap from its core: nothing moves, and our memory is bounded the same.
        _, core_peak_rss_bytes = _inspect(str(core), "--save-xml", str(from_core), "--core")
    finally:
        core.unlink(missing_ok=True)  # (GiBs: not left to pytest's kept temporary folders)
    assert rebuilt.read_bytes() == own.read_bytes(), str(SHAPE)
    assert peak_rss_bytes <= RSS_BOUND_BYTES, (str(SHAPE), peak_rss_bytes)
    assert from_core.read_bytes() == own.read_bytes(), str(SHAPE)
    assert core_peak_rss_bytes <= RSS_BOUND_BYTES, (str(SHAPE), core_peak_rss_bytes)
    thread_arenas = [arena for arena in document["arenas"] if arena["index"] > 0]
    assert len(thread_arenas) == SHAPE.threads, str(SHAPE)
    # Its free lists are what the shape says they are (the draw reached the target).
    assert all(arena["rest_chunks"] >= SHAPE.small_frees // 2 for arena in thread_arenas), (
        str(SHAPE),
        [arena["rest_chunks"] for arena in thread_arenas],
    )


def test_a_busy_held_out_heap_is_read_with_no_call_in_its_place(release: Any) -> None:
    with _target(release, None, busy=True, name="busy") as pid:
        for _ in range(2):
            document, peak_rss_bytes = _inspect(pid)
            assert all(arena["balanced"] for arena in document["residency"]["arenas"]), str(SHAPE)
            assert document["read_only"]["scouted_arenas"] >= SHAPE.threads, str(SHAPE)
            assert peak_rss_bytes <= RSS_BOUND_BYTES, (str(SHAPE), peak_rss_bytes)
        _left_running(pid)
