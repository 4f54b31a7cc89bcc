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
import time
from typing import Any, NoReturn, Protocol

from memforensics.errors import (
    DeadlineError,
    MemforensicsError,
    TargetExitedError,
    ThreadVanishedError,
)
from memforensics.sources.gdb.call_context import guardian_line, register_numbers, saved_registers
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
from memforensics.sources.glibc.libc_elf import ENTRY_FUNCTIONS, LibcImage
from memforensics.sources.proc.procfs import pid_alive

# A non-stop interrupt that has not stopped its thread after this long is sent again.
_INTERRUPT_AGAIN_SECONDS = 0.5
# Non-stop run-forward: how long the threads run between two looks.
_RESAMPLE_SECONDS = 0.002
# How long cleanup may wait for gdb to stop a running target or delete breakpoints.
CLEANUP_SECONDS = 3.0


def _is_stopped(record: dict[str, Any]) -> bool:
    return record.get("message") == "stopped"


class SessionPort(Protocol):
    """What ThreadControl needs from its gdb session, and all it may use of it.

    ``command`` sends one MI command and waits for its answer under the session's deadline
    (or ``timeout_seconds``), gdb's failures turned into the project's errors; it is never a
    call into the target (the watchdog is not told of it). ``mi`` is the transport, for what
    ``command`` cannot do: wait for asynchronous records (stops, thread exits), send without
    waiting, interrupt gdb. ``libc`` is the target's libc image (where its allocator is). Both
    raise ToolingError when the session has none yet. ``non_stop`` is the mode the session
    attached in; it is fixed before the attach and does not change afterwards.
    """

    @property
    def non_stop(self) -> bool: ...

    def command(self, text: str, *, timeout_seconds: float | None = None) -> MiResult: ...

    def mi(self) -> MiTransport: ...

    def libc(self) -> LibcImage: ...


