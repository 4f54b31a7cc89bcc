"""How long a stop of a live target may go on reading arenas (arena_hold): 4 ms, or in a process
of hundreds of threads, whose hold alone costs tens of ms, half the hold's time (at most 25 ms);
a process of a few threads keeps 4 ms however slow one hold was. The threads counted are those
of a real hold, against the kernel's own list of the target's threads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from memforensics.sources.glibc.arena_hold import (
    STOP_BUDGET_SECONDS,
    STOP_SHARE_MAX_SECONDS,
    STOP_SHARE_MIN_THREADS,
    StopBatches,
    reading_budget_seconds,
)
from tests.support.targets import proc_status


def test_a_few_threads_keep_the_budget_however_slow_their_hold() -> None:
    # (33 busy threads on 2 CPUs: a hold of 300 ms once in a while, no reason to read longer.)
    for hold_seconds in (0.0, 0.001, 0.3, 5.0):
        assert reading_budget_seconds(0.004, hold_seconds, 33) == 0.004
        assert reading_budget_seconds(0.004, hold_seconds, STOP_SHARE_MIN_THREADS - 1) == 0.004


def test_many_threads_read_for_half_their_hold_within_the_bounds() -> None:
    many = 1501
    assert reading_budget_seconds(0.004, 0.030, many) == pytest.approx(0.015)
    assert reading_budget_seconds(0.004, 0.002, many) == 0.004  # never below the budget
    assert reading_budget_seconds(0.004, 0.400, many) == STOP_SHARE_MAX_SECONDS
    assert reading_budget_seconds(0.004, 0.020, STOP_SHARE_MIN_THREADS) == pytest.approx(0.010)


_THREADS = r"""
import threading, time
for _ in range(int(__import__("sys").argv[1])):
    threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
print("ready", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("threads", [3, STOP_SHARE_MIN_THREADS + 50])
def test_a_stop_counts_the_threads_it_holds(threads: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _THREADS, str(threads)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
        batches = StopBatches(proc.pid, libc=None, single_threaded=False, timeout_seconds=10)
        try:
            with batches.arena():
                held = len(os.listdir(f"/proc/{proc.pid}/task"))  # the kernel's own count
                assert held == threads + 1
                assert batches._hold_threads == held
                expected = reading_budget_seconds(STOP_BUDGET_SECONDS, batches._hold_seconds, held)
                assert batches._budget_seconds() == expected
                assert (expected > STOP_BUDGET_SECONDS) == (
                    held >= STOP_SHARE_MIN_THREADS and batches._hold_seconds > 0.008
                )
        finally:
            batches.close()
        assert proc_status(proc.pid)["TracerPid"] == "0"
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
