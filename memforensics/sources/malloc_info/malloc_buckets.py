"""One arena as glibc prints it, checked whole in C; its ``<sizes>`` table kept as text.

A big dump has thousands of arenas and a million bucket lines. Python work per element
dominated parse time, so a ``<heap>`` of exactly the shape glibc writes is checked by one
regular expression on its input text (``malloc_texts``; on libxml2's serialisation of it where
the text cannot be trusted); its totals come from the match, and its bucket table is decoded
into columns (:class:`~memforensics.model.heap.BucketColumns`) the first time a report reads
it. Anything else takes the careful path (``malloc_elements``), element by
element, which names the exact line of a bad value and keeps unknown elements.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from typing import Any, overload

from lxml import etree

from memforensics.model.heap import (
    SUSPECT_BYTES,
    SUSPECT_CODE_OFFSET,
    SUSPECT_COUNT,
    Arena,
    BucketColumns,
    ColumnarSizes,
    SizeBucket,
    is_suspect,
)

# One bucket line as lxml serialises glibc's output: fixed attribute order, 1-19 digits
# (a 20-digit value may exceed 2**64 and is left to the careful path).
BUCKET_LINE_RE = re.compile(
    rb'<(size|unsorted) from="(\d{1,19})" to="(\d{1,19})" total="(\d{1,19})" count="(\d{1,19})"/>'
)
# The same without capturing groups, for checking whole blocks (captures cost in loops).
_BUCKET_LINE = (
    rb'<(?:size|unsorted) from="\d{1,19}" to="\d{1,19}" total="\d{1,19}" count="\d{1,19}"/>'
)
# XML's whitespace only: "\s" also admits \f and \v, which libxml2 refuses, and a block cut
# from the input is never seen by libxml2 (malloc_texts).
_WS = rb"[ \t\r\n]*"
SIZES_BLOCK_RE = re.compile(
    rb"<sizes>(?:" + _WS + _BUCKET_LINE + rb")*" + _WS + rb"</sizes>|<sizes/>"
)

# Decoding trick: in a checked table every number follows an `=`. Keeping only digits and
# turning `=` into `,` leaves ",17,32,384,12,..." that the C JSON decoder turns into ints.
EQUALS_TO_COMMA = bytes.maketrans(b"=", b",")
NOT_DIGIT_OR_EQUALS = bytes(c for c in range(256) if c not in b"0123456789=")


def decode_numbers(raw: bytes) -> list[int]:
    """Every ``from, to, total, count`` of a checked table, in order."""
    text = raw.translate(EQUALS_TO_COMMA, NOT_DIGIT_OR_EQUALS)
    try:
        numbers: list[int] = json.loads(b"[" + text[1:] + b"]")
    except ValueError:  # a leading zero ("007") is not JSON; rare enough for a slow path
        numbers = [
            int(digits) for match in BUCKET_LINE_RE.finditer(raw) for digits in match.groups()[1:]
        ]
    return numbers


def numbers_array(raw: bytes) -> Any:
    """The numbers of a checked table as a numpy uint64 array; False if numpy cannot help."""
    numpy = numpy_module()
    if numpy is None:
        return False
    text = raw.translate(EQUALS_TO_COMMA, NOT_DIGIT_OR_EQUALS)[1:]
    if not text:
        return numpy.zeros(0, dtype=numpy.uint64)
    try:
        # uint64 holds every checked value (at most 19 digits).
        return numpy.fromstring(text, dtype=numpy.uint64, sep=",")
    except ValueError:
        return False  # an oddity such as a leading zero: the JSON path reads it


def _columns_of_array(array: Any, unsorted: list[int]) -> BucketColumns:
    """Columns from a decoded array, the fastbin mask computed by numpy (see bucket_kind)."""
    froms, tos = array[0::4], array[1::4]
    fast = ((tos & 1) == 0) & (froms < tos)
    fast[unsorted] = False
    return BucketColumns(
        froms.tolist(),
        tos.tolist(),
        array[2::4].tolist(),
        array[3::4].tolist(),
        fast=fast.tolist(),
        unsorted=unsorted,
    )


@functools.cache
def numpy_module() -> Any:
    """numpy if installed, else None (memforensics works without it, slower on big dumps)."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy


