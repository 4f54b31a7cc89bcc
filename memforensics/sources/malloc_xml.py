"""Streaming parser for glibc ``malloc_info`` XML: bytes, files or streams into HeapDumps.

Built on lxml's pull parser so that memory stays bounded: each ``<heap>`` element is turned
into an :class:`~memforensics.model.Arena` and dropped from the tree as soon as it closes, and
each ``<malloc>`` document is yielded and dropped before the next one is read. A file may hold
several documents one after another (a process dumped periodically into one log); they are
wrapped in a synthetic root so libxml2 reads them as one stream.

Hostile input is refused, never resolved: no DTD is loaded, no entity is expanded, nothing is
fetched, and a ``<!DOCTYPE``/``<!ENTITY`` is an error. Every problem is an
:class:`~memforensics.errors.InputDataError` naming the source and line.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, cast

from lxml import etree

from memforensics.errors import InputDataError
from memforensics.model.heap import (
    BUCKET_LINE_RE,
    SUSPECT_BYTES,
    SUSPECT_COUNT,
    Arena,
    HeapDump,
    SizeBucket,
    SizeTable,
    bucket_kind,
)

READ_CHUNK_BYTES = 1 << 20
_SERIES_OPEN = b"<memforensics-series>"
_SERIES_CLOSE = b"</memforensics-series>"
_SERIES_TAG = "memforensics-series"
_MAX_VALUE = (1 << 64) - 1
_DECL_RE = re.compile(rb"^\s*<\?xml[^>]*\?>")
_FORBIDDEN = (b"<!DOCTYPE", b"<!ENTITY")
_OTHER_ALLOCATORS = {
    "jemalloc": "Android bionic's jemalloc wrapper",
    "hardened_malloc": "GrapheneOS hardened_malloc",
    "scudo": "LLVM scudo",
}
# glibc prints these four attributes, always in this order.
_BUCKET_ATTRS = ("from", "to", "total", "count")
_SIZES_BLOCK_RE = re.compile(
    rb"<sizes>(?:\s*" + BUCKET_LINE_RE.pattern + rb")*\s*</sizes>|<sizes/>"
)


_DEFAULT_HINT = "expected the unedited output of glibc's malloc_info(0, fp)"


def _line(elem: etree._Element) -> int | None:
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


def _first_error(log: Any) -> Any:
    """The first entry of an lxml error log, or None."""
    return next(iter(cast(Iterable[Any], log)), None)


def _fail(what: str, source: str, line: int | None, hint: str | None = None) -> InputDataError:
    return InputDataError(what, source=source, line=line, hint=hint or _DEFAULT_HINT)


def _number(value: str | None, what: str, source: str, line: int | None) -> int:
    """A non-negative decimal integer below 2**64, or an InputDataError."""
    if value is None:
        raise _fail(f"missing attribute: {what}", source, line)
    text = value.strip()
    if not (text.isascii() and text.isdigit()):
        if text.startswith("-") and text[1:].isdigit():
            raise _fail(f"negative number {value!r} in {what}", source, line)
        raise _fail(f"not a number: {what}={value!r}", source, line)
    # Checked before int(): a 200,000-digit value must not reach the conversion at all.
    if len(text) > 20 or int(text) > _MAX_VALUE:
        raise _fail(f"number out of range (over 2^64) in {what}", source, line)
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
        line = _line(elem)
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
            raise _fail(f"{where} has no {', '.join(missing)}", source, line)


def _buckets_fast(sizes: etree._Element, heap_line: int) -> SizeTable | None:
    """Check every bucket line with one regular expression in C and keep the text.

    Per-element Python work dominates parse time, so the common, well-formed case is
    serialised by libxml2 and matched whole; objects are built when a report reads them.
    None sends the element to the careful path, which names the exact bad line.
    """
    raw = etree.tostring(sizes, with_tail=False)
    if _SIZES_BLOCK_RE.fullmatch(raw) is None:
        return None
    return SizeTable(raw, len(sizes), heap_line + 2)


def _buckets_slow(
    sizes: etree._Element, source: str, extra: list[tuple[str, str]]
) -> list[SizeBucket]:
    """Element-by-element reading that names the exact line of a bad value."""
    buckets = []
    for child in sizes:
        line = _line(child)
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
                suspect=count >= SUSPECT_COUNT or total_bytes >= SUSPECT_BYTES,
            )
        )
    return buckets


def _arena(heap: etree._Element, source: str) -> Arena:
    line = _line(heap)
    index = _number(heap.get("nr"), "<heap> nr", source, line)
    totals = _Totals()
    extra: list[tuple[str, str]] = list(_unknown(heap, ("nr",)))
    buckets: Sequence[SizeBucket] = ()
    for child in heap:
        if child.tag == "sizes":
            fast = _buckets_fast(child, line or 0)
            buckets = fast if fast is not None else _buckets_slow(child, source, extra)
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


def _check_version(elem: etree._Element, source: str) -> str:
    version = elem.get("version")
    line = _line(elem)
    if version is None:
        raise _fail("<malloc> has no version attribute", source, line)
    if version == "1":
        return version
    for prefix, who in _OTHER_ALLOCATORS.items():
        if version.startswith(prefix):
            raise _fail(
                f'<malloc version="{version}"> is {who} output, not glibc malloc_info',
                source,
                line,
                hint="memforensics reads glibc's malloc_info format only",
            )
    raise _fail(f'unsupported <malloc version="{version}"> (glibc writes "1")', source, line)


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
    if arenas and arenas[0].top_bytes is not None:
        notes.append("rest includes each arena's top chunk (glibc >= 2.31)")
    elif arenas:
        notes.append("rest excludes the top chunk (glibc before 2.31): in-use includes it")
    return tuple(notes)


def _dump(elem: etree._Element, arenas: list[Arena], source: str, sequence: int) -> HeapDump:
    version = _check_version(elem, source)
    totals = _Totals()
    extra: list[tuple[str, str]] = list(_unknown(elem, ("version",)))
    for child in elem:
        if child.tag == "heap":  # already consumed; only the emptied shell remains
            continue
        if not totals.take(child, source):
            extra.append((_tag(child), _attrs_text(child)))
    totals.require("<malloc>", source, _line(elem))
    assert totals.rest is not None and totals.system_current is not None
    assert totals.system_max is not None
    return HeapDump(
        version=version,
        arenas=tuple(arenas),
        fast_chunks=totals.fast[0] if totals.fast else None,
        fast_bytes=totals.fast[1] if totals.fast else None,
        rest_chunks=totals.rest[0],
        rest_bytes=totals.rest[1],
        mmap_chunks=totals.mmap[0] if totals.mmap else None,
        mmap_bytes=totals.mmap[1] if totals.mmap else None,
        system_bytes=totals.system_current,
        system_max_bytes=totals.system_max,
        aspace_total_bytes=totals.aspace_total,
        aspace_mprotect_bytes=totals.aspace_mprotect,
        source=source,
        line=_line(elem) or 1,
        sequence=sequence,
        extra=tuple(extra + totals.extra),
        notes=_dialect_notes(totals, arenas),
    )


def _drop_consumed(elem: etree._Element) -> None:
    """Free an element and its already-processed siblings (bounded memory)."""
    elem.clear()
    parent = elem.getparent()
    if parent is not None:
        while elem.getprevious() is not None:
            del parent[0]


class _Reader:
    """Feeds chunks to libxml2 and turns closing elements into arenas and dumps."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.parser = etree.XMLPullParser(
            events=("start", "end"),
            # Events only for the two levels we act on: per-element events for every bucket
            # line would cost more than libxml2's own parsing.
            tag=("malloc", "heap"),
            resolve_entities=False,
            no_network=True,
            load_dtd=False,
            huge_tree=False,
            remove_comments=True,
            remove_pis=True,
            dtd_validation=False,
        )
        self.arenas: list[Arena] = []
        self.sequence = 0
        self.inside = False  # between a <malloc> start and its end
        self.newlines = 0  # lines fed so far, for errors outside any element
        self.tail = b""
        self.started = False
        # libxml2 reports the first fatal error in the thread's log, behind later ones;
        # clear it so an error message never comes from an earlier parse.
        etree.clear_error_log()
        self.parser.feed(_SERIES_OPEN)

    def _syntax_error(self, exc: etree.XMLSyntaxError) -> InputDataError:
        # libxml2 keeps going after the first fatal error; the first one is the cause.
        first = _first_error(exc.error_log)
        line = (first.line if first is not None else exc.lineno) or self.newlines + 1
        message = first.message if first is not None else str(exc.msg or exc)
        message = re.sub(r",? line \d+, column \d+$", "", message)
        # libxml2's advice to lift its limits is not ours to give; one line, no newline.
        message = re.sub(r",? (use|try) XML_PARSE_HUGE( option)?", " (refused)", message)
        message = " ".join(message.split())
        if self.sequence == 0 and not self.inside:
            return _fail(
                f"not a malloc_info dump (not well-formed XML: {message})",
                self.source,
                line,
                hint=_DEFAULT_HINT,
            )
        return _fail(f"malformed XML: {message}", self.source, line)

    def feed(self, chunk: bytes) -> Iterator[HeapDump]:
        if not self.started:
            stripped = chunk.lstrip(b"\xef\xbb\xbf")
            if stripped.strip():
                self.started = True
                stripped = _DECL_RE.sub(lambda m: b"\n" * m.group(0).count(b"\n"), stripped, 1)
            chunk = stripped
        window = self.tail + chunk
        for marker in _FORBIDDEN:
            position = window.find(marker)
            if position >= 0:
                line = self.newlines - self.tail.count(b"\n") + window.count(b"\n", 0, position)
                raise _fail(
                    "DTDs and entity declarations are not allowed in a malloc_info dump "
                    "(refused; nothing was resolved or fetched)",
                    self.source,
                    line + 1,
                    hint="malloc_info never writes a DTD: this file was altered or is hostile",
                )
        self.tail = chunk[-16:]
        try:
            self.parser.feed(chunk)
            yield from self._events()
        except etree.XMLSyntaxError as exc:
            raise self._syntax_error(exc) from None
        self.newlines += chunk.count(b"\n")

    def close(self) -> Iterator[HeapDump]:
        if not self.started:
            raise _fail(
                "empty input: no <malloc> document found",
                self.source,
                1,
                hint=_DEFAULT_HINT,
            )
        try:
            self.parser.feed(_SERIES_CLOSE)
            yield from self._events()
            root = self.parser.close()
        except etree.XMLSyntaxError as exc:
            # An error on the last line, where our closing wrapper tag meets an open
            # <malloc>, means the input stopped early.
            first = _first_error(exc.error_log)
            error_line = (first.line if first is not None else exc.lineno) or 0
            if self.inside and error_line >= self.newlines:
                raise _fail(
                    "truncated: the input ends inside a <malloc> document",
                    self.source,
                    self.newlines + 1,
                    hint="the dump was cut short; capture it again",
                ) from None
            raise self._syntax_error(exc) from None
        if self.sequence == 0:
            first = next(iter(root), None)
            found = f": found <{etree.QName(first).localname}>" if first is not None else ""
            raise _fail(
                f"not a malloc_info dump: no <malloc> document{found}",
                self.source,
                _line(first) if first is not None else self.newlines + 1,
                hint=_DEFAULT_HINT,
            )

    def _events(self) -> Iterator[HeapDump]:
        for event, item in self.parser.read_events():
            elem = cast(etree._Element, item)
            parent = elem.getparent()
            parent_tag = parent.tag if parent is not None else None
            if elem.tag == "malloc":
                if parent_tag != _SERIES_TAG:
                    raise _fail("<malloc> nested inside another element", self.source, _line(elem))
                if event == "start":
                    _check_version(elem, self.source)
                    self.inside = True
                    continue
                dump = _dump(elem, self.arenas, self.source, self.sequence)
                self.arenas = []
                self.sequence += 1
                self.inside = False
                _drop_consumed(elem)
                yield dump
            elif event == "end":  # a <heap>
                if parent_tag != "malloc":
                    raise _fail(
                        "not a malloc_info dump: <heap> outside a <malloc> document",
                        self.source,
                        _line(elem),
                        hint='a pasted excerpt? the <malloc version="1"> root is missing',
                    )
                self.arenas.append(_arena(elem, self.source))
                _drop_consumed(elem)


