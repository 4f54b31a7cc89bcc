"""GdbSession against real processes with real gdb: safe points, calls, refusals, detaching."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from memforensics.errors import (
    DeadlineError,
    GdbUnavailableError,
    NoSuchProcessError,
    NotGlibcMallocError,
    TargetError,
    TargetPermissionError,
    ToolingError,
)
from memforensics.sources.gdb.gdb import GdbSession
from memforensics.sources.gdb.gdb_capture import capture_malloc_info
from memforensics.sources.gdb.watchdog_link import Watchdog
from memforensics.sources.glibc.libc_elf import load_libc_image
from memforensics.sources.malloc_info.malloc_xml import parse_dump
from memforensics.sources.proc import process_facts
from tests.support.targets import (
    Target,
    c_target,
    compile_target,
    live_skip_reason,
    python_target,
    running,
)

_SKIP = live_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]

XML_START = b'<malloc version="1">'
BEAT_RE = re.compile(r"beat (\d+)")


def _status(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def _assert_left_running(target: Target) -> None:
    """Detached (no tracer) and not stopped: the promise after every session."""
    assert target.alive()
    status = _status(target.pid)
    assert status["TracerPid"] == "0"
    assert status["State"][0] not in ("T", "t"), status["State"]


def _beats(target: Target, *, at_least: int = 1, timeout_seconds: float = 5.0) -> list[int]:
    """Read heartbeat lines from the target's stdout (fails if none come: not running)."""
    assert target.proc.stdout is not None
    os.set_blocking(target.proc.stdout.fileno(), False)
    seen: list[int] = []
    deadline = time.monotonic() + timeout_seconds
    pending = b""
    while time.monotonic() < deadline and len(seen) < at_least:
        chunk = target.proc.stdout.read()
        if chunk:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                text = line.decode(errors="replace")
                assert "corrupt" not in text, text
                match = BEAT_RE.match(text)
                if match:
                    seen.append(int(match.group(1)))
        else:
            time.sleep(0.02)
    assert len(seen) >= at_least, f"no heartbeat from PID {target.pid}: {seen}"
    return seen


def test_idle_multithreaded_target_gives_one_xml_document_per_arena() -> None:
    with c_target("idle_arenas", "8", "1500") as target:
        capture = capture_malloc_info(target.pid, timeout_seconds=10)
        assert capture.xml.startswith(XML_START)
        dump = parse_dump(capture.xml, name="idle")
        assert len(dump.arenas) == 9  # main arena + one per worker thread
        assert dump.free_bytes > 0
        assert 0 < capture.pause_seconds < 5
        assert "outside the allocator" in capture.safe_point
        _assert_left_running(target)


def test_session_makes_several_calls_and_trim_returns_an_int() -> None:
    with c_target("idle_arenas", "4", "1500") as target:
        log: list[str] = []
        with GdbSession(target.pid, log=log.append) as session:
            assert session.attached
            first = session.malloc_info()
            trimmed = session.malloc_trim(0)
            second = session.malloc_info()
        assert not session.attached
        assert trimmed in (0, 1)
        assert first.startswith(XML_START) and second.startswith(XML_START)
        assert session.pause_seconds > 0
        # -v shows the exchange; every command carried a token and every call was cast.
        sent = [line for line in log if line.startswith("-> ")]
        assert all(re.match(r"-> \d+-", line) for line in sent[:-1])
        calls = [line for line in sent if "-data-evaluate-expression" in line]
        assert calls and all('"((' in line or '"(' in line for line in calls)
        _assert_left_running(target)


def test_allocator_range_covers_malloc_internals_and_not_ordinary_functions() -> None:
    with c_target("idle_arenas", "1", "10") as target:
        facts = process_facts.read_process(target.pid)
        assert facts.libc_path is not None
        libc = load_libc_image(target.pid, facts.libc_path)
        for name in ("malloc", "free", "malloc_info", "malloc_trim"):
            assert libc.in_allocator(libc.functions[name])
        for name in ("open_memstream", "fclose"):
            assert not libc.in_allocator(libc.functions[name])


def test_busy_single_threaded_target_survives_fifty_inspections() -> None:
    """The issue's reproducer: the manual recipe corrupted this kind of target in 7 attaches."""
    with c_target("busy_heap", "0") as target:
        first_beat = _beats(target)[-1]
        safe_points: set[str] = set()
        for _ in range(50):
            capture = capture_malloc_info(target.pid, timeout_seconds=10)
            assert capture.xml.startswith(XML_START)
            parse_dump(capture.xml, name="busy")
            safe_points.add(capture.safe_point.split(" (")[0].split(" after")[0])
            _assert_left_running(target)
        later = _beats(target, at_least=2)
        assert later[-1] > first_beat  # still making progress: alive, running, uncorrupted
        assert target.alive()


def test_busy_multithreaded_target_stays_consistent() -> None:
    with c_target("busy_heap", "3") as target:
        first_beat = _beats(target)[-1]
        for _ in range(10):
            capture = capture_malloc_info(target.pid, timeout_seconds=10)
            dump = parse_dump(capture.xml, name="busy-mt")
            assert len(dump.arenas) >= 2
            _assert_left_running(target)
        assert _beats(target, at_least=2)[-1] > first_beat


def test_no_safe_point_in_time_gives_up_without_calling() -> None:
    binary = compile_target("stuck_in_malloc_stats")
    with running([str(binary)]) as target:
        started = time.monotonic()
        with pytest.raises(DeadlineError) as info, GdbSession(target.pid, timeout_seconds=0.5):
            pass
        assert time.monotonic() - started < 5
        assert "no safe point" in info.value.message
        assert "malloc_stats" in info.value.message  # names where the thread was
        status = _status(target.pid)
        assert status["TracerPid"] == "0"
        assert status["State"][0] == "S"  # still blocked in its write, untouched


