"""JSON documents against docs/json.md: required keys, and the value rules every key obeys.

The required keys come from the ```keys SCHEMA``` blocks of docs/json.md. A path through a
list (``a[].b``) must reach at least one element: an empty list proves nothing, so it counts as
missing unless the caller says that list may be empty. Values are checked by the naming
contract (docs/json.md): ``*_bytes`` are integers (or null), ``*_seconds``
non-negative numbers, ``free_ratio`` between 0 and 1, ``time`` ISO-8601 UTC, ``schema`` the
schema's own name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parent.parent.parent / "docs" / "json.md"
_BLOCK = re.compile(r"```keys (\S+)\n(.*?)```", re.DOTALL)
_SIGNED_BYTE_KEYS = ("delta", "released", "unexplained", "change", "unaccounted")
_ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|\+00:00)$")


def required_keys(schema: str) -> list[str]:
    """The dotted key paths docs/json.md promises for ``schema``."""
    for name, body in _BLOCK.findall(DOC.read_text()):
        if name == schema:
            return body.split()
    raise KeyError(f"docs/json.md has no keys block for {schema}")


def missing_keys(document: Any, schema: str, *, may_be_empty: Iterable[str] = ()) -> list[str]:
    """What ``document`` lacks or gets wrong against docs/json.md; empty when it conforms.

    Entries are key paths (missing, or a list that is empty where ``a[].b`` needs elements)
    and ``path: why`` for values that break the naming rules. ``may_be_empty`` names lists
    (``events``) that are legitimately empty in this document.
    """
    empty_ok = set(may_be_empty)
    problems = [
        path for path in required_keys(schema) if not _has(document, path.split("."), empty_ok)
    ]
    problems.extend(value_problems(document, schema.split("#", maxsplit=1)[0]))
    return problems


def _has(node: Any, parts: list[str], empty_ok: set[str]) -> bool:
    if not parts:
        return True
    head, rest = parts[0], parts[1:]
    if head.endswith("[]"):
        key = head[:-2]
        if not isinstance(node, dict) or not isinstance(node.get(key), list):
            return False
        items = node[key]
        if not items:
            return key in empty_ok
        return all(_has(item, rest, empty_ok) for item in items)
    return isinstance(node, dict) and head in node and _has(node[head], rest, empty_ok)


def value_problems(document: Any, schema: str) -> list[str]:
    """``path: why`` for every value that breaks the naming contract."""
    problems = []
    for path, key, value in _walk(document, ""):
        why = _rule_broken(key, value, schema, top=path == key)
        if why:
            problems.append(f"{path}: {why} (got {value!r})")
    return problems


def _walk(node: Any, prefix: str) -> Iterator[tuple[str, str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else key
            yield path, key, value
            yield from _walk(value, path)
    elif isinstance(node, list):
        for position, item in enumerate(node):
            yield from _walk(item, f"{prefix}[{position}]")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _rule_broken(key: str, value: Any, schema: str, *, top: bool) -> str | None:
    if key.endswith("_bytes"):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            return "byte counts are integers"
        # Changes and measured releases may be negative (a target that grew meanwhile).
        signed = any(word in key for word in _SIGNED_BYTE_KEYS)
        if value is not None and value < 0 and not signed:
            return "a byte count below zero"
    elif key.endswith("_seconds"):
        if value is not None and (not _is_number(value) or value < 0):
            return "durations are non-negative numbers"
    elif key == "free_ratio":
        if not _is_number(value) or not 0 <= value <= 1:
            return "free_ratio is a number from 0 to 1"
    elif key == "time":
        if value is not None and (not isinstance(value, str) or not _ISO_UTC.match(value)):
            return "times are ISO-8601 UTC"
    elif key == "schema" and top and value != schema:
        return f"schema must be {schema}"
    return None