def _open(
    source: str | os.PathLike[str] | BinaryIO | bytes, name: str | None
) -> tuple[BinaryIO, str, bool]:
    if isinstance(source, bytes):
        return io.BytesIO(source), name or "<bytes>", True
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            return path.open("rb"), name or str(source), True
        except IsADirectoryError:
            raise _fail("is a directory, not a dump", str(source), None) from None
        except FileNotFoundError:
            raise _fail("no such file", str(source), None) from None
        except PermissionError:
            raise _fail(
                "permission denied", str(source), None, hint="check the file's permissions"
            ) from None
    return source, str(name or getattr(source, "name", "<stream>")), False


def iter_dumps(
    source: str | os.PathLike[str] | BinaryIO | bytes, *, name: str | None = None
) -> Iterator[HeapDump]:
    """Yield every ``<malloc>`` document in ``source``, in order, in bounded memory.

    ``source`` is a path, a binary stream or bytes; ``name`` is what errors call it.
    Raises :class:`InputDataError` (exit 7) naming the line of the first problem.
    """
    stream, label, owned = _open(source, name)
    reader = _Reader(label)
    try:
        while True:
            try:
                chunk = stream.read(READ_CHUNK_BYTES)
            except OSError as exc:
                raise _fail(f"cannot read: {exc.strerror or exc}", label, None) from None
            if not chunk:
                break
            yield from reader.feed(chunk)
        yield from reader.close()
    finally:
        if owned:
            stream.close()


def parse_dump(xml: bytes, *, name: str = "<target>") -> HeapDump:
    """Parse exactly one ``<malloc>`` document (what one malloc_info call produced)."""
    dumps = list(iter_dumps(xml, name=name))
    if len(dumps) != 1:
        raise _fail(f"expected one <malloc> document, found {len(dumps)}", name, None)
    return dumps[0]