def test_target_that_exits_while_waiting_for_a_safe_point() -> None:
    binary = compile_target("stuck_in_malloc_stats")
    with running([str(binary)]) as target:

        def drain_later() -> None:
            time.sleep(1.0)
            assert target.proc.stderr is not None
            while target.proc.stderr.read(65536):
                pass

        drainer = threading.Thread(target=drain_later, daemon=True)
        drainer.start()
        with pytest.raises(NoSuchProcessError), GdbSession(target.pid, timeout_seconds=20):
            pass
        drainer.join(timeout=5)
        target.proc.wait(timeout=5)
        assert target.proc.returncode == 0


def test_static_binary_is_refused_naming_it() -> None:
    binary = compile_target("idle_arenas", "-static")
    with running([str(binary), "2", "10"]) as target:
        with pytest.raises(NotGlibcMallocError) as info, GdbSession(target.pid):
            pass
        assert "static" in info.value.message
        _assert_left_running(target)


def test_already_traced_target_is_refused_with_the_tracer_pid() -> None:
    with (
        c_target("idle_arenas", "2", "10") as target,
        c_target("tracer", str(target.pid)) as tracer,
    ):
        with pytest.raises(TargetPermissionError) as info, GdbSession(target.pid):
            pass
        assert f"TracerPid {tracer.pid}" in info.value.message
        assert info.value.exit_code == 4


def test_stopped_target_is_refused_or_left_stopped() -> None:
    with c_target("idle_arenas", "2", "200") as target:
        os.kill(target.pid, signal.SIGSTOP)  # someone else stopped it
        deadline = time.monotonic() + 5
        while target.state() != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(TargetError), GdbSession(target.pid):
            pass
        capture = capture_malloc_info(target.pid, allow_stopped=True)
        assert capture.xml.startswith(XML_START)
        time.sleep(0.05)
        assert target.state() == "T"  # never resumed by us
        assert _status(target.pid)["TracerPid"] == "0"
        os.kill(target.pid, signal.SIGCONT)


def test_missing_gdb_and_missing_pid() -> None:
    with pytest.raises(ToolingError) as info, GdbSession(os.getpid(), gdb_path="/nonexistent/gdb"):
        pass
    assert isinstance(info.value, GdbUnavailableError)
    assert (
        info.value.exit_code == 5 and info.value.hint and "apt-get install gdb" in info.value.hint
    )
    with pytest.raises(NoSuchProcessError), GdbSession(2**22 + 12345):
        pass


def _wait_state(target: Target, wanted: str, timeout_seconds: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while target.state() != wanted and time.monotonic() < deadline:
        time.sleep(0.01)
    assert target.state() == wanted


def test_watchdog_resumes_a_target_left_stopped_when_memforensics_dies() -> None:
    """SIGKILL of memforensics at the wrong moment can leave a queued SIGSTOP behind (the
    target then sits in T with nobody to resume it). The watchdog sees its pipe close
    without "done", kills gdb and SIGCONTs the target that was running before."""
    with c_target("busy_heap", "0") as target:
        stand_in_gdb = subprocess.Popen(["sleep", "60"], start_new_session=True)
        try:
            dog = Watchdog(target.pid, stand_in_gdb.pid, was_running=True)
            os.kill(target.pid, signal.SIGSTOP)
            _wait_state(target, "T")
            assert dog._proc is not None and dog._proc.stdin is not None
            dog._proc.stdin.close()  # what the kernel does when memforensics is SIGKILLed
            assert stand_in_gdb.wait(timeout=5) == -signal.SIGKILL
            _wait_state(target, "R")
            assert _beats(target, at_least=2)
            dog._proc.wait(timeout=10)
        finally:
            if stand_in_gdb.poll() is None:
                stand_in_gdb.kill()
            stand_in_gdb.wait()


def test_dismissed_watchdog_touches_nothing() -> None:
    with c_target("idle_arenas", "1", "10") as target:
        stand_in_gdb = subprocess.Popen(["sleep", "60"], start_new_session=True)
        try:
            dog = Watchdog(target.pid, stand_in_gdb.pid, was_running=True)
            os.kill(target.pid, signal.SIGSTOP)
            _wait_state(target, "T")
            dog.dismiss()
            time.sleep(0.2)
            assert target.state() == "T"  # a clean finish: nobody else's stop is undone
            assert stand_in_gdb.poll() is None
            os.kill(target.pid, signal.SIGCONT)
        finally:
            stand_in_gdb.kill()
            stand_in_gdb.wait()


@pytest.mark.parametrize("life_seconds", [0.0, 0.02, 0.05, 0.1, 0.2, 0.4])
def test_target_exiting_before_or_during_the_attach_is_a_target_error(
    life_seconds: float,
) -> None:
    """Issue 10 item 5: whenever the target exits, the error is the target's (exit 3)."""
    code = f"import os, time; print('ready', flush=True); time.sleep({life_seconds}); os._exit(0)"
    with python_target(code) as target:
        try:
            with GdbSession(target.pid, timeout_seconds=10) as session:
                session.malloc_info()
        except TargetError as exc:  # exit 3: exited while being inspected, gone, or a zombie
            assert exc.exit_code == 3
        except ToolingError as exc:
            pytest.fail(f"a target that exited was reported as a tooling error: {exc}")
