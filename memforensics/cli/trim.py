"""`memforensics trim`: forecast, run and measure malloc_trim once or in rounds.

This module is the command line only; the work is in cli/trim_run.py, imported when the
command runs, so that `trim --help` does not load the gdb machinery and the renderers.
"""

from __future__ import annotations

import click

from memforensics.cli import COMMAND_SUMMARIES
from memforensics.cli.options import (
    DURATION,
    SIZE,
    accept_corrupt_risk_option,
    exit_codes_epilog,
    json_option,
    timeout_option,
    trim_gdb_option,
    verbose_option,
)


@click.command(name="trim", short_help=COMMAND_SUMMARIES["trim"], epilog=exit_codes_epilog())
@click.argument("pids", metavar="PID...", nargs=-1, type=click.IntRange(min=1))
@click.option(
    "--name",
    "names",
    multiple=True,
    metavar="REGEX",
    help="Also trim processes whose name or command line matches (repeatable).",
)
@click.option(
    "--pad",
    "pad_bytes",
    type=SIZE,
    default="0",
    show_default=True,
    help="Bytes malloc_trim leaves at the top of the main heap.",
)
@click.option(
    "--dry-run", is_flag=True, help="Forecast only: dump and measure, do not call malloc_trim."
)
@click.option(
    "--min-free",
    "min_free_bytes",
    type=SIZE,
    default="0",
    show_default=True,
    help="Trim only when the forecast (resident free memory) is at least this much.",
)
@click.option(
    "--interval",
    "interval_seconds",
    type=DURATION,
    default=None,
    help="Periodic mode: trim again every DURATION until Ctrl-C (or --count rounds).",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=None,
    help="Periodic mode: stop after N rounds (needs --interval).",
)
@json_option
@timeout_option("10s")
@trim_gdb_option
@accept_corrupt_risk_option
@verbose_option
def command(
    *,
    pids: tuple[int, ...],
    names: tuple[str, ...],
    pad_bytes: int,
    dry_run: bool,
    min_free_bytes: int,
    interval_seconds: float | None,
    count: int | None,
    as_json: bool,
    timeout_seconds: float,
    gdb_path: str | None,
    accept_corrupt_risk: bool,
    verbose: bool,
) -> None:
    """Give a process's free heap memory back to the OS with glibc's malloc_trim, and prove it.

    For each PID: measure RSS (total and anonymous), read the heap from the target's memory,
    forecast what a trim can release (whole resident pages inside free chunks), call
    malloc_trim(PAD) from a thread outside the allocator unless --dry-run or the forecast is
    below --min-free, and measure RSS again. The call needs no gdb (--gdb PATH calls through
    gdb instead); the thread restores itself even if memforensics is killed. The target is
    stopped for the reported pause.

    \b
    Examples:
      memforensics trim 1234                 trim once, show before/after/forecast
      memforensics trim --dry-run --name api forecast only, for every process matching 'api'
      memforensics trim 1234 --interval 5m --min-free 64MiB   trim every 5 min when worth it
    """
    if count is not None and interval_seconds is None:
        raise click.UsageError("--count needs --interval")
    if not pids and not names:
        raise click.UsageError("give at least one PID or --name")
    from memforensics.cli.trim_run import run_trim

    run_trim(
        pids=pids,
        names=names,
        pad_bytes=pad_bytes,
        dry_run=dry_run,
        min_free_bytes=min_free_bytes,
        interval_seconds=interval_seconds,
        count=count,
        as_json=as_json,
        timeout_seconds=timeout_seconds,
        gdb_path=gdb_path,
        verbose=verbose,
        accept_corrupt_risk=accept_corrupt_risk,
    )
