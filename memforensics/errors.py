"""The one exception hierarchy; each class carries its exit code and a default hint.

Each error is also the standard exception a caller would catch (pystack's habit): a vanished
process is a ProcessLookupError, a refused ptrace a PermissionError, a missed deadline a
TimeoutError, bad input a ValueError. Errors about one process carry its ``pid``.
"""

from __future__ import annotations

from typing import Any

# Exit codes: the contract in README.md and every command's --help epilog.
EXIT_OK = 0
EXIT_GATE = 1
EXIT_USAGE = 2
EXIT_TARGET = 3
EXIT_PERMISSION = 4
EXIT_TOOLING = 5
EXIT_TIMEOUT = 6
EXIT_INPUT = 7
EXIT_CORRUPT = 8

EXIT_CODE_TABLE: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "success"),
    (EXIT_GATE, "a gate failed (threshold exceeded, or oom --fail-if-found found kills)"),
    (EXIT_USAGE, "usage error"),
    (EXIT_TARGET, "target process problem (no such PID, exited, zombie, not glibc malloc)"),
    (
        EXIT_PERMISSION,
        "permission denied (ptrace not allowed, journal not readable, unsafe state dir)",
    ),
    (EXIT_TOOLING, "tooling problem (gdb or journalctl missing or unusable)"),
    (
        EXIT_TIMEOUT,
        "timeout (no safe point, a call did not return, or a read ran out of its time; "
        "target left running)",
    ),
    (EXIT_INPUT, "invalid input data (malformed, truncated or hostile dump or log)"),
    (EXIT_CORRUPT, "the heap is corrupt: reported as a finding, nothing called into it"),
)


class MemforensicsError(Exception):
    """Root of every error the tool reports; ``str(err)`` is the one-line message."""

    exit_code: int = EXIT_TOOLING
    default_hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None, pid: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint
        self.pid = pid  # the process the error is about, where there is one

    def __str__(self) -> str:
        return self.message


class TargetError(MemforensicsError):
    """The target process cannot be examined: gone, zombie, kernel thread, not glibc."""

    exit_code = EXIT_TARGET


class NoSuchProcessError(TargetError, ProcessLookupError):
    """No process has the given PID (or it exited while we worked on it)."""

    default_hint = "check the PID with `ps -p PID`"


class TargetExitedError(NoSuchProcessError):
    """The process existed when we started and exited while we worked on it."""

    default_hint = "the process ended on its own; nothing was left stopped or traced"


class ThreadVanishedError(TargetError):
    """A thread of the target (not the process) exited while gdb was looking at it."""

    default_hint = "the process lives on and was left running; try again"


class TargetStoppedError(TargetError):
    """The target was already stopped (SIGSTOP, a debugger) before we came."""

    default_hint = "resume it with `kill -CONT PID`, or inspect it as it is and leave it stopped"


class NotGlibcMallocError(TargetError):
    """The target does not allocate through glibc malloc (musl, jemalloc, static …)."""

    default_hint = "malloc_info only describes glibc's allocator; use the allocator's own stats"


class GdbMayHelpError(TargetError):
    """The way tried cannot serve this target, and gdb's way (a call made through gdb at a
    safe point) may: the CLI names its flag where the command has one."""

    default_hint = "gdb's way may work"


class ReadOnlyRefusedError(GdbMayHelpError):
    """The read from the target's memory cannot give malloc_info's document for this target
    (an unknown glibc layout, main_arena or mp_ not found, an arena locked at every stop);
    gdb's call to malloc_info may. The default falls back to it (entry.inspect decides)."""

    default_hint = "the gdb path (gdb calls malloc_info) may read it"

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        pid: int | None = None,
        too_long: tuple[int, ...] = (),
        partial: object = None,
    ) -> None:
        super().__init__(message, hint=hint, pid=pid)
        # The malloc_state addresses of the arenas refused because their lists were too long
        # to follow within a stop (a read made right after need not try them again).
        self.too_long = too_long
        # The refused read's HeapScan (model.heapscan; errors sit below model) where its
        # arenas were found: the call that stands in proves the arenas it left unread.
        self.partial = partial


