"""The ``memforensics/heap/1`` JSON document of a heap analysis (docs/json.md), without rich.

Kept apart from the rich report (render/heap.py) so that ``--json`` never imports rich.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from memforensics.model.advice import Advice
from memforensics.model.heap import LINE_KINDS, Arena, SizeBucket, line_codes
from memforensics.model.heap_analysis import ArenaFigures, HeapAnalysis
from memforensics.render.jsondoc import Prerendered, record

HEAP_SCHEMA = "memforensics/heap/1"


def _sizes_text(sizes: Sequence[SizeBucket], level: int) -> str:
    """``arenas[].sizes`` as JSON text, exactly as ``json.dumps(indent=2)`` writes it.

    Every line has one of six shapes (kind x suspect), so a template of the arena's line
    shapes filled by one ``%`` over all its numbers writes a whole arena in two C calls; the
    generic encoder took seconds for the million lines of a big dump.
    """
    codes, numbers = line_codes(sizes)
    if not codes:
        return "[]"
    shapes = _line_shapes(level)
    outer = "\n" + "  " * (level + 1)
    template = "[" + outer + ("," + outer).join(map(shapes.__getitem__, codes))
    return template % tuple(numbers) + "\n" + "  " * level + "]"


@functools.lru_cache(maxsize=16)
def _line_shapes(level: int) -> tuple[str, ...]:
    """One bucket object's text per line code (model.heap.LINE_KINDS, +3 when suspect)."""
    outer = "\n" + "  " * (level + 1)
    key = outer + "  "
    shapes = []
    for suspect in ("false", "true"):
        for kind in LINE_KINDS:
            shapes.append(
                "{"
                + key
                + f'"kind": "{kind}",'
                + key
                + '"from_bytes": %d,'
                + key
                + '"to_bytes": %d,'
                + key
                + '"total_bytes": %d,'
                + key
                + '"count": %d,'
                + key
                + f'"suspect": {suspect}'
                + outer
                + "}"
            )
    return tuple(shapes)


def _arena_json(figures: ArenaFigures, arena: Arena) -> dict[str, Any]:
    document = record(figures)
    sizes = arena.sizes
    document["sizes"] = Prerendered(lambda level: _sizes_text(sizes, level))
    return document


def heap_document(
    analysis: HeapAnalysis, *, extra_advice: tuple[Advice, ...] = ()
) -> dict[str, Any]:
    """The ``memforensics/heap/1`` document (docs/json.md); parse and inspect add keys.

    ``arenas`` is produced lazily while the document is written (``write_json``).
    """
    dump = analysis.dump
    return {
        "schema": HEAP_SCHEMA,
        "source": dump.source,
        "sequence": dump.sequence,
        "malloc_version": dump.version,
        "totals": record(analysis.totals),
        "arenas": map(_arena_json, analysis.arenas, dump.arenas),
        "histogram": [record(row) for row in analysis.histogram],
        "advice": [record(item) for item in analysis.advice + extra_advice],
        "notes": list(analysis.notes),
    }