class ThreadControl:
    """The threads of one attached target: the safe point, the caller, and holding them.

    Held by one GdbSession, which attaches, makes the calls and detaches; this component
    chooses the calling thread and keeps the target in a state where it may call. It owns:

    - ``safe_point``: how the caller was chosen ("not reached" until then);
    - ``caller``: gdb's id of the thread that makes the calls, None until the safe point;
    - ``running``: True only while an all-stop run forward is under way (from its
      ``-exec-continue`` until gdb reports the stop); no call may be made meanwhile;
    - the allocator entry breakpoints, present only during an all-stop run forward (removed
      when it ends, or by ``delete_breakpoints`` at the detach if it could not be stopped);
      they are the only thing it has gdb write into the target;
    - ``target_exited``: True once this component saw the target exit (it then raised
      TargetExitedError). Never reset.

    It calls nothing in the target. Every MI command it sends goes through ``port``, so the
    session's deadline and error translation apply.
    """

    def __init__(self, port: SessionPort, *, pid: int, timeout_seconds: float) -> None:
        self._port = port
        self._pid = pid
        self._timeout_seconds = timeout_seconds
        self._safe_point = "not reached"
        self._caller: str | None = None
        self._running = False
        self._breakpoints: list[str] = []
        self._target_exited = False

    @property
    def safe_point(self) -> str:
        """How the calling thread was chosen, for the report; "not reached" before."""
        return self._safe_point

    @property
    def caller(self) -> str | None:
        """gdb's id of the thread that makes the calls; None before the safe point."""
        return self._caller

    @property
    def running(self) -> bool:
        """The target was resumed by -exec-continue and gdb has not reported it stopped."""
        return self._running

    @property
    def target_exited(self) -> bool:
        """This component saw the target exit (and raised TargetExitedError)."""
        return self._target_exited

    def reach_safe_point(self, attach_started: float | None) -> None:
        """Select a thread outside the allocator, running the target forward if needed.

        The search ends ``timeout_seconds`` after ``attach_started`` (the monotonic time the
        attach began; None: from now) with DeadlineError, or TargetExitedError.
        """
        if self._port.non_stop:
            self._non_stop_safe_point(attach_started)
        else:
            self._all_stop_safe_point(attach_started)

    def caller_guardian_line(self) -> str | None:
        """The caller's registers as gdb will restore them, as the watchdog's guardian reads
        them; None before the safe point or when gdb knows no LWP for the caller."""
        if self._caller is None:
            return None
        lwp = self._thread_info(self._caller).lwp
        if lwp is None:
            return None
        numbers = register_numbers(self._port.command("-data-list-register-names").payload)
        values = self._port.command(
            f"-data-list-register-values --thread {self._caller} r "
            + " ".join(str(n) for n in sorted(numbers))
        ).payload
        return guardian_line(lwp, saved_registers(values, numbers))

    # -- non-stop --------------------------------------------------------------------------

    def _non_stop_safe_point(self, attach_started: float | None) -> None:
        """Look at one thread at a time; if all are in the allocator, let them run a moment and
        look again. No breakpoint is written into the target's code: should gdb die at any
        moment here, nothing is left behind that could trap a thread (an int3 at malloc's
        entry kills the process at its next malloc once no debugger is there)."""
        libc = self._port.libc()
        deadline = (attach_started or time.monotonic()) + self._timeout_seconds
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
                        held_ms = (time.monotonic() - (attach_started or 0)) * 1000
                        waited = f" after running forward {held_ms:.0f} ms"
                    self._safe_point = (
                        f"{describe_thread(self._thread_info(thread_id))} outside the "
                        f"allocator, {describe_frames(libc, frames)}{waited}"
                    )
                    return
                looked.append((thread_id, frames))
                self._release(thread_id)
            if not looked and not pid_alive(self._pid):
                self._target_exited = True
                raise TargetExitedError(
                    f"PID {self._pid} exited while being inspected", pid=self._pid
                )
            if looked:
                busy = ", ".join(f"thread {t} {describe_frames(libc, f)}" for t, f in looked)
            if time.monotonic() + _RESAMPLE_SECONDS > deadline:
                self._give_up(busy)
            first_look = False
            time.sleep(_RESAMPLE_SECONDS)  # let them run out of malloc/free, then look again

    def hold_caller_again(self) -> None:
        """Stop the caller again after something resumed it (non-stop), within a fresh
        ``timeout_seconds``; ThreadVanishedError if it is gone, DeadlineError if it is now
        inside the allocator (no call may be made then)."""
        caller = self._caller
        deadline = time.monotonic() + self._timeout_seconds
        if caller is None or not self._hold(caller, deadline):
            raise ThreadVanishedError(
                f"the calling thread of PID {self._pid} is gone", pid=self._pid
            )
        libc = self._port.libc()
        if in_allocator(libc, self._frames(caller)):
            raise DeadlineError(
                f"the calling thread of PID {self._pid} was resumed and ran into the allocator;"
                " no more calls",
                pid=self._pid,
            )
        self._safe_point += " (held again after gdb found it running)"

    def release_bystanders(self) -> None:
        """Resume threads that stopped at a breakpoint while another became the caller."""
        mi = self._port.mi()
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
        payload = self._port.command("-thread-list-ids").payload
        ids = (payload.get("thread-ids") or {}).get("thread-id") or []
        ids = [ids] if isinstance(ids, str) else ids
        return sorted((str(i) for i in ids), key=lambda i: int(i) if i.isdigit() else 0)

    def _thread_info(self, thread_id: str) -> ThreadInfo:
        threads = parse_threads(self._port.command(f"-thread-info {thread_id}").payload)
        return threads[0] if threads else ThreadInfo(thread_id, None, "", None)

    def _hold(self, thread_id: str, deadline: float) -> bool:
        """Interrupt one thread and wait until gdb reports it stopped; False if it is gone."""
        try:
            self._port.command(f"-exec-interrupt --thread {thread_id}")
        except (DeadlineError, TargetExitedError):
            raise
        except MemforensicsError:  # the thread exited between the list and now
            return False
        mi = self._port.mi()

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
                # Its stop may have come with no record reaching us (one read while another
                # thread's was awaited is dropped): gdb's own word on the thread decides.
                state = self._thread_state(thread_id)
                if state == "stopped":
                    return True
                if state is None:
                    return False  # gone: it exited meanwhile
                if left <= _INTERRUPT_AGAIN_SECONDS:
                    self._give_up(f"thread {thread_id} did not stop when interrupted")
            # gdb can lose a non-stop interrupt of a thread that a stream of signals keeps
            # stopping and resuming (a 2 ms SIGALRM): ask again. A thread that stopped
            # meanwhile makes gdb refuse this one; its stop is still on its way.
            with contextlib.suppress(MemforensicsError):
                self._port.command(f"-exec-interrupt --thread {thread_id}")
        return record.get("message") != "thread-exited"

    def _thread_state(self, thread_id: str) -> str | None:
        """gdb's state of the thread ("stopped", "running"), None when gdb no longer lists it."""
        try:
            payload = self._port.command(f"-thread-info {thread_id}").payload
        except (DeadlineError, TargetExitedError):
            raise
        except MemforensicsError:  # gdb no longer knows the thread
            return None
        threads = payload.get("threads") or []
        return str(threads[0].get("state", "")) if threads else None

    def _release(self, thread_id: str) -> None:
        self._port.command(f"-exec-continue --thread {thread_id}")

    def _choose(self, thread_id: str) -> None:
        self._caller = thread_id
        self._port.command(f"-thread-select {thread_id}")

    def _insert_entry_breakpoints(self, entry: dict[int, str]) -> None:
        for address in entry:
            result = self._port.command(f"-break-insert *{address:#x}")
            self._breakpoints.append(str(result.payload.get("bkpt", {}).get("number", "")))

    def interrupt_call(self) -> None:
        """Make gdb abandon a call that overran; unwindonsignal restores the caller.

        Only the interrupt is sent: the caller of this waits for gdb's answer to the call.
        """
        mi = self._port.mi()
        if self._port.non_stop and self._caller:
            with contextlib.suppress(MiGdbExited, OSError):
                mi.send(f"-exec-interrupt --thread {self._caller}")
        else:
            mi.interrupt()

    # -- all-stop ------------------------------------------------------------------------

    def _all_stop_safe_point(self, attach_started: float | None) -> None:
        """All-stop: select a thread outside the allocator, running forward if needed."""
        libc = self._port.libc()
        deadline = (attach_started or time.monotonic()) + self._timeout_seconds
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
                self._safe_point = (
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
                        f"PID {self._pid} exited while being inspected", pid=self._pid
                    )
                thread_id = str(stopped.get("thread-id", ""))
                frame = stopped.get("frame") or {}
                pc = int(str(frame.get("addr", "0")), 16)
                if reason != "breakpoint-hit" or pc not in entry or not thread_id:
                    continue  # a signal or another event: keep running forward
                frames = self._frames(thread_id)
                if len(frames) < 2 or in_allocator(libc, frames[1:]):
                    continue  # the allocator calling itself (e.g. realloc -> malloc)
                self.delete_breakpoints()
                self._select(thread_id)
                who = by_id.get(thread_id, ThreadInfo(thread_id, None, "", pc))
                self._safe_point = (
                    f"{describe_thread(who)} at the entry of {entry[pc]}() after running forward "
                    f"{(time.monotonic() - (attach_started or 0)) * 1000:.0f} ms"
                )
                return
        finally:
            if self._breakpoints and not self._running:
                self.delete_breakpoints()

    def _run_until_stop(self, deadline: float, busy: str) -> dict[str, Any]:
        mi = self._port.mi()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self._give_up(busy)
        mi.drain_async()
        self._port.command("-exec-continue")
        self._running = True
        try:
            record = mi.wait_async(
                lambda r: r.get("message") == "stopped", timeout_seconds=remaining
            )
        except MiTimeout:
            self.stop_running()
            self._give_up(busy)
        self._running = False
        payload: dict[str, Any] = record.get("payload") or {}
        return payload

    def _give_up(self, busy: str) -> NoReturn:
        if not pid_alive(self._pid):  # it exited while we waited: that is what happened
            self._target_exited = True
            raise TargetExitedError(f"PID {self._pid} exited while being inspected", pid=self._pid)
        raise DeadlineError(
            f"no safe point in PID {self._pid} within {self._timeout_seconds:g} s: every thread "
            f"stayed inside the allocator ({busy}); nothing was called",
        )

    def stop_running(self) -> None:
        """Stop a target that runs forward (all-stop), so that it can be detached."""
        mi = self._port.mi()
        if not self._running:
            return
        try:
            self._port.command("-exec-interrupt", timeout_seconds=CLEANUP_SECONDS)
            mi.wait_async(lambda r: r.get("message") == "stopped", timeout_seconds=CLEANUP_SECONDS)
            self._running = False
        except (MiError, MiTimeout):
            mi.interrupt()
            mi.wait_async(lambda r: r.get("message") == "stopped", timeout_seconds=CLEANUP_SECONDS)
            self._running = False

    def _select(self, thread: str) -> None:
        """Make ``thread`` the caller; the others keep running while it calls (see docs)."""
        self._caller = thread
        self._port.command(f"-thread-select {thread}")
        # scheduler-locking off: other threads run during each call. One of them may hold an
        # arena mutex (or stdio's list lock) that malloc_info/open_memstream needs; stopped,
        # it would deadlock the call, running it releases it as in any multi-threaded program.
        # It also keeps the pause the process feels down to the attach and the detach.
        self._port.command("-gdb-set scheduler-locking off")

    def _threads(self) -> list[ThreadInfo]:
        """Every thread, the main thread first."""
        return parse_threads(self._port.command("-thread-info").payload)

    def _frames(self, thread: str) -> list[Frame]:
        return parse_frames(self._port.command(frames_command(thread)).payload)

    def delete_breakpoints(self) -> None:
        """Remove the allocator entry breakpoints, if any (never while the target runs forward)."""
        if self._breakpoints:
            numbers = " ".join(n for n in self._breakpoints if n)
            self._breakpoints = []
            if numbers:
                self._port.command(f"-break-delete {numbers}", timeout_seconds=CLEANUP_SECONDS)
