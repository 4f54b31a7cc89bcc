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

from memforensics.model.heap import SUSPECT_BYTES, SUSPECT_CODE_OFFSET, SUSPECT_COUNT, Arena
from memforensics.sources.malloc_info.malloc_buckets import (
    EQUALS_TO_COMMA,
    NOT_DIGIT_OR_EQUALS,
    SizeTable,
    numpy_module,
)

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
    decoded = _decode(numpy, checked)
    if decoded is None:
        return None
    return _sums(numpy, *decoded, len(checked), class_limits)


def _decode(np: Any, tables: list[SizeTable]) -> tuple[Any, Any, Any] | None:
    """Every table's numbers in one array, each line's code, and each line's arena.

    One numpy read over all tables' digits at once (per table, the calls cost more than the
    work). Each table adopts its slices, so a JSON writer reading it
    afterwards decodes nothing again. None where a table does not read as 4 numbers a line.
    """
    # Every number follows an `=`; keeping digits and `=` (as `,`) leaves ",17,32,384,…".
    # Table by table, so that no copy of the whole dump's text is made.
    texts = [t.raw.translate(EQUALS_TO_COMMA, NOT_DIGIT_OR_EQUALS) for t in tables]
    lines = np.array([t.count(b",") for t in texts], dtype=np.int64)
    if (lines % 4).any():
        return None
    lines //= 4
    text = b"".join(texts)[1:]
    del texts
    total_lines = int(lines.sum())
    if not text:
        numbers = np.zeros(0, dtype=np.uint64)
    else:
        try:
            numbers = np.fromstring(text, dtype=np.uint64, sep=",")
        except ValueError:
            return None
    if len(numbers) != 4 * total_lines:
        return None
    froms, tos, totals, counts = numbers[0::4], numbers[1::4], numbers[2::4], numbers[3::4]
    codes = (((tos & 1) == 0) & (froms < tos)).astype(np.int8)  # 1: a fastbin line
    ends = np.cumsum(lines)
    starts = (ends - lines).tolist()
    codes[
        [
            start + at
            for t, start in zip(tables, starts, strict=True)
            for at in t.unsorted_positions()
        ]
    ] = 2
    suspect = (counts >= SUSPECT_COUNT) | (totals >= SUSPECT_BYTES)
    codes += suspect.astype(np.int8) * SUSPECT_CODE_OFFSET
    for table, start, end in zip(tables, starts, ends.tolist(), strict=True):
        table.adopt(numbers[4 * start : 4 * end], codes[start:end])
    arena_ids = np.repeat(np.arange(len(tables)), lines)
    return numbers, codes, arena_ids


def _sums(
    np: Any, numbers: Any, codes: Any, arena_ids: Any, arenas: int, class_limits: Sequence[int]
) -> DumpSums | None:
    tos, totals, counts = numbers[1::4], numbers[2::4], numbers[3::4]
    lines = len(counts)
    suspect = codes >= SUSPECT_CODE_OFFSET
    if suspect.any():
        return None  # suspect lines carry values up to 2**64: exact Python integers instead
    if lines and int(totals.max()) * lines >= _SAFE_SUM:
        return None  # hostile magnitudes: exact Python integers instead
    fast = codes == 1
    bin_chunks = _grouped_sum(np, arena_ids, np.where(fast, 0, counts), arenas)
    bin_bytes = _grouped_sum(np, arena_ids, np.where(fast, 0, totals), arenas)
    # Histogram: mean chunk size of each line, PREV_INUSE removed from odd non-fast lines.
    keep = counts > 0
    prev_inuse = np.where(((tos & 1) == 1) & ~fast, counts, 0)
    chunk_bytes = np.where(totals >= prev_inuse, totals - prev_inuse, 0)
    kept_counts, kept_bytes = counts[keep], chunk_bytes[keep]
    classes = np.searchsorted(
        np.array(class_limits, dtype=np.uint64), kept_bytes // kept_counts, side="left"
    )
    slots = len(class_limits) + 1
    return DumpSums(
        bins=list(zip(bin_chunks, bin_bytes, strict=True)),
        suspect=[False] * arenas,
        class_chunks=_grouped_sum(np, classes, kept_counts, slots),
        class_bytes=_grouped_sum(np, classes, kept_bytes, slots),
    )


def _grouped_sum(np: Any, groups: Any, values: Any, size: int) -> list[int]:
    """Exact per-group sums (uint64; the caller has ruled out overflow) as Python ints."""
    sums = np.zeros(size, dtype=np.uint64)
    np.add.at(sums, groups, values.astype(np.uint64))
    return [int(v) for v in sums.tolist()]
