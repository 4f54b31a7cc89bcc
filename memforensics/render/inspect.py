"""`memforensics inspect` output: the heap report of a live process plus who it is and where
its RSS went, as rich renderables and as the ``memforensics/heap/1`` document."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.text import Text

from memforensics.render.heap import heap_document, render_heap
from memforensics.render.heap_sort import SortKey
from memforensics.render.process import (
    process_json,
    render_process_header,
    render_waterfall,
    residency_json,
    waterfall_json,
)

if TYPE_CHECKING:
    from memforensics.live import Inspection


def inspection_document(result: Inspection) -> dict[str, Any]:
    """The heap document plus process, pause, safe point, residency and waterfall."""
    document = heap_document(result.analysis, extra_advice=result.extra_advice)
    document["process"] = process_json(result.facts, result.memory)
    document["pause_seconds"] = round(result.capture.pause_seconds, 6)
    document["safe_point"] = result.capture.safe_point
    document["residency"] = residency_json(result.residency) if result.residency else None
    document["waterfall"] = waterfall_json(result.waterfall) if result.waterfall else None
    document["residency_error"] = result.residency_error
    return document


def render_inspection(result: Inspection, *, top: int, sort: SortKey) -> RenderableType:
    """Process header, RSS waterfall and the heap report, in that order."""
    parts: list[RenderableType] = [
        render_process_header(
            result.facts, result.memory, pause_seconds=result.capture.pause_seconds
        ),
        Text(f"safe point: {result.capture.safe_point}", style="dim"),
        Text(""),
    ]
    if result.waterfall is not None:
        parts.extend([render_waterfall(result.waterfall), Text("")])
    elif result.residency_error:
        parts.append(Text(f"no residency figures: {result.residency_error}", style="dim"))
    parts.append(
        render_heap(
            result.analysis,
            top=top,
            sort=sort,
            title=f"PID {result.facts.pid} ({result.facts.name})",
            extra_advice=result.extra_advice,
        )
    )
    return Group(*parts)
