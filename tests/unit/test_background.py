"""gdb_background.QuietGate with real threads: workers park at checkpoints while gdb attaches."""

from __future__ import annotations

import os
import sys
import threading
import time

from memforensics.entry.readers.gdb_background import (
    QuietGate,
    lower_thread_priority,
    prompt_thread_switches,
)


def test_quiet_waits_for_a_busy_worker_to_park_and_holds_it_until_done() -> None:
    gate = QuietGate(settle_seconds=5.0)
    units_done: list[int] = []
    release_first_unit = threading.Event()

    def work() -> None:
        with gate.worker():
            release_first_unit.wait(5.0)  # a unit of work in progress when quiet() begins
            units_done.append(1)
            gate.checkpoint()
            units_done.append(2)

    worker = threading.Thread(target=work)
    worker.start()
    entered = threading.Event()
    seen_inside: list[list[int]] = []

    def attach() -> None:
        with gate.quiet():
            entered.set()
            time.sleep(0.05)
            seen_inside.append(list(units_done))

    attacher = threading.Thread(target=attach)
    attacher.start()
    time.sleep(0.05)
    assert not entered.is_set()  # quiet() waits: the worker is busy and not parked
    release_first_unit.set()
    attacher.join(5.0)
    worker.join(5.0)
    assert entered.is_set()
    # Inside quiet(): the worker had finished its unit and sat at the checkpoint, not beyond.
    assert seen_inside == [[1]]
    assert units_done == [1, 2]


def test_quiet_gives_up_waiting_after_the_settle_time() -> None:
    gate = QuietGate(settle_seconds=0.05)
    stop = threading.Event()

    def never_checks() -> None:
        with gate.worker():
            stop.wait(5.0)

    worker = threading.Thread(target=never_checks)
    worker.start()
    try:
        began = time.monotonic()
        with gate.quiet():
            waited = time.monotonic() - began
        assert 0.04 <= waited < 2.0  # proceeds without the worker, after the settle time
    finally:
        stop.set()
        worker.join(5.0)


def test_a_worker_starting_while_closed_parks_before_its_first_unit() -> None:
    gate = QuietGate(settle_seconds=1.0)
    started_work = threading.Event()

    def work() -> None:
        with gate.worker():
            started_work.set()

    with gate.quiet():
        worker = threading.Thread(target=work)
        worker.start()
        assert not started_work.wait(0.1)
    worker.join(5.0)
    assert started_work.is_set()


def test_background_threads_run_niced_and_switches_are_restored() -> None:
    seen: list[int] = []

    def work() -> None:
        lower_thread_priority()
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(5.0)
    assert seen and seen[0] >= 10
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < 10  # only that thread
    before = sys.getswitchinterval()
    with prompt_thread_switches():
        assert sys.getswitchinterval() <= 0.0002
    assert sys.getswitchinterval() == before
