"""Threads under gdb: finding the safe point (a thread outside the allocator) and holding it.

Two ways, chosen by the session. A running target is attached in **non-stop** mode: its
threads keep running except the one we interrupt to look at, and the one that makes the calls;
nothing that grows with the thread count stops the whole process (with 1,500 threads, every
all-stop call cost ~280 ms of stopping and resuming all of them). A target someone else stopped
is attached in **all-stop** mode, so that it stays stopped as it was.

Either way the calling thread is one whose frames are all outside glibc's allocator. In
non-stop mode, a target whose threads are all inside it is let run and looked at again (never
a breakpoint: see _non_stop_safe_point); in all-stop mode it runs forward to an allocator entry
breakpoint, accepted with no allocator frame below it. Otherwise nothing is called and the
search gives up at the deadline (DeadlineError).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from typing import Any, NoReturn

from memforensics.errors import DeadlineError, MemforensicsError, TargetError, TargetExitedError
from memforensics.sources.gdb.call_context import (
    entry_point,
    guardian_line,
    register_numbers,
    saved_registers,
)
from memforensics.sources.gdb.gdbmi import MiError, MiGdbExited, MiResult, MiTimeout, MiTransport
from memforensics.sources.gdb.safepoint import (
    Frame,
    ThreadInfo,
    describe_frames,
    describe_thread,
    frames_command,
    in_allocator,
    parse_frames,
    parse_threads,
)
from memforensics.sources.gdb.watchdog_link import Watchdog
from memforensics.sources.glibc.libc_elf import ENTRY_FUNCTIONS, LibcImage
from memforensics.sources.proc import procfs
from memforensics.sources.proc.procfs import pid_alive
from memforensics.sources.proc.procmem import TargetMemory

# A non-stop interrupt that has not stopped its thread after this long is sent again.
_INTERRUPT_AGAIN_SECONDS = 0.5
# Non-stop run-forward: how long the threads run between two looks.
_RESAMPLE_SECONDS = 0.002
# How long cleanup may wait for gdb to stop a running target or delete breakpoints.
CLEANUP_SECONDS = 3.0


def _is_stopped(record: dict[str, Any]) -> bool:
    return record.get("message") == "stopped"


class ThreadControl:
    """The safe-point half of GdbSession (which provides the transport and the commands)."""

    pid: int
    timeout_seconds: float
    safe_point: str
    non_stop: bool
    _attach_started: float | None
    _running: bool
    _breakpoints: list[str]
    _target_exited: bool
    _caller: str | None  # gdb's id of the thread that makes the calls
    _watchdog: Watchdog | None
    _memory: TargetMemory | None
    _was_running: bool
    _command: Callable[..., MiResult]
    _mi_or_fail: Callable[[], MiTransport]
    _libc_or_fail: Callable[[], LibcImage]
    _detached_at: float | None
    _attached: bool

    @property
    def pause_seconds(self) -> float:
        """How long the target was stopped (attach to detach; until now while attached)."""
        if self._attach_started is None:
            return 0.0
        end = self._detached_at if self._detached_at is not None else time.monotonic()
        return end - self._attach_started

    @property
    def attached(self) -> bool:
        """True while gdb holds the target."""
        return self._attached

    def _reach_safe_point(self) -> None:
        """Select a thread outside the allocator, running the target forward if needed."""
        if self.non_stop:
            self._non_stop_safe_point()
        else:
            self._all_stop_safe_point()
        self._tell_watchdog_the_caller()

    def _tell_watchdog_the_call_dummy(self) -> None:
        """Where gdb's calls return to, and the byte its breakpoint there replaces."""
        address = entry_point(self.pid)
        if address is None or self._watchdog is None or self._memory is None:
            return
        with contextlib.suppress(TargetError):
            original = self._memory.read(address, 1)
            self._watchdog.tell(f"entry {address:x} {original.hex()}")

    def _tell_call(self, running: bool) -> None:
        if self._watchdog is not None:
            self._watchdog.tell("call" if running else "ret")

    def _tell_watchdog_the_caller(self) -> None:
        """The caller's registers as gdb will restore them, for the watchdog's guardian."""
        if self._watchdog is None or self._caller is None:
            return
        lwp = self._thread_info(self._caller).lwp
        if lwp is None:
            return
        numbers = register_numbers(self._command("-data-list-register-names").payload)
        values = self._command(
            f"-data-list-register-values --thread {self._caller} r "
            + " ".join(str(n) for n in sorted(numbers))
        ).payload
        self._watchdog.tell(guardian_line(lwp, saved_registers(values, numbers)))

    # -- non-stop --------------------------------------------------------------------------

    def _non_stop_safe_point(self) -> None:
        """Look at one thread at a time; if all are in the allocator, let them run a moment and
        look again. No breakpoint is written into the target's code: should gdb die at any
        moment here, nothing is left behind that could trap a thread (an int3 at malloc's
        entry kills the process at its next malloc once no debugger is there)."""
        libc = self._libc_or_fail()
        deadline = (self._attach_started or time.monotonic()) + self.timeout_seconds
        first_look = True
        busy = "no thread could be stopped in time"
        while True:
            looked: list[tuple[str, list[Frame]]] = []
            for thread_id in self._thread_ids():
                if time.monotonic() > deadline:
                    break
                if not self._hold(thread_id, deadline):
                    continue  # it exited meanwhile
                frames = self._frames(thread_id)
                if not in_allocator(libc, frames):
                    self._choose(thread_id)
                    waited = ""
                    if not first_look:
                        held_ms = (time.monotonic() - (self._attach_started or 0)) * 1000
                        waited = f" after running forward {held_ms:.0f} ms"
                    self.safe_point = (
                        f"{describe_thread(self._thread_info(thread_id))} outside the "
                        f"allocator, {describe_frames(libc, frames)}{waited}"
                    )
                    return
                looked.append((thread_id, frames))
                self._release(thread_id)
            if not looked and not pid_alive(self.pid):
                self._target_exited = True
                raise TargetExitedError(
                    f"PID {self.pid} exited while being inspected", pid=self.pid
                )
            if looked:
                busy = ", ".join(f"thread {t} {describe_frames(libc, f)}" for t, f in looked)
            if time.monotonic() + _RESAMPLE_SECONDS > deadline:
                self._give_up(busy)
            first_look = False
            time.sleep(_RESAMPLE_SECONDS)  # let them run out of malloc/free, then look again

    def release_bystanders(self) -> None:
        """Resume threads that stopped at a breakpoint while another became the caller."""
        mi = self._mi_or_fail()
        while True:
            try:
                stopped = mi.wait_async(_is_stopped, timeout_seconds=0.0)
            except (MiTimeout, MiError):
                return
            thread_id = str((stopped.get("payload") or {}).get("thread-id", ""))
            if thread_id and thread_id != self._caller:
                self._release(thread_id)

    def _thread_ids(self) -> list[str]:
        """gdb's thread ids, the main thread first (no frames: cheap with thousands)."""
        payload = self._command("-thread-list-ids").payload
        ids = (payload.get("thread-ids") or {}).get("thread-id") or []
        ids = [ids] if isinstance(ids, str) else ids
        return sorted((str(i) for i in ids), key=lambda i: int(i) if i.isdigit() else 0)

    def _thread_info(self, thread_id: str) -> ThreadInfo:
        threads = parse_threads(self._command(f"-thread-info {thread_id}").payload)
        return threads[0] if threads else ThreadInfo(thread_id, None, "", None)

    def _hold(self, thread_id: str, deadline: float) -> bool:
        """Interrupt one thread and wait until gdb reports it stopped; False if it is gone."""
        try:
            self._command(f"-exec-interrupt --thread {thread_id}")
        except (DeadlineError, TargetExitedError):
            raise
        except MemforensicsError:  # the thread exited between the list and now
            return False
        mi = self._mi_or_fail()

        def this_thread(record: dict[str, Any]) -> bool:
            payload = record.get("payload") or {}
            if record.get("message") == "thread-exited":  # it will never report a stop
                return str(payload.get("id")) == thread_id
            return _is_stopped(record) and str(payload.get("thread-id")) == thread_id

        while True:
            left = deadline - time.monotonic()
            try:
                record = mi.wait_async(
                    this_thread, timeout_seconds=max(min(left, _INTERRUPT_AGAIN_SECONDS), 0.1)
                )
                break
            except MiTimeout:
                if left <= _INTERRUPT_AGAIN_SECONDS:
                    self._give_up(f"thread {thread_id} did not stop when interrupted")
            # gdb can lose a non-stop interrupt of a thread that a stream of signals keeps
            # stopping and resuming (a 2 ms SIGALRM): ask again. A thread that stopped
            # meanwhile makes gdb refuse this one; its stop is still on its way.
            with contextlib.suppress(MemforensicsError):
                self._command(f"-exec-interrupt --thread {thread_id}")
        return record.get("message") != "thread-exited"

    def _release(self, thread_id: str) -> None:
        self._command(f"-exec-continue --thread {thread_id}")

    def _choose(self, thread_id: str) -> None:
        self._caller = thread_id
        self._command(f"-thread-select {thread_id}")

    def _insert_entry_breakpoints(self, entry: dict[int, str]) -> None:
        for address in entry:
            result = self._command(f"-break-insert *{address:#x}")
            self._breakpoints.append(str(result.payload.get("bkpt", {}).get("number", "")))

    def _unwind_call(self, token: int) -> None:
        """Interrupt the call sent as ``token`` and wait for gdb's answer to it (MiTimeout or
        MiGdbExited without one: the call may still run, and the watchdog may have to
        rescue it). Once gdb answered, the call is over, and the watchdog hears so: told
        nothing, it would still see a call running when gdb exits after the detach."""
        self._interrupt_call()
        # An MiError is how gdb answers an interrupted call: it unwound the call.
        with contextlib.suppress(MiError):
            self._mi_or_fail().wait_result(token, timeout_seconds=CLEANUP_SECONDS)
        self._tell_call(False)

    def _interrupt_call(self) -> None:
        """Make gdb abandon a call that overran; unwindonsignal restores the caller."""
        mi = self._mi_or_fail()
        if self.non_stop and self._caller:
            with contextlib.suppress(MiGdbExited, OSError):
                mi.send(f"-exec-interrupt --thread {self._caller}")
        else:
            mi.interrupt()

    def _restore_target_state(self) -> None:
        """A target that was running must not stay in T (stopped) after we let go of it."""
        if not self._was_running or self._attach_started is None:
            return
        for _ in range(5):
            try:
                state = procfs.process_state(self.pid)
            except MemforensicsError:
                return
            if state != "T":
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)
            time.sleep(0.01)

    # -- all-stop ------------------------------------------------------------------------

    def _all_stop_safe_point(self) -> None:
        """All-stop: select a thread outside the allocator, running forward if needed."""
        libc = self._libc_or_fail()
        deadline = (self._attach_started or time.monotonic()) + self.timeout_seconds
        stacks: list[tuple[ThreadInfo, list[Frame]]] = []
        threads = self._threads()
        for thread in threads:
            if thread.pc is not None and libc.in_allocator(thread.pc):
                stacks.append((thread, [Frame(thread.pc, "")]))  # inside already: no unwind
                continue
            frames = self._frames(thread.gdb_id)
            stacks.append((thread, frames))
            if not in_allocator(libc, frames):
                self._select(thread.gdb_id)
                self.safe_point = (
                    f"{describe_thread(thread)} outside the allocator, "
                    f"{describe_frames(libc, frames)}"
                )
                return
        busy = ", ".join(
            f"{describe_thread(thread)} {describe_frames(libc, frames)}"
            for thread, frames in stacks
        )
        by_id = {thread.gdb_id: thread for thread in threads}
        entry = {libc.functions[name]: name for name in ENTRY_FUNCTIONS}
        self._insert_entry_breakpoints(entry)
        try:
            while True:
                stopped = self._run_until_stop(deadline, busy)
                reason = str(stopped.get("reason", ""))
                if reason.startswith("exited"):
                    self._target_exited = True
                    raise TargetExitedError(
                        f"PID {self.pid} exited while being inspected", pid=self.pid
                    )
                thread_id = str(stopped.get("thread-id", ""))
                frame = stopped.get("frame") or {}
                pc = int(str(frame.get("addr", "0")), 16)
                if reason != "breakpoint-hit" or pc not in entry or not thread_id:
                    continue  # a signal or another event: keep running forward
                frames = self._frames(thread_id)
                if len(frames) < 2 or in_allocator(libc, frames[1:]):
                    continue  # the allocator calling itself (e.g. realloc -> malloc)
                self._delete_breakpoints()
                self._select(thread_id)
                who = by_id.get(thread_id, ThreadInfo(thread_id, None, "", pc))
                self.safe_point = (
                    f"{describe_thread(who)} at the entry of {entry[pc]}() after running forward "
                    f"{(time.monotonic() - (self._attach_started or 0)) * 1000:.0f} ms"
                )
                return
        finally:
            if self._breakpoints and not self._running:
                self._delete_breakpoints()

    def _run_until_stop(self, deadline: float, busy: str) -> dict[str, Any]:
        mi = self._mi_or_fail()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self._give_up(busy)
        mi.drain_async()
        self._command("-exec-continue")
        self._running = True
        try:
            record = mi.wait_async(
                lambda r: r.get("message") == "stopped", timeout_seconds=remaining
            )
        except MiTimeout:
            self._stop_running()
            self._give_up(busy)
        self._running = False
        payload: dict[str, Any] = record.get("payload") or {}
        return payload

    def _give_up(self, busy: str) -> NoReturn:
        if not pid_alive(self.pid):  # it exited while we waited: that is what happened
            self._target_exited = True
            raise TargetExitedError(f"PID {self.pid} exited while being inspected", pid=self.pid)
        raise DeadlineError(
            f"no safe point in PID {self.pid} within {self.timeout_seconds:g} s: every thread "
            f"stayed inside the allocator ({busy}); nothing was called",
        )

    def _stop_running(self) -> None:
        """Stop a target that runs forward (all-stop), so that it can be detached."""
        mi = self._mi_or_fail()
        if not self._running:
            return
        try:
            self._command("-exec-interrupt", timeout_seconds=CLEANUP_SECONDS)
            mi.wait_async(lambda r: r.get("message") == "stopped", timeout_seconds=CLEANUP_SECONDS)
            self._running = False
        except (MiError, MiTimeout):
            mi.interrupt()
            mi.wait_async(lambda r: r.get("message") == "stopped", timeout_seconds=CLEANUP_SECONDS)
            self._running = False

    def _select(self, thread: str) -> None:
        """Make ``thread`` the caller; the others keep running while it calls (see docs)."""
        self._caller = thread
        self._command(f"-thread-select {thread}")
        # scheduler-locking off: other threads run during each call. One of them may hold an
        # arena mutex (or stdio's list lock) that malloc_info/open_memstream needs; stopped,
        # it would deadlock the call, running it releases it as in any multi-threaded program.
        # It also keeps the pause the process feels down to the attach and the detach.
        self._command("-gdb-set scheduler-locking off")

    def _threads(self) -> list[ThreadInfo]:
        """Every thread, the main thread first."""
        return parse_threads(self._command("-thread-info").payload)

    def _frames(self, thread: str) -> list[Frame]:
        return parse_frames(self._command(frames_command(thread)).payload)

    def _delete_breakpoints(self) -> None:
        if self._breakpoints:
            numbers = " ".join(n for n in self._breakpoints if n)
            self._breakpoints = []
            if numbers:
                self._command(f"-break-delete {numbers}", timeout_seconds=CLEANUP_SECONDS)
