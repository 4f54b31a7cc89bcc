"""`memforensics census`: what fills the heap, live chunks by type (like `jmap -histo`)."""

from __future__ import annotations

import click

from memforensics.cli import COMMAND_SUMMARIES
from memforensics.cli.options import DURATION, exit_codes_epilog, json_option, verbose_option
from memforensics.cli.output import emit_json, stdout_console

EXAMPLES = """\b
Examples:
  memforensics census 4242
  memforensics census --top 20 4242
  memforensics census --json 4242 > before.json; sleep 3600
  memforensics census --json 4242 > after.json
  memforensics diff before.json after.json      # the type that grew first
  memforensics census --core core.4242
\b
Every live chunk of every arena (and every mmapped chunk) is classified:
c++ (by RTTI: vptr -> vtable -> type_info -> name; stripped binaries too),
python (by ob_type, also inside pymalloc's pools), text, zeros, pointers
(mostly pointers into the heap), and unknown by size class. The heap is read
from memory in short stops of every thread: no gdb, nothing run in the
target. See docs/census.md.
"""


@click.command(
    name="census",
    short_help=COMMAND_SUMMARIES["census"],
    epilog=EXAMPLES + "\n" + exit_codes_epilog(),
)
@click.argument("pids", nargs=-1, type=click.IntRange(min=1), metavar="PID...")
@click.option(
    "--core",
    "core_path",
    type=click.Path(exists=True, dir_okay=False),
    help="Read a core file (the kernel's or gdb's gcore) instead of a live process.",
)
@click.option(
    "--sysroot",
    type=click.Path(exists=True, file_okay=False),
    help="With --core: where the dead machine's files are (libstdc++, python).",
)
@click.option(
    "--top",
    type=click.IntRange(min=1),
    default=None,
    help="Show the N biggest types and one 'other' line (default: every type).",
)
@click.option(
    "--timeout",
    "timeout_seconds",
    type=DURATION,
    default="1s",
    show_default=True,
    help="How long an arena may stay locked before it is read anyway (validated).",
)
@click.option(
    "--max-pause",
    "max_pause_seconds",
    type=DURATION,
    default=None,
    help="Stop reading once the target's stops add up to this (a census of a heap of "
    "several GiB stops it for seconds in all, in stops of a few ms each); what was not "
    "read is reported, counted in no type. Default: read the whole heap.",
)
@json_option
@verbose_option
def command(
    pids: tuple[int, ...],
    core_path: str | None,
    sysroot: str | None,
    top: int | None,
    timeout_seconds: float,
    max_pause_seconds: float | None,
    as_json: bool,
    verbose: bool,
) -> None:
    """Count the live chunks of PID's heap by type (or of a core with --core)."""
    from memforensics.entry.census import census_core, census_live
    from memforensics.render.census_json import census_json

    if bool(pids) == bool(core_path):
        raise click.UsageError("give either PID... or --core FILE")
    if core_path is not None and max_pause_seconds is not None:
        raise click.UsageError("--max-pause applies to a live PID: a core is never stopped")
    results = []
    warnings: tuple[str, ...] = ()
    if core_path is not None:
        census, warnings = census_core(core_path, sysroot=sysroot)
        results.append((census, f"core {core_path}"))
    else:
        for pid in pids:
            census = census_live(
                pid, timeout_seconds=timeout_seconds, pause_budget_seconds=max_pause_seconds
            )
            results.append((census, f"pid:{pid}"))
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    if as_json:
        documents = [census_json(c, source=s, top=top) for c, s in results]
        emit_json(documents[0] if len(documents) == 1 else documents)
        return
    from memforensics.render.census import render_census

    console = stdout_console()
    for census, source in results:
        console.print(render_census(census, source=source, top=top))
