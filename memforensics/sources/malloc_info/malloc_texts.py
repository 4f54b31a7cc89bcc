"""Arena texts cut from the input before libxml2 sees it, and the slimmer bytes it parses.

A big dump is a million ``<size>`` lines; building (and freeing) a tree node for each one
cost libxml2 more than everything else together. The reader checks each ``<heap>`` of glibc's
exact shape with one regular expression on the input text, keeps its ``<sizes>`` block as
text (decoded later, in bulk), and hands libxml2 the heap with that block replaced by
``<sizes/>`` and the same number of newlines: the tree it builds is a dozen nodes per arena,
every line number is what it was, and the element still carries its own totals and ``nr``.

Why this is safe: the replaced block matched a pattern that admits only bucket lines of
digits and whitespace, so it is well-formed whatever surrounds it, and replacing a
well-formed element by an empty one of the same name changes no check libxml2 makes around
it. In glibc's output every ``<heap`` in the text opens a heap element, in document order, so
the k-th text belongs to the k-th heap element that closes (nested heaps are refused by the
reader before any pairing). Comments, CDATA, processing instructions and namespaces could
break that; from the first one on, nothing more is replaced (the tree is read instead), and
the arena number of each text is checked against its element's.
"""

from __future__ import annotations

import re
from collections import deque

from memforensics.sources.malloc_info.malloc_buckets import HEAP_RE

# Markup after which a literal "<heap" in the text may not be an element of ours.
_UNTRUSTED_TEXT = (b"<!--", b"<![CDATA[", b"<?", b"xmlns")
_AFTER_NAME = (b" ", b"\t", b"\r", b"\n", b">", b"/")  # what may follow a tag name "heap"
# Bytes always held back to the next chunk, so that a tag name cut by a chunk boundary is
# seen whole ("<heap" and the byte after it).
_HOLD_BYTES = 6
# A heap still open after this much text is not glibc's (131 lines are ~10 KB): libxml2
# reads it and everything after it as it comes, nothing more is held or replaced.
MAX_HELD_HEAP_BYTES = 1 << 20
_SIZES_STUB = b"<sizes/>"
# Deletes every byte but line breaks: the stub keeps a table's CR and LF bytes as they were,
# so libxml2 counts the same lines after it.
_NOT_LINE_BREAK = bytes(c for c in range(256) if c not in b"\r\n")


def _find_tag(data: bytes, tag: bytes, start: int) -> int:
    """Position of the next ``tag`` that is a whole tag name (``<heap`` not ``<heapx``)."""
    size = len(tag)
    position = data.find(tag, start)
    while position >= 0 and data[position + size : position + size + 1] not in _AFTER_NAME:
        position = data.find(tag, position + size)
    return position


class HeapTexts:
    """Turns the input into what libxml2 parses, and pairs each heap element with its text.

    :meth:`take` returns the bytes to feed now (some are held back until the next chunk);
    :meth:`next_heap` gives, per closed heap element in order, the arena pattern matched on
    its text, or None where the element must be read from the tree.
    """

    def __init__(self) -> None:
        self.pending = b""  # received, not yet handed to libxml2
        self.tail = b""  # the last bytes seen, for markers cut by a chunk boundary
        self.usable = True
        self.entries: deque[re.Match[bytes] | None] = deque()  # one per <heap> fed

    def take(self, chunk: bytes, *, final: bool = False) -> bytes:
        """The bytes to feed libxml2 for ``chunk`` (all that is left when ``final``)."""
        if self.usable:
            window = self.tail + chunk
            # "!" or "?" (never in glibc's output) are found by memchr; only then is each
            # marker looked for (a multi-byte search costs ~1 ms per MB, per marker).
            rare = b"!" in window or b"?" in window
            if (rare and any(marker in window for marker in _UNTRUSTED_TEXT)) or (
                b"xmlns" in window
            ):
                self.usable = False
            self.tail = window[-16:]
        data = self.pending + chunk if self.pending else chunk
        if not self.usable:
            self.pending = b""
            return data
        slim, held_from = self._slim(data, final)
        self.pending = data[held_from:]
        return slim

    def _slim(self, data: bytes, final: bool) -> tuple[bytes, int]:
        """(bytes to feed, where the held-back rest of ``data`` starts)."""
        pieces: list[bytes] = []
        copied = 0  # data[:copied] is in pieces already
        position = 0
        limit = len(data) if final else len(data) - _HOLD_BYTES
        held_from = max(limit, 0)
        # Where the next "</heap" is, and whether it is whole: searched once for a run of
        # opening tags, so that thousands of nested "<heap>" cost one scan, not one each.
        close, closed = -1, False
        while True:
            start = _find_tag(data, b"<heap", position)
            if start < 0 or start >= limit:
                break
            match = HEAP_RE.match(data, start)
            if match is not None:
                self.entries.append(match)
                begin, end = match.span("sizes")
                pieces.append(data[copied:begin])
                pieces.append(_SIZES_STUB + data[begin:end].translate(None, _NOT_LINE_BREAK))
                copied = end
                position = match.end()
                continue
            if close < start:  # one search serves every "<heap" before that "</heap"
                close = _find_tag(data, b"</heap", start)
                closed = close >= 0 and data.find(b">", close) >= 0
                if close < 0:
                    close = len(data)  # none anywhere after: no need to look again
            if not closed:
                if not final and len(data) - start <= MAX_HELD_HEAP_BYTES:
                    held_from = start  # not whole yet: look again with the next chunk
                    break
                if not final:
                    # Too long to be glibc's: stop replacing; libxml2 reads the rest as is.
                    self.usable = False
                    held_from = len(data)
                    break
            self.entries.append(None)  # not glibc's exact shape: read from the tree
            position = start + 1
        held_from = max(held_from, copied)
        pieces.append(data[copied:held_from])
        return b"".join(pieces), held_from

    def next_heap(self) -> re.Match[bytes] | None:
        """The arena pattern matched on the next closed heap's text, or None (use the tree)."""
        return self.entries.popleft() if self.entries else None
