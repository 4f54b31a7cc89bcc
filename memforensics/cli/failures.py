"""The CLI's side of errors: the one place that prints them, adds flag hints, picks exit codes.

The library says what went wrong and what to do in its own terms; only here, at the CLI
boundary, does a hint name a command-line flag, and only a flag the running command has.
"""

from __future__ import annotations

from collections.abc import Iterable

import click

from memforensics.errors import (
    EXIT_CORRUPT,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_TOOLING,
    DeadlineError,
    GdbMayHelpError,
    GdbNotForAllocatorError,
    GdbUnavailableError,
    HeapCorruptionError,
    MemforensicsError,
    NoSuchProcessError,
    StatisticsOnlyError,
    TargetExitedError,
    TargetStoppedError,
    UnsafeDirectoryError,
)

EXIT_INTERRUPTED = 130  # the shell's convention for a Ctrl-C ending a program
EXIT_INTERNAL = EXIT_TOOLING  # a bug in memforensics is a tooling problem to the caller

# Error class -> (the option it concerns, what to say). The first matching class wins (every
# rule of that class applies, in order), so a subclass that must not get its parent's hint is
# listed first with None.
FLAG_HINTS: tuple[tuple[type[MemforensicsError], str | None, str], ...] = (
    (DeadlineError, "--timeout", "allow more time with --timeout (e.g. --timeout 30s)"),
    (GdbUnavailableError, "--gdb", "name a working gdb with --gdb PATH"),
    (
        GdbUnavailableError,
        "--read-only",
        "without --gdb the heap is read from memory, gdb only where that read is refused",
    ),
    (
        HeapCorruptionError,
        "--accept-corrupt-heap-risk",
        "--gdb gdb --accept-corrupt-heap-risk calls into it anyway, at the risk of hanging "
        "or crashing the process",
    ),
    (TargetStoppedError, "--allow-stopped", "or pass --allow-stopped to inspect it as it is"),
    (GdbMayHelpError, "--gdb", "try it with --gdb gdb"),
    (StatisticsOnlyError, "--read-only", "drop --read-only"),
    (GdbNotForAllocatorError, "--gdb", "drop --gdb"),
    (TargetExitedError, None, ""),
    (NoSuchProcessError, "--name", "or select processes by name with --name PATTERN"),
    (UnsafeDirectoryError, "--state-dir", "or pass --state-dir DIR"),
)
# The same for failures known only by their exit code (a trim target's recorded failure).
_FLAG_HINTS_BY_EXIT_CODE = {
    EXIT_TIMEOUT: FLAG_HINTS[0],
    EXIT_CORRUPT: next(rule for rule in FLAG_HINTS if rule[0] is HeapCorruptionError),
}


def command_options(command: click.Command | None) -> frozenset[str]:
    """Every option string a command accepts (``--timeout``, ``-v`` …)."""
    if command is None:
        return frozenset()
    return frozenset(opt for param in command.params for opt in getattr(param, "opts", ()))


def _running_command_options() -> frozenset[str]:
    ctx = click.get_current_context(silent=True)
    return command_options(ctx.command if ctx is not None else None)


def _with_flag(
    hint: str | None, rule: tuple[object, str | None, str] | None, options: frozenset[str]
) -> str | None:
    if rule is None:
        return hint
    _, option, words = rule
    if option is None or option not in options:
        return hint
    return f"{hint}; {words}" if hint else words


def cli_hint(exc: MemforensicsError, options: frozenset[str] | None = None) -> str | None:
    """The library's hint plus, where one applies, the flag of the command that helps.

    ``options``: what the command accepts (default: the command running now).
    """
    accepted = _running_command_options() if options is None else options
    matched = next((cls for cls, _, _ in FLAG_HINTS if isinstance(exc, cls)), None)
    hint = exc.hint
    for cls, option, words in FLAG_HINTS:
        if cls is matched:
            hint = _with_flag(hint, (cls, option, words), accepted)
    return hint


def exit_code_for(exc: BaseException) -> int:
    """The documented exit code for an exception that ends a command."""
    if isinstance(exc, MemforensicsError):
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        status: int = getattr(exc, "exit_status", EXIT_INTERRUPTED)
        return status
    return EXIT_INTERNAL


def worst_exit_code(codes: Iterable[int]) -> int:
    """The highest exit code of several targets (0 when all went well)."""
    return max(codes, default=EXIT_OK)


def print_error(message: str, hint: str | None = None, *, prefix: str = "") -> None:
    """``error: …`` and ``hint: …`` on stderr, one line each whatever a tool put in the text."""
    click.echo(f"error: {prefix}{' '.join(message.split())}", err=True)
    if hint:
        click.echo(f"hint: {' '.join(hint.split())}", err=True)


def report_failure(
    exc: MemforensicsError, *, prefix: str = "", options: frozenset[str] | None = None
) -> None:
    """Print a library error with the CLI's hint."""
    print_error(exc.message, cli_hint(exc, options), prefix=prefix)


def report_recorded(message: str, hint: str | None, exit_code: int) -> None:
    """Print a failure recorded earlier (message, hint and exit code kept, not the error)."""
    rule = _FLAG_HINTS_BY_EXIT_CODE.get(exit_code)
    print_error(message, _with_flag(hint, rule, _running_command_options()))
