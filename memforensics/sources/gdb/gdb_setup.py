"""Starting gdb for a session: finding it, its settings, and its failures as project errors."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator

from memforensics.errors import (
    DeadlineError,
    GdbUnavailableError,
    MemforensicsError,
    TargetError,
    TargetExitedError,
    ThreadVanishedError,
    ToolingError,
)
from memforensics.sources.gdb.gdbmi import MiError, MiGdbExited, MiTimeout
from memforensics.sources.gdb.watchdog_link import RESCUE_SECONDS
from memforensics.sources.proc import attach_diagnosis, procfs


def mi_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


# Signals the program gets while we work are delivered to it without stopping gdb: a stop
# would make gdb unwind our call half-way (unwindonsignal), possibly with an arena mutex
# held. Faults still stop, so a call that faults is unwound instead of killing the target.
SIGNAL_HANDLING = (
    "handle all nostop noprint pass",
    "handle SIGSEGV SIGBUS SIGFPE SIGILL SIGABRT SIGSYS stop",
)


# Sourced from the data directory (gdb_spawn.lean_data_directory writes it there), ``handle``
# prints nothing; typed at the console it prints gdb's whole table of 160 signals, each a
# line to parse (about 10 ms of our CPU per session).
SIGNALS_FILE = "memforensics-signals.gdb"


def signal_handling_file(directory: str | None) -> str | None:
    """The signal table's command file in gdb's data ``directory``, where it has one."""
    if directory is None:
        return None
    path = os.path.join(directory, SIGNALS_FILE)
    return path if os.path.isfile(path) else None


def private_sysroot(libc_path: str, image: bytes) -> str:
    """A private sysroot holding ``image`` under ``libc_path``, for a libc replaced on disk
    since the target started: gdb must unwind with the mapped image's CFI, not the new
    file's. The session removes it."""
    sysroot = tempfile.mkdtemp(prefix="memforensics-libc-")
    copy = os.path.join(sysroot, libc_path.lstrip("/"))
    os.makedirs(os.path.dirname(copy), exist_ok=True)
    with open(copy, "wb") as handle:
        handle.write(image)
    return sysroot


def gdb_settings(
    pid: int, *, was_running: bool, non_stop: bool, signals_file: str | None = None
) -> list[str]:
    """MI commands that keep the stop short and the calls safe (all sent before attaching);
    ``signals_file``: SIGNAL_HANDLING in gdb's data directory (signal_handling_file), sourced
    quietly."""
    settings = [
        "-gdb-set mi-async on",  # accept -exec-interrupt while the target runs forward
        "-gdb-set pagination off",
        "-gdb-set confirm off",
        "-gdb-set auto-solib-add off",  # read no library's symbols except libc's
        "-gdb-set debuginfod enabled off",  # never fetch debug info over the network
        '-interpreter-exec console "set debug-file-directory"',  # no separate debug files
        '-interpreter-exec console "set auto-load off"',
        "-gdb-set unwindonsignal on",  # an interrupted call is unwound, not left half-done
        "-gdb-set print thread-events off",
        f"-gdb-set non-stop {'on' if non_stop else 'off'}",  # see gdb_threads
        # Without libthread_db gdb still stops and lists every thread (it attaches each
        # LWP from /proc/PID/task); loading it and libc's symbols for it doubled the pause.
        '-interpreter-exec console "set libthread-db-search-path /nonexistent"',
        # Read the executable's symbols now, while the target still runs, not after attach.
        f"-file-exec-and-symbols /proc/{pid}/exe",
    ]
    if signals_file is not None:
        settings.append(f"-interpreter-exec console {mi_quote('source ' + signals_file)}")
    else:
        settings.extend(f'-interpreter-exec console "{line}"' for line in SIGNAL_HANDLING)
    if not was_running:
        # A target someone else stopped (and the caller allowed) re-enters its group stop as
        # soon as a thread runs our call; swallow that SIGSTOP during calls, and queue one for
        # the detach (see _detach) so that the target is left stopped as it was.
        settings.append('-interpreter-exec console "handle SIGSTOP nostop noprint nopass"')
    return settings


