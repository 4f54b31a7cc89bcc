"""Census documents (``memforensics/census/1``) read back from files, for ``diff``: every
value checked, hostile input refused as InputDataError (exit 7), never a traceback."""

from __future__ import annotations

import json
from typing import Any, BinaryIO

from memforensics.errors import InputDataError
from memforensics.model.census import KINDS, CensusType

CENSUS_SCHEMA = "memforensics/census/1"
MAX_DOCUMENT_BYTES = 256 << 20
MAX_TYPES = 1_000_000


def looks_like_census(head: bytes) -> bool:
    """Whether the first bytes of a file are a census document's (a JSON object naming the
    census schema early: the renderer writes ``schema`` first)."""
    return head.lstrip()[:1] == b"{" and CENSUS_SCHEMA.encode() in head


def read_census(source: str | BinaryIO, label: str) -> tuple[tuple[CensusType, ...], str | None]:
    """(types, time) of the census document in ``source``."""
    try:
        if isinstance(source, str):
            with open(source, "rb") as handle:
                raw = handle.read(MAX_DOCUMENT_BYTES + 1)
        else:
            raw = source.read(MAX_DOCUMENT_BYTES + 1)
    except OSError as exc:
        raise InputDataError(f"cannot read: {exc.strerror}", source=label) from exc
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise InputDataError("census document larger than 256 MiB", source=label)
    try:
        document: Any = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InputDataError(f"not a JSON document: {exc}", source=label) from exc
    if not isinstance(document, dict) or document.get("schema") != CENSUS_SCHEMA:
        raise InputDataError(
            f"not a {CENSUS_SCHEMA} document",
            source=label,
            hint="diff compares two census documents (memforensics census --json) or two dumps",
        )
    rows = document.get("types")
    if not isinstance(rows, list) or len(rows) > MAX_TYPES:
        raise InputDataError("census document without a types list", source=label)
    types: list[CensusType] = []
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise InputDataError(f"types[{index}] is not an object", source=label)
        name, kind, count, size = (row.get(k) for k in ("name", "kind", "count", "bytes"))
        if (
            not isinstance(name, str)
            or kind not in (*KINDS, "other")
            or type(count) is not int
            or type(size) is not int
            or count < 0
            or size < 0
        ):
            raise InputDataError(
                f"types[{index}]: name, kind, count, bytes are not a census line", source=label
            )
        types.append(CensusType(name, str(kind), count, size))
    time = document.get("time")
    return tuple(types), time if isinstance(time, str) else None
