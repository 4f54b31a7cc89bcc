"""The pins of `inspect --json` (docs/json.md): each pin with its sentence, and each heap's
figures the pins are measured against; the heap maps are left to the HTML picture."""

from __future__ import annotations

from typing import Any

from memforensics.analysis.pins import pin_sentence
from memforensics.model.pins import HeapPicture
from memforensics.render.jsondoc import record


def pins_json(picture: HeapPicture) -> list[dict[str, Any]]:
    """``pins[]``: every heap's pins, each heap's from the top down."""
    return [{**record(pin), "sentence": pin_sentence(pin)} for pin in picture.pins]


def pin_heaps_json(picture: HeapPicture) -> list[dict[str, Any]]:
    """``pin_heaps[]``: each heap walked, its figures and how many pins were not listed."""
    return [record(heap, drop=("pins",)) | {"pins": len(heap.pins)} for heap in picture.heaps]
