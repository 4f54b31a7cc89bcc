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
    from memforensics.model.pins import HeapPicture

SHOWN_PINS = 5


def render_pins(picture: HeapPicture) -> list[RenderableType]:
    """The pins, one sentence each, the biggest first (at most SHOWN_PINS of them)."""
    from memforensics.analysis.pins import pin_sentence
    from memforensics.units import format_bytes

    pins = sorted(picture.pins, key=lambda pin: -pin.pinned_free_bytes)
    held = sum(heap.held_free_bytes for heap in picture.heaps)
    lines: list[RenderableType] = [
        Text(
            f"Pins: {format_bytes(held)} of free memory lies below the topmost live chunk of "
            f"{len(picture.heaps)} heap{'s' if len(picture.heaps) != 1 else ''}",
            style="bold",
        )
    ]
    if not pins and held:
        lines.append(
            Text(
                "no single live chunk holds 1 MiB (or 1% of its heap) of it: many small live "
                "chunks hold it between them (fragmentation); malloc_trim can cut its whole "
                "free pages, free() cannot return it"
            )
        )
    for pin in pins[:SHOWN_PINS]:
        lines.append(Text(pin_sentence(pin)))
    partial = [heap for heap in picture.heaps if not heap.complete]
    if partial:
        lines.append(
            Text(
                f"{len(partial)} heap walk{'s' if len(partial) != 1 else ''} stopped early "
                "(a header it could not trust): pins above that point are not known",
                style="dim",
            )
        )
    if len(pins) > SHOWN_PINS:
        lines.append(Text(f"… and {len(pins) - SHOWN_PINS} more (--json lists them)", style="dim"))
    return lines


def render_inspection(result: Inspection, *, top: int, sort: SortKey) -> RenderableType:
    """Process header, RSS waterfall and the heap report, in that order."""
    parts: list[RenderableType] = [
        render_process_header(
            result.facts, result.memory, pause_seconds=result.capture.pause_seconds
        ),
        Text(f"safe point: {result.capture.safe_point}", style="dim"),
    ]
    if result.fallback is not None:
        parts.append(
            Text(
                f"malloc_info called without gdb: the memory read was refused "
                f"({result.fallback.reason})",
                style="dim",
            )
        )
    parts.append(Text(""))
    if result.waterfall is not None:
        parts.extend([render_waterfall(result.waterfall), Text("")])
    elif result.residency_error:
        parts.append(Text(f"no residency figures: {result.residency_error}", style="dim"))
    if result.picture is not None:
        parts.extend([*render_pins(result.picture), Text("")])
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
