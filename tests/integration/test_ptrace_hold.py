"""ThreadHold on real targets: every thread held in a ptrace stop, then released as it was.

The targets are tests/targets/hold_counter.c (worker threads that count, a SIGALRM chain,
thread churn, a zombie leader, a thread stuck in vfork) and a real tracer (tracer.c). What
"released as it was" means is checked from outside: /proc's state and TracerPid of every
thread, and the target's own counters going on.
"""

from __future__ import annotations

import collections
import errno
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from memforensics.errors import (
    DeadlineError,
    NoSuchProcessError,
    TargetError,
    TargetPermissionError,
)
from memforensics.sources.proc import ptrace_hold, ptrace_regs
from memforensics.sources.proc.ptrace_hold import ThreadHold
from tests.support.hold_targets import (
    CounterTarget,
    assert_progress,
    hold_counter,
    wait_left_running,
)
from tests.support.targets import c_target, ptrace_skip_reason

_SKIP = ptrace_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
    pytest.mark.skipif(os.uname().machine != "x86_64", reason="ptrace_hold is x86-64 only"),
]
NOBODY = 65534


def _assert_all_held(counter: CounterTarget, hold: ThreadHold) -> None:
    """Every thread the target has is in a ptrace stop, traced by the hold's tracer thread
    (a zombie leader aside), and those are exactly the hold's thread_ids."""
    threads = counter.threads()
    alive = {tid: status for tid, status in threads.items() if status[0] != "Z"}
    assert set(alive) == set(hold.thread_ids), (threads, hold.thread_ids)
    tracers = {tracer for _, tracer in alive.values()}
    assert tracers == {hold._tracer_tid}, threads
    assert hold._tracer_tid != threading.get_native_id()
    assert {state for state, _ in alive.values()} == {"t"}, threads


@pytest.mark.parametrize("workers", [0, 7])
def test_running_target_is_held_then_runs_on_untraced(workers: int) -> None:
    with hold_counter(str(workers)) as counter:
        for _ in range(5):
            with ThreadHold(counter.pid) as hold:
                _assert_all_held(counter, hold)
                assert len(hold.thread_ids) == workers + 1
                assert set(hold.stop_kinds.values()) <= {"interrupt", "signal"}
            assert hold.stop_seconds > 0
            threads = counter.threads()
            # Immediately after the hold, not eventually: __exit__ returns once all is let go.
            assert all(tracer == 0 for _, tracer in threads.values()), threads
            assert all(state in ("R", "S") for state, _ in threads.values()), threads
        wait_left_running(counter)
        assert_progress(counter)


