"""Options and parameter types shared by every command (defined once, reused)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from memforensics.errors import EXIT_CODE_TABLE
from memforensics.units import parse_duration, parse_size

F = TypeVar("F", bound=Callable[..., Any])


def exit_codes_epilog() -> str:
    """The exit-code table for every command's --help (``\\b`` keeps click from rewrapping)."""
    rows = "\n".join(f"  {code}  {meaning}" for code, meaning in EXIT_CODE_TABLE)
    return f"\b\nExit codes:\n{rows}"


class SizeType(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.4
    """A byte size in human units: 4096, 512KiB, 64MiB, 2GiB."""

    name = "SIZE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class DurationType(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.4
    """A duration: 500ms, 10s, 5m, 1h, or a bare number of seconds."""

    name = "DURATION"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        try:
            seconds = parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if seconds <= 0:
            self.fail(f"{value!r} must be longer than zero", param, ctx)
        return seconds


class RatioType(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.4
    """A ratio between 0 and 1, also accepted as a percentage (``0.5`` or ``50%``)."""

    name = "RATIO"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        text = str(value).strip()
        try:
            ratio = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            self.fail(f"{value!r} is not a ratio (try 0.5 or 50%)", param, ctx)
        if not 0 <= ratio <= 1:
            self.fail(f"{value!r} is outside 0..1 (0%..100%)", param, ctx)
        return ratio


SIZE = SizeType()
DURATION = DurationType()
RATIO = RatioType()


def json_option(func: F) -> F:
    """``--json``: one JSON document on stdout instead of the human report."""
    return click.option(
        "--json", "as_json", is_flag=True, help="Print one JSON document on stdout (for scripts)."
    )(func)


def verbose_option_showing(what: str) -> Callable[[F], F]:
    """``-v``: show ``what`` and tracebacks on stderr (each command says what it has to show)."""

    def remember(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
        if value:
            ctx.find_root().meta["memforensics.verbose"] = True
        return value

    return click.option(
        "-v",
        "--verbose",
        is_flag=True,
        callback=remember,
        expose_value=True,
        help=f"Show {what} on stderr.",
    )


# The live commands: gdb's exchange where gdb is used; oom: journalctl's; files: tracebacks.
verbose_option = verbose_option_showing(
    "the gdb/MI exchange (where gdb is used) and full tracebacks"
)
verbose_journal_option = verbose_option_showing("the journalctl exchange and full tracebacks")
verbose_files_option = verbose_option_showing("full tracebacks")


TIMEOUT_HELP = (
    "Give up (exit 6, target left running) if a safe point or a call takes longer; a read "
    "from memory has at least this long (more for big heaps)."
)


def timeout_option(default: str = "10s", *, help_text: str = TIMEOUT_HELP) -> Callable[[F], F]:
    """``--timeout``: deadline for reaching a safe point and for each call into the target,
    and the least time a read from memory has (entry.readers.memory.read_budget_seconds)."""
    return click.option(
        "--timeout",
        "timeout_seconds",
        type=DURATION,
        default=default,
        show_default=True,
        help=help_text,
    )


def gdb_option_with(help_text: str) -> Callable[[F], F]:
    """``--gdb PATH``: make the command's call into the target through this gdb."""
    return click.option(
        "--gdb",
        "gdb_path",
        type=click.Path(dir_okay=False),
        default=None,
        metavar="PATH",
        help=help_text,
    )


def accept_corrupt_risk_option(func: F) -> F:
    """``--accept-corrupt-heap-risk``: with ``--gdb``, call into a heap found corrupt."""
    return click.option(
        "--accept-corrupt-heap-risk",
        "accept_corrupt_risk",
        is_flag=True,
        help="With --gdb: call malloc_info/malloc_trim even into a heap found corrupt. The "
        "call follows the corrupt lists: it may hang the target for good or crash it, and "
        "leave an arena's lock held. Without it a corrupt heap is reported (exit 8), never "
        "called into.",
    )(func)


# inspect and demo's inspection (entry.inspect.inspect_method).
gdb_option = gdb_option_with(
    "Read the heap through this gdb: malloc_info called at a safe point ('gdb': the one on "
    "PATH). Without it no gdb is used: the heap is read from the target's memory, and only "
    "where that read is impossible is malloc_info called, through a frame that restores "
    "the thread by itself (--read-only: never)."
)
# watch and collect (entry.inspect.sample_method).
sample_gdb_option = gdb_option_with(
    "Read each sample through this gdb: malloc_info called at a safe point ('gdb': the one "
    "on PATH). Without it no gdb is used and nothing is called: each sample is read from "
    "the target's memory, and a read that is refused is a gap in the series."
)
# trim: the read and the call.
trim_gdb_option = gdb_option_with(
    "Read the heap and call malloc_trim through this gdb, at a safe point ('gdb': the one on "
    "PATH). Without it no gdb is used: the heap is read from memory and the call restores its "
    "thread by itself; gdb makes the call only where this machine cannot (not x86-64, a "
    "shadow stack)."
)


def read_only_option_with(help_text: str) -> Callable[[F], F]:
    """``--read-only``: heap figures read from the target's memory, with no gdb and no call."""
    return click.option("--read-only", "read_only", is_flag=True, help=help_text)


read_only_option = read_only_option_with(
    "No call into the target: where malloc_info cannot be rebuilt from its memory (glibc "
    "2.26+, 64-bit; docs/inspect.md), fail instead of calling it (without gdb)."
)
# watch and collect: their samples never fall back to a call (entry.inspect.sample_method).
sample_read_only_option = read_only_option_with(
    "Read each sample from the target's memory, with no gdb: the default here (a refused "
    "read is a gap, never a gdb session); kept for scripts that pass it."
)


def heap_view_options(func: F) -> F:
    """``--top N`` and ``--sort KEY`` for the per-arena table of a heap report."""
    from memforensics.render.heap_sort import SORT_KEYS

    func = click.option(
        "--sort",
        type=click.Choice(SORT_KEYS),
        default="free",
        show_default=True,
        help="Order of the arena table.",
    )(func)
    return click.option(
        "--top",
        type=click.IntRange(min=0),
        default=20,
        show_default=True,
        help="Show this many arenas (0: all).",
    )(func)
