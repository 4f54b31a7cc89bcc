"""Required JSON keys, read from the ```keys SCHEMA``` blocks of docs/json.md."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parent.parent.parent / "docs" / "json.md"
_BLOCK = re.compile(r"```keys (\S+)\n(.*?)```", re.DOTALL)


def required_keys(schema: str) -> list[str]:
    """The dotted key paths docs/json.md promises for ``schema``."""
    for name, body in _BLOCK.findall(DOC.read_text()):
        if name == schema:
            return body.split()
    raise KeyError(f"docs/json.md has no keys block for {schema}")


def missing_keys(document: Any, schema: str) -> list[str]:
    """Paths from docs/json.md that ``document`` lacks (``a[].b``: b in every element of a)."""
    missing = []
    for path in required_keys(schema):
        if not _has(document, path.split(".")):
            missing.append(path)
    return missing


def _has(node: Any, parts: list[str]) -> bool:
    if not parts:
        return True
    head, rest = parts[0], parts[1:]
    if head.endswith("[]"):
        key = head[:-2]
        if not isinstance(node, dict) or not isinstance(node.get(key), list):
            return False
        return all(_has(item, rest) for item in node[key])
    return isinstance(node, dict) and head in node and _has(node[head], rest)
