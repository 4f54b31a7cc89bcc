"""Hold every thread of a live process still with ptrace, read-only, then let them all go.

While the hold lasts nothing in the target runs, so its memory read through /proc/PID/mem
is one moment (docs/architecture.md, "The read from memory"). The hold writes nothing
and runs no code there: PTRACE_SEIZE (with PTRACE_O_TRACECLONE), PTRACE_INTERRUPT, waitid,
PTRACE_GETREGS and PTRACE_DETACH; never PTRACE_ATTACH, SIGSTOP or a breakpoint. ``in_tracer``
runs a caller's own requests in its tracer thread (ptrace_call's calls). x86-64 Linux.

Invariants:

- One thread, the tracer, makes every ptrace request and every wait: the kernel makes a
  thread, not a process, the tracer. Each hold starts its own tracer thread, which ends when
  the hold ends, and a tracer thread that ends has the kernel detach whatever it still traces
  (exit_ptrace), delivering the signal of a signal-delivery-stop as PTRACE_DETACH would. That
  releases what PTRACE_DETACH cannot, since it needs a tracee in a stop: a thread that never
  stopped before the deadline (one waiting uninterruptibly in the kernel, as a vfork parent
  does), and one whose stop was not seen when the hold failed. The same kernel rule
  leaves the target running when memforensics itself is killed.
- PTRACE_DETACH is used only on a thread whose stop was seen, with the signal of a
  signal-delivery-stop (a real signal that arrived while the thread was seized) as its
  data, so that signal is delivered, not lost. Stops are seen with waitid(WNOWAIT), never
  consumed: consuming one clears the signal the kernel would deliver if the tracer died
  before PTRACE_DETACH.
- A group-stop (the process was stopped by SIGSTOP, SIGTSTP, SIGTTIN or SIGTTOU) is reported
  as PTRACE_EVENT_STOP with that signal; the kernel puts such a thread back into the group
  stop at detach, so a stopped target stays stopped (state T) and a running one runs.
- No thread is missed: every thread listed in /proc/PID/task is seized; a seized thread's new
  threads are traced from birth (PTRACE_O_TRACECLONE); the listing is repeated until it shows
  no new thread, and again once every thread has stopped, when none can be midway through
  creating one (a clone begun before its parent was seized makes an untraced thread).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal, TypeVar

from memforensics.errors import (
    HoldTimeoutError,
    NoSuchProcessError,
    TargetError,
    TargetExitedError,
    TargetPermissionError,
)
from memforensics.sources.proc import attach_diagnosis, ptrace_regs
from memforensics.sources.proc.cpu_quota import stop_pacer

# Requests and options from <sys/ptrace.h> and <linux/ptrace.h>.
_PTRACE_DETACH = 17
_PTRACE_SEIZE = 0x4206
_PTRACE_INTERRUPT = 0x4207
_PTRACE_EVENT_CLONE = 3
_PTRACE_O_TRACECLONE = 1 << _PTRACE_EVENT_CLONE
_PTRACE_EVENT_STOP = 128
# wait flags from <linux/wait.h>: threads are "clone" children, which only __WALL waits
# for; __WNOTHREAD: only the tracer thread's own tracees.
_WALL = 0x40000000
_WNOTHREAD = 0x20000000
_GROUP_STOP_SIGNALS = frozenset({signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU})
# While waiting for stops: a few bare yields first (an interrupted thread needs a CPU for a
# few microseconds to reach its stop, and on a small machine the tracer holds one), then
# naps doubling up to 1 ms.
_YIELD_ROUNDS = 8
_FIRST_NAP_SECONDS = 20e-6
_LONGEST_NAP_SECONDS = 1e-3
# How often a thread that has not stopped is looked up in /proc: a zombie never stops.
_STATE_CHECK_SECONDS = 2e-3
_TRACER_GONE_SECONDS = 2.0

# One ptrace request (a module-level name: the tests' seam for failing or freezing one).
_ptrace = ptrace_regs.request
T = TypeVar("T")
StopKind = Literal["interrupt", "group", "signal", "event"]
"""How a held thread stopped: "interrupt" (PTRACE_INTERRUPT, or a new thread's first stop),
"group" (the process's job-control stop), "signal" (a signal-delivery-stop: the signal is
delivered at release), "event" (a ptrace event such as PTRACE_EVENT_CLONE)."""


@dataclass(slots=True)
class _Tracee:
    """One seized thread, as the tracer knows it."""

    tid: int
    kind: StopKind | None = None  # None until its stop was seen
    signal: int = 0  # a signal-delivery-stop's signal, delivered at detach
    gone: bool = False  # exited: nothing to detach
    released: bool = False  # detached early (let_others_go): nothing more to detach


class _Released(Exception):
    """The caller gave up while the threads were being stopped (Ctrl-C in __enter__)."""


def _thread_status(pid: int, tid: int) -> tuple[str, int] | None:
    """(one-letter state, TracerPid) of a thread, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    except OSError:
        return None
    fields = dict(line.partition(":")[::2] for line in text.splitlines())
    return fields.get("State", "?").strip()[:1], int(fields.get("TracerPid", "0").strip() or 0)


def _list_threads(pid: int) -> list[int]:
    """The thread ids /proc/PID/task lists, in order (the leader first)."""
    return sorted(int(name) for name in os.listdir(f"/proc/{pid}/task"))


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _wait_thread_gone(tid: int) -> None:
    """Until our thread ``tid`` has ended, so the kernel has let go of all it traced."""
    deadline = time.monotonic() + _TRACER_GONE_SECONDS
    while os.path.exists(f"/proc/self/task/{tid}") and time.monotonic() < deadline:
        time.sleep(20e-6)


class ThreadHold:
    """Every thread of ``pid`` held in a ptrace stop for the ``with`` block, then released.

    ``__enter__`` returns once every thread of the process is in a ptrace stop (the threads
    are ``thread_ids``); a zombie leader, whose threads live on, is not among them and never
    runs. ``__exit__`` (from any thread) returns once every seized thread is detached,
    whatever happened: an exception, Ctrl-C, a failure in ``__enter__`` (which detaches
    before it raises). A target stopped before the hold is stopped after it; a running one
    runs, untraced, with every signal that arrived meanwhile delivered.

    ``__enter__`` raises NoSuchProcessError (exit 3; TargetExitedError when the process
    exits during the hold), TargetError for memforensics itself or a zombie, TargetPermission-
    Error (exit 4) when another tracer holds a thread or ptrace is refused, DeadlineError
    (exit 6) when a thread does not stop within ``timeout_seconds`` of the start.

    ``stop_seconds`` is measured from the first PTRACE_INTERRUPT to the return of the last
    PTRACE_DETACH, or of ``let_others_go``'s when it let other threads go before a long call
    (the calling thread is then busy in the call, not stopped), and is known once the hold is
    over (threads run on while all are being seized; one that stops by itself meanwhile, on a
    signal or a new thread, stops a little longer). ``stop_kinds`` says how each held
    thread stopped; ``deferred_signals`` the signals held back in signal-delivery-stops and
    delivered at release. The caller refuses what ``target_check.check_target`` refuses first
    (kernel threads, other allocators); this class only holds.
    """

    def __init__(self, pid: int, *, timeout_seconds: float = 1.0, registers: bool = False) -> None:
        if not timeout_seconds > 0:
            raise ValueError(f"timeout_seconds must be positive, not {timeout_seconds!r}")
        self.pid = pid
        self.timeout_seconds = timeout_seconds
        self._want_registers = registers
        # With ``registers``: each held thread's (rip, orig_rax) at its stop; orig_rax is
        # the system call it was in (-1 as unsigned when none). A thread whose registers
        # could not be read is absent.
        self.program_counters: dict[int, tuple[int, int]] = {}
        self.thread_ids: tuple[int, ...] = ()
        self.stop_kinds: dict[int, StopKind] = {}
        self.deferred_signals: dict[int, int] = {}
        self._stop_seconds: float | None = None
        self._tracees: dict[int, _Tracee] = {}
        self._ignored: set[int] = set()  # listed threads that vanished or are zombies
        self._first_interrupt: float | None = None
        self._others_released: float | None = None  # when let_others_go detached them
        self._release = threading.Event()
        self._work: Callable[[], object] | None = None
        self._work_ready = threading.Event()
        self._work_done = threading.Event()
        self._work_result: tuple[bool, object] = (True, None)
        self._settled = threading.Event()  # held, or failed and let go
        self._failure: BaseException | None = None
        self._tracer: threading.Thread | None = None
        self._tracer_tid = 0

    @property
    def stop_seconds(self) -> float:
        """First PTRACE_INTERRUPT to the return of the last PTRACE_DETACH, in seconds."""
        if self._stop_seconds is None:
            raise RuntimeError("stop_seconds is measured when the hold is released")
        return self._stop_seconds

    def __enter__(self) -> ThreadHold:
        if self._tracer is not None:
            raise RuntimeError("a ThreadHold holds once; make a new one")
        if self.pid == os.getpid():
            raise TargetError(
                f"PID {self.pid} is memforensics itself",
                hint="point memforensics at another process",
                pid=self.pid,
            )
        # Under a CPU quota, wait until it has room for the stop: throttled in a stop, we
        # would hold the target until the quota's next period (up to 100 ms).
        stop_pacer().before_stop()
        self._tracer = threading.Thread(
            target=self._trace, name=f"memforensics-hold-{self.pid}", daemon=True
        )
        self._tracer.start()
        try:
            self._settled.wait()
        except BaseException:
            self._finish()
            raise
        if self._failure is not None:
            self._finish()
            raise self._failure
        stop_pacer().held()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._finish()

    def _finish(self) -> None:
        """Tell the tracer to let go and return once it has ended. Should this wait itself be
        interrupted (a second Ctrl-C), the tracer still lets go on its own."""
        stop_pacer().releasing()
        self._release.set()
        self._work_ready.set()  # wakes a tracer waiting for work
        if self._tracer is not None:
            self._tracer.join()
            # join() returns a moment before the OS thread ends, and with it the kernel's
            # release of anything the tracer did not detach itself.
            _wait_thread_gone(self._tracer_tid)
        stop_pacer().after_stop()

    # Everything below runs in the tracer thread.

    def _trace(self) -> None:
        self._tracer_tid = threading.get_native_id()
        try:
            self._hold_all(time.monotonic() + self.timeout_seconds)
        except BaseException as exc:  # __enter__ raises it in the caller's thread
            self._failure = exc
        else:
            self._settled.set()
            while not self._release.is_set():
                self._serve()
        finally:
            self._let_go()
            self._settled.set()

    def _serve(self) -> None:
        """Run the work in_tracer handed over, if any, else wait a moment for it."""
        if not self._work_ready.wait(1.0):
            return
        self._work_ready.clear()
        work, self._work = self._work, None
        if work is not None:
            try:
                self._work_result = (True, work())
            except BaseException as exc:  # raised again in the caller's thread
                self._work_result = (False, exc)
            self._work_done.set()

    def in_tracer(self, work: Callable[[], T]) -> T:
        """``work()`` run in the tracer thread while every thread is held (ptrace requests
        on them come from there only); its result, or its exception raised here."""
        self._work_done.clear()
        self._work = work
        self._work_ready.set()
        self._work_done.wait()
        ok, value = self._work_result
        if not ok:
            raise value  # type: ignore[misc]
        return value  # type: ignore[return-value]

    def resumed(self, tid: int) -> None:
        """In the tracer: ``tid`` ran (a call) and is in an interrupt stop again, with no
        signal to deliver at release."""
        tracee = self._tracees[tid]
        tracee.kind, tracee.signal = "interrupt", 0

    def let_others_go(self, keep: int) -> None:
        """In the tracer: detach every held thread but ``keep``, each with the signal its stop
        holds (as at release), so that they run while ``keep`` makes a long call; the hold
        then holds ``keep`` alone. A thread of the process never seized (born after the hold)
        is not ours either. No effect when ``keep`` is the only thread held."""
        others = [
            t
            for t in self._tracees.values()
            if t.tid != keep and t.kind is not None and not t.gone and not t.released
        ]
        if not others:
            return
        # Failures pass, as at release: ESRCH is a thread killed while held.
        self._each(_PTRACE_DETACH, [t.tid for t in others], [t.signal for t in others])
        for tracee in others:
            tracee.released = True
        if self._others_released is None:
            self._others_released = time.monotonic()

    def _ptrace(self, request: int, tid: int, data: int = 0) -> None:
        self._in_tracer_thread()
        _ptrace(request, tid, data)

    def _in_tracer_thread(self) -> None:
        # The kernel takes only the tracer thread's requests; a call from anywhere else is a
        # bug here, said plainly rather than as ESRCH.
        if threading.get_native_id() != self._tracer_tid:
            raise RuntimeError("ptrace requests of a ThreadHold come from its tracer thread only")

    def _each(self, request: int, tids: list[int], data: list[int] | int = 0) -> dict[int, int]:
        """``request`` on every one of ``tids`` (ptrace_regs.request_each), from the tracer."""
        self._in_tracer_thread()
        return ptrace_regs.request_each(request, tids, data, one=_ptrace)

    def _hold_all(self, deadline: float) -> None:
        while fresh := self._fresh_threads():
            self._seize(fresh)
            self._check_time(deadline)
        if not self._tracees:
            raise self._nothing_to_hold()
        self._first_interrupt = time.monotonic()
        waiting = list(self._tracees.values())
        while waiting:
            self._interrupt(waiting)
            self._await_stops(waiting, deadline)
            waiting = self._seize(self._fresh_threads())
        held = [t for t in self._tracees.values() if t.kind is not None and not t.gone]
        if not held:
            raise TargetExitedError(
                f"PID {self.pid} exited while its threads were being held", pid=self.pid
            )
        self.thread_ids = tuple(sorted(t.tid for t in held))
        self.stop_kinds = {t.tid: t.kind for t in held if t.kind is not None}
        self.deferred_signals = {t.tid: t.signal for t in held if t.signal}
        if self._want_registers:
            self.program_counters = self._program_counters(held)

    def _program_counters(self, held: list[_Tracee]) -> dict[int, tuple[int, int]]:
        """(rip, orig_rax) of each held thread, read with PTRACE_GETREGS (reading only)."""
        found: dict[int, tuple[int, int]] = {}
        for tracee in held:
            with contextlib.suppress(OSError):
                regs = ptrace_regs.get_regs(tracee.tid)
                found[tracee.tid] = (regs.rip, regs.orig_rax)
        return found

    def _fresh_threads(self) -> list[int]:
        """The threads /proc/PID/task lists now that are neither seized nor known gone."""
        try:
            tids = _list_threads(self.pid)
        except (FileNotFoundError, ProcessLookupError):
            if self._tracees:
                raise TargetExitedError(
                    f"PID {self.pid} exited while its threads were being held", pid=self.pid
                ) from None
            raise NoSuchProcessError(f"no process with PID {self.pid}", pid=self.pid) from None
        return [t for t in tids if t not in self._tracees and t not in self._ignored]

    def _nothing_to_hold(self) -> Exception:
        if os.path.exists(f"/proc/{self.pid}"):
            return TargetError(
                f"PID {self.pid} ({_comm(self.pid)}) is a zombie: it has exited",
                hint="its parent has not reaped it yet; look at the parent (ps -o ppid= -p PID)",
                pid=self.pid,
            )
        return NoSuchProcessError(f"no process with PID {self.pid}", pid=self.pid)

    def _seize(self, tids: list[int]) -> list[_Tracee]:
        """Seize each of ``tids`` (they run on), or adopt one PTRACE_O_TRACECLONE already made
        ours; the threads now held by us, without those that vanished or are zombies. A
        refusal is raised once every thread that could be seized is ours (so the tracer's
        end lets go of them all)."""
        failed = self._each(_PTRACE_SEIZE, tids, _PTRACE_O_TRACECLONE)
        refusal: Exception | None = None
        seized: list[_Tracee] = []
        for tid in tids:
            err = failed.get(tid)
            status = _thread_status(self.pid, tid) if err == errno.EPERM else None
            if err == errno.ESRCH or (err == errno.EPERM and (status is None or status[0] in "ZX")):
                self._ignored.add(tid)  # gone, or dead (the kernel refuses to seize it)
            elif err is None or (status is not None and status[1] == self._tracer_tid):
                seized.append(self._tracees.setdefault(tid, _Tracee(tid)))  # or born traced
            elif refusal is None:
                cause = OSError(err, os.strerror(err))
                refusal = (
                    self._refusal(tid, status[1], cause)
                    if status is not None
                    else TargetError(f"cannot hold PID {self.pid}: {cause.strerror}")
                )
        if refusal is not None:
            raise refusal
        return seized

    def _refusal(self, tid: int, tracer_pid: int, exc: OSError) -> Exception:
        """The error for a thread the kernel would not let us seize."""
        if not tracer_pid:
            return attach_diagnosis.diagnose_attach_failure(
                self.pid, str(exc.strerror), tool="ptrace"
            )
        tracer = f"TracerPid {tracer_pid} ({_comm(tracer_pid)})"
        whose = f"PID {self.pid} ({_comm(self.pid)})"
        if tid != self.pid:
            whose = f"thread {tid} of {whose}"
        return TargetPermissionError(
            f"{whose} is already traced by {tracer}",
            hint="detach the other debugger or tracer (gdb, strace, a profiler) and retry",
            pid=self.pid,
        )

    def _interrupt(self, tracees: list[_Tracee]) -> None:
        failed = self._each(_PTRACE_INTERRUPT, [t.tid for t in tracees])
        # ESRCH: it is exiting; its wait status will say so.
        for err in failed.values():
            if err != errno.ESRCH:
                raise TargetError(f"cannot hold PID {self.pid}: {os.strerror(err)}")

    def _await_stops(self, tracees: list[_Tracee], deadline: float) -> None:
        """See a stop (or an exit) of each of ``tracees``, within the deadline."""
        pending = {t.tid: t for t in tracees if t.kind is None and not t.gone}
        rounds = 0
        next_state_check = time.monotonic() + _STATE_CHECK_SECONDS
        while pending:
            for tid in [tid for tid, tracee in pending.items() if self._collect(tracee)]:
                del pending[tid]
            if not pending:
                return
            if self._release.is_set():
                raise _Released
            now = time.monotonic()
            if now >= next_state_check:
                for tid in list(pending):
                    status = _thread_status(self.pid, tid)
                    if status is None or status[0] in ("Z", "X"):
                        # Dead, kept as a zombie for us (a leader whose threads live on is
                        # never reported until they end): no stop will come.
                        pending.pop(tid).gone = True
                next_state_check = now + _STATE_CHECK_SECONDS
            if now >= deadline and pending:
                raise self._late(sorted(pending))
            rounds += 1
            if rounds <= _YIELD_ROUNDS:
                os.sched_yield()
            else:
                nap = _FIRST_NAP_SECONDS * 2 ** min(rounds - _YIELD_ROUNDS, 10)
                time.sleep(min(nap, _LONGEST_NAP_SECONDS))

    def _collect(self, tracee: _Tracee) -> bool:
        """Whether a stop or an exit of ``tracee`` was seen (its kind is then known).

        A stop is only looked at (WNOWAIT), never consumed: consuming it clears the
        tracee's exit_code, which is where a signal-delivery-stop keeps its signal, and a
        tracer that then dies (SIGKILL before PTRACE_DETACH) would have the kernel resume
        the thread with no signal: lost. Left there, the kernel delivers it.
        """
        try:
            info = os.waitid(
                os.P_PID,
                tracee.tid,
                os.WEXITED | os.WSTOPPED | os.WNOHANG | os.WNOWAIT | _WALL | _WNOTHREAD,
            )
        except ChildProcessError:
            tracee.gone = True
            return True
        if info is None:
            return False
        if info.si_code not in (os.CLD_TRAPPED, os.CLD_STOPPED):
            # It exited. Reaped now: a traced zombie thread waits for its tracer, and its
            # process's own exit waits for it.
            tracee.gone = True
            with contextlib.suppress(ChildProcessError):
                os.waitpid(tracee.tid, os.WNOHANG | _WALL | _WNOTHREAD)
            return True
        # waitid's si_status is the whole stop code: the signal, and a ptrace event above it.
        stop_signal, event = info.si_status & 0xFF, info.si_status >> 8
        if event == _PTRACE_EVENT_STOP:
            # ptrace(2), PTRACE_SEIZE: a group-stop is PTRACE_EVENT_STOP with the stopping
            # signal; the interrupt's (and a new thread's first) stop has SIGTRAP.
            tracee.kind = "group" if stop_signal in _GROUP_STOP_SIGNALS else "interrupt"
        elif event:
            tracee.kind = "event"
        else:
            tracee.kind = "signal"
            tracee.signal = stop_signal
        return True

    def _late(self, tids: list[int]) -> HoldTimeoutError:
        states = []
        for tid in tids[:4]:
            status = _thread_status(self.pid, tid)
            states.append(f"{tid} ({'gone' if status is None else 'state ' + status[0]})")
        more = f" and {len(tids) - 4} more" if len(tids) > 4 else ""
        return HoldTimeoutError(
            f"PID {self.pid} ({_comm(self.pid)}): {len(tids)} of {len(self._tracees)} "
            f"threads did not stop within {self.timeout_seconds:g} s: "
            f"{', '.join(states)}{more}",
            pid=self.pid,
        )

    def _check_time(self, deadline: float) -> None:
        if self._release.is_set():
            raise _Released
        if time.monotonic() >= deadline:
            raise HoldTimeoutError(
                f"PID {self.pid} ({_comm(self.pid)}): its threads could not all be seized "
                f"within {self.timeout_seconds:g} s ({len(self._tracees)} were)",
                pid=self.pid,
            )

    def _let_go(self) -> None:
        """Detach each thread whose stop was seen; the tracer's end releases the rest."""
        for tracee in self._tracees.values():
            if tracee.kind is None and not tracee.gone:
                # The hold failed midway: a stop that came but was not seen carries the
                # signal PTRACE_DETACH must deliver. A thread with no stop yet is not
                # detached: it may be entering a signal-delivery-stop right now.
                with contextlib.suppress(OSError):
                    self._collect(tracee)
        stopped = [
            t
            for t in self._tracees.values()
            if t.kind is not None and not t.gone and not t.released
        ]
        # Failures pass: ESRCH is a thread killed while held (SIGKILL ends a ptrace stop),
        # which the tracer's end reaps for its parent.
        self._each(_PTRACE_DETACH, [t.tid for t in stopped], [t.signal for t in stopped])
        if self._first_interrupt is not None:
            end = self._others_released or time.monotonic()
            self._stop_seconds = end - self._first_interrupt
        else:
            self._stop_seconds = 0.0