class SizeTable(ColumnarSizes):
    """An arena's checked bucket lines kept as serialised XML, decoded on first use.

    ``first_line`` is the source line of ``<sizes>``; each bucket's line is counted from the
    newlines really in the text, so a dump written on one line reports line 1, not invented
    lines.
    """

    __slots__ = (
        "_array",
        "_buckets",
        "_codes",
        "_columns",
        "_count",
        "_first_line",
        "_flagged",
        "_raw",
    )

    def __init__(
        self, raw: bytes, count: int | None, first_line: int, flagged: tuple[int, ...] = ()
    ):
        self._raw = raw
        self._count = count  # None: counted on first len()
        self._first_line = first_line
        # Lines judged suspect beyond their own values (implausible for their arena).
        self._flagged = flagged
        self._array: Any = None
        self._codes: Any = None  # line codes as a numpy array, where decoded in bulk
        self._columns: BucketColumns | None = None
        self._buckets: tuple[SizeBucket, ...] | None = None

    def flagged(self, positions: tuple[int, ...]) -> SizeTable:
        """This table with the lines at ``positions`` suspect, whatever their values."""
        return SizeTable(self._raw, self._count, self._first_line, self._flagged + positions)

    def unsorted_lines(self) -> list[tuple[int, SizeBucket]]:
        """The ``<unsorted>`` lines as (text offset, bucket without its line number), read
        without decoding the table; :meth:`locate` gives a line's position and line."""
        found = []
        at = self._raw.find(b"<unsorted")
        while at >= 0:
            match = BUCKET_LINE_RE.match(self._raw, at)
            if match is not None:  # always, in a checked table
                low, high, total, count = map(int, match.groups()[1:])
                bucket = SizeBucket(
                    "unsorted", low, high, total, count, 0, is_suspect(total, count)
                )
                found.append((at, bucket))
            at = self._raw.find(b"<unsorted", at + 1)
        return found

    def locate(self, offset: int) -> tuple[int, int]:
        """(position among the lines, source line) of the bucket line at text ``offset``."""
        # Each line opens with one "<"; the first "<" is <sizes> itself.
        return self._raw.count(b"<", 0, offset) - 1, self._first_line + self._raw.count(
            b"\n", 0, offset
        )

    def unsorted_positions(self) -> list[int]:
        """Indexes of the ``<unsorted>`` lines."""
        found = []
        position = self._raw.find(b"<unsorted")
        while position >= 0:
            # Each line opens with one "<"; the first "<" is <sizes> itself.
            found.append(self._raw.count(b"<", 0, position) - 1)
            position = self._raw.find(b"<unsorted", position + 1)
        return found

    @property
    def raw(self) -> bytes:
        """The table's checked text, ``<sizes>`` to ``</sizes>``."""
        return self._raw

    def adopt(self, array: Any, codes: Any) -> None:
        """Take this table's numbers and line codes, decoded with the whole dump's at once."""
        self._array, self._codes = array, codes

    def array(self) -> Any:
        """``from, to, total, count`` repeated, as a numpy uint64 array (decoded once).

        For big dumps only: numpy reads the digits ~7x faster than the JSON decoder but
        costs ~60 ms to import. None without numpy or for a table it cannot read.
        """
        if self._array is None:
            self._array = numbers_array(self._raw)
        return self._array if self._array is not False else None

    def columns(self) -> BucketColumns:
        """The table as columns, decoded once (from the numpy array if there is one)."""
        if self._columns is None:
            array = self._array if self._array is not None and self._array is not False else None
            if array is None:
                numbers = decode_numbers(self._raw)
                columns = BucketColumns.from_numbers(numbers, self.unsorted_positions())
            else:
                columns = _columns_of_array(array, self.unsorted_positions())
            if self._flagged:
                flags = list(columns.suspects())
                for position in self._flagged:
                    flags[position] = True
                columns.flagged = flags
            self._columns = columns
        return self._columns

    def line_codes(self) -> tuple[list[int], list[int]]:
        """Line codes and flat numbers (model.heap.line_codes), by numpy where decoded so."""
        array = self._array if self._array is not None and self._array is not False else None
        if array is None:
            return super().line_codes()  # from columns(), flags included
        if self._codes is not None:
            codes = self._codes.tolist()
        else:
            froms, tos, totals, counts = array[0::4], array[1::4], array[2::4], array[3::4]
            coded = (((tos & 1) == 0) & (froms < tos)).astype("int8")
            coded[self.unsorted_positions()] = 2
            suspect = (counts >= SUSPECT_COUNT) | (totals >= SUSPECT_BYTES)
            coded += suspect.astype("int8") * SUSPECT_CODE_OFFSET
            codes = coded.tolist()
        for position in self._flagged:
            if codes[position] < SUSPECT_CODE_OFFSET:
                codes[position] += SUSPECT_CODE_OFFSET
        return codes, array.tolist()

    def lines_over(self, chunk_bytes: int) -> list[SizeBucket]:
        """model.heap.lines_over, by numpy where the table was decoded in bulk."""
        array = self._array if self._array is not None and self._array is not False else None
        if array is None or self._codes is None:
            return super().lines_over(chunk_bytes)
        tos, totals, counts = array[1::4], array[2::4], array[3::4]
        # Line codes (model.heap.LINE_KINDS): 0 a bin, 2 unsorted; fastbins and suspect
        # lines (3 and up) never qualify. Odd sizes carry PREV_INUSE once per chunk.
        codes = self._codes
        candidate = (codes == 0) | (codes == 2)
        prev_inuse = counts * (tos & 1)
        # counts of lines that are not suspect (below SUSPECT_COUNT) times a page, and
        # their totals, stay far below 2**64.
        keep = candidate & (totals >= prev_inuse)
        keep &= totals - prev_inuse > counts * numpy_module().uint64(chunk_bytes)
        keep[list(self._flagged)] = False
        picked = keep.nonzero()[0].tolist()
        if not picked:
            return []
        rows = array.reshape(-1, 4)[picked].tolist()
        kinds = codes[picked].tolist()
        return [
            SizeBucket("unsorted" if kind == 2 else "bin", *row)
            for kind, row in zip(kinds, rows, strict=True)
        ]

    def _materialize(self) -> tuple[SizeBucket, ...]:
        if self._buckets is None:
            columns = self.columns()
            lines = []
            line, previous = self._first_line, 0
            for match in BUCKET_LINE_RE.finditer(self._raw):
                line += self._raw.count(b"\n", previous, match.start())
                previous = match.start()
                lines.append(line)
            self._buckets = tuple(
                SizeBucket(kind, low, high, total, count, at, suspect)
                for kind, low, high, total, count, at, suspect in zip(
                    columns.kinds,
                    columns.froms,
                    columns.tos,
                    columns.totals,
                    columns.counts,
                    lines,
                    columns.suspects(),
                    strict=True,
                )
            )
        return self._buckets

    def __len__(self) -> int:
        if self._count is None:
            self._count = self._raw.count(b' from="')  # one per bucket line
        return self._count

    @property
    def text_bytes(self) -> int:
        """Size of the table's text: what decoding it costs."""
        return len(self._raw)

    @overload
    def __getitem__(self, index: int) -> SizeBucket: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[SizeBucket, ...]: ...
    def __getitem__(self, index: int | slice) -> SizeBucket | tuple[SizeBucket, ...]:
        return self._materialize()[index]

    def __iter__(self) -> Iterator[SizeBucket]:
        return iter(self._materialize())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (tuple, list, ColumnarSizes)):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._materialize())

    def __repr__(self) -> str:
        return f"SizeTable({len(self)} buckets)"


