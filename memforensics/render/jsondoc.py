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
from itertools import chain, islice
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


_AS_IS = frozenset({int, str, bool, type(None)})
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
        # Counts, names and None pass as they are; only the rest goes through _plain.
        return {
            name: value if type(value) in _AS_IS else _plain(value)
            for name in names
            for value in (getattr(obj, name),)
        }
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


_KEY_TEXT: dict[str, str] = {}  # encoded keys: the same few dozen names, millions of times
_END = object()


def _key(name: str) -> str:
    text = _KEY_TEXT.get(name)
    if text is None:
        text = _KEY_TEXT[name] = encode_basestring_ascii(str(name)) + ": "
    return text


def _encode(value: Any, level: int, parts: list[str], flush: Callable[[], None]) -> None:
    """Append ``value``'s JSON text (``json.dumps(indent=2)`` layout) to ``parts``.

    Lists given as iterators are pulled one item at a time and ``flush`` is offered the text
    after each item, so a long lazy list is written as it is produced.
    """
    kind = type(value)
    if value is None or kind is int or kind is str or kind is bool or kind is float:
        parts.append(scalar_text(value))
    elif kind is Prerendered:
        parts.append(value.render(level))
    elif isinstance(value, Mapping):
        _encode_object(value, level, parts, flush)
    elif isinstance(value, Iterable) and not isinstance(value, (bytes, bytearray)):
        _encode_array(value, level, parts, flush)
    else:
        parts.append(scalar_text(value))


def _encode_object(
    value: Mapping[str, Any], level: int, parts: list[str], flush: Callable[[], None]
) -> None:
    if not value:
        parts.append("{}")
        return
    inner = "\n" + _INDENT * (level + 1)
    separator = "{" + inner
    for key, item in value.items():
        head = separator + (_KEY_TEXT.get(key) or _key(key))
        item_kind = type(item)
        if item_kind is int:  # most values are byte counts
            parts.append(head + int.__repr__(item))
        elif item is None or item_kind is str or item_kind is bool or item_kind is float:
            parts.append(head + scalar_text(item))
        else:
            parts.append(head)
            _encode(item, level + 1, parts, flush)
        separator = "," + inner
    parts.append("\n" + _INDENT * level + "}")


def _encode_array(
    value: Iterable[Any], level: int, parts: list[str], flush: Callable[[], None]
) -> None:
    lazy = not isinstance(value, (list, tuple))
    items = iter(value)
    first = next(items, _END)
    if first is _END:
        parts.append("[]")
        return
    inner = "\n" + _INDENT * (level + 1)
    separator = "[" + inner
    for item in chain((first,), items):
        parts.append(separator)
        _encode(item, level + 1, parts, flush)
        separator = "," + inner
        if lazy:
            flush()
    parts.append("\n" + _INDENT * level + "]")


def iter_json(value: Any) -> Iterator[str]:
    """Pieces of ``value``'s JSON text (``json.dumps(indent=2)`` layout)."""
    parts: list[str] = []
    _encode(value, 0, parts, lambda: None)
    yield from parts


def write_json(document: Any, write: Callable[[str], Any], *, buffer_chars: int = 1 << 16) -> None:
    """Write ``document`` and a newline through ``write``, in pieces of about ``buffer_chars``.

    Lazy lists (``arenas`` of a big dump) are written item by item, never held whole.
    """
    parts: list[str] = []
    counted = [0, 0]  # characters in parts[: counted[1]], which is counted[0]

    def flush() -> None:
        # Each piece is measured once: summing every piece at each item of a long lazy list
        # cost as much as encoding it.
        counted[0] += sum(map(len, islice(parts, counted[1], None)))
        counted[1] = len(parts)
        if counted[1] > 64 and counted[0] >= buffer_chars:
            write("".join(parts))
            parts.clear()
            counted[:] = [0, 0]

    _encode(document, 0, parts, flush)
    parts.append("\n")
    write("".join(parts))
