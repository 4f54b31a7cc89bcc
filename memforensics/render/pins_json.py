"""The pins of `inspect --json` (docs/json.md): each pin with its sentence, each heap's
figures the pins are measured against, and each heap's map at most JSON_MAP_CELLS cells (what
`report --html` draws from a saved document)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from memforensics.model.pins import HeapMap, HeapPicture
from memforensics.render.jsondoc import record

JSON_MAP_CELLS = 512
MAP_LAYERS = ("live", "free_resident", "free_released", "top", "other")


def pins_json(picture: HeapPicture) -> list[dict[str, Any]]:
    """``pins[]``: every heap's pins, each heap's from the top down."""
    # (analysis.pins imports numpy: only a document with pins pays for it, not every
    # `inspect --json`.)
    from memforensics.analysis.pins import pin_sentence

    return [{**record(pin), "sentence": pin_sentence(pin)} for pin in picture.pins]


def pin_heaps_json(picture: HeapPicture) -> list[dict[str, Any]]:
    """``pin_heaps[]``: each heap walked, its figures and how many pins were not listed."""
    return [record(heap, drop=("pins",)) | {"pins": len(heap.pins)} for heap in picture.heaps]


def heap_maps_json(picture: HeapPicture, *, lazy: bool = False) -> dict[str, Any]:
    """``heap_maps``: whether residency was known, and each heap's map in cells of
    ``pages_per_cell`` pages, one list of each cell's bytes per layer. ``lazy``: the heaps
    are an iterator, made one by one as jsondoc.write_json writes them (a thousand heaps'
    cells as Python lists would cost tens of MiB), to be written once."""
    heaps: Iterable[dict[str, Any]] = map(_map_json, picture.maps)
    return {"resident_known": picture.resident_known, "heaps": heaps if lazy else list(heaps)}


def _map_json(cells: HeapMap) -> dict[str, Any]:
    from memforensics.analysis.pins import coarser

    small = coarser(cells, JSON_MAP_CELLS)
    return {
        "arena": small.arena,
        "heap": small.heap,
        "start": small.start,
        "end": small.end,
        "page_bytes": small.page_bytes,
        "pages_per_cell": small.pages_per_cell,
        # Lists of bytes, one per cell (not `*_bytes` keys: those are single counts).
        "cells": {layer: list(getattr(small, layer)) for layer in MAP_LAYERS},
    }