class DeadlineError(MemforensicsError, TimeoutError):
    """No safe point was reached, or a call did not return in time; target left running."""

    exit_code = EXIT_TIMEOUT
    default_hint = "retry with a longer deadline"


class HoldTimeoutError(DeadlineError):
    """A read's hold of every thread gave up: nothing was called, and each thread held was
    released (the kernel ends a tracer's seizes when it lets go)."""

    default_hint = (
        "retry with a longer deadline; nothing was called into the target and every thread "
        "was released: it was left running"
    )


class ArenaLockedError(ReadOnlyRefusedError, DeadlineError):
    """Every arena left unread was locked (its mutex held) at every stop of the read, until
    the retries or the deadline ran out: no moment came to read it, as no safe point comes
    for a call (exit 6). The target was left running and intact."""

    exit_code = EXIT_TIMEOUT


class ReadTimeRanOutError(DeadlineError):
    """The read from memory ran out of its own time before it reached every arena, and every
    arena it did not read was only late (or locked): the read is not impossible here, only
    longer than its budget, so no other way stands in for it (exit 6). Nothing was called
    into the target, which was left running."""

    default_hint = (
        "nothing was called into the target and it was left running; a longer deadline "
        "gives the read more time"
    )


class StatisticsOnlyError(TargetError):
    """A read-only inspection was asked of a process whose allocator (jemalloc, tcmalloc,
    mimalloc) is described only by its own statistics calls."""

    default_hint = "its statistics calls are made without gdb, at a moment no thread is inside it"


class GdbNotForAllocatorError(TargetError):
    """gdb's way was asked for a process on jemalloc, tcmalloc or mimalloc: gdb's way reads
    and trims glibc's malloc only, their own calls are made without gdb."""

    default_hint = "the allocator's own calls are made without gdb"


class HeapCorruptionError(TargetError):
    """The target's heap failed glibc's own checks in a read made while its threads were
    held still: it is corrupt, not moving. A finding about the target, reported with each
    failed check (``findings``); nothing is ever called into such a heap (no malloc_info,
    no malloc_trim), on any path. ``partial``: what the read measured nonetheless (the
    read's HeapScan, for a report of the bins that did read consistently), where known."""

    exit_code = EXIT_CORRUPT
    default_hint = (
        "the process has corrupted its own heap (a use-after-free or an overflow into a chunk "
        "header): its next malloc or free may crash or hang it; nothing was called into it"
    )

    def __init__(
        self,
        message: str,
        findings: tuple[Any, ...],  # model.corruption.HeapCorruption (errors sit below model)
        *,
        hint: str | None = None,
        pid: int | None = None,
        partial: object = None,
    ) -> None:
        super().__init__(message, hint=hint, pid=pid)
        self.findings = findings
        self.partial = partial


class TargetPermissionError(MemforensicsError, PermissionError):
    """Not allowed to trace the target or to read the journal."""

    exit_code = EXIT_PERMISSION
    default_hint = "run as the target's user or as root (sudo -E), or grant CAP_SYS_PTRACE"


class UnsafeDirectoryError(MemforensicsError, PermissionError):
    """A directory we would keep state in is writable by others (world-writable, or owned
    by another user): what it holds could be forged, so it is refused."""

    exit_code = EXIT_PERMISSION
    default_hint = "make it owned by this user with mode 0700 (chmod 700 DIR), or choose another"


class ToolingError(MemforensicsError):
    """A tool we drive (gdb, journalctl) is missing or misbehaves."""

    exit_code = EXIT_TOOLING


class GdbUnavailableError(ToolingError):
    """gdb is missing, too old, or cannot run."""

    default_hint = "install gdb (apt-get install gdb), or name a working gdb binary"


class InputDataError(MemforensicsError, ValueError):
    """A dump or log that is malformed, truncated, hostile or not what it claims."""

    exit_code = EXIT_INPUT

    def __init__(
        self,
        what: str,
        *,
        source: str | None = None,
        line: int | None = None,
        hint: str | None = None,
    ) -> None:
        where = ""
        if source is not None:
            where = f"{source}:{line}: " if line is not None else f"{source}: "
        super().__init__(f"{where}{what}", hint=hint)
        self.what = what
        self.source = source
        self.line = line
