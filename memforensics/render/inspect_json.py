"""`memforensics inspect --json`: the ``memforensics/heap/1`` document of a live process plus
who it is, its pause, residency and waterfall (docs/json.md), without importing rich."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memforensics.render.foreign_json import allocator_json
from memforensics.render.heap_json import heap_document
from memforensics.render.pins_json import heap_maps_json, pin_heaps_json, pins_json
from memforensics.render.process_json import process_json, residency_json, waterfall_json

if TYPE_CHECKING:
    from memforensics.model.inspection import Inspection


def inspection_document(result: Inspection) -> dict[str, Any]:
    """The heap document plus process, pause, safe point, residency, waterfall and pins."""
    document = heap_document(result.analysis, extra_advice=result.extra_advice)
    document["process"] = process_json(result.facts, result.memory)
    document["pause_seconds"] = round(result.capture.pause_seconds, 6)
    document["safe_point"] = result.capture.safe_point
    document["residency"] = residency_json(result.residency) if result.residency else None
    document["waterfall"] = waterfall_json(result.waterfall) if result.waterfall else None
    document["residency_error"] = result.residency_error
    # Kept for the scripts that read it (keys are never removed): no gdb stands in any more.
    document["gdb_fallback"] = None
    fallback = result.fallback
    document["fallback"] = (
        {"way": fallback.way, "reason": fallback.reason} if fallback is not None else None
    )
    document["allocator"] = allocator_json(result.facts.allocator, result.foreign)
    picture = result.picture
    document["pins"] = pins_json(picture) if picture is not None else None
    document["pin_heaps"] = pin_heaps_json(picture) if picture is not None else None
    document["pins_error"] = (
        (result.pins_error or "read through gdb, which walks no chunks")
        if picture is None
        else None
    )
    document["heap_maps"] = heap_maps_json(picture, lazy=True) if picture is not None else None
    read = result.read_only
    document["read_only"] = (
        None
        if read is None
        else {
            "source": read.source,
            "stops": read.stops,
            "longest_stop_seconds": round(read.longest_stop_seconds, 6),
            "total_stop_seconds": round(read.total_stop_seconds, 6),
            "lock_retries": read.lock_retries,
            "malloc_par_layout": read.malloc_par_layout,
            "glibc_version": read.glibc_version,
            "heap_info_bytes": read.heap_info_bytes,
            "tcache_chunk_bytes": read.tcache_chunk_bytes,
            "read_seconds": round(read.read_seconds, 6),
            "stop_copy_bytes": read.stop_copy_bytes,
            "scouted_arenas": read.scouted_arenas,
            "scout_kept_arenas": read.scout_kept_arenas,
            "walked_before_stop_arenas": read.walked_before_stop_arenas,
            "parted_arenas": read.parted_arenas,
            "arena_parts": read.arena_parts,
            "relayed_arenas": read.relayed_arenas,
            "relay_stops": read.relay_stops,
            "swept_arenas": read.swept_arenas,
            "swept_in_one_stop_arenas": read.swept_in_one_stop_arenas,
        }
    )
    return document
