"""What a command line may begin before it is parsed: the collector's pause for `inspect`,
the read of its target's smaps, and the search of a saved log for `oom --file`.

Python spends the first ~0.2 s of a command importing click and the command's modules.
`inspect` pauses the garbage collector from the start (pause_collector says why).
`memforensics inspect PID …` whose every option is one ``inspect_pid`` knows reads
/proc/PID/smaps in a thread meanwhile (sources/proc/smaps_ahead.py): the kernel walks the
target's page tables on the second core, and the scan takes the text.
`memforensics oom --file LOG …` starts the search of LOG's bytes in a child process
(sources/logs/logsearch.py), on the second core while this one imports (the collector paused
until the command resumes it). Anything ``oom_file`` does not recognise for certain (another
command, --help, an option it does not know, a value it cannot read) starts nothing: click
parses the command line as always and the command does the same work itself, a little later.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Sequence

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


# The options of `inspect` (cli/inspect.py) after which the heap is read from the memory of the
# one PID named; any other (--gdb, --core, --name, --help …) starts nothing early.
INSPECT_VALUE_OPTIONS = frozenset({"--save-xml", "--timeout", "--html", "--top", "--sort"})
INSPECT_FLAG_OPTIONS = frozenset(
    {"--json", "--allow-stopped", "--read-only", "--pins", "--no-pins", "-v", "--verbose"}
)


def _options(
    tokens: Sequence[str], values: frozenset[str], flags: frozenset[str]
) -> list[tuple[str, str]] | None:
    """A command line's tokens after the command, in order: (name, value) for an option of
    ``values`` (``--name=value`` or ``--name value``), (name, "") for a flag of ``flags``,
    ("", token) for a positional. None when a token is anything else (an option neither set
    knows, --help, a flag given a value, an option missing its value): click's to judge."""
    parsed: list[tuple[str, str]] = []
    tokens_left = iter(tokens)
    for token in tokens_left:
        name, has_value, value = token.partition("=")
        if name in values:
            if not has_value:
                following = next(tokens_left, None)
                if following is None:
                    return None
                value = following
            parsed.append((name, value))
        elif name in flags and not has_value:
            parsed.append((name, ""))
        elif token.startswith("-"):
            return None
        else:
            parsed.append(("", token))
    return parsed


def inspect_pid(argv: Sequence[str]) -> int | None:
    """The PID of an `inspect` command line that names one PID and only options of
    INSPECT_VALUE_OPTIONS and INSPECT_FLAG_OPTIONS; None when ``argv`` is anything else or
    not certainly understood."""
    if not argv or argv[0] != "inspect":
        return None
    parsed = _options(argv[1:], INSPECT_VALUE_OPTIONS, INSPECT_FLAG_OPTIONS)
    positionals = [token for name, token in parsed or () if not name]
    if parsed is None or len(positionals) != 1:
        return None
    pid = positionals[0]
    return int(pid) if pid.isascii() and pid.isdigit() and int(pid) > 0 else None


def oom_file(argv: Sequence[str]) -> str | None:
    """The first --file of an `oom` command line that reads saved files only; None when
    ``argv`` is anything else or not certainly understood (a positional, --kmsg, --directory,
    --boot: a journal or the kernel's ring buffer, not a saved file)."""
    if not argv or argv[0] != "oom":
        return None
    parsed = _options(argv[1:], OOM_VALUE_OPTIONS, OOM_FLAG_OPTIONS)
    if parsed is None or any(name in ("", "--kmsg", "--directory", "--boot") for name, _ in parsed):
        return None
    files = [value for name, value in parsed if name == "--file"]
    return files[0] if files and files[0] != "-" else None


def begin(argv: Sequence[str]) -> None:
    """Pause the collector for an `inspect` command, and start reading its target's smaps
    (inspect_pid); start the search of the first saved log of an `oom --file LOG …`
    command."""
    path = oom_file(argv)
    if path is not None:
        pause_collector()  # `oom` resumes it once imported, before it parses
        from memforensics.sources.logs import logsearch

        logsearch.start(path)
        return
    if argv and argv[0] == "inspect":
        pause_collector()
        pid = inspect_pid(argv)
        if pid is not None:
            from memforensics.sources.proc import smaps_ahead

            smaps_ahead.start(pid)


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
