"""What `inspect PID` and `oom --file` can begin before their command line is parsed.

(And the garbage collector's pause for the command's start, pause_collector.)

Python spends the first ~50 ms of a command importing click and the command's modules. For
`memforensics inspect --gdb PATH PID …` (the gdb path; the default reads the target's
memory and has neither to begin) the two slowest pieces of work need nothing of that: gdb's own
start-up (gdb_spawn.prestart) and the first target's residency scan (scanning.early_scan).
``begin`` recognises such a command line from ``sys.argv`` with the standard library alone
and starts both; the command then takes them over (``take_scan``). Anything it does not
recognise for certain (another command, --help, an option it does not know, a value it
cannot read) starts nothing: click parses the command line as always and the command starts
the same work itself, a little later. Only the command line decides what is started, and the
scan reads /proc of the PID named there, as the command would.

`memforensics oom --file LOG …` likewise starts the search of LOG's bytes in a child process
(sources/logs/logsearch.py), on the second core while this one imports (the collector paused
until the command resumes it).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memforensics.entry.scanning import BackgroundScan

# The options of `inspect` (cli/inspect.py; tests/unit/test_early.py keeps the two in step).
VALUE_OPTIONS = frozenset(
    {
        "--name",
        "--save-xml",
        "--timeout",
        "--gdb",
        "--top",
        "--sort",
        "--core",
        "--exe",
        "--sysroot",
        "--html",
    }
)
FLAG_OPTIONS = frozenset(
    {
        "--json",
        "--allow-stopped",
        "--read-only",
        "--pins",
        "--accept-corrupt-heap-risk",
        "-v",
        "--verbose",
    }
)

_scans: dict[int, BackgroundScan] = {}

# The options of `oom` (cli/oom.py; tests/unit/test_early.py keeps the two in step).
OOM_VALUE_OPTIONS = frozenset(
    {
        "--boot",
        "--since",
        "--until",
        "--directory",
        "--file",
        "--process",
        "--recording",
        "--state-dir",
    }
)
OOM_FLAG_OPTIONS = frozenset(
    {"--kmsg", "--summary", "--wide", "--json", "--fail-if-found", "-v", "--verbose"}
)


def oom_file(argv: Sequence[str]) -> str | None:
    """The first --file of an `oom` command line that reads saved files only; None when
    ``argv`` is anything else or not certainly understood."""
    if not argv or argv[0] != "oom":
        return None
    files: list[str] = []
    tokens = iter(argv[1:])
    for token in tokens:
        name, has_value, value = token.partition("=")
        if name in OOM_VALUE_OPTIONS:
            if not has_value:
                following = next(tokens, None)
                if following is None:
                    return None
                value = following
            if name in ("--directory", "--boot"):
                return None
            if name == "--file":
                files.append(value)
        elif name not in OOM_FLAG_OPTIONS or has_value or name == "--kmsg":
            return None  # --help, a positional, a typo: click's to judge
    return files[0] if files and files[0] != "-" else None


def inspect_command(argv: Sequence[str]) -> tuple[list[int], str | None, bool] | None:
    """(PIDs, --gdb, --allow-stopped) of an `inspect` command line; None when ``argv`` (the
    arguments after the program's name) is anything else or not certainly understood."""
    if not argv or argv[0] != "inspect":
        return None
    pids: list[int] = []
    gdb_path: str | None = None
    allow_stopped = False
    tokens = iter(argv[1:])
    positional_only = False
    for token in tokens:
        if positional_only or not token.startswith("-"):
            if not token.isascii() or not token.isdigit() or int(token) < 1:
                return None
            pids.append(int(token))
        elif token == "--":
            positional_only = True
        else:
            understood = _inspect_option(token, tokens)
            if understood is None:
                return None
            name, value = understood
            if name == "--gdb":
                gdb_path = value
            allow_stopped = allow_stopped or name == "--allow-stopped"
    return (pids, gdb_path, allow_stopped) if pids else None


def _inspect_option(token: str, tokens: Iterator[str]) -> tuple[str, str | None] | None:
    """(option, value) of one option of an `inspect` command line, its value taken from
    ``tokens`` where it is the next one; None for what this reader does not start early."""
    name, has_value, value = token.partition("=")
    if name in ("--core", "--exe", "--sysroot"):
        return None  # a core file: no process to begin reading, no gdb to start
    if name in VALUE_OPTIONS:
        if not has_value:
            following = next(tokens, None)
            if following is None:
                return None
            value = following
        return name, value
    if name in FLAG_OPTIONS and not has_value and name != "--read-only":
        return name, None
    # --read-only (no gdb to start), --help, a short option cluster, a typo: click's to judge
    return None


def begin(argv: Sequence[str]) -> None:
    """Pause the collector for an `inspect PID …` command, and start gdb and the first
    target's scan when it takes the gdb path (--gdb PATH);
    the search of the first saved log when it is an `oom --file LOG …` command."""
    path = oom_file(argv)
    if path is not None:
        pause_collector()  # `oom` resumes it once imported, before it parses
        from memforensics.sources.logs import logsearch

        logsearch.start(path)
        return
    command = inspect_command(argv)
    if command is None:
        return
    pids, gdb_path, allow_stopped = command
    pause_collector()
    if gdb_path is None:
        return  # the default reads the target's memory itself: no gdb to start, no scan
    try:
        # The scan first: it is the longer of the two (gdb starts in ~40 ms, the scan of a
        # 400 MB heap takes ~130 ms), and each import delays what follows it.
        from memforensics.entry.scanning import early_scan

        scan = early_scan(pids[0], allow_stopped=allow_stopped)
        if scan is not None:
            _scans[pids[0]] = scan
        from memforensics.sources.gdb.gdb_spawn import prestart

        prestart(gdb_path)
    except Exception:  # the command starts the same work itself, and reports on it
        return


def pause_collector() -> None:
    """Python's cyclic garbage collector off until resume_collector(), for an `inspect` or
    the imports of an `oom --file`.

    Until its first report is out, `inspect` allocates only what lives to the end: some
    200,000 objects of modules, classes and functions as it imports, then one document. The
    collector would traverse them about 50 times (once per 700 allocations, more at each
    older generation) and free nothing. `oom` resumes it after its imports, before it
    parses a log of any size: from then on the collector runs as always, over what is new.
    """
    gc.disable()


def resume_collector() -> None:
    """The collector back on; what exists by now is frozen out of its future passes."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """pause_collector() for the duration, resume_collector() at its end whatever happens: a
    caller in the same process (tests, a library user) gets the collector back. Also a
    decorator: the `inspect` command runs under it."""
    pause_collector()
    try:
        yield
    finally:
        resume_collector()


def take_scan(pid: int) -> BackgroundScan | None:
    """The scan ``begin`` started for ``pid``, handed over once; None if there is none."""
    return _scans.pop(pid, None)
