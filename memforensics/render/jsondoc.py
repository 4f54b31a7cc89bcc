"""JSON documents: built from model records by one mechanism, and written out piece by piece.

``record(obj)`` turns a frozen dataclass into the JSON object of the same fields in the same
order, so a new model field is a new key with no second edit (then say it in docs/json.md).
``write_json`` writes a document the way ``json.dumps(document, indent=2)`` would, but pulls
lists given as iterators lazily and writes as it goes, so a report of a million bucket lines is
never held whole as one string; values that render themselves (:class:`Prerendered`) let a
hot, fixed-shape part skip the generic encoder.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import chain
from json.encoder import encode_basestring_ascii
from typing import Any

# Ratios and durations are rounded to this many decimals in every document.
FLOAT_DECIMALS = 6
_INDENT = "  "


class Prerendered:
    """A value that writes its own JSON text, given the indentation of its nesting level."""

    __slots__ = ("_render",)

    def __init__(self, render: Callable[[int], str]) -> None:
        self._render = render

    def render(self, level: int) -> str:
        """The value's text for nesting ``level`` (0 = the document itself)."""
        return self._render(level)


def _plain(value: Any) -> Any:
    kind = type(value)
    if value is None or kind is int or kind is str or kind is bool:
        return value  # the common case first: most fields are counts
    if kind is float:
        return round(value, FLOAT_DECIMALS)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return record(value)
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(kind: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(kind)
    if names is None:
        names = _FIELD_NAMES[kind] = tuple(field.name for field in dataclasses.fields(kind))
    return names


def record(
    obj: Any, *, drop: Iterable[str] = (), rename: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The JSON object of a dataclass: its fields in order, nested records, floats rounded.

    ``drop`` leaves fields out; ``rename`` maps a field to its published key.
    """
    names = _field_names(type(obj))
    if not drop and not rename:
        return {name: _plain(getattr(obj, name)) for name in names}
    skip = set(drop)
    published = rename or {}
    return {
        published.get(name, name): _plain(getattr(obj, name)) for name in names if name not in skip
    }


def scalar_text(value: Any) -> str:
    """One JSON scalar exactly as ``json.dumps`` writes it."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return float.__repr__(value)
    if isinstance(value, str):
        text: str = encode_basestring_ascii(value)
        return text
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def iter_json(value: Any, level: int = 0) -> Iterator[str]:
    """Pieces of ``value``'s JSON text (``json.dumps(indent=2)`` layout), produced lazily."""
    if isinstance(value, Prerendered):
        yield value.render(level)
    elif isinstance(value, Mapping):
        if not value:
            yield "{}"
            return
        inner = "\n" + _INDENT * (level + 1)
        separator = "{" + inner
        for key, item in value.items():
            head = f"{separator}{encode_basestring_ascii(str(key))}: "
            if item is None or isinstance(item, (str, int, float)):
                yield head + scalar_text(item)  # most values: no nested generator
            else:
                yield head
                yield from iter_json(item, level + 1)
            separator = "," + inner
        yield "\n" + _INDENT * level + "}"
    elif isinstance(value, (list, tuple)) or (
        isinstance(value, Iterable) and not isinstance(value, (str, bytes))
    ):
        items = iter(value)
        first = next(items, _END)
        if first is _END:
            yield "[]"
            return
        inner = "\n" + _INDENT * (level + 1)
        separator = "[" + inner
        for item in chain((first,), items):
            yield separator
            yield from iter_json(item, level + 1)
            separator = "," + inner
        yield "\n" + _INDENT * level + "]"
    else:
        yield scalar_text(value)


_END = object()


def write_json(document: Any, write: Callable[[str], Any], *, buffer_chars: int = 1 << 16) -> None:
    """Write ``document`` and a newline through ``write`` in pieces of about ``buffer_chars``."""
    pending: list[str] = []
    size = 0
    for piece in iter_json(document):
        pending.append(piece)
        size += len(piece)
        if size >= buffer_chars:
            write("".join(pending))
            pending, size = [], 0
    pending.append("\n")
    write("".join(pending))
