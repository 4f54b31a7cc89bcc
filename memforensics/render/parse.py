"""`memforensics parse` output: a file's series of dumps, its gates, and its heap document."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from memforensics.analysis.gates import GateViolation
from memforensics.model.heap_analysis import HeapAnalysis, SeriesRow
from memforensics.render.heap_json import heap_document
from memforensics.render.jsondoc import record
from memforensics.units import format_bytes


def series_table(name: str, series: Sequence[SeriesRow]) -> Table:
    """One row per dump of a file holding a series."""
    table = Table(title=f"{len(series)} dumps in {name}", title_justify="left")
    for column in ("#", "line", "arenas", "system", "in use", "free", "free %", "mmap"):
        table.add_column(column, justify="right")
    for row in series:
        table.add_row(
            str(row.sequence + 1),
            str(row.line),
            str(row.arenas),
            format_bytes(row.system_bytes),
            format_bytes(row.in_use_bytes),
            format_bytes(row.free_bytes),
            f"{row.free_ratio:.0%}",
            format_bytes(row.mmap_bytes),
        )
    return table


def parse_document(
    name: str,
    last: HeapAnalysis,
    series: Sequence[SeriesRow],
    violations: Sequence[tuple[int, GateViolation]],
) -> dict[str, Any]:
    """The heap document of a file's last dump, plus ``dumps``, ``series`` and ``gates``."""
    document = heap_document(last)
    document["source"] = name
    document["dumps"] = len(series)
    if len(series) > 1:
        document["series"] = [record(row) for row in series]
    document["gates"] = [
        {"dump": sequence, **record(violation, rename={"arena_index": "arena"})}
        for sequence, violation in violations
    ]
    return document


def gate_line(name: str, dumps: int, sequence: int, violation: GateViolation) -> str:
    """One stderr line per violated gate, naming file (and dump in a series), arena, value."""
    where = name if dumps == 1 else f"{name}[dump {sequence + 1}]"
    return f"gate failed: {where}: {violation.message}"
