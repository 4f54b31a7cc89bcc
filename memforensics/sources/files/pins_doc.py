"""The heap picture read back from a saved `inspect --json --pins` document (its `pins`,
`pin_heaps` and `heap_maps`), every value checked: what `report --html` draws."""

from __future__ import annotations

from array import array
from typing import Any

from memforensics.errors import InputDataError
from memforensics.model.pins import HeapMap, HeapPicture, HeapPins, Pin

_MAX_CELLS = 1 << 16
_MAX_HEAPS = 1 << 16
_LAYERS = ("live", "free_resident", "free_released", "top", "other")


def _int(value: Any, what: str, source: str, *, null: bool = False) -> Any:
    if value is None and null:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 64:
        raise InputDataError(f"{what}: not a byte count or address", source=source)
    return value


def _text(value: Any, what: str, source: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise InputDataError(f"{what}: not a string", source=source)


def _pin(item: Any, source: str) -> Pin:
    if not isinstance(item, dict):
        raise InputDataError("pins[]: not an object", source=source)
    return Pin(
        arena=_int(item.get("arena"), "pins[].arena", source),
        heap=_int(item.get("heap"), "pins[].heap", source),
        address=_int(item.get("address"), "pins[].address", source),
        chunk_bytes=_int(item.get("chunk_bytes"), "pins[].chunk_bytes", source),
        pinned_free_bytes=_int(item.get("pinned_free_bytes"), "pins[].pinned_free_bytes", source),
        resident_bytes=_int(item.get("resident_bytes"), "pins[].resident_bytes", source, null=True),
        rank=_int(item.get("rank"), "pins[].rank", source),
        type=_text(item.get("type"), "pins[].type", source),
        kind=_text(item.get("kind"), "pins[].kind", source),
        preview=_text(item.get("preview"), "pins[].preview", source),
    )


def _cells(item: dict[str, Any], layer: str, source: str) -> array[int]:
    cells = item.get("cells")
    values = cells.get(layer) if isinstance(cells, dict) else None
    if not isinstance(values, list) or len(values) > _MAX_CELLS:
        raise InputDataError(f"heap_maps.heaps[].cells.{layer}: not a list of cells", source=source)
    out: array[int] = array("Q")
    for value in values:
        out.append(_int(value, f"heap_maps.heaps[].cells.{layer}[]", source))
    return out


def _map(item: Any, source: str) -> HeapMap:
    if not isinstance(item, dict):
        raise InputDataError("heap_maps.heaps[]: not an object", source=source)
    layers = {layer: _cells(item, layer, source) for layer in _LAYERS}
    if len({len(values) for values in layers.values()}) != 1 or not layers["live"]:
        raise InputDataError("heap_maps.heaps[]: layers of different lengths", source=source)
    page = _int(item.get("page_bytes"), "heap_maps.heaps[].page_bytes", source)
    per_cell = _int(item.get("pages_per_cell"), "heap_maps.heaps[].pages_per_cell", source)
    if page == 0 or per_cell == 0:
        raise InputDataError("heap_maps.heaps[]: a cell of no bytes", source=source)
    return HeapMap(
        arena=_int(item.get("arena"), "heap_maps.heaps[].arena", source),
        heap=_int(item.get("heap"), "heap_maps.heaps[].heap", source),
        start=_int(item.get("start"), "heap_maps.heaps[].start", source),
        end=_int(item.get("end"), "heap_maps.heaps[].end", source),
        page_bytes=page,
        pages_per_cell=per_cell,
        **layers,
    )


def _heap(item: Any, pins: list[Pin], source: str) -> HeapPins:
    if not isinstance(item, dict):
        raise InputDataError("pin_heaps[]: not an object", source=source)
    arena = _int(item.get("arena"), "pin_heaps[].arena", source)
    heap = _int(item.get("heap"), "pin_heaps[].heap", source)
    figures = {
        key: _int(item.get(key), f"pin_heaps[].{key}", source)
        for key in (
            "start",
            "end",
            "heap_bytes",
            "live_bytes",
            "free_bytes",
            "top_bytes",
            "held_free_bytes",
            "threshold_bytes",
            "pins_omitted",
        )
    }
    return HeapPins(
        arena=arena,
        heap=heap,
        pins=tuple(p for p in pins if (p.arena, p.heap) == (arena, heap)),
        complete=bool(item.get("complete")),
        **figures,
    )


def picture_from_document(document: dict[str, Any], source: str) -> HeapPicture | None:
    """The picture a heap document carries, or None when it carries none (no `--pins`)."""
    pins, heaps, maps = document.get("pins"), document.get("pin_heaps"), document.get("heap_maps")
    if pins is None or heaps is None or maps is None:
        return None
    if not (isinstance(pins, list) and isinstance(heaps, list) and isinstance(maps, dict)):
        raise InputDataError("pins, pin_heaps or heap_maps: not lists", source=source)
    drawn = maps.get("heaps")
    if not isinstance(drawn, list) or len(drawn) != len(heaps) or len(heaps) > _MAX_HEAPS:
        raise InputDataError("heap_maps.heaps: not one map per heap", source=source)
    read = [_pin(item, source) for item in pins]
    return HeapPicture(
        heaps=tuple(_heap(item, read, source) for item in heaps),
        maps=tuple(_map(item, source) for item in drawn),
        resident_known=bool(maps.get("resident_known")),
    )
