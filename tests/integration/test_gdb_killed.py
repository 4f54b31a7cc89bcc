"""gdb SIGKILLed at any moment of a session: the target survives and is left running.

Issue 10, item 2. gdb is killed from memforensics' own -v log callback, right as a chosen
command goes out, or in the middle of a call made long on purpose: a thread of the target
holds the main arena's mutex inside malloc_stats() (blocked writing to a full stderr pipe)
until the test drains the pipe, so the calls (malloc first) wait for it. After each kill the
target must be alive, untraced, not stopped, and its main thread (the one that made the
calls, blocked in read() on its stdin) must still answer commands: its registers and its
interrupted system call came back. The session makes no call while it sees an arena's mutex
held (test_no_call_while_an_arena_stays_locked); the tests of a call that waits stand for a
mutex taken just after that look (a race): they hide the arenas from the look
(_lock_taken_after_the_look).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from memforensics.errors import MemforensicsError
from memforensics.sources.gdb import gdb as gdb_module
from memforensics.sources.gdb import watchdog_link
from memforensics.sources.gdb.gdb import GdbSession
from tests.support.stall_target import StallTarget
from tests.support.targets import assert_integrity_intact, compile_target, live_skip_reason, running

_SKIP = live_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
    pytest.mark.skipif(os.uname().machine != "x86_64", reason="the guardian restores x86-64"),
]


@pytest.fixture
def _lock_taken_after_the_look(monkeypatch: pytest.MonkeyPatch) -> None:
    """The session's look at the arenas' mutexes finds no arena: as if the stall took the
    main arena's mutex just after that look, so that the first call waits for it."""
    monkeypatch.setattr(gdb_module, "arena_mutexes", lambda pid, libc_path: [])


@contextlib.contextmanager
def victim() -> Iterator[StallTarget]:
    target = StallTarget()
    try:
        yield target
    finally:
        target.close()


def _left_running(target: StallTarget, timeout_seconds: float = 30.0) -> None:
    """Alive, untraced, not stopped, and the main thread answers on its stdin."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        assert target.proc.poll() is None, f"target died: {target.proc.returncode}"
        status = target.status()
        if status["TracerPid"] == "0" and status["State"][0] not in ("T", "t"):
            break
        time.sleep(0.01)
    status = target.status()
    assert status["TracerPid"] == "0", status
    assert status["State"][0] not in ("T", "t"), status["State"]
    assert target.say("gap").startswith("gap ")
    assert target.proc.poll() is None


def _kill_gdb_when(  # type: ignore[no-untyped-def]
    session_box: list[GdbSession], pattern: str, delay_seconds: float, *, nth: int = 1
):
    """A -v log callback that SIGKILLs gdb at the ``nth`` line matching ``pattern``."""
    fired = threading.Event()
    seen = [0]

    def log(line: str) -> None:
        if fired.is_set() or not re.search(pattern, line):
            return
        seen[0] += 1
        if seen[0] < nth:
            return
        fired.set()
        mi = session_box[0]._mi
        assert mi is not None
        gdb_pid = mi.pid
        if delay_seconds == 0:
            # At the moment itself: dead before the session sends anything more. (A kill from
            # another thread raced the next command: landing while gdb wrote the registers of
            # a short call, it hit the window docs/inspect.md describes, not this moment.)
            os.kill(gdb_pid, signal.SIGKILL)
            _wait_dead(gdb_pid)
            return

        def kill() -> None:
            time.sleep(delay_seconds)
            with contextlib.suppress(ProcessLookupError):
                os.kill(gdb_pid, signal.SIGKILL)

        threading.Thread(target=kill, daemon=True).start()

    return log, fired


def _wait_dead(pid: int, timeout_seconds: float = 5.0) -> None:
    """Until ``pid`` is a zombie or gone (its parent, the session, reaps it later)."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.001)
    raise AssertionError(f"gdb {pid} still alive {timeout_seconds:g} s after SIGKILL")


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
                    members.append(int(entry.name))
    return members


# As long as the watchdog waits to call a target left alone (watchdog._CALM_SECONDS).
_CALM_SECONDS = 0.5


def _untraced_for(target: StallTarget, seconds: float, timeout_seconds: float = 150.0) -> None:
    """The target is untraced for ``seconds`` on end (a watchdog's rescue, up to its 120 s,
    is over)."""
    deadline = time.monotonic() + timeout_seconds
    calm_since = time.monotonic()
    while time.monotonic() - calm_since < seconds:
        assert time.monotonic() < deadline, f"still traced: {target.status()['TracerPid']}"
        if target.status()["TracerPid"] != "0":
            calm_since = time.monotonic()
        time.sleep(0.01)


