"""Streaming parser for glibc ``malloc_info`` XML: bytes, files or streams into HeapDumps.

Built on lxml's pull parser so that memory stays bounded: each ``<heap>`` element is turned
into an :class:`~memforensics.model.Arena` and dropped from the tree as soon as it closes, and
each ``<malloc>`` document is yielded and dropped before the next one is read. A file may hold
several documents one after another (a process dumped periodically into one log); they are
wrapped in a synthetic root so libxml2 reads them as one stream. Each arena of glibc's exact
shape reaches libxml2 without its bucket lines, which are kept as text (``malloc_texts``).

Hostile input is refused, never resolved: no DTD is loaded, no entity is expanded, nothing is
fetched, and a ``<!DOCTYPE``/``<!ENTITY`` is an error. Every problem is an
:class:`~memforensics.errors.InputDataError` naming the source and line.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, cast

from lxml import etree

from memforensics.errors import InputDataError, MemforensicsError
from memforensics.model.heap import Arena, HeapDump
from memforensics.sources.malloc_info.malloc_elements import (
    DEFAULT_HINT,
    arena_of,
    check_version,
    dump_of,
    fail,
    first_error,
    line_of,
)
from memforensics.sources.malloc_info.malloc_texts import HeapTexts

READ_CHUNK_BYTES = 1 << 20
_SERIES_OPEN = b"<memforensics-series>"
_SERIES_CLOSE = b"</memforensics-series>"
_SERIES_TAG = "memforensics-series"
_DECL_RE = re.compile(rb"^\s*<\?xml[^>]*\?>")
_FORBIDDEN = (b"<!DOCTYPE", b"<!ENTITY")


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
        self.texts = HeapTexts()
        # libxml2 reports the first fatal error in the thread's log, behind later ones;
        # clear it so an error message never comes from an earlier parse.
        etree.clear_error_log()
        self.parser.feed(_SERIES_OPEN)

    def _syntax_error(self, exc: etree.XMLSyntaxError) -> InputDataError:
        # libxml2 keeps going after the first fatal error; the first one is the cause.
        first = first_error(exc.error_log)
        # libxml2 knows the line of the fault; without it, say none rather than guess.
        line = (first.line if first is not None else exc.lineno) or None
        message = first.message if first is not None else str(exc.msg or exc)
        message = re.sub(r",? line \d+, column \d+$", "", message)
        # libxml2's advice to lift its limits is not ours to give; one line, no newline.
        message = re.sub(r",? (use|try) XML_PARSE_HUGE( option)?", " (refused)", message)
        message = " ".join(message.split())
        if self.sequence == 0 and not self.inside:
            return fail(
                f"not a malloc_info dump (not well-formed XML: {message})",
                self.source,
                line,
                hint=DEFAULT_HINT,
            )
        return fail(f"malformed XML: {message}", self.source, line)

    def feed(self, chunk: bytes) -> Iterator[HeapDump]:
        if not self.started:
            stripped = chunk.lstrip(b"\xef\xbb\xbf")
            if stripped.strip():
                self.started = True
                stripped = _DECL_RE.sub(lambda m: b"\n" * m.group(0).count(b"\n"), stripped, 1)
            chunk = stripped
        window = self.tail + chunk
        # Both markers hold a "!", which glibc never writes: one memchr-fast scan clears a
        # chunk where several string searches (each ~1 ms per MB) would each find nothing.
        for marker in _FORBIDDEN if b"!" in window else ():
            position = window.find(marker)
            if position >= 0:
                line = self.newlines - self.tail.count(b"\n") + window.count(b"\n", 0, position)
                raise fail(
                    "DTDs and entity declarations are not allowed in a malloc_info dump "
                    "(refused; nothing was resolved or fetched)",
                    self.source,
                    line + 1,
                    hint="malloc_info never writes a DTD: this file was altered or is hostile",
                )
        self.tail = chunk[-16:]
        try:
            self.parser.feed(self.texts.take(chunk))
            yield from self._events()
        except etree.XMLSyntaxError as exc:
            raise self._syntax_error(exc) from None
        self.newlines += chunk.count(b"\n")

    def close(self) -> Iterator[HeapDump]:
        if not self.started:
            raise fail(
                "empty input: no <malloc> document found",
                self.source,
                1,
                hint=DEFAULT_HINT,
            )
        try:
            self.parser.feed(self.texts.take(b"", final=True))
            self.parser.feed(_SERIES_CLOSE)
            yield from self._events()
            root = self.parser.close()
        except etree.XMLSyntaxError as exc:
            # An error on the last line, where our closing wrapper tag meets an open
            # <malloc>, means the input stopped early.
            first = first_error(exc.error_log)
            error_line = (first.line if first is not None else exc.lineno) or 0
            if self.inside and error_line >= self.newlines:
                raise fail(
                    "truncated: the input ends inside a <malloc> document",
                    self.source,
                    self.newlines + 1,
                    hint="the dump was cut short; capture it again",
                ) from None
            raise self._syntax_error(exc) from None
        if self.sequence == 0:
            first = next(iter(root), None)
            found = f": found <{etree.QName(first).localname}>" if first is not None else ""
            raise fail(
                f"not a malloc_info dump: no <malloc> document{found}",
                self.source,
                line_of(first) if first is not None else self.newlines + 1,
                hint=DEFAULT_HINT,
            )

    def _events(self) -> Iterator[HeapDump]:
        for event, item in self.parser.read_events():
            elem = cast(etree._Element, item)
            parent = elem.getparent()
            parent_tag = parent.tag if parent is not None else None
            if elem.tag == "malloc":
                if parent_tag != _SERIES_TAG:
                    raise fail("<malloc> nested inside another element", self.source, line_of(elem))
                if event == "start":
                    check_version(elem, self.source)
                    self.inside = True
                    continue
                dump = dump_of(elem, self.arenas, self.source, self.sequence)
                self.arenas = []
                self.sequence += 1
                self.inside = False
                _drop_consumed(elem)
                yield dump
            elif event == "end":  # a <heap>
                if parent_tag != "malloc":
                    raise fail(
                        "not a malloc_info dump: <heap> outside a <malloc> document",
                        self.source,
                        line_of(elem),
                        hint='a pasted excerpt? the <malloc version="1"> root is missing',
                    )
                text = self.texts.next_heap()
                if text is not None and text.group(1) != (elem.get("nr") or "").encode():
                    # Cannot happen (see malloc_texts); refused rather than mis-attributed.
                    raise fail(
                        "cannot pair a <heap> with its text (please report this)",
                        self.source,
                        line_of(elem),
                    )
                self.arenas.append(arena_of(elem, self.source, text))
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
            raise fail("is a directory, not a dump", str(source), None) from None
        except FileNotFoundError:
            raise fail("no such file", str(source), None) from None
        except PermissionError:
            raise fail(
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
            except MemforensicsError:
                raise  # already says what went wrong (a PermissionError too, but ours)
            except OSError as exc:
                raise fail(f"cannot read: {exc.strerror or exc}", label, None) from None
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
        raise fail(f"expected one <malloc> document, found {len(dumps)}", name, None)
    return dumps[0]
