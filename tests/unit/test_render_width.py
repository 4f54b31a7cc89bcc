"""Issue 10 item 6: the arena table fits 80 columns without cutting a number."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from memforensics.analysis.heap import analyze
from memforensics.render.heap import arena_table
from memforensics.sources.malloc_info.malloc_xml import parse_dump

FIXTURES = Path(__file__).resolve().parent.parent.parent / "fixtures"


def test_wide_figures_fit_80_columns_and_only_the_bar_gives_way() -> None:
    analysis = analyze(parse_dump((FIXTURES / "arena-max-1.xml").read_bytes(), name="x"))
    wide = replace(
        analysis.arenas[0],
        index=1499,
        suspect=True,
        system_bytes=237_300 * 1024 * 1024 // 1000,
        in_use_bytes=79_100 * 1024 * 1024 // 1000,
        free_bytes=158_200 * 1024 * 1024 // 1000,
        top_bytes=33_900 * 1024 * 1024 // 1000,
        subheaps=1234,
    )
    analysis = replace(analysis, arenas=(wide,) * 3)
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(arena_table(analysis, top=3))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    row = next(line for line in lines if "1499 !" in line)
    for figure in ("237.3 MiB", "79.1 MiB", "158.2 MiB", "33.9 MiB", "1234"):
        assert figure in row, row