def gdb_error(
    exc: Exception,
    pid: int,
    *,
    doing: str,
    call: bool = False,
    attached: bool = True,
    timeout_seconds: float | None = None,
    unwound: bool = True,
) -> MemforensicsError:
    """The one place where gdb's failures become the project's errors.

    A failure is the target's when the target is gone (it exited: exit 3, never "install gdb"),
    the deadline's when gdb or a call did not answer in time, and gdb's own otherwise.
    ``unwound``: gdb answered the interrupt of a call that overran (it restored the caller);
    False when it did not (the watchdog's guardian then finishes the call in its place).
    """
    command = doing.split(maxsplit=1)[0] if doing else "a command"
    message = str(exc).splitlines()[0] if str(exc) else ""
    # Before the attach too: gdb failing to read /proc/PID/exe of a process that is exiting is
    # the target's doing, never a reason to reinstall gdb.
    if _exited(pid, message) or (
        attached and ("has exited" in message or "not being run" in message)
    ):
        return TargetExitedError(f"PID {pid} exited while being inspected", pid=pid)
    if doing.startswith("-target-attach") and isinstance(exc, MiError):
        # gdb's own answer only: a deadline that ends during the attach is a timeout, and a
        # gdb that dies then is gdb's failure (below); /proc shows our own gdb as the tracer
        # then, which the diagnosis would take for somebody else's.
        # ptrace refused: say why (Yama, capabilities, another tracer, another user). gdb says
        # "No such process" also when Yama refuses a live process, so the words prove nothing.
        return attach_diagnosis.diagnose_attach_failure(pid, message)
    if not call and "No such process" in message:
        # The process lives (checked above): one of its threads exited between gdb's thread
        # list and its look at that thread (a JVM's compiler threads come and go). A race of
        # the target's, which a second attempt does not meet.
        return ThreadVanishedError(
            f"a thread of PID {pid} exited while gdb read it ({message})", pid=pid
        )
    if isinstance(exc, MiTimeout):
        if call:
            after = (
                "gdb interrupted it and says it unwound it"
                if unwound
                else "gdb did not answer its interrupt; the watchdog took the call over and "
                "restores the calling thread when the call returns (a call still waiting for "
                f"a lock after {RESCUE_SECONDS:g} s is unwound where it waits)"
            )
            return DeadlineError(
                f"a call into PID {pid} did not return within {timeout_seconds:g} s; {after}",
                pid=pid,
            )
        if not attached:
            return GdbUnavailableError(f"gdb did not answer gdb/MI commands ({command})")
        waited = f" within {timeout_seconds:g} s" if timeout_seconds is not None else " in time"
        return DeadlineError(f"gdb did not answer {command}{waited} for PID {pid}", pid=pid)
    if isinstance(exc, MiGdbExited):
        if not attached:
            return GdbUnavailableError("gdb exited at start-up: not a working gdb with MI support")
        return ToolingError(f"gdb exited unexpectedly during {command} on PID {pid}", pid=pid)
    if call and "signaled while in a function called from GDB" in message:
        return TargetError(
            f"the call into PID {pid} raised a signal; gdb says it unwound it: {message}",
            pid=pid,
        )
    if not attached:
        return GdbUnavailableError(f"gdb rejected {doing!r}: {message or 'error'}")
    return ToolingError(f"gdb: {message or 'error'}", pid=pid)


@contextlib.contextmanager
def gdb_failures(pid: int) -> Iterator[None]:
    """Transport failures that escaped ``_command`` become the project's errors."""
    try:
        yield
    except (MiGdbExited, MiTimeout, MiError) as exc:
        raise gdb_error(exc, pid, doing="") from exc


def _exited(pid: int, message: str) -> bool:
    """The target is gone, or going: an exiting process loses /proc/PID/exe before it is a
    zombie, so when gdb says a /proc file of it is missing, give the exit a moment to show."""
    if not procfs.pid_alive(pid):
        return True
    if f"/proc/{pid}/" not in message and "No such process" not in message:
        return False
    for _ in range(10):
        time.sleep(0.005)
        if not procfs.pid_alive(pid):
            return True
    return False
