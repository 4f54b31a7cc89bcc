"""`memforensics inspect` output: the heap report of a live process plus who it is and where
its RSS went, as rich renderables (the JSON document: render/inspect_json.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.text import Text

from memforensics.render.heap import render_heap
from memforensics.render.heap_sort import SortKey
from memforensics.render.process import render_process_header, render_waterfall

if TYPE_CHECKING:
    from memforensics.model.inspection import Inspection


def render_inspection(result: Inspection, *, top: int, sort: SortKey) -> RenderableType:
    """Process header, RSS waterfall and the heap report, in that order."""
    parts: list[RenderableType] = [
        render_process_header(
            result.facts, result.memory, pause_seconds=result.capture.pause_seconds
        ),
        Text(f"safe point: {result.capture.safe_point}", style="dim"),
    ]
    if result.gdb_fallback is not None:
        parts.append(
            Text(f"through gdb: the memory read was refused ({result.gdb_fallback})", style="dim")
        )
    parts.append(Text(""))
    if result.waterfall is not None:
        parts.extend([render_waterfall(result.waterfall), Text("")])
    elif result.residency_error:
        parts.append(Text(f"no residency figures: {result.residency_error}", style="dim"))
    title = f"PID {result.facts.pid} ({result.facts.name})"
    if result.foreign is not None:
        from memforensics.render.foreign import render_foreign

        parts.append(
            render_foreign(
                result.foreign,
                result.analysis,
                top=top,
                sort=sort,
                title=title,
                extra_advice=result.extra_advice,
            )
        )
    else:
        parts.append(
            render_heap(
                result.analysis, top=top, sort=sort, title=title, extra_advice=result.extra_advice
            )
        )
    return Group(*parts)
