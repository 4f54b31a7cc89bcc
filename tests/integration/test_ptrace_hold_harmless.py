"""ThreadHold never harms its target: not when memforensics is SIGKILLed at any moment of a
hold, and not across consecutive holds of a target that notices any disturbance.

The read from memory (docs/architecture.md): "A dead memforensics leaves the target running:
the kernel ends a dead tracer's seizes" (tested here). A child Python process holds a target
through ThreadHold, stops at a chosen moment (its ptrace wrapper or waitid freezes the
tracer thread there, or the hold is simply on), says so, and is SIGKILLed. The target, a
hold_counter whose workers count and whose SIGALRM chain dies if one SIGALRM is lost, must
then be alive, untraced, not stopped, and counting on, every worker and the chain."""

from __future__ import annotations

import collections
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from memforensics.sources.proc.procmaps import parse_maps
from memforensics.sources.proc.procmem import ProcessMemoryReader
from memforensics.sources.proc.ptrace_hold import ThreadHold
from tests.support.hold_targets import assert_progress, hold_counter, wait_left_running
from tests.support.targets import (
    assert_integrity_intact,
    compile_target,
    ptrace_skip_reason,
    running,
)

_SKIP = ptrace_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
    pytest.mark.skipif(os.uname().machine != "x86_64", reason="ptrace_hold is x86-64 only"),
]
REPO = Path(__file__).resolve().parents[2]

# The holder: argv = PID MOMENT N. It freezes its tracer thread right after the Nth
# PTRACE_SEIZE / PTRACE_INTERRUPT / PTRACE_DETACH, or before the Nth waitid, or (held)
# once __enter__ has returned, or (signal) once it has seen a thread in a signal-delivery-
# stop for SIGALRM (holding again and again until one does); prints "ready TRACER_TID"
# there and sleeps until killed.
HOLDER = r"""
import os, signal, sys, threading, time
from memforensics.sources.proc import ptrace_hold

pid, moment, nth = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
REQUESTS = {
    "seize": ptrace_hold._PTRACE_SEIZE,
    "interrupt": ptrace_hold._PTRACE_INTERRUPT,
    "detach": ptrace_hold._PTRACE_DETACH,
}
calls = [0]

def freeze(tracer_tid):
    print(f"ready {tracer_tid}", flush=True)
    time.sleep(600)

real_ptrace = ptrace_hold._ptrace
def ptrace(request, tid, data=0):
    real_ptrace(request, tid, data)
    if REQUESTS.get(moment) == request:
        calls[0] += 1
        if calls[0] == nth:
            freeze(threading.get_native_id())
ptrace_hold._ptrace = ptrace

real_waitid = os.waitid
def waitid(idtype, tid, options):
    if moment == "wait" and threading.current_thread().name.startswith("memforensics-hold"):
        calls[0] += 1
        if calls[0] == nth:
            freeze(threading.get_native_id())
    seen = real_waitid(idtype, tid, options)
    if (
        moment == "signal"
        and seen is not None
        and seen.si_code == os.CLD_TRAPPED
        and seen.si_status == signal.SIGALRM
    ):
        freeze(threading.get_native_id())
    return seen
os.waitid = waitid

for attempt in range(3000 if moment == "signal" else 1):
    with ptrace_hold.ThreadHold(pid, timeout_seconds=60) as hold:
        if moment == "held":
            freeze(hold._tracer_tid)
print("ready never", flush=True)
"""

# (target arguments, moment, N): one thread and eight, idle-ish and busy, at each moment.
MOMENTS = [
    (("0",), "seize", 1),
    (("0",), "interrupt", 1),
    (("0",), "wait", 1),
    (("0",), "held", 0),
    (("7",), "seize", 4),
    (("7",), "interrupt", 4),
    (("7",), "wait", 1),  # every thread interrupted, no stop collected
    (("7",), "wait", 5),  # some stops collected
    (("7",), "held", 0),
    (("7",), "detach", 4),
    (("0",), "signal", 0),  # the kernel must deliver the SIGALRM the dead tracer saw
    (("7",), "signal", 0),
    (("3", "busy"), "interrupt", 2),
    (("3", "busy"), "held", 0),
]


@pytest.mark.parametrize(("args", "moment", "nth"), MOMENTS)
def test_holder_killed_at_a_moment_leaves_the_target_running(
    args: tuple[str, ...], moment: str, nth: int
) -> None:
    with hold_counter(*args, "alarm=300") as counter:
        threads_before = len(counter.threads())
        with running(
            [sys.executable, "-c", HOLDER, str(counter.pid), moment, str(nth)],
            env={"PYTHONPATH": str(REPO)},
        ) as holder:
            assert holder.ready_line != "ready never", "no hold saw a SIGALRM on its way in"
            tracer_tid = int(holder.ready_line.split()[1])
            threads = counter.threads()
            traced = [tid for tid, (_, tracer) in threads.items() if tracer == tracer_tid]
            # The moment is real: the holder traces threads of the target as it dies.
            assert traced, threads
            if moment == "seize":
                assert len(traced) == nth, threads
            if moment == "held":
                assert len(traced) == threads_before, threads
                assert {state for state, _ in threads.values()} == {"t"}, threads
            os.kill(holder.pid, signal.SIGKILL)
            assert holder.proc.wait(timeout=10) == -signal.SIGKILL
        wait_left_running(counter)
        assert len(counter.threads()) == threads_before
        assert_progress(counter, alarms=True)


def test_integrity_target_is_undisturbed_by_20_holds() -> None:
    """Issue 10 item 3's target (registers with upper ymm lanes held across a spin, a blocking
    read() of an ordered byte stream, SIGALRM every 2 ms, heap buffers) held 20 times, at
    different points of its loop; while held, its heap read twice through /proc/PID/mem is
    the same: nothing moves."""
    binary = compile_target("integrity", "-mavx2")
    with running([str(binary)]) as target:
        kinds: collections.Counter[str] = collections.Counter()
        deferred = 0
        for round_index in range(20):
            time.sleep((round_index % 7) * 0.0013)
            with ThreadHold(target.pid) as hold, ProcessMemoryReader(target.pid) as memory:
                kinds.update(hold.stop_kinds.values())
                deferred += len(hold.deferred_signals)
                maps = parse_maps(Path(f"/proc/{target.pid}/maps").read_text())
                heap = next(m for m in maps if m.path == "[heap]")
                size = heap.end_address - heap.start_address
                first = memory.read_present(heap.start_address, size)
                time.sleep(0.005)
                assert memory.read_present(heap.start_address, size) == first
            assert len(hold.thread_ids) == 2
            assert target.alive(), target.proc.stdout.read() if target.proc.stdout else ""
        assert_integrity_intact(target)
        print(f"20 holds: stops {dict(kinds)}, SIGALRMs deferred to the release: {deferred}")
