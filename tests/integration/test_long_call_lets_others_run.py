"""A long call into the target keeps only its calling thread busy: the other threads are let go
as it starts (ThreadHold.let_others_go), by `inspect` where it calls malloc_info (the read of
a main arena of 3.1 million unsorted chunks scattered over ~1.3 GiB is refused: too many for
a relay to follow, more than a sweep keeps, list_sweep.SWEEP_MAX_CHUNKS) and by `trim`
(malloc_trim).

Target: tests/targets/seeds_heap.c's unsorted shape (its main thread and a ticker thread),
in a memory cgroup. Oracle: the kernel's word on each thread, /proc/PID/task/TID/status
sampled every millisecond while the command runs. A hold seizes and releases all the threads
within a millisecond; a call the others sit out shows as tens of milliseconds in which exactly
one thread is traced (the caller) while another is not. Before, every thread stayed traced
for the whole call. The target lives on untraced, and its answer to a command says it runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from memforensics.sources.glibc.list_sweep import SWEEP_MAX_CHUNKS
from tests.support.targets import compile_target, live_skip_reason, started_in_cgroup

_SKIP = live_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]

# Unsorted chunks past what a sweep keeps: the read is refused, malloc_info is called.
BLOCKS = 2 * (SWEEP_MAX_CHUNKS + 100_000)
LIMIT_BYTES = 2 << 30
SAMPLE_SECONDS = 0.001
# A hold seizes and releases a handful of threads in well under a millisecond: a state this
# long is a call with the other threads let go (the calls here last 30 ms to 0.5 s).
ALONE_MIN_SECONDS = 0.01


def _tracers(pid: int) -> dict[int, int]:
    """TracerPid of each thread of ``pid`` now (a thread that vanished meanwhile is left out)."""
    found: dict[int, int] = {}
    for name in os.listdir(f"/proc/{pid}/task"):
        try:
            text = Path(f"/proc/{pid}/task/{name}/status").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("TracerPid:"):
                found[int(name)] = int(line.split()[1])
    return found


class _Sampler(threading.Thread):
    """Samples _tracers(pid) every SAMPLE_SECONDS until stopped; ``alone_seconds`` is the
    longest run of samples in which one thread was traced and another was not."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.done = threading.Event()
        self.alone_seconds = 0.0
        self.samples = 0
        self.traced_samples = 0

    def run(self) -> None:
        since: float | None = None
        while not self.done.is_set():
            tracers = _tracers(self.pid)
            now = time.monotonic()
            traced = [tid for tid, tracer in tracers.items() if tracer]
            self.samples += 1
            self.traced_samples += bool(traced)
            if len(traced) == 1 and len(tracers) > 1:
                since = now if since is None else since
                self.alone_seconds = max(self.alone_seconds, now - since)
            else:
                since = None
            time.sleep(SAMPLE_SECONDS)


def _run_sampled(pid: int, *argv: str) -> tuple[dict[str, object], _Sampler]:
    sampler = _Sampler(pid)
    sampler.start()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "memforensics", *argv, "--json", str(pid)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        sampler.done.set()
        sampler.join()
    assert done.returncode == 0, done.stderr
    document: dict[str, object] = json.loads(done.stdout)
    return document, sampler


def _assert_untraced(pid: int) -> None:
    assert all(tracer == 0 for tracer in _tracers(pid).values()), _tracers(pid)


def test_the_other_threads_run_while_malloc_info_is_called() -> None:
    binary = compile_target("seeds_heap")
    argv = [str(binary), "unsorted", str(BLOCKS)]
    with started_in_cgroup(
        argv, group_name="memforensics-test-others-run", limit_bytes=LIMIT_BYTES, arena_max=8
    ) as pid:
        document, sampler = _run_sampled(pid, "inspect")
        fallback = document["fallback"]
        assert isinstance(fallback, dict) and fallback["way"] == "call", fallback
        # (Its list, which no read followed, was proved whole in the call's hold first.)
        assert "arena 0 (which the read could not follow) proved" in document["safe_point"]
        assert sampler.traced_samples > 0, "no sample saw the hold"
        assert sampler.alone_seconds >= ALONE_MIN_SECONDS, vars(sampler)
        _assert_untraced(pid)


def test_the_other_threads_run_while_malloc_trim_is_called() -> None:
    """Eight idle thread arenas of 200 MiB, big blocks trapped between live ones: malloc_trim
    madvises about a GiB of free pages, with the eight workers and the ticker let go."""
    binary = compile_target("seeds_heap")
    with started_in_cgroup(
        [str(binary), "8", "200", "0"],
        group_name="memforensics-test-others-run-trim",
        limit_bytes=3 << 30,
        arena_max=9,
        tunables=f"glibc.malloc.mmap_threshold={32 << 20}",
    ) as pid:
        document, sampler = _run_sampled(pid, "trim")
        assert document["trimmed"] is True, document
        assert sampler.traced_samples > 0, "no sample saw the hold"
        assert sampler.alone_seconds >= ALONE_MIN_SECONDS, vars(sampler)
        _assert_untraced(pid)
