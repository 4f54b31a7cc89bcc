"""Frozen dataclasses for one glibc ``malloc_info`` dump: arenas, bins and totals."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import and_, gt, lt, mul, not_, sub
from typing import Literal

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


def is_suspect(total_bytes: int, count: int) -> bool:
    """True for counters no real heap prints (old glibc's uninitialised <unsorted> slot)."""
    return count >= SUSPECT_COUNT or total_bytes >= SUSPECT_BYTES


# The smallest chunk glibc has (MINSIZE on 32-bit; 32 bytes on 64-bit): no free chunk's raw
# size field is below it.
MIN_CHUNK_BYTES = 16


def implausible_unsorted(bucket: SizeBucket, system_bytes: int) -> bool:
    """True when an ``<unsorted>`` line cannot describe free chunks of an arena holding
    ``system_bytes``: magnitudes no heap prints, ``count`` chunks that cannot lie between
    ``from`` and ``to`` and add up to ``total``, or more chunk bytes than the arena has.

    glibc <= 2.17 printed the unsorted bin's slot of malloc_info's size table without ever
    filling it in, then added it into the arena's (and the process's) ``rest``: glibc 2.12
    malloc/malloc.c, ``malloc_info`` -> ``mi_arena()``, ``sizes[NFASTBINS]`` (davidlt/
    glibc-2.12-slc6 @ 32193c7ac389b562ae9c954afbe435df44792d6b); stack garbage, 1e9 to 1.4e14
    in real dumps. From the ``__malloc_info`` rewrite on (about 2.18; seen in the 2.22-2.24
    tree xen0n/glibc @ 37f5c73130b69e48a7c7ef5a2d09f2255c5dd6f2) the unsorted bin is walked
    like the others, and a real line passes these checks.
    """
    low, high = bucket.from_bytes, bucket.to_bytes
    total, count = bucket.total_bytes, bucket.count
    if is_suspect(total, count):
        return True
    if count == 0:
        return total != 0
    # Each chunk's raw size lies in [from, to] (MIN_CHUNK_BYTES at least), so the total lies
    # in [count * from, count * to]; minus the PREV_INUSE bit per chunk, it fits the arena.
    return (
        low < MIN_CHUNK_BYTES
        or low > high
        or not count * low <= total <= count * high
        or total - count > system_bytes
    )


_KIND_BY_FAST: tuple[BucketKind, BucketKind] = ("bin", "fast")


class BucketColumns:
    """An arena's bucket lines as parallel columns: what reports and sums read.

    A dump with thousands of arenas has a million bucket lines; summing columns with
    C-level ``map``/``sum`` instead of one object per line keeps reports near libxml2's speed.
    Treat as read-only.
    """

    __slots__ = ("_kinds", "counts", "fast", "flagged", "froms", "tos", "totals", "unsorted")

    def __init__(
        self,
        froms: list[int],
        tos: list[int],
        totals: list[int],
        counts: list[int],
        *,
        fast: list[bool],
        unsorted: Iterable[int] = (),
        flagged: list[bool] | None = None,
    ) -> None:
        self.froms, self.tos, self.totals, self.counts = froms, tos, totals, counts
        self.fast = fast  # kinds[i] == "fast", as a mask for compress()
        self.unsorted = tuple(unsorted)  # positions of <unsorted> lines
        self.flagged = flagged  # suspect flags set by hand; None: judged from the values
        self._kinds: list[BucketKind] | None = None

    @classmethod
    def from_numbers(cls, numbers: list[int], unsorted: Iterable[int] = ()) -> BucketColumns:
        """Columns from ``from, to, total, count`` repeated, with the ``<unsorted>`` positions."""
        unsorted = tuple(unsorted)
        froms, tos = numbers[0::4], numbers[1::4]
        # fast: an even `to` above `from` (bucket_kind), decided without a Python-level loop.
        fast = list(map(and_, map(lt, froms, tos), map(not_, map(and_, tos, repeat(1)))))
        for position in unsorted:
            fast[position] = False
        return cls(froms, tos, numbers[2::4], numbers[3::4], fast=fast, unsorted=unsorted)

    @classmethod
    def from_buckets(cls, buckets: Iterable[SizeBucket]) -> BucketColumns:
        """Columns of bucket objects (a hand-built arena, or the parser's careful path)."""
        rows = list(buckets)
        return cls(
            [b.from_bytes for b in rows],
            [b.to_bytes for b in rows],
            [b.total_bytes for b in rows],
            [b.count for b in rows],
            fast=[b.kind == "fast" for b in rows],
            unsorted=[i for i, b in enumerate(rows) if b.kind == "unsorted"],
            flagged=[b.suspect for b in rows],
        )

    @property
    def kinds(self) -> list[BucketKind]:
        """Per line: ``fast``, ``bin`` or ``unsorted`` (built on first use)."""
        if self._kinds is None:
            kinds: list[BucketKind] = list(map(_KIND_BY_FAST.__getitem__, self.fast))
            for position in self.unsorted:
                kinds[position] = "unsorted"
            self._kinds = kinds
        return self._kinds

    def __len__(self) -> int:
        return len(self.counts)

    @property
    def any_suspect(self) -> bool:
        """True when some line has implausible counters."""
        if self.flagged is not None:
            return any(self.flagged)
        return bool(self.counts) and (
            max(self.counts) >= SUSPECT_COUNT or max(self.totals) >= SUSPECT_BYTES
        )

    def suspects(self) -> list[bool]:
        """Per line: implausible counters (old glibc garbage)."""
        if self.flagged is not None:
            return self.flagged
        if not self.any_suspect:
            return [False] * len(self.counts)
        return list(map(is_suspect, self.totals, self.counts))

    def free_chunk_bytes(self) -> int:
        """Bytes of the free chunks of every line that is not suspect, glibc's PREV_INUSE
        artefact removed (SizeBucket.chunk_bytes, summed)."""
        counts, totals = self.counts, self.totals
        if self.any_suspect:
            keep = list(map(not_, self.suspects()))
            counts, totals = list(compress(counts, keep)), list(compress(totals, keep))
            fast, tos = list(compress(self.fast, keep)), list(compress(self.tos, keep))
        else:
            fast, tos = self.fast, self.tos
        # `(to & 1) > fast`: odd and not a fastbin, the lines printed with PREV_INUSE.
        prev_inuse = map(gt, map(and_, tos, repeat(1)), fast)
        return sum(map(max, map(sub, totals, map(mul, counts, prev_inuse)), repeat(0)))

    def bin_sums(self) -> tuple[int, int]:
        """(chunks, bytes) over the lines that are not fastbins: what glibc sums into rest."""
        return (
            sum(self.counts) - sum(compress(self.counts, self.fast)),
            sum(self.totals) - sum(compress(self.totals, self.fast)),
        )


class ColumnarSizes(Sequence[SizeBucket]):
    """A bucket table that can give its columns without building one object per line."""

    __slots__ = ()

    @abstractmethod
    def columns(self) -> BucketColumns:
        """The table as columns (computed once)."""

    def line_codes(self) -> tuple[list[int], list[int]]:
        """See :func:`line_codes`."""
        return _line_codes_of(self.columns())

    def lines_over(self, chunk_bytes: int) -> list[SizeBucket]:
        """See :func:`lines_over`."""
        return _lines_over(self.columns(), chunk_bytes)


# Kinds by line code; a suspect line's code is its kind's plus 3.
LINE_KINDS: tuple[BucketKind, BucketKind, BucketKind] = ("bin", "fast", "unsorted")
SUSPECT_CODE_OFFSET = 3


def line_codes(sizes: Sequence[SizeBucket]) -> tuple[list[int], list[int]]:
    """Per line a code (index in LINE_KINDS, plus 3 when suspect), and every line's
    ``from, to, total, count`` in one flat list: what a writer of all lines needs."""
    if isinstance(sizes, ColumnarSizes):
        return sizes.line_codes()
    return _line_codes_of(BucketColumns.from_buckets(sizes))


def _line_codes_of(columns: BucketColumns) -> tuple[list[int], list[int]]:
    codes = [
        LINE_KINDS.index(kind) + SUSPECT_CODE_OFFSET * suspect
        for kind, suspect in zip(columns.kinds, columns.suspects(), strict=True)
    ]
    numbers: list[int] = [0] * (4 * len(codes))
    numbers[0::4] = columns.froms
    numbers[1::4] = columns.tos
    numbers[2::4] = columns.totals
    numbers[3::4] = columns.counts
    return codes, numbers


def lines_over(sizes: Sequence[SizeBucket], chunk_bytes: int) -> list[SizeBucket]:
    """The lines, neither fastbins nor suspect, whose mean chunk is over ``chunk_bytes``
    (PREV_INUSE artefact removed): with a page size, the only lines a whole page can lie in.
    Built from columns, so a big table makes objects for those lines alone."""
    if isinstance(sizes, ColumnarSizes):
        return sizes.lines_over(chunk_bytes)
    return [
        b
        for b in sizes
        if b.kind != "fast" and not b.suspect and b.chunk_bytes > b.count * chunk_bytes
    ]


def _lines_over(columns: BucketColumns, chunk_bytes: int) -> list[SizeBucket]:
    counts, totals, tos, fast = columns.counts, columns.totals, columns.tos, columns.fast
    prev_inuse = map(gt, map(and_, tos, repeat(1)), fast)  # odd and not fast
    sizes = map(sub, totals, map(mul, counts, prev_inuse))
    keep = list(map(gt, sizes, map(mul, counts, repeat(chunk_bytes))))
    if columns.any_suspect:
        keep = list(map(and_, keep, map(not_, columns.suspects())))
    keep = list(map(and_, keep, map(not_, fast)))  # fastbins: at most 128 bytes anyway
    kinds, froms = columns.kinds, columns.froms
    return [
        SizeBucket(kinds[i], froms[i], tos[i], totals[i], counts[i])
        for i in compress(range(len(keep)), keep)
    ]


def bucket_columns(sizes: Sequence[SizeBucket]) -> BucketColumns:
    """The columns of any bucket table: the parser's lazy table or a tuple of buckets."""
    if isinstance(sizes, ColumnarSizes):
        return sizes.columns()
    return BucketColumns.from_buckets(sizes)


def rest_counts_top(arena: Arena, bin_chunks: int) -> bool:
    """Whether ``rest`` counts the top chunk, from the sums of every non-fast line.

    glibc 2.31 added top to ``rest`` as one extra block (BZ #24026; cherry-picked into some
    2.29/2.30 distribution builds, so no version number decides): rest's count is then one
    more than the bins', where 2.27-2.30 print exactly the bins'. Implausible lines taken out
    of ``rest`` by the parser are taken out of the bins here too.
    """
    return arena.rest_chunks == bin_chunks - arena.implausible_rest[0] + 1


def top_chunk_bytes(arena: Arena, bin_chunks: int, bin_bytes: int) -> int | None:
    """The top chunk's bytes from rest and the sums of every non-fast line (None: ``rest``
    does not count top, so the dump does not say; see :func:`rest_counts_top`)."""
    if not rest_counts_top(arena, bin_chunks):
        return None
    top = arena.rest_bytes - (bin_bytes - arena.implausible_rest[1])
    return top if top >= 0 else None


def process_source(pid: int) -> str:
    """How a dump taken from a live process names its source (``pid:N``, docs/json.md)."""
    return f"pid:{pid}"


class FreeFigures:
    """free / in use / free ratio, defined once for an arena and for a whole dump.

    free = fast + rest (chunks sitting in bins); in use = system current − free, an upper
    bound (docs/heap-report.md).
    """

    __slots__ = ()
    fast_bytes: int | None
    rest_bytes: int
    system_bytes: int

    @property
    def free_bytes(self) -> int:
        """Bytes in free chunks held in bins (fast + rest)."""
        return (self.fast_bytes or 0) + self.rest_bytes

    @property
    def in_use_bytes(self) -> int:
        """Upper bound of bytes in use: system current minus free."""
        return max(self.system_bytes - self.free_bytes, 0)

    @property
    def free_ratio(self) -> float:
        """Share of the system memory that sits free in bins (0..1)."""
        if self.system_bytes <= 0:
            return 0.0
        return min(self.free_bytes / self.system_bytes, 1.0)


@dataclass(frozen=True, slots=True)
class Arena(FreeFigures):
    """One ``<heap nr=N>``: a malloc arena (0 is the main arena, 1 the newest)."""

    index: int
    sizes: Sequence[SizeBucket]  # a tuple, or the parser's lazy ColumnarSizes
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
    # <unsorted> lines the parser judged implausible (implausible_unsorted): flagged suspect
    # in ``sizes``; when ``implausible_in_rest``, glibc had added them into rest and
    # rest_chunks/rest_bytes are given without them.
    implausible: tuple[SizeBucket, ...] = ()
    implausible_in_rest: bool = False

    @property
    def implausible_rest(self) -> tuple[int, int]:
        """(chunks, bytes) the parser took out of glibc's ``rest``: the implausible lines'."""
        if not self.implausible_in_rest:
            return 0, 0
        return sum(b.count for b in self.implausible), sum(b.total_bytes for b in self.implausible)

    @property
    def rest_includes_top(self) -> bool:
        """Whether this glibc counts the top chunk in ``rest`` (2.31+): see rest_counts_top."""
        return rest_counts_top(self, bucket_columns(self.sizes).bin_sums()[0])

    @property
    def top_bytes(self) -> int | None:
        """The top chunk's bytes where glibc counts it in ``rest`` (2.31+), else None.

        glibc 2.31 added top to ``rest`` as one extra block (BZ #24026), so rest's count is
        one more than the bins' and top is rest minus the bins; older glibc leaves it out.
        """
        return top_chunk_bytes(self, *bucket_columns(self.sizes).bin_sums())

    @property
    def free_chunk_bytes(self) -> int:
        """Bytes of the free chunks in the arena's bins and fastbins, as its size lines give
        them: PREV_INUSE artefact removed, suspect lines left out, top never included. The
        same figure whatever the glibc version (unlike ``free_bytes``, which is ``rest`` as
        printed: with top from 2.31 on)."""
        return bucket_columns(self.sizes).free_chunk_bytes()

    @property
    def free_chunk_bytes_with_top(self) -> int | None:
        """``free_chunk_bytes`` plus the top chunk: what a complete walk of the arena's free
        lists and top finds. None where the dump does not contain the top (glibc < 2.31:
        ``rest_includes_top`` is False): add a top measured elsewhere, or say it is unknown;
        never read None as 0."""
        top = self.top_bytes
        return None if top is None else self.free_chunk_bytes + top

    @property
    def suspect(self) -> bool:
        """True when glibc printed implausible numbers (old uninitialised counters)."""
        return bool(self.implausible) or bucket_columns(self.sizes).any_suspect


@dataclass(frozen=True, slots=True)
class HeapDump(FreeFigures):
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
    def rest_includes_top(self) -> bool | None:
        """Whether this dump's glibc counts each arena's top chunk in ``rest`` (2.31+),
        judged on the main arena (one glibc printed them all); None without arenas."""
        return self.arenas[0].rest_includes_top if self.arenas else None

    @property
    def all_zero(self) -> bool:
        """True when glibc malloc holds nothing: another allocator serves this process."""
        return (
            self.system_bytes == 0
            and self.free_bytes == 0
            and not self.mmap_bytes
            and all(a.system_bytes == 0 for a in self.arenas)
        )