def test_stopped_target_stays_stopped_and_its_stop_is_a_group_stop() -> None:
    with hold_counter("3") as counter:
        os.kill(counter.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while {s for s, _ in counter.threads().values()} != {"T"}:
            assert time.monotonic() < deadline, counter.threads()
            time.sleep(0.005)
        for _ in range(3):
            with ThreadHold(counter.pid) as hold:
                _assert_all_held(counter, hold)
                assert set(hold.stop_kinds.values()) == {"group"}, hold.stop_kinds
            # A thread detached from its group-stop is woken in the kernel and stops again
            # there, never running its own code: it may read 'R' for that moment.
            deadline = time.monotonic() + 2
            threads = counter.threads()
            while not all(s == "T" and t == 0 for s, t in threads.values()):
                assert time.monotonic() < deadline, threads
                time.sleep(0.005)
                threads = counter.threads()
            assert threads
        os.kill(counter.pid, signal.SIGCONT)
        wait_left_running(counter)
        assert_progress(counter)


def test_no_sigalrm_is_lost_over_many_holds() -> None:
    """The target re-arms a one-shot timer in its SIGALRM handler: one SIGALRM swallowed at
    detach ends the chain for good. Holds land on signal-delivery-stops often enough (the
    signal dequeued between seize and interrupt) that the deferral is exercised."""
    with hold_counter("2", "alarm=200") as counter:
        deferred: collections.Counter[int] = collections.Counter()
        for _ in range(300):
            with ThreadHold(counter.pid) as hold:
                deferred.update(hold.deferred_signals.values())
        assert deferred[signal.SIGALRM] > 0, "no hold caught a SIGALRM on its way in"
        wait_left_running(counter)
        assert_progress(counter, alarms=True)


def test_the_lost_sigalrm_oracle_is_not_vacuous(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hold that drops the deferred signal at detach is caught: the chain stops."""
    real = ptrace_hold._ptrace

    def dropping(request: int, tid: int, data: int = 0) -> None:
        real(request, tid, 0 if request == ptrace_hold._PTRACE_DETACH else data)

    monkeypatch.setattr(ptrace_hold, "_ptrace", dropping)
    with hold_counter("2", "alarm=200") as counter:
        for _ in range(300):
            with ThreadHold(counter.pid) as hold:
                pass
            if hold.deferred_signals:
                break
        assert hold.deferred_signals, "no hold caught a SIGALRM on its way in"
        before = counter.counts().alarms
        time.sleep(0.2)
        assert counter.counts().alarms == before


def test_threads_made_and_ended_meanwhile_and_a_zombie_leader() -> None:
    """Short-lived threads appear and end all the time; the leader is a zombie. Every thread
    present is held; none is left traced or stopped."""
    with hold_counter("3", "churn", "leader-exits") as counter:
        deadline = time.monotonic() + 10
        while counter.threads()[counter.pid][0] != "Z":  # it says ready, then exits
            assert time.monotonic() < deadline, counter.threads()
            time.sleep(0.005)
        counts = collections.Counter[str]()
        thread_counts = set()
        for _ in range(60):
            with ThreadHold(counter.pid) as hold:
                _assert_all_held(counter, hold)
                assert counter.pid not in hold.thread_ids  # the zombie leader is no thread
                counts.update(hold.stop_kinds.values())
                thread_counts.add(len(hold.thread_ids))
                counts["vanished"] += len(hold._ignored - {counter.pid})
                counts["gone"] += sum(t.gone for t in hold._tracees.values())
        assert len(thread_counts) > 1, "the churn made no difference"
        # Threads ended between listing and seizing, or between seizing and stopping.
        assert counts["vanished"] + counts["gone"] > 0, counts
        wait_left_running(counter)
        assert_progress(counter)
        assert counter.counts().threads_created > 0
        print(f"over 60 holds: {dict(counts)}; threads held: {sorted(thread_counts)}")


def test_a_thread_gone_between_listing_and_seizing_is_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ESRCH from PTRACE_SEIZE (a thread that ended after /proc listed it) is no failure."""
    ended = subprocess.Popen(["true"])
    ended.wait()
    real = ptrace_hold._list_threads
    monkeypatch.setattr(ptrace_hold, "_list_threads", lambda pid: [*real(pid), ended.pid])
    with hold_counter("2") as counter:
        with ThreadHold(counter.pid) as hold:
            assert ended.pid not in hold.thread_ids
            assert len(hold.thread_ids) == 3
        assert ended.pid in hold._ignored
        wait_left_running(counter)


@pytest.mark.skipif(
    ptrace_regs._batch is None,
    reason="the C loop is not in use (not built here, or MEMFORENSICS_PURE_PYTHON is set)",
)
def test_the_c_loop_fails_the_threads_the_python_loop_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PTRACE_SEIZE of a live thread, a gone one and a live one again: both loops give ESRCH
    for the gone one alone, and seize the others (until the tracer thread ends)."""
    ended = subprocess.Popen(["true"])
    ended.wait()
    with hold_counter("2") as counter:
        live = sorted(counter.threads())
        tids = [live[0], ended.pid, live[1]]
        results: dict[bool, dict[int, int]] = {}
        traced: dict[bool, list[int]] = {}

        def seize(native: bool) -> None:
            hold = ThreadHold(counter.pid)
            hold._tracer_tid = threading.get_native_id()
            with monkeypatch.context() as patch:
                if not native:
                    patch.setattr(ptrace_regs, "_batch", None)
                results[native] = hold._each(
                    ptrace_hold._PTRACE_SEIZE, tids, ptrace_hold._PTRACE_O_TRACECLONE
                )
            traced[native] = [counter.threads()[tid][1] for tid in tids if tid != ended.pid]

        for native in (True, False):
            tracer = threading.Thread(target=seize, args=(native,))
            tracer.start()
            tracer.join()
            wait_left_running(counter)  # the tracer thread ended: the kernel let go
        assert results[True] == results[False] == {ended.pid: errno.ESRCH}
        assert all(traced[True]) and all(traced[False]), traced
        assert ptrace_regs._batch is not None
        with pytest.raises(ValueError, match="differ in length"):
            ptrace_regs._batch.each(ptrace_hold._PTRACE_DETACH, tids, [0])
        with pytest.raises(ValueError, match="positive"):
            ptrace_regs._batch.each(ptrace_hold._PTRACE_DETACH, [0], 0)
        assert_progress(counter)


def _await_vfork_sleep(counter: CounterTarget) -> None:
    """Until the target's vfork thread waits in vfork() (state D), within 10 s."""
    deadline = time.monotonic() + 10
    while "D" not in {s for s, _ in counter.threads().values()}:
        assert time.monotonic() < deadline, counter.threads()
        time.sleep(0.005)


def test_a_thread_that_cannot_stop_times_out_and_is_released() -> None:
    """A thread waiting in vfork() sleeps killable-only: PTRACE_INTERRUPT does not wake it.
    The hold gives up (exit 6) and detaches everything; PTRACE_DETACH cannot release a
    thread that never stopped, so the tracer thread's end does, and once vfork returns that
    thread runs on instead of entering the stop it was asked for."""
    with hold_counter("2", "vfork") as counter:
        vfork_child = int(counter.target.ready_line.split("=")[1])
        try:
            _await_vfork_sleep(counter)
            started = time.monotonic()
            with pytest.raises(DeadlineError) as info, ThreadHold(counter.pid, timeout_seconds=0.3):
                pass
            assert time.monotonic() - started >= 0.3
            assert info.value.exit_code == 6
            assert "1 of 4 threads did not stop within 0.3 s" in info.value.message
            assert "(state D)" in info.value.message
            assert info.value.hint is not None and "left running" in info.value.hint
            threads = counter.threads()
            assert all(tracer == 0 for _, tracer in threads.values()), threads
        finally:
            os.kill(vfork_child, signal.SIGKILL)
        wait_left_running(counter)
        before = counter.counts().vforker
        time.sleep(0.2)
        assert counter.counts().vforker > before, "the vfork thread did not run on"
        assert_progress(counter)


def test_ctrl_c_while_stopping_lets_go() -> None:
    """KeyboardInterrupt in __enter__ (waiting for a thread that will not stop) detaches."""
    with hold_counter("2", "vfork") as counter:
        vfork_child = int(counter.target.ready_line.split("=")[1])
        try:
            _await_vfork_sleep(counter)
            main = threading.main_thread().ident
            assert main is not None and main == threading.get_ident()
            timer = threading.Timer(0.2, signal.pthread_kill, (main, signal.SIGINT))
            timer.start()
            try:
                with pytest.raises(KeyboardInterrupt), ThreadHold(counter.pid, timeout_seconds=30):
                    pass
            finally:
                timer.cancel()
            threads = counter.threads()
            assert all(tracer == 0 for _, tracer in threads.values()), threads
        finally:
            os.kill(vfork_child, signal.SIGKILL)
        wait_left_running(counter)
        assert_progress(counter)


def test_exceptions_in_the_block_and_an_exit_from_another_thread_let_go() -> None:
    with hold_counter("3") as counter:
        with pytest.raises(KeyboardInterrupt), ThreadHold(counter.pid):
            raise KeyboardInterrupt
        wait_left_running(counter)
        hold = ThreadHold(counter.pid)
        hold.__enter__()
        # All ptrace requests come from the hold's own tracer thread, so the caller may
        # release it from any thread.
        _assert_all_held(counter, hold)
        releaser = threading.Thread(target=hold.__exit__, args=(None, None, None))
        releaser.start()
        releaser.join(timeout=10)
        assert not releaser.is_alive()
        threads = counter.threads()
        assert all(tracer == 0 for _, tracer in threads.values()), threads
        with pytest.raises(RuntimeError, match="holds once"):
            hold.__enter__()
        wait_left_running(counter)
        assert_progress(counter)


def test_ptrace_from_another_thread_is_refused_plainly() -> None:
    hold = ThreadHold(os.getppid())
    hold._tracer_tid = threading.get_native_id() + 1
    with pytest.raises(RuntimeError, match="tracer thread only"):
        hold._ptrace(ptrace_hold._PTRACE_INTERRUPT, os.getppid())


def test_already_traced_target_is_refused_and_nothing_is_half_seized() -> None:
    """A tracer on the leader: refused at once. A tracer on the last thread only: the hold
    has seized the others by then, and lets them go before it raises."""
    with hold_counter("3") as counter:
        with c_target("tracer", str(counter.pid)) as tracer:
            with pytest.raises(TargetPermissionError) as info, ThreadHold(counter.pid):
                pass
            assert info.value.exit_code == 4
            assert f"PID {counter.pid} (hold_counter-" in info.value.message
            assert f"is already traced by TracerPid {tracer.pid} (tracer-" in info.value.message
            assert info.value.hint is not None and "detach the other" in info.value.hint
        wait_left_running(counter)
        last = max(counter.threads())
        with c_target("tracer", str(last)) as tracer:
            with pytest.raises(TargetPermissionError) as info, ThreadHold(counter.pid):
                pass
            assert f"thread {last} of PID {counter.pid}" in info.value.message
            threads = counter.threads()
            assert threads.pop(last)[1] == tracer.pid
            assert all(t == 0 and s in ("R", "S") for s, t in threads.values()), threads
        wait_left_running(counter)
        assert_progress(counter)


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another uid needs root")
def test_ptrace_refused_is_a_permission_error() -> None:
    """As uid nobody without CAP_SYS_PTRACE, a root target: exit 4 naming the cause."""
    with hold_counter("1") as counter:
        read_end, write_end = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - runs in the child
            try:
                os.close(read_end)
                os.setgroups([])
                os.setresgid(NOBODY, NOBODY, NOBODY)
                os.setresuid(NOBODY, NOBODY, NOBODY)
                try:
                    with ThreadHold(counter.pid):
                        text = "held"
                except Exception as exc:
                    code = getattr(exc, "exit_code", None)
                    text = f"{type(exc).__name__}\n{code}\n{exc}\n{getattr(exc, 'hint', '')}"
                os.write(write_end, text.encode())
            finally:
                os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as reader:
            kind, code, message, hint = reader.read().decode().split("\n", 3)
        os.waitpid(child, 0)
        assert (kind, code) == ("TargetPermissionError", "4"), message
        assert f"runs as uid 0, you are uid {NOBODY}" in message
        assert "sudo -E" in hint
        wait_left_running(counter)


def test_no_such_process_zombie_and_itself() -> None:
    ended = subprocess.Popen(["true"])
    ended.wait()
    with pytest.raises(NoSuchProcessError) as info, ThreadHold(ended.pid):
        pass
    assert info.value.exit_code == 3
    zombie = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        stat = Path(f"/proc/{zombie.pid}/stat")
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.005)
        with pytest.raises(TargetError, match="zombie") as zombie_info, ThreadHold(zombie.pid):
            pass
        assert zombie_info.value.exit_code == 3
    finally:
        zombie.wait()
    with pytest.raises(TargetError, match="memforensics itself"), ThreadHold(os.getpid()):
        pass
