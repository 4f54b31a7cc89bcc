"""A gdb/MI session on a live process: attach, reach a safe point, call into libc, always detach.

The rules this module enforces are those of docs/architecture.md, "Touching a live process";
docs/inspect.md explains the reasoning. In short: the thread that makes a call must not be inside
glibc's allocator (otherwise malloc is re-entered: heap corruption on a single-threaded target, a
deadlock on a multi-threaded one); if no thread is outside it, the target runs forward to an
allocator entry point (no lock held yet) within the deadline; every call is cast, bounded in time
and its result checked before use; the target is detached whatever happens and never left stopped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import struct
import time
from collections.abc import Callable
from types import TracebackType

from memforensics.errors import (
    DeadlineError,
    MemforensicsError,
    NoSuchProcessError,
    NotGlibcMallocError,
    TargetError,
    ToolingError,
)
from memforensics.sources.gdb.call_context import entry_point
from memforensics.sources.gdb.gdb_probe import check_call_restores
from memforensics.sources.gdb.gdb_setup import (
    gdb_error,
    gdb_failures,
    gdb_settings,
    mi_quote,
    private_sysroot,
    signal_handling_file,
)
from memforensics.sources.gdb.gdb_spawn import GdbProcess, find_gdb, start_gdb
from memforensics.sources.gdb.gdb_threads import CLEANUP_SECONDS, ThreadControl
from memforensics.sources.gdb.gdbmi import MiError, MiGdbExited, MiResult, MiTimeout, MiTransport
from memforensics.sources.gdb.signals import TerminationHandlers, deferred_signals
from memforensics.sources.gdb.watchdog_link import Watchdog
from memforensics.sources.glibc.call_moment import arena_mutexes
from memforensics.sources.glibc.libc_elf import LibcImage, load_libc_image
from memforensics.sources.proc import procfs, target_check
from memforensics.sources.proc.procmem import TargetMemory

# gdb's answer when a call is asked of a thread that is not stopped (it starts nothing then).
_RUNNING_CALLER = "Selected thread is running"
# malloc_info of a process with thousands of arenas stays far below this; more is not XML we want.
MAX_XML_BYTES = 64 * 1024 * 1024
# While the XML is read from /proc/PID/mem, the calling thread sleeps this long in the target
# (base + size / speed): long enough that the read ends before the threads are stopped again.
_READ_SLEEP_BASE_US = 2000
_READ_BYTES_PER_US = 200  # 200 MB/s, a fifth of what /proc/PID/mem reads here
# Looks again at the arenas' mutexes at the safe point, at first after this long, doubling.
_LOCK_LOOK_FIRST_SECONDS = 0.001
_LOCK_LOOK_MAX_SECONDS = 0.05


# --- the session ----------------------------------------------------------------------------


class _ThreadsPort:
    """A GdbSession as its ThreadControl sees it (gdb_threads.SessionPort): nothing more."""

    def __init__(self, session: GdbSession) -> None:
        self._session = session

    @property
    def non_stop(self) -> bool:
        return self._session.non_stop

    def command(self, text: str, *, timeout_seconds: float | None = None) -> MiResult:
        return self._session._command(text, timeout_seconds=timeout_seconds)

    def mi(self) -> MiTransport:
        return self._session._mi_or_fail()

    def libc(self) -> LibcImage:
        return self._session._libc_or_fail()


class GdbSession:
    """Attach to PID under gdb/MI, reach a safe point, make calls, always detach.

    The threads (choosing the caller, holding it, running forward) are ``_threads``'s, a
    ThreadControl that reaches the session only through a _ThreadsPort. The session owns the
    gdb process, the attach and its time, the target's libc and memory, the watchdog and the
    calls; ``non_stop`` (decided from the target's state before the attach, fixed after it) is
    the session's too, read by ``_threads`` through the port.
    """

    def __init__(
        self,
        pid: int,
        *,
        timeout_seconds: float = 10.0,
        gdb_path: str | None = None,
        log: Callable[[str], None] | None = None,
        allow_stopped: bool = False,
        quiet_while_stopping: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
    ) -> None:
        self.pid = pid
        # Entered around the attach and the detach, when gdb stops every thread of the target
        # in turn: the caller's background work holds still meanwhile.
        self._quiet_while_stopping = quiet_while_stopping or contextlib.nullcontext
        self.timeout_seconds = timeout_seconds
        self.gdb_path = gdb_path
        self.allow_stopped = allow_stopped
        self._log = log
        self._mi: MiTransport | None = None
        self._watchdog: Watchdog | None = None
        self._libc: LibcImage | None = None
        self._attach_started: float | None = None
        self._detached_at: float | None = None
        self._detached_cleanly = False  # gdb acknowledged -target-detach: it holds nothing
        self._attached = False
        self._was_running = True
        self._signal_handlers = TerminationHandlers()
        # gdb answered that the process is gone (_threads.target_exited: the threads saw it).
        self._target_exited = False
        self._call_abandoned = False  # a call was interrupted: make no further calls
        self._memory: TargetMemory | None = None
        self._sysroot: str | None = None  # private copy of a libc replaced on disk, for gdb
        self._gdb: GdbProcess | None = None
        self._pending_calls: dict[int, str] = {}  # token -> command of calls sent, not awaited
        self._arena_mutexes: list[int] = []  # each arena's address (its mutex), read at start
        self.non_stop = False  # set for a running target (see gdb_threads)
        self.held_result: object = None  # what malloc_info's while_held returned
        self._threads = ThreadControl(_ThreadsPort(self), pid=pid, timeout_seconds=timeout_seconds)

    # -- public API --------------------------------------------------------------------------

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

    @property
    def safe_point(self) -> str:
        """How the calling thread was chosen ("not reached" before it was)."""
        return self._threads.safe_point

    def release_bystanders(self) -> None:
        """Resume threads that stopped at a breakpoint while another became the caller."""
        self._threads.release_bystanders()

    def __enter__(self) -> GdbSession:
        self._signal_handlers.install()
        try:
            with gdb_failures(self.pid):
                self._start()
        except BaseException:
            self._cleanup()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._cleanup()

    def malloc_info(self, while_held: Callable[[], object] | None = None) -> bytes:
        """The target's ``malloc_info(0, fp)`` XML, written to an in-memory stream in the target.

        ``open_memstream`` keeps the document in the target's own heap (no file anywhere, so a
        target in another mount namespace works and nothing is left behind); the buffer is read
        back through gdb and freed. Every value a call returns is checked before it is used.
        ``while_held`` runs right after malloc_info, the caller still held, nothing freed yet
        (its result is ``held_result``; it must not raise; its time counts in the pause).
        """
        with gdb_failures(self.pid):
            return self._malloc_info(while_held)

    def _malloc_info(self, while_held: Callable[[], object] | None = None) -> bytes:
        libc = self._require_safe()
        fn = libc.functions
        cell = self._call(f"(long)((void *(*)(unsigned long)){fn['malloc']:#x})(16)")
        if cell == 0:
            raise TargetError(f"malloc(16) failed in PID {self.pid}: the target is out of memory")
        stream = 0
        buffer = 0
        try:
            # char *ptr; size_t size; for open_memstream(&ptr, &size), both zeroed first.
            self._command(f"-data-write-memory-bytes {cell:#x} {'00' * 16}")
            stream = self._call(
                f"(long)((void *(*)(char **, unsigned long *)){fn['open_memstream']:#x})"
                f"((char **){cell:#x}, (unsigned long *){cell + 8:#x})"
            )
            if stream == 0:
                raise TargetError(f"open_memstream failed in PID {self.pid} (out of memory?)")
            status = self._call(
                f"(int)((int (*)(int, void *)){fn['malloc_info']:#x})(0, {stream:#x})"
            )
            if while_held is not None and status == 0:
                self.held_result = while_held()
            closed = self._call(f"(int)((int (*)(void *)){fn['fclose']:#x})({stream:#x})")
            stream = 0
            buffer, size_bytes = self._read_words(cell)
            if status != 0:
                raise TargetError(f"malloc_info returned {status} in PID {self.pid}")
            if closed != 0:
                raise TargetError(
                    f"fclose of the memory stream returned {closed} in PID {self.pid}"
                )
            if buffer == 0:
                raise TargetError(f"the memory stream of PID {self.pid} has no buffer")
            if not 0 < size_bytes <= MAX_XML_BYTES:
                raise TargetError(f"malloc_info wrote an implausible {size_bytes} bytes")
            xml = self._read_document(buffer, size_bytes)
        finally:
            if stream:
                self._best_effort_call(f"(int)((int (*)(void *)){fn['fclose']:#x})({stream:#x})")
                with contextlib.suppress(MemforensicsError):
                    buffer, _ = self._read_words(cell)
            if buffer:
                self._best_effort_call(f"(((void (*)(void *)){fn['free']:#x})({buffer:#x}), 0)")
            self._best_effort_call(f"(((void (*)(void *)){fn['free']:#x})({cell:#x}), 0)")
        if not xml.startswith(b"<malloc"):
            raise TargetError(
                f"malloc_info of PID {self.pid} did not write a <malloc> document",
                hint="the verbose gdb exchange shows what the target returned",
            )
        return xml

    def malloc_trim(self, pad_bytes: int = 0) -> int:
        """``(int)malloc_trim(pad_bytes)`` at the safe point: 1 if memory was released, else 0."""
        if pad_bytes < 0:
            raise ValueError("pad_bytes must not be negative")
        with gdb_failures(self.pid):
            libc = self._require_safe()
            address = libc.functions["malloc_trim"]
            return self._call(f"(int)((int (*)(unsigned long)){address:#x})({pad_bytes})")

    # -- attach and safe point ---------------------------------------------------------------

    def _start(self) -> None:
        gdb = find_gdb(self.gdb_path)
        check_call_restores(gdb)  # before the target is touched
        facts = target_check.check_target(self.pid, allow_stopped=self.allow_stopped)
        self._was_running = facts.state not in ("T", "t")
        self.non_stop = self._was_running
        if facts.libc_path is None:
            raise NotGlibcMallocError(f"PID {self.pid} maps no shared glibc")
        # Signals wait while the helper processes start, so that none is left unrecorded.
        with deferred_signals():
            self._gdb = start_gdb(gdb)
            self._mi = MiTransport(self._gdb.process, log=self._log)
        # gdb works through its settings (the executable's symbols, the signal table) while
        # we read libc's symbols and start the watchdog: 4-6 ms each, overlapped.
        directory = self._gdb.data_directory
        sent = self._send_settings(
            gdb_settings(
                self.pid,
                was_running=self._was_running,
                non_stop=self.non_stop,
                signals_file=signal_handling_file(directory),
            )
        )
        self._libc = load_libc_image(self.pid, facts.libc_path)
        self._arena_mutexes = arena_mutexes(self.pid, facts.libc_path)
        with contextlib.suppress(OSError):  # without it, memory is read through gdb (slower)
            self._memory = TargetMemory(self.pid)
        with deferred_signals():
            self._watchdog = Watchdog(self.pid, self._mi.pid, was_running=self._was_running)
        self._tell_watchdog_the_call_dummy()
        if self._libc.image is not None:  # libc replaced on disk: see private_sysroot
            self._sysroot = private_sysroot(self._libc.path, self._libc.image)
            sent += self._send_settings(
                [f'-interpreter-exec console "set sysroot {self._sysroot}"']
            )
        self._collect_settings(sent)
        # The target's threads are stopped and resumed one by one as gdb attaches: no work of
        # ours competes with gdb for a CPU meanwhile (see gdb_background.QuietGate).
        with self._quiet_while_stopping():
            self._attach()
        self._threads.reach_safe_point(self._attach_started)
        self._await_unlocked_arenas()
        self._tell_watchdog_the_caller()

    def _await_unlocked_arenas(self) -> None:
        """Return once no arena's mutex is held, the caller held at its safe point; else
        DeadlineError at the deadline, nothing called. Every call takes arena mutexes (the
        first is malloc's). A mutex held by a thread that does not let go (blocked inside
        malloc_stats on a full pipe, say) would keep the call waiting past its deadline, and
        gdb's interrupt of a call in non-stop mode abandons it without restoring the caller:
        it would return into the dummy frame later, gdb gone, and kill the target. Non-stop:
        the other threads run meanwhile, so a mutex held a moment is let go. All-stop: every
        thread is held, so a held mutex stays held: no call."""
        memory = self._memory
        if not self._arena_mutexes or memory is None:
            return
        deadline = (self._attach_started or time.monotonic()) + self.timeout_seconds
        wait = _LOCK_LOOK_FIRST_SECONDS
        while True:
            held = [address for address in self._arena_mutexes if _lock_held(memory, address)]
            if not held:
                return
            if not self.non_stop or time.monotonic() + wait > deadline:
                during = (
                    "with every thread stopped"
                    if not self.non_stop
                    else f"at every look within {self.timeout_seconds:g} s"
                )
                raise DeadlineError(
                    f"PID {self.pid}: the mutex of the arena at {held[0]:#x} was held {during}; "
                    "a call would wait for it: nothing was called",
                    pid=self.pid,
                    hint="a thread may be blocked holding it (its stack shows malloc_stats, "
                    "malloc_info or a fork); retry with a longer deadline",
                )
            time.sleep(wait)
            wait = min(2 * wait, _LOCK_LOOK_MAX_SECONDS)

    def _tell_watchdog_the_call_dummy(self) -> None:
        """Where gdb's calls return to, and the byte its breakpoint there replaces."""
        address = entry_point(self.pid)
        if address is None or self._watchdog is None or self._memory is None:
            return
        with contextlib.suppress(TargetError):
            original = self._memory.read(address, 1)
            self._watchdog.tell(f"entry {address:x} {original.hex()}")

    def _tell_watchdog_the_caller(self) -> None:
        """The caller's registers as gdb will restore them, for the watchdog's guardian."""
        if self._watchdog is None:
            return
        line = self._threads.caller_guardian_line()
        if line is not None:
            self._watchdog.tell(line)

    def _send_settings(self, settings: list[str]) -> list[int]:
        """Send without waiting (_collect_settings waits); failures are gdb's own here."""
        mi = self._mi_or_fail()
        try:
            return [mi.send(setting) for setting in settings]
        except MiGdbExited as exc:
            raise gdb_error(exc, self.pid, doing="start-up", attached=False) from exc

    def _collect_settings(self, tokens: list[int]) -> None:
        mi = self._mi_or_fail()
        try:
            for token in tokens:
                mi.wait_result(token, timeout_seconds=max(self.timeout_seconds, 10.0))
        except (MiError, MiGdbExited, MiTimeout) as exc:
            raise gdb_error(exc, self.pid, doing="start-up", attached=False) from exc

    def _attach(self) -> None:
        mi = self._mi_or_fail()
        self._attach_started = time.monotonic()
        # Non-stop: "&" leaves every thread running once attached; we stop only those we look at.
        background = " &" if self.non_stop else ""
        try:
            self._command(f"-target-attach {self.pid}{background}")
        except (DeadlineError, ToolingError):
            raise  # gdb may have attached meanwhile (or died doing so): the cleanup sees to it
        except MemforensicsError:  # gdb_error diagnosed the refusal; nothing to detach from
            self._attach_started = None
            raise
        self._attached = True
        if not self.non_stop:
            try:
                mi.wait_async(
                    lambda r: r.get("message") == "stopped", timeout_seconds=self.timeout_seconds
                )
            except MiTimeout as exc:
                raise DeadlineError(
                    f"gdb did not stop PID {self.pid} in time after attaching", pid=self.pid
                ) from exc
        libc = self._libc_or_fail()
        # thread_db already reads libc's symbols on glibc >= 2.34; this is a no-op then.
        pattern = os.path.basename(libc.path).replace(".", "\\\\.")
        with contextlib.suppress(MiError):
            self._command(f'-interpreter-exec console "sharedlibrary {pattern}"')

    # -- calls ---------------------------------------------------------------------------------

    def _require_safe(self) -> LibcImage:
        if not self._attached or self._threads.running:
            raise ToolingError("the gdb session is not attached at a safe point")
        if self._call_abandoned:
            raise DeadlineError(f"an earlier call into PID {self.pid} did not return; no more")
        return self._libc_or_fail()

    def _call(self, expression: str) -> int:
        """Evaluate a cast call in the target under the deadline and return its integer value."""
        command = f"{self._evaluate()} {mi_quote(expression)}"
        try:
            result = self._command(command, call=True)
        except ToolingError as exc:
            if not self.non_stop or _RUNNING_CALLER not in exc.message:
                raise
            # gdb refused to start the call, so nothing ran: something resumed the caller
            # between two calls (seen on OpenJDK, 2 inspections in about 40). Hold it again
            # and call only if it is still outside the allocator.
            self._threads.hold_caller_again()
            result = self._command(command, call=True)
        value = str(result.payload.get("value", "")).split()[0] if result.payload else ""
        try:
            return int(value, 0)
        except ValueError as exc:
            raise ToolingError(f"gdb returned {value!r} for {expression}") from exc

    def _best_effort_call(self, expression: str) -> None:
        with contextlib.suppress(MemforensicsError, MiError, MiTimeout, MiGdbExited):
            # After an abandoned call a lock may be held: cleaning up could hang the same way.
            if self._attached and not self._threads.running and not self._call_abandoned:
                self._call(expression)

    def _read_words(self, address: int) -> tuple[int, int]:
        first, second = struct.unpack("<QQ", self._read_memory(address, 16))
        return first, second

    def _read_document(self, address: int, size_bytes: int) -> bytes:
        """Read the XML while the target's threads run, not while they are held.

        The calling thread sleeps in ``usleep`` (a call: gdb resumes every thread for it, and
        the buffer is ours until we free it), while we read the buffer from /proc/PID/mem.
        Nothing proportional to the document happens while the threads are stopped.
        """
        memory = self._memory
        if memory is None:
            return self._read_memory(address, size_bytes)
        if self.non_stop:
            return memory.read(address, size_bytes)  # only the caller is held: just read
        usleep = self._libc_or_fail().functions["usleep"]
        sleep_us = _READ_SLEEP_BASE_US + size_bytes // _READ_BYTES_PER_US
        token = self._send_call(f"(int)((int (*)(unsigned int)){usleep:#x})({sleep_us})")
        try:
            data = memory.read(address, size_bytes)
        finally:
            self._await(token, self._pending_calls.pop(token), call=True)
        return data

    def _read_memory(self, address: int, size_bytes: int) -> bytes:
        if self._memory is not None:
            with contextlib.suppress(TargetError):
                return self._memory.read(address, size_bytes)
        result = self._command(f"-data-read-memory-bytes {address:#x} {size_bytes}")
        chunks = sorted(
            result.payload.get("memory") or [], key=lambda block: int(str(block["begin"]), 16)
        )
        data = b"".join(bytes.fromhex(str(block.get("contents", ""))) for block in chunks)
        if len(data) != size_bytes:
            raise TargetError(
                f"could read only {len(data)} of {size_bytes} bytes at {address:#x} "
                f"in PID {self.pid}"
            )
        return data

    def _command(
        self, text: str, *, timeout_seconds: float | None = None, call: bool = False
    ) -> MiResult:
        """Run one MI command under a deadline, turning gdb's failures into our errors."""
        mi = self._mi_or_fail()
        if call:
            self._tell_call(True)
        return self._await(mi.send(text), text, call=call, timeout_seconds=timeout_seconds)

    def _evaluate(self) -> str:
        """The evaluate command, bound to the calling thread once there is one."""
        caller = self._threads.caller
        thread = f" --thread {caller}" if caller else ""
        return f"-data-evaluate-expression{thread}"

    def _send_call(self, expression: str) -> int:
        """Start a cast call without waiting for it (see _read_document); _await ends it."""
        text = f"{self._evaluate()} {mi_quote(expression)}"
        self._tell_call(True)
        token = self._mi_or_fail().send(text)
        self._pending_calls[token] = text
        return token

    def _await(
        self, token: int, text: str, *, call: bool = False, timeout_seconds: float | None = None
    ) -> MiResult:
        """Wait for the result of command ``token`` under the deadline; errors become ours."""
        mi = self._mi_or_fail()
        timeout = self.timeout_seconds if timeout_seconds is None else timeout_seconds
        try:
            result = mi.wait_result(token, timeout_seconds=timeout)
            if call:
                self._tell_call(False)
            return result
        except MiTimeout as exc:
            unwound = True
            if call:
                # unwindonsignal: gdb abandons the call and restores the thread's registers.
                self._call_abandoned = True
                unwound = False
                with contextlib.suppress(MiTimeout, MiGdbExited):
                    unwound = self._unwind_call(token)
            raise gdb_error(
                exc, self.pid, doing=text, call=call, timeout_seconds=timeout, unwound=unwound
            ) from exc
        except (MiGdbExited, MiError) as exc:
            if call and isinstance(exc, MiError):
                self._tell_call(False)  # gdb answered: it unwound or finished the call
            error = gdb_error(exc, self.pid, doing=text, call=call)
            if isinstance(exc, MiGdbExited) or isinstance(error, NoSuchProcessError):
                self._attached = False
            if isinstance(error, NoSuchProcessError):
                self._target_exited = True
            raise error from exc

    def _tell_call(self, running: bool) -> None:
        if self._watchdog is not None:
            self._watchdog.tell("call" if running else "ret")

    def _unwind_call(self, token: int) -> bool:
        """Interrupt the call sent as ``token`` and wait for gdb's answer to it: True once
        gdb answered (the call is over, and the watchdog hears so: told nothing, it would
        still see a call running when gdb exits after the detach). MiTimeout or MiGdbExited
        without an answer: the call may still run, and the watchdog may have to rescue it
        (gdb/MI reads no command while a call it evaluates runs in non-stop mode, so the
        interrupt waits behind it)."""
        self._threads.interrupt_call()
        # An MiError is how gdb answers an interrupted call: it unwound the call.
        with contextlib.suppress(MiError):
            self._mi_or_fail().wait_result(token, timeout_seconds=CLEANUP_SECONDS)
        self._tell_call(False)
        return True

    # -- cleanup -------------------------------------------------------------------------------

    def _cleanup(self) -> None:
        """Detach whatever happened; never leave the target stopped. Signals wait until done."""
        with deferred_signals():
            try:
                with self._quiet_while_stopping():
                    self._detach()
            finally:
                if self._mi is not None:
                    self._mi.close(wait=not self._detached_cleanly)
                if self._memory is not None:
                    self._memory.close()
                if self._sysroot is not None:
                    shutil.rmtree(self._sysroot, ignore_errors=True)
                self._restore_target_state()
                if self._watchdog is not None:
                    if self._detached_cleanly or self._attach_started is None:
                        self._watchdog.dismiss()
                    else:
                        self._watchdog.hand_over()
                    self._watchdog = None
                self._signal_handlers.restore()

    def _detach(self) -> None:
        mi = self._mi
        # Detach also when the attach's answer never arrived (interrupted while waiting).
        exited = self._target_exited or self._threads.target_exited
        if mi is None or not mi.alive() or self._attach_started is None or exited:
            self._mark_detached()
            return
        try:
            for token in list(mi.in_flight):
                self._unwind_call(token)  # an abandoned call: gdb unwinds it (unwindonsignal)
            if self._threads.running:
                self._threads.stop_running()
            with contextlib.suppress(MiError):
                self._threads.delete_breakpoints()
            if self.non_stop:
                self._threads.release_bystanders()
            if not self._was_running:
                # Leave a stopped target stopped: SIGSTOP is delivered as gdb lets go.
                with contextlib.suppress(MiError):
                    self._command('-interpreter-exec console "handle SIGSTOP nostop noprint pass"')
                    self._command('-interpreter-exec console "queue-signal SIGSTOP"')
            self._command("-target-detach", timeout_seconds=CLEANUP_SECONDS)
            self._detached_cleanly = True
            if self._watchdog is not None:
                self._watchdog.tell("detached")  # gdb's exit from now on is expected
        except (MiError, MiTimeout, MiGdbExited, MemforensicsError):
            # gdb is stuck or gone: closing it kills it and the kernel detaches ptrace;
            # _restore_target_state then resumes the target if it was left stopped.
            pass
        finally:
            self._mark_detached()

    def _mark_detached(self) -> None:
        if self._attach_started is not None and self._detached_at is None:
            self._detached_at = time.monotonic()
        self._attached = False

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

    def _mi_or_fail(self) -> MiTransport:
        if self._mi is None:
            raise ToolingError("gdb is not running")
        return self._mi

    def _libc_or_fail(self) -> LibcImage:
        if self._libc is None:
            raise ToolingError("the target's libc was not read")
        return self._libc


def _lock_held(memory: TargetMemory, address: int) -> bool:
    """The lock word at ``address`` is nonzero, or could not be read (taken as held)."""
    try:
        return int.from_bytes(memory.read(address, 4), "little") != 0
    except TargetError:
        return True
