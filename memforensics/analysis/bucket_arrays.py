"""Bucket sums of a big dump in one vectorised pass (numpy), for the heap analysis.

A dump of thousands of arenas has a million bucket lines. With numpy the size-class sums and
each arena's bin totals are a handful of array operations over all lines at once; the
analysis falls back to its per-arena path (same results, pinned by tests) for small dumps,
without numpy, or where sums could overflow 64 bits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memforensics.model.heap import SUSPECT_BYTES, SUSPECT_COUNT, Arena
from memforensics.sources.malloc_buckets import SizeTable, numpy_module

# Below this much table text (~20,000 lines) the per-arena path is fast enough and numpy's
# import is not paid.
MIN_TEXT_BYTES = 1 << 20
_SAFE_SUM = 1 << 63  # every sum below stays under this, or the exact path is taken


@dataclass(frozen=True, slots=True)
class DumpSums:
    """Per arena: (bin chunks, bin bytes) and suspect; per size class: chunks and bytes."""

    bins: list[tuple[int, int]]
    suspect: list[bool]
    class_chunks: list[int]
    class_bytes: list[int]


def dump_sums(arenas: Sequence[Arena], class_limits: Sequence[int]) -> DumpSums | None:
    """The sums for ``arenas``, or None where the per-arena path must do it."""
    tables = [arena.sizes for arena in arenas]
    if not all(isinstance(t, SizeTable) for t in tables):
        return None
    checked = [t for t in tables if isinstance(t, SizeTable)]
    if sum(t.text_bytes for t in checked) < MIN_TEXT_BYTES:
        return None
    numpy = numpy_module()
    if numpy is None:
        return None
    arrays = [t.array() for t in checked]
    if any(a is None or len(a) % 4 for a in arrays):
        return None
    return _sums(numpy, arrays, checked, class_limits)


def _sums(
    np: Any, arrays: list[Any], tables: list[SizeTable], class_limits: Sequence[int]
) -> DumpSums | None:
    numbers = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.uint64)
    froms, tos, totals, counts = numbers[0::4], numbers[1::4], numbers[2::4], numbers[3::4]
    lines = len(counts)
    suspect = (counts >= SUSPECT_COUNT) | (totals >= SUSPECT_BYTES)
    clean_totals = np.where(suspect, 0, totals)
    clean_counts = np.where(suspect, 0, counts)
    if lines and int(clean_totals.max()) * lines >= _SAFE_SUM:
        return None  # hostile magnitudes: exact Python integers instead
    unsorted = np.zeros(lines, dtype=bool)
    sizes = np.array([len(a) // 4 for a in arrays], dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])) if len(sizes) else sizes
    for table, start in zip(tables, starts.tolist(), strict=True):
        for position in table.unsorted_positions():
            unsorted[start + position] = True
    fast = ((tos & 1) == 0) & (froms < tos) & ~unsorted
    arena_ids = np.repeat(np.arange(len(tables)), sizes)
    per_arena_suspect = np.bincount(arena_ids, weights=suspect, minlength=len(tables)) > 0
    if per_arena_suspect.any():
        return None  # suspect lines carry values up to 2**64: exact Python integers instead
    bin_chunks = _grouped_sum(np, arena_ids, np.where(fast, 0, counts), len(tables))
    bin_bytes = _grouped_sum(np, arena_ids, np.where(fast, 0, totals), len(tables))
    # Histogram: mean chunk size of each line, PREV_INUSE removed from odd non-fast lines.
    keep = clean_counts > 0
    prev_inuse = np.where(((tos & 1) == 1) & ~fast, counts, 0)
    chunk_bytes = np.where(totals >= prev_inuse, totals - prev_inuse, 0)
    kept_counts, kept_bytes = counts[keep], chunk_bytes[keep]
    classes = np.searchsorted(
        np.array(class_limits, dtype=np.uint64), kept_bytes // kept_counts, side="left"
    )
    slots = len(class_limits) + 1
    return DumpSums(
        bins=list(zip(bin_chunks, bin_bytes, strict=True)),
        suspect=per_arena_suspect.tolist(),
        class_chunks=_grouped_sum(np, classes, kept_counts, slots),
        class_bytes=_grouped_sum(np, classes, kept_bytes, slots),
    )


def _grouped_sum(np: Any, groups: Any, values: Any, size: int) -> list[int]:
    """Exact per-group sums (uint64; the caller has ruled out overflow) as Python ints."""
    sums = np.zeros(size, dtype=np.uint64)
    np.add.at(sums, groups, values.astype(np.uint64))
    return [int(v) for v in sums.tolist()]
