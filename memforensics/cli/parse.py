"""`memforensics parse`: the heap report from saved malloc_info XML, with CI gates."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import click
from rich.table import Table

from memforensics.analysis.gates import GateViolation, check_gates
from memforensics.analysis.heap import HeapAnalysis, analyze
from memforensics.cli.options import (
    RATIO,
    SIZE,
    exit_codes_epilog,
    heap_view_options,
    json_option,
    verbose_option,
)
from memforensics.cli.output import emit_json, stderr_console, stdout_console
from memforensics.errors import EXIT_GATE
from memforensics.model.heap import HeapDump
from memforensics.render.heap import SortKey, heap_json, render_heap
from memforensics.sources.malloc_xml import iter_dumps
from memforensics.units import format_bytes

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
    series: list[dict[str, Any]] = field(default_factory=list)
    violations: list[tuple[int, GateViolation]] = field(default_factory=list)


def _series_row(dump: HeapDump) -> dict[str, Any]:
    return {
        "sequence": dump.sequence,
        "line": dump.line,
        "arenas": len(dump.arenas),
        "system_bytes": dump.system_bytes,
        "free_bytes": dump.free_bytes,
        "in_use_bytes": dump.in_use_bytes,
        "mmap_bytes": dump.mmap_bytes,
        "free_ratio": round(dump.free_ratio, 6),
    }


def read_file(
    name: str,
    *,
    max_free_ratio: float | None,
    max_free_bytes: int | None,
    max_arenas: int | None,
) -> FileResult:
    """Parse every dump in ``name`` keeping only the last one whole (bounded memory)."""
    source = sys.stdin.buffer if name == "-" else name
    label = "<stdin>" if name == "-" else name
    last: HeapDump | None = None
    series: list[dict[str, Any]] = []
    violations: list[tuple[int, GateViolation]] = []
    status = stderr_console()
    with status.status(f"reading {label}…") as spinner:
        for dump in iter_dumps(source, name=label):
            last = dump
            series.append(_series_row(dump))
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
    return FileResult(label, analyze(last), series, violations)


def _series_table(result: FileResult) -> Table:
    table = Table(title=f"{len(result.series)} dumps in {result.name}", title_justify="left")
    for column in ("#", "line", "arenas", "system", "in use", "free", "free %", "mmap"):
        table.add_column(column, justify="right")
    for row in result.series:
        table.add_row(
            str(row["sequence"] + 1),
            str(row["line"]),
            str(row["arenas"]),
            format_bytes(row["system_bytes"]),
            format_bytes(row["in_use_bytes"]),
            format_bytes(row["free_bytes"]),
            f"{row['free_ratio']:.0%}",
            format_bytes(row["mmap_bytes"]),
        )
    return table


def _document(result: FileResult) -> dict[str, Any]:
    document = heap_json(result.last)
    document["source"] = result.name
    document["dumps"] = len(result.series)
    if len(result.series) > 1:
        document["series"] = result.series
    document["gates"] = [
        {
            "gate": v.gate,
            "dump": sequence,
            "arena": v.arena_index,
            "value": v.value,
            "limit": v.limit,
            "message": v.message,
        }
        for sequence, v in result.violations
    ]
    return document


def gate_line(result: FileResult, sequence: int, violation: GateViolation) -> str:
    """One stderr line per violated gate, naming file (and dump in a series), arena, value."""
    where = result.name if len(result.series) == 1 else f"{result.name}[dump {sequence + 1}]"
    return f"gate failed: {where}: {violation.message}"


@click.command(name="parse", epilog=EXAMPLES + "\n" + exit_codes_epilog())
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
@verbose_option
def command(
    files: tuple[str, ...],
    as_json: bool,
    top: int,
    sort: SortKey,
    max_free_ratio: float | None,
    max_free_bytes: int | None,
    max_arenas: int | None,
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
                out.print(_series_table(result))
            out.print(render_heap(result.last, top=top, sort=sort, title=title))
    if as_json:
        documents = [_document(r) for r in results]
        emit_json(documents[0] if len(documents) == 1 else documents)
    failed = False
    for result in results:
        for sequence, violation in result.violations:
            click.echo(gate_line(result, sequence, violation), err=True)
            failed = True
    if failed:
        click.get_current_context().exit(EXIT_GATE)
