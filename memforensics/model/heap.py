"""Frozen dataclasses for one glibc ``malloc_info`` dump: arenas, bins and totals."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, overload

BucketKind = Literal["fast", "bin", "unsorted"]


@dataclass(frozen=True, slots=True)
class SizeBucket:
    """One ``<size>`` or ``<unsorted>`` line: free chunks of one bin of one arena.

    ``from_bytes``/``to_bytes`` are printed as glibc prints them: regular bins carry the
    PREV_INUSE bit (odd values, ``total_bytes`` over by ``count``); ``chunk_bytes``
    removes that artefact.
    """

    kind: BucketKind
    from_bytes: int
    to_bytes: int
    total_bytes: int
    count: int
    line: int = 0
    suspect: bool = False

    @property
    def chunk_bytes(self) -> int:
        """Bytes of free chunks with glibc's PREV_INUSE artefact removed."""
        if self.kind == "fast" or self.to_bytes % 2 == 0:
            return self.total_bytes
        return max(self.total_bytes - self.count, 0)


# Counts this large are not real chunk counts: old glibc (<= 2.17) printed the never
# initialised <unsorted> slot, with values seen between 1e9 and 1.4e14 in real dumps.
SUSPECT_COUNT = 10**9
SUSPECT_BYTES = 1 << 56


def bucket_kind(tag: str, from_bytes: int, to_bytes: int) -> BucketKind:
    """Classify a bucket line: ``<unsorted>``, a fastbin, or a regular bin."""
    if tag == "unsorted":
        return "unsorted"
    # Regular bins carry PREV_INUSE and so print odd sizes; fastbin lines print the
    # masked chunk size (even) over a MALLOC_ALIGNMENT-wide range.
    if to_bytes % 2 == 0 and from_bytes < to_bytes:
        return "fast"
    return "bin"


# One bucket line as lxml serialises glibc's output: fixed attribute order, 1-19 digits
# (a 20-digit value may exceed 2**64 and is left to the parser's careful path).
BUCKET_LINE_RE = re.compile(
    rb'<(size|unsorted) from="(\d{1,19})" to="(\d{1,19})" total="(\d{1,19})" count="(\d{1,19})"/>'
)


class SizeTable(Sequence[SizeBucket]):
    """An arena's bucket lines kept as serialised XML, turned into SizeBuckets on use.

    A big dump has hundreds of thousands of bucket lines; keeping their text and building
    objects only when a report asks keeps parsing near libxml2's own speed and memory low.
    The parser has already checked that ``raw`` is nothing but well-formed bucket lines.
    """

    __slots__ = ("_buckets", "_count", "_first_line", "_raw")

    def __init__(self, raw: bytes, count: int, first_line: int):
        self._raw = raw
        self._count = count
        self._first_line = first_line
        self._buckets: tuple[SizeBucket, ...] | None = None

    def _materialize(self) -> tuple[SizeBucket, ...]:
        if self._buckets is None:
            built = []
            for position, match in enumerate(BUCKET_LINE_RE.finditer(self._raw)):
                tag, *digits = match.groups()
                from_bytes, to_bytes, total_bytes, count = map(int, digits)
                built.append(
                    SizeBucket(
                        bucket_kind(tag.decode(), from_bytes, to_bytes),
                        from_bytes,
                        to_bytes,
                        total_bytes,
                        count,
                        self._first_line + position,
                        count >= SUSPECT_COUNT or total_bytes >= SUSPECT_BYTES,
                    )
                )
            self._buckets = tuple(built)
        return self._buckets

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> SizeBucket: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[SizeBucket]: ...
    def __getitem__(self, index: int | slice) -> SizeBucket | Sequence[SizeBucket]:
        return self._materialize()[index]

    def __iter__(self) -> Iterator[SizeBucket]:
        return iter(self._materialize())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._materialize())

    def __repr__(self) -> str:
        return f"SizeTable({len(self)} buckets)"


@dataclass(frozen=True, slots=True)
class Arena:
    """One ``<heap nr=N>``: a malloc arena (0 is the main arena, 1 the newest)."""

    index: int
    sizes: Sequence[SizeBucket]  # a tuple, or a lazily built SizeTable from the parser
    fast_chunks: int | None  # None: glibc without fastbins (after 2.43) prints no line
    fast_bytes: int | None
    rest_chunks: int
    rest_bytes: int
    system_bytes: int
    system_max_bytes: int
    aspace_total_bytes: int | None = None
    aspace_mprotect_bytes: int | None = None
    subheaps: int | None = None  # glibc >= 2.27, non-main arenas only
    line: int = 0
    extra: tuple[tuple[str, str], ...] = ()  # unknown elements/attributes, kept verbatim

    @property
    def top_bytes(self) -> int | None:
        """The top chunk's bytes where glibc counts it in ``rest`` (2.31+), else None.

        glibc 2.31 added top to ``rest`` as one extra block (BZ #24026), so rest's count is
        one more than the bins' and top is rest minus the bins; older glibc leaves it out.
        """
        bins = [b for b in self.sizes if b.kind != "fast"]
        if self.rest_chunks != sum(b.count for b in bins) + 1:
            return None
        top = self.rest_bytes - sum(b.total_bytes for b in bins)
        return top if top >= 0 else None

    @property
    def free_bytes(self) -> int:
        """Bytes in free chunks the arena holds in its bins (fast + rest)."""
        return (self.fast_bytes or 0) + self.rest_bytes

    @property
    def in_use_bytes(self) -> int:
        """Upper bound of bytes in use: system current minus free (DESIGN.md)."""
        return max(self.system_bytes - self.free_bytes, 0)

    @property
    def free_ratio(self) -> float:
        """Share of the arena's system memory that sits free in bins (0..1)."""
        if self.system_bytes <= 0:
            return 0.0
        return min(self.free_bytes / self.system_bytes, 1.0)

    @property
    def suspect(self) -> bool:
        """True when glibc printed implausible numbers (old uninitialised counters)."""
        return any(bucket.suspect for bucket in self.sizes)


@dataclass(frozen=True, slots=True)
class HeapDump:
    """One ``<malloc version="1">`` document: every arena plus the process totals."""

    version: str
    arenas: tuple[Arena, ...]
    fast_chunks: int | None
    fast_bytes: int | None
    rest_chunks: int
    rest_bytes: int
    mmap_chunks: int | None  # None: glibc before ~2.17 printed no mmap total
    mmap_bytes: int | None
    system_bytes: int
    system_max_bytes: int
    aspace_total_bytes: int | None = None
    aspace_mprotect_bytes: int | None = None
    source: str = "<memory>"
    line: int = 1
    sequence: int = 0  # position of this dump in a file holding a series
    extra: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = field(default=())  # what the parser noticed about the dialect

    @property
    def free_bytes(self) -> int:
        """Bytes in free chunks across all arenas (fast + rest)."""
        return (self.fast_bytes or 0) + self.rest_bytes

    @property
    def in_use_bytes(self) -> int:
        """Upper bound of bytes in use inside arenas: system current minus free."""
        return max(self.system_bytes - self.free_bytes, 0)

    @property
    def free_ratio(self) -> float:
        """Share of arena memory that sits free in bins (0..1)."""
        if self.system_bytes <= 0:
            return 0.0
        return min(self.free_bytes / self.system_bytes, 1.0)

    @property
    def all_zero(self) -> bool:
        """True when glibc malloc holds nothing: another allocator serves this process."""
        return (
            self.system_bytes == 0
            and self.free_bytes == 0
            and not self.mmap_bytes
            and all(a.system_bytes == 0 for a in self.arenas)
        )
