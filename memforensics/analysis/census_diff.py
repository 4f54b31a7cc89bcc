"""Two censuses compared type by type: what grew, by how much, and how fast (the leak's name).

A type is keyed by (name, kind); a type in one census only counts 0 in the other. Rows are
ordered biggest growth first (bytes, then count), the types that grew and are named (C++ by
RTTI, CPython by type) before the content kinds that grew (text, zeros, pointers, unknown:
often what the named objects own, so a leaking class comes before its strings); then what
did not grow. ``per_hour`` rates are given when both censuses carry their time.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

from memforensics.model.census import CensusType

_NAMED = frozenset(("c++", "python"))


@dataclass(frozen=True, slots=True)
class TypeDelta:
    """One type's change from the old census to the new."""

    name: str
    kind: str
    old_count: int
    new_count: int
    count_delta: int
    old_bytes: int
    new_bytes: int
    bytes_delta: int
    count_per_hour: float | None  # None without both times
    bytes_per_hour: float | None


@dataclass(frozen=True, slots=True)
class CensusDiff:
    """Every type's change, biggest growth first, and the totals' change."""

    seconds: float | None  # between the two censuses; None when a time is missing
    types: tuple[TypeDelta, ...]
    live_chunks_delta: int
    live_bytes_delta: int


def _parse_time(text: str | None) -> datetime.datetime | None:
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def diff_censuses(
    old: Sequence[CensusType],
    new: Sequence[CensusType],
    *,
    old_time: str | None = None,
    new_time: str | None = None,
) -> CensusDiff:
    """The change from ``old`` to ``new`` (see the module)."""
    before, after = _parse_time(old_time), _parse_time(new_time)
    seconds = (after - before).total_seconds() if before and after else None
    hours = seconds / 3600 if seconds and seconds > 0 else None
    olds = {(t.name, t.kind): t for t in old}
    news = {(t.name, t.kind): t for t in new}
    rows = []
    for key in {**olds, **news}:
        o, n = olds.get(key), news.get(key)
        old_count, old_bytes = (o.count, o.total_bytes) if o else (0, 0)
        new_count, new_bytes = (n.count, n.total_bytes) if n else (0, 0)
        count_delta, bytes_delta = new_count - old_count, new_bytes - old_bytes
        rows.append(
            TypeDelta(
                name=key[0],
                kind=key[1],
                old_count=old_count,
                new_count=new_count,
                count_delta=count_delta,
                old_bytes=old_bytes,
                new_bytes=new_bytes,
                bytes_delta=bytes_delta,
                count_per_hour=count_delta / hours if hours else None,
                bytes_per_hour=bytes_delta / hours if hours else None,
            )
        )
    rows.sort(
        key=lambda r: (
            not (r.bytes_delta > 0 or r.count_delta > 0),
            r.kind not in _NAMED,
            -r.bytes_delta,
            -r.count_delta,
            r.name,
            r.kind,
        )
    )
    return CensusDiff(
        seconds=seconds,
        types=tuple(rows),
        live_chunks_delta=sum(t.count for t in new) - sum(t.count for t in old),
        live_bytes_delta=sum(t.total_bytes for t in new) - sum(t.total_bytes for t in old),
    )
