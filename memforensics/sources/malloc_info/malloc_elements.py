"""From parsed ``malloc_info`` elements to model objects: values checked, unknowns kept.

The reader (:mod:`memforensics.sources.malloc_info.malloc_xml`) hands over each closed
``<heap>`` and ``<malloc>`` element; this module checks every number (non-negative, below
2**64, digits only) and builds :class:`~memforensics.model.heap.Arena`
and :class:`~memforensics.model.heap.HeapDump`.
Unknown elements and attributes are kept verbatim in ``extra`` rather than refused.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import Any, cast

from lxml import etree

from memforensics.errors import InputDataError
from memforensics.model.heap import (
    Arena,
    HeapDump,
    SizeBucket,
    bucket_kind,
    implausible_unsorted,
    is_suspect,
)
from memforensics.sources.malloc_info.malloc_buckets import (
    SizeTable,
    arena_from_text,
    checked_table,
)

_MAX_VALUE = (1 << 64) - 1
_OTHER_ALLOCATORS = {
    "jemalloc": "Android bionic's jemalloc wrapper",
    "hardened_malloc": "GrapheneOS hardened_malloc",
    "scudo": "LLVM scudo",
}
# glibc prints these four attributes, always in this order.
_BUCKET_ATTRS = ("from", "to", "total", "count")

DEFAULT_HINT = "expected the unedited output of glibc's malloc_info(0, fp)"


def line_of(elem: etree._Element) -> int | None:
    """The element's source line (lxml's stubs do not say it is an int)."""
    value: Any = elem.sourceline
    return value if isinstance(value, int) else None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _tag(elem: etree._Element) -> str:
    return _text(elem.tag)


def _attrs_text(elem: etree._Element) -> str:
    """Attributes as ``k=v`` words, for keeping unknown elements verbatim."""
    return " ".join(f"{_text(k)}={_text(v)}" for k, v in elem.items())


def first_error(log: Any) -> Any:
    """The first entry of an lxml error log, or None."""
    return next(iter(cast(Iterable[Any], log)), None)


def fail(what: str, source: str, line: int | None, hint: str | None = None) -> InputDataError:
    return InputDataError(what, source=source, line=line, hint=hint or DEFAULT_HINT)


def _number(value: str | None, what: str, source: str, line: int | None) -> int:
    """A non-negative decimal integer below 2**64, or an InputDataError."""
    if value is None:
        raise fail(f"missing attribute: {what}", source, line)
    text = value.strip()
    if not (text.isascii() and text.isdigit()):
        if text.startswith("-") and text[1:].isdigit():
            raise fail(f"negative number {value!r} in {what}", source, line)
        raise fail(f"not a number: {what}={value!r}", source, line)
    # Checked before int(): a 200,000-digit value must not reach the conversion at all.
    if len(text) > 20 or int(text) > _MAX_VALUE:
        raise fail(f"number out of range (over 2^64) in {what}", source, line)
    return int(text)


def _unknown(elem: etree._Element, known: tuple[str, ...]) -> list[tuple[str, str]]:
    """Attributes outside ``known`` as (tag@name, value) pairs, kept rather than fatal."""
    return [
        (f"{_tag(elem)}@{_text(name)}", _text(value))
        for name, value in elem.attrib.items()
        if name not in known
    ]


class _Totals:
    """The <total>/<system>/<aspace> leaves of one <heap> or <malloc> level."""

    __slots__ = (
        "aspace_mprotect",
        "aspace_total",
        "extra",
        "fast",
        "mmap",
        "rest",
        "subheaps",
        "system_current",
        "system_max",
    )

    def __init__(self) -> None:
        self.fast: tuple[int, int] | None = None
        self.rest: tuple[int, int] | None = None
        self.mmap: tuple[int, int] | None = None
        self.system_current: int | None = None
        self.system_max: int | None = None
        self.aspace_total: int | None = None
        self.aspace_mprotect: int | None = None
        self.subheaps: int | None = None
        self.extra: list[tuple[str, str]] = []

    def take(self, elem: etree._Element, source: str) -> bool:
        """Record ``elem`` if it is a totals leaf; False if it is something else."""
        tag = elem.tag
        kind = elem.get("type")
        line = line_of(elem)
        if tag == "total":
            pair = (
                _number(elem.get("count"), f'<total type="{kind}"> count', source, line),
                _number(elem.get("size"), f'<total type="{kind}"> size', source, line),
            )
            if kind == "fast":
                self.fast = pair
            elif kind == "rest":
                self.rest = pair
            elif kind == "mmap":
                self.mmap = pair
            else:
                self.extra.append((f"total@type={kind}", f"count={pair[0]} size={pair[1]}"))
            self.extra.extend(_unknown(elem, ("type", "count", "size")))
            return True
        if tag in ("system", "aspace"):
            size = _number(elem.get("size"), f'<{tag} type="{kind}"> size', source, line)
            slot = {
                ("system", "current"): "system_current",
                ("system", "max"): "system_max",
                ("aspace", "total"): "aspace_total",
                ("aspace", "mprotect"): "aspace_mprotect",
                ("aspace", "subheaps"): "subheaps",
            }.get((tag, kind or ""))
            if slot is None:
                self.extra.append((f"{tag}@type={kind}", str(size)))
            else:
                setattr(self, slot, size)
            self.extra.extend(_unknown(elem, ("type", "size")))
            return True
        return False

    def require(self, where: str, source: str, line: int | None) -> None:
        missing = [
            name
            for name, value in (
                ('<total type="rest">', self.rest),
                ('<system type="current">', self.system_current),
                ('<system type="max">', self.system_max),
            )
            if value is None
        ]
        if missing:
            raise fail(f"{where} has no {', '.join(missing)}", source, line)


def _buckets_careful(
    sizes: etree._Element, source: str, extra: list[tuple[str, str]]
) -> list[SizeBucket]:
    """Element-by-element reading that names the exact line of a bad value."""
    buckets = []
    for child in sizes:
        line = line_of(child)
        if child.tag not in ("size", "unsorted"):
            extra.append((f"sizes/{_tag(child)}", _attrs_text(child)))
            continue
        numbers = [
            _number(child.get(attr), f"<{child.tag}> {attr}", source, line)
            for attr in _BUCKET_ATTRS
        ]
        from_bytes, to_bytes, total_bytes, count = numbers
        extra.extend(_unknown(child, _BUCKET_ATTRS))
        buckets.append(
            SizeBucket(
                kind=bucket_kind(child.tag, from_bytes, to_bytes),
                from_bytes=from_bytes,
                to_bytes=to_bytes,
                total_bytes=total_bytes,
                count=count,
                line=line or 0,
                suspect=is_suspect(total_bytes, count),
            )
        )
    return buckets


def arena_of(heap: etree._Element, source: str, text: re.Match[bytes] | None = None) -> Arena:
    """The arena of one closed ``<heap>``: glibc's exact shape fast, anything else carefully.

    ``text``: the arena pattern matched on the element's source text, where the reader has it.
    """
    arena = arena_from_text(heap, text)
    return _unsorted_judged(arena if arena is not None else _arena_careful(heap, source))


def _unsorted_judged(arena: Arena) -> Arena:
    """``arena`` with its implausible ``<unsorted>`` lines flagged suspect and, where glibc
    had added them into rest, taken out of it (see model.heap.implausible_unsorted).

    glibc <= 2.17 added its never-filled unsorted slot into rest once the arena was in use:
    rest then holds at least the line's count and total. An arena it was never in use for
    printed the slot alone; rest is left as printed there.
    """
    sizes = arena.sizes
    if isinstance(sizes, SizeTable):
        lines = sizes.unsorted_lines()  # one line read: the table stays undecoded
    else:
        lines = [(i, b) for i, b in enumerate(sizes) if b.kind == "unsorted"]
    bad = [(i, b) for i, b in lines if implausible_unsorted(b, arena.system_bytes)]
    if not bad:
        return arena
    if isinstance(sizes, SizeTable):  # text offsets to positions and source lines
        located = [(sizes.locate(at), b) for at, b in bad]
        bad = [(i, dataclasses.replace(b, line=line)) for (i, line), b in located]
    positions = tuple(i for i, _ in bad)
    flagged = tuple(dataclasses.replace(b, suspect=True) for _, b in bad)
    chunks, total = sum(b.count for b in flagged), sum(b.total_bytes for b in flagged)
    in_rest = arena.rest_chunks >= chunks and arena.rest_bytes >= total
    new_sizes: Sequence[SizeBucket]
    if isinstance(sizes, SizeTable):
        new_sizes = sizes.flagged(positions)
    else:
        by_position = dict(zip(positions, flagged, strict=True))
        new_sizes = tuple(by_position.get(i, b) for i, b in enumerate(sizes))
    return dataclasses.replace(
        arena,
        sizes=new_sizes,
        rest_chunks=arena.rest_chunks - chunks if in_rest else arena.rest_chunks,
        rest_bytes=arena.rest_bytes - total if in_rest else arena.rest_bytes,
        implausible=flagged,
        implausible_in_rest=in_rest,
    )


def _arena_careful(heap: etree._Element, source: str) -> Arena:
    """The arena of a ``<heap>`` of any other shape, element by element."""
    line = line_of(heap)
    index = _number(heap.get("nr"), "<heap> nr", source, line)
    totals = _Totals()
    extra: list[tuple[str, str]] = list(_unknown(heap, ("nr",)))
    buckets: Sequence[SizeBucket] = ()
    for child in heap:
        if child.tag == "sizes":
            table = checked_table(child)
            buckets = table if table is not None else _buckets_careful(child, source, extra)
        elif not totals.take(child, source):
            extra.append((_tag(child), _attrs_text(child)))
    totals.require(f"arena {index}", source, line)
    assert totals.rest is not None and totals.system_current is not None
    assert totals.system_max is not None
    rest_chunks, rest_bytes = totals.rest
    return Arena(
        index=index,
        sizes=buckets,
        fast_chunks=totals.fast[0] if totals.fast else None,
        fast_bytes=totals.fast[1] if totals.fast else None,
        rest_chunks=rest_chunks,
        rest_bytes=rest_bytes,
        system_bytes=totals.system_current,
        system_max_bytes=totals.system_max,
        aspace_total_bytes=totals.aspace_total,
        aspace_mprotect_bytes=totals.aspace_mprotect,
        subheaps=totals.subheaps,
        line=line or 0,
        extra=tuple(extra + totals.extra),
    )


def check_version(elem: etree._Element, source: str) -> str:
    version = elem.get("version")
    line = line_of(elem)
    if version is None:
        raise fail("<malloc> has no version attribute", source, line)
    if version == "1":
        return version
    for prefix, who in _OTHER_ALLOCATORS.items():
        if version.startswith(prefix):
            raise fail(
                f'<malloc version="{version}"> is {who} output, not glibc malloc_info',
                source,
                line,
                hint="memforensics reads glibc's malloc_info format only",
            )
    raise fail(f'unsupported <malloc version="{version}"> (glibc writes "1")', source, line)


def _dialect_notes(dump_totals: _Totals, arenas: list[Arena]) -> tuple[str, ...]:
    notes = []
    if dump_totals.fast is None:
        notes.append(
            "no fastbin totals: a glibc without fastbins (after 2.43); "
            "more freed memory sits in tcache, which malloc_info does not show"
        )
    if dump_totals.mmap is None:
        notes.append("no mmap total: glibc before ~2.17 did not print one")
    # Deciding from the main arena alone keeps parsing lazy; every arena of one glibc agrees.
    if arenas and arenas[0].rest_includes_top:
        notes.append("rest includes each arena's top chunk (glibc >= 2.31)")
    elif arenas:
        notes.append("rest excludes the top chunk (glibc before 2.31): in-use includes it")
    for in_rest in (True, False):
        judged = [a.index for a in arenas if a.implausible and a.implausible_in_rest == in_rest]
        if judged:
            where = f"arena{'s' if len(judged) > 1 else ''} {', '.join(map(str, judged))}"
            notes.append(
                f"{where}: an implausible <unsorted> line (glibc <= 2.17 printed a slot it never "
                "filled in) is flagged suspect and "
                + (
                    "kept out of rest, free and in use (glibc had added it in)"
                    if in_rest
                    else "left out of the histogram (rest did not include it)"
                )
            )
    return tuple(notes)


def _without_implausible(rest: tuple[int, int], arenas: list[Arena]) -> tuple[int, int]:
    """The process's rest without what the parser took out of its arenas' rest (glibc
    printed the process totals as the sums of the arenas' figures as printed)."""
    chunks = sum(a.implausible_rest[0] for a in arenas)
    size = sum(a.implausible_rest[1] for a in arenas)
    if chunks > rest[0] or size > rest[1]:
        return rest  # not the sums of these arenas (an excerpt): left as printed
    return rest[0] - chunks, rest[1] - size


def dump_of(elem: etree._Element, arenas: list[Arena], source: str, sequence: int) -> HeapDump:
    version = check_version(elem, source)
    totals = _Totals()
    extra: list[tuple[str, str]] = list(_unknown(elem, ("version",)))
    for child in elem:
        if child.tag == "heap":  # already consumed; only the emptied shell remains
            continue
        if not totals.take(child, source):
            extra.append((_tag(child), _attrs_text(child)))
    totals.require("<malloc>", source, line_of(elem))
    assert totals.rest is not None and totals.system_current is not None
    assert totals.system_max is not None
    rest_chunks, rest_bytes = _without_implausible(totals.rest, arenas)
    return HeapDump(
        version=version,
        arenas=tuple(arenas),
        fast_chunks=totals.fast[0] if totals.fast else None,
        fast_bytes=totals.fast[1] if totals.fast else None,
        rest_chunks=rest_chunks,
        rest_bytes=rest_bytes,
        mmap_chunks=totals.mmap[0] if totals.mmap else None,
        mmap_bytes=totals.mmap[1] if totals.mmap else None,
        system_bytes=totals.system_current,
        system_max_bytes=totals.system_max,
        aspace_total_bytes=totals.aspace_total,
        aspace_mprotect_bytes=totals.aspace_mprotect,
        source=source,
        line=line_of(elem) or 1,
        sequence=sequence,
        extra=tuple(extra + totals.extra),
        notes=_dialect_notes(totals, arenas),
    )
