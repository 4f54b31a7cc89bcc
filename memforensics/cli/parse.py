"""`memforensics parse`: the heap report from saved malloc_info XML, with CI gates."""

from __future__ import annotations

from dataclasses import dataclass, field

import click

from memforensics.analysis.gates import GateViolation, check_gates
from memforensics.analysis.heap import analyze, series_row
from memforensics.cli import COMMAND_SUMMARIES
from memforensics.cli.inputs import input_source
from memforensics.cli.options import (
    RATIO,
    SIZE,
    exit_codes_epilog,
    heap_view_options,
    json_option,
    verbose_files_option,
)
from memforensics.cli.output import emit_json, stderr_console, stdout_console
from memforensics.errors import EXIT_GATE
from memforensics.model.heap import HeapDump
from memforensics.model.heap_analysis import HeapAnalysis, SeriesRow
from memforensics.render.heap import render_heap
from memforensics.render.heap_sort import SortKey
from memforensics.render.parse import gate_line, parse_document, series_table
from memforensics.sources.malloc_info.malloc_xml import iter_dumps

EXAMPLES = """\b
Examples:
  memforensics parse dump.xml                 report on one saved dump
  memforensics parse --json dump.xml | jq .totals
  memforensics parse --max-free-ratio 50% --max-arenas 16 nightly.xml   # CI gate
  gdb -p PID -batch -ex '…malloc_info…' | memforensics parse -
\b
A file holding several dumps one after another (a process dumped periodically)
is read as a series: the report shows the last dump plus one line per dump, and
gates are checked on every dump. Files of any size are read in bounded memory.
\b
free    = fast + rest: chunks sitting in malloc's bins
in use  = system − free (an upper bound: tcache counts as in use)
mmap    = live allocations outside the arenas
"""


@dataclass
class FileResult:
    """What one input file produced: the last dump's analysis and the series behind it."""

    name: str
    last: HeapAnalysis
    series: list[SeriesRow] = field(default_factory=list)
    violations: list[tuple[int, GateViolation]] = field(default_factory=list)


def read_file(
    name: str,
    *,
    max_free_ratio: float | None,
    max_free_bytes: int | None,
    max_arenas: int | None,
    page_bytes: int | None = None,
) -> FileResult:
    """Parse every dump in ``name`` keeping only the last one whole (bounded memory).

    ``page_bytes``: the page size of the dump's machine (None: this machine's)."""
    source, label = input_source(name)
    last: HeapDump | None = None
    series: list[SeriesRow] = []
    violations: list[tuple[int, GateViolation]] = []
    status = stderr_console()
    with status.status(f"reading {label}…") as spinner:
        for dump in iter_dumps(source, name=label):
            last = dump
            series.append(series_row(dump))
            for violation in check_gates(
                dump,
                max_free_ratio=max_free_ratio,
                max_free_bytes=max_free_bytes,
                max_arenas=max_arenas,
            ):
                violations.append((dump.sequence, violation))
            if dump.sequence % 50 == 49:
                spinner.update(f"reading {label}… {dump.sequence + 1} dumps")
    assert last is not None  # iter_dumps raises when a file holds no dump
    return FileResult(label, analyze(last, page_bytes=page_bytes), series, violations)


def _power_of_two(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    if value is not None and (value < 4096 or value & (value - 1)):
        raise click.BadParameter(f"{value} is not a page size (a power of two, 4KiB or more)")
    return value


@click.command(
    name="parse",
    short_help=COMMAND_SUMMARIES["parse"],
    epilog=EXAMPLES + "\n" + exit_codes_epilog(),
)
@click.argument(
    "files",
    nargs=-1,
    required=True,
    type=click.Path(exists=True, dir_okay=False, allow_dash=True),
)
@json_option
@heap_view_options
@click.option(
    "--max-free-ratio",
    type=RATIO,
    default=None,
    help="Gate: fail (exit 1) if all arenas together, or any arena of 1 MiB or more, "
    "are freer than this (0.5 or 50%).",
)
@click.option(
    "--max-free",
    "max_free_bytes",
    type=SIZE,
    default=None,
    help="Gate: fail (exit 1) if free bytes across arenas exceed SIZE (e.g. 512MiB).",
)
@click.option(
    "--max-arenas",
    type=click.IntRange(min=0),
    default=None,
    help="Gate: fail (exit 1) if there are more arenas than this.",
)
@click.option(
    "--page-size",
    "page_bytes",
    type=SIZE,
    default=None,
    callback=_power_of_two,
    help="Page size of the machine the dumps come from, for the trim estimate "
    "(default: this machine's, e.g. 4KiB; 16KiB or 64KiB on some arm64 kernels).",
)
@verbose_files_option
def command(
    files: tuple[str, ...],
    as_json: bool,
    top: int,
    sort: SortKey,
    max_free_ratio: float | None,
    max_free_bytes: int | None,
    max_arenas: int | None,
    page_bytes: int | None,
    verbose: bool,
) -> None:
    """Report on saved glibc malloc_info XML dumps (FILE, or - for stdin)."""
    results = []
    out = stdout_console()
    for name in files:
        result = read_file(
            name,
            max_free_ratio=max_free_ratio,
            max_free_bytes=max_free_bytes,
            max_arenas=max_arenas,
            page_bytes=page_bytes,
        )
        results.append(result)
        if not as_json:
            sequence = result.last.dump.sequence
            title = (
                result.name
                if len(result.series) == 1
                else f"dump {sequence + 1} of {len(result.series)} — {result.name}"
            )
            if len(result.series) > 1:
                out.print(series_table(result.name, result.series))
            out.print(render_heap(result.last, top=top, sort=sort, title=title))
    if as_json:
        documents = [parse_document(r.name, r.last, r.series, r.violations) for r in results]
        # The shape follows the command line: one FILE an object, several an array.
        emit_json(documents if len(files) > 1 else documents[0])
    failed = False
    for result in results:
        for sequence, violation in result.violations:
            click.echo(gate_line(result.name, len(result.series), sequence, violation), err=True)
            failed = True
    if failed:
        click.get_current_context().exit(EXIT_GATE)