def _wait_gone(gdb_pid: int, timeout_seconds: float = 10.0) -> None:
    """gdb's process group (gdb and anything it forked) is empty within the deadline."""
    deadline = time.monotonic() + timeout_seconds
    while _group_members(gdb_pid):
        assert time.monotonic() < deadline, f"left of gdb's group: {_group_members(gdb_pid)}"
        time.sleep(0.02)


# The moments, from attach to detach: (pattern of the log line, which occurrence). A line
# "->" is a command going out; "^done,value=" is a call's result coming back.
MOMENTS = [
    (r"^-> \d+-target-attach", 1),
    (r"^-> \d+-interpreter-exec console \"sharedlibrary", 1),
    (r"^-> \d+-exec-interrupt", 1),
    (r"^-> \d+-stack-list-frames", 1),
    (r"^-> \d+-data-list-register-values", 1),
    (r"^<- \d+\^done,value=", 1),  # malloc(16) returned
    (r"^<- \d+\^done,value=", 2),  # open_memstream returned
    (r"^<- \d+\^done,value=", 3),  # malloc_info returned
    (r"^<- \d+\^done,value=", 5),  # the buffer freed
    (r"^-> \d+-target-detach", 1),
]
# Not among them: the instant a short call (malloc(16), fclose, free: microseconds) is sent.
# gdb then writes the caller's registers one at a time while it sets the call up; a kill in
# that window leaves a half-written context that the kernel resumes at once, before anything
# can step in (measured: 3-4 of 15 such kills ended the target with SIGSEGV). See
# docs/inspect.md, "If gdb dies".


@pytest.mark.slow
@pytest.mark.parametrize(("moment", "nth"), MOMENTS)
def test_gdb_killed_at_a_moment_leaves_the_target_running(moment: str, nth: int) -> None:
    with victim() as target:
        box: list[GdbSession] = []
        log, fired = _kill_gdb_when(box, moment, 0.0, nth=nth)
        session = GdbSession(target.pid, timeout_seconds=10, log=log)
        box.append(session)
        with contextlib.suppress(MemforensicsError), session:
            session.malloc_info()
        assert fired.is_set(), f"the session never reached {moment} #{nth}"
        _left_running(target)
        # Nothing of gdb's is left either: killed while attaching, gdb leaves the copy of
        # itself it forks to probe ptrace stopped for ever; the watchdog ends gdb's group.
        assert session._mi is not None
        _wait_gone(session._mi.pid)
        # The watchdog, told gdb died, may still be rescuing a call it believed in flight (a
        # kill just as a call's result came back): it traces the calling thread until it is
        # done, and a session started meanwhile is refused as "already traced". Its
        # rescue ends first.
        _untraced_for(target, _CALM_SECONDS)
        # And the target can be inspected again: nothing was left behind in its code.
        with GdbSession(target.pid, timeout_seconds=10) as again:
            assert again.malloc_info().startswith(b"<malloc")
        _left_running(target)


def _session_killed_in_its_first_call(
    target: StallTarget,
) -> tuple[GdbSession, threading.Event]:
    """The stall started, and a session (not yet entered) whose gdb is SIGKILLed 0.3 s after
    its first call, malloc(16), goes out: that call already waits for the main arena's mutex.
    The event is set once the kill is on its way."""
    assert target.say("stall") == "stalling"
    box: list[GdbSession] = []
    log, fired = _kill_gdb_when(box, r"^-> \d+-data-evaluate-expression .*\(16\)", 0.3)
    session = GdbSession(target.pid, timeout_seconds=30, log=log)
    box.append(session)
    return session, fired


@pytest.mark.slow
@pytest.mark.usefixtures("_lock_taken_after_the_look")
def test_gdb_killed_during_a_long_call_the_guardian_finishes_it() -> None:
    with victim() as target:
        session, fired = _session_killed_in_its_first_call(target)

        def drain_when_gdb_is_gone() -> None:
            # The call waits for the arena mutex until stderr drains: let it finish only once
            # gdb is dead and the watchdog has seized the caller.
            fired.wait(timeout=30)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                tracer = int(target.status()["TracerPid"])
                if tracer and session._mi is not None and tracer != session._mi.pid:
                    break
                time.sleep(0.005)
            target.drain_stderr()

        drainer = threading.Thread(target=drain_when_gdb_is_gone, daemon=True)
        drainer.start()
        with contextlib.suppress(MemforensicsError), session:
            session.malloc_info()
        drainer.join(timeout=40)
        assert fired.is_set()
        _left_running(target)
        target.drain_stderr()
        with GdbSession(target.pid, timeout_seconds=10) as again:
            assert again.malloc_info().startswith(b"<malloc")
        _left_running(target)