def _number_re(tag: str, kind: str, *attrs: str) -> bytes:
    fields = " ".join(f'{attr}="(\\d{{1,19}})"' for attr in attrs)
    return _WS + f'<{tag} type="{kind}" {fields}/>'.encode()


# A <heap> exactly as glibc 2.26+ prints it (fastbin totals optional: none after 2.43;
# aspace lines optional; subheaps only for non-main arenas).
HEAP_RE = re.compile(
    rb'<heap nr="(\d{1,19})">'
    + _WS
    + rb"(?P<sizes>"
    + SIZES_BLOCK_RE.pattern
    + rb")"
    + b"(?:"
    + _number_re("total", "fast", "count", "size")
    + b")?"
    + _number_re("total", "rest", "count", "size")
    + _number_re("system", "current", "size")
    + _number_re("system", "max", "size")
    + b"(?:"
    + _number_re("aspace", "total", "size")
    + _number_re("aspace", "mprotect", "size")
    + b")?"
    + b"(?:"
    + _number_re("aspace", "subheaps", "size")
    + b")?"
    + _WS
    + rb"</heap>"
)


def _optional(value: bytes | None) -> int | None:
    return None if value is None else int(value)


def arena_from_text(heap: etree._Element, text: re.Match[bytes] | None = None) -> Arena | None:
    """The arena of a ``<heap>`` of exactly glibc's shape, or None for the careful path.

    ``text`` is the arena pattern matched on the element's source text, if the reader has it
    (else the tree is serialised); it is used only if it names the same arena as the element.
    """
    match = text
    if match is not None and match.group(1) != (heap.get("nr") or "").encode():
        match = None
    if match is None:
        match = HEAP_RE.fullmatch(etree.tostring(heap, with_tail=False))
    if match is None:
        return None
    raw = match.string
    heap_start = match.start()
    line = heap.sourceline if isinstance(heap.sourceline, int) else 0
    start, end = match.span("sizes")
    sizes_line = line + raw.count(b"\n", heap_start, start)
    # Groups: nr, the table, fast count/size, rest count/size, system current/max,
    # aspace total/mprotect, subheaps.
    (
        nr,
        _,
        fast_count,
        fast_size,
        rest_count,
        rest_size,
        current,
        peak,
        total,
        mprotect,
        subheaps,
    ) = match.groups()
    table = SizeTable(raw[start:end], None, sizes_line)
    return Arena(
        index=int(nr),
        sizes=table,
        fast_chunks=_optional(fast_count),
        fast_bytes=_optional(fast_size),
        rest_chunks=int(rest_count),
        rest_bytes=int(rest_size),
        system_bytes=int(current),
        system_max_bytes=int(peak),
        aspace_total_bytes=_optional(total),
        aspace_mprotect_bytes=_optional(mprotect),
        subheaps=_optional(subheaps),
        line=line,
    )


def checked_table(sizes: etree._Element) -> SizeTable | None:
    """The table of ``<sizes>`` if every line is a well-formed bucket line, else None."""
    raw = etree.tostring(sizes, with_tail=False)
    if SIZES_BLOCK_RE.fullmatch(raw) is None:
        return None
    line = sizes.sourceline
    return SizeTable(raw, len(sizes), line if isinstance(line, int) else 0)