@pytest.mark.slow
@pytest.mark.usefixtures("_lock_taken_after_the_look")
def test_a_rescued_call_blocked_on_a_lock_past_the_deadline_is_unwound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gdb killed while its call waits for a mutex that stays held past the rescue's
    deadline: the guardian unwinds the call where it waits, never lets go of it (the call
    would later return into gdb's breakpoint and kill the target). The main thread answers
    while the mutex is still held: it is back in its read(), not in the call."""
    monkeypatch.setattr(watchdog_link, "RESCUE_SECONDS", 1.0)
    with victim() as target:
        session, fired = _session_killed_in_its_first_call(target)
        with contextlib.suppress(MemforensicsError), session:
            session.malloc_info()
        assert fired.is_set()
        # The mutex is still held (stderr not drained): only an unwound caller answers.
        _left_running(target)
        target.drain_stderr()
        _left_running(target)
        with GdbSession(target.pid, timeout_seconds=10) as again:
            assert again.malloc_info().startswith(b"<malloc")
        _left_running(target)


@pytest.mark.slow
def test_nothing_in_the_target_changes_across_dozens_of_inspects_and_trims() -> None:
    """Issue 10 item 3: registers (upper ymm lanes too) held across a loop, a blocking read()
    of an ordered byte stream, SIGALRM every 2 ms and heap buffers: all intact."""
    binary = compile_target("integrity", "-mavx2")
    with running([str(binary)]) as target:
        safe_points: set[str] = set()
        # 36 rounds, and more (up to 120) until calls were made from more than one place of
        # the main thread: its register loop, its read(), its SIGALRM handler. Where gdb
        # stops it depends on the scheduler: on a loaded machine it may sit in read() for
        # dozens of rounds in a row, so the rounds go on until the places differ.
        round_index = 0
        while round_index < 36 or (len(safe_points) < 2 and round_index < 120):
            with GdbSession(target.pid, timeout_seconds=10) as session:
                if round_index % 3 == 2:
                    assert session.malloc_trim(0) in (0, 1)
                else:
                    assert session.malloc_info().startswith(b"<malloc")
            safe_points.add(session.safe_point.split(",", 1)[-1].strip())
            assert target.alive(), target.proc.stdout.read() if target.proc.stdout else ""
            round_index += 1
        assert_integrity_intact(target)
        assert len(safe_points) >= 2, safe_points


def _stalled_malloc_info_error(target: StallTarget) -> MemforensicsError:
    """The error of malloc_info through a session with a 1.5 s deadline, the main arena's
    mutex held by the stall: a timeout (exit 6)."""
    assert target.say("stall") == "stalling"
    with (
        pytest.raises(MemforensicsError) as info,
        GdbSession(target.pid, timeout_seconds=1.5) as session,
    ):
        session.malloc_info()
    assert info.value.exit_code == 6, info.value
    return info.value


@pytest.mark.slow
def test_no_call_while_an_arena_stays_locked() -> None:
    """An arena's mutex held at every look from the safe point to the deadline (a thread
    blocked inside malloc_stats): no call is made, so none can be left waiting in the
    target; the session ends at its deadline, untraced at once, and the main thread (the
    caller it chose) answers as soon as the mutex is let go."""
    with victim() as target:
        started = time.monotonic()
        error = _stalled_malloc_info_error(target)
        assert "nothing was called" in error.message, error
        assert time.monotonic() - started < 5
        # No call was left to the watchdog: nothing traces the target once gdb detached.
        assert target.status()["TracerPid"] == "0"
        target.drain_stderr()
        _left_running(target)


@pytest.mark.slow
@pytest.mark.usefixtures("_lock_taken_after_the_look")
def test_call_past_its_deadline_is_unwound_and_the_target_left_running() -> None:
    """A call that overruns (here: waiting for an arena mutex another thread took after the
    session looked) is given up at its deadline, and said to be: gdb/MI reads no interrupt
    while a non-stop call runs, so the watchdog takes the call over and restores the caller
    once the mutex is free; the target then carries on, untraced."""
    with victim() as target:
        started = time.monotonic()
        error = _stalled_malloc_info_error(target)
        assert "did not return within 1.5 s" in error.message, error
        assert "the watchdog took the call over" in error.message, error
        assert time.monotonic() - started < 15
        target.drain_stderr()
        _left_running(target)
        target.drain_stderr()
        with GdbSession(target.pid, timeout_seconds=10) as again:
            assert again.malloc_info().startswith(b"<malloc")
        _left_running(target)
