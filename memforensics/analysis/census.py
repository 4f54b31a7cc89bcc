"""Pure classification of a chunk's bytes when no type names it (text, zeros, pointers,
unknown by size class), and the tally of a census into its lines.

- text: printable bytes (ASCII or UTF-8, tab and newline too) from the first byte, at least
  TEXT_MIN_CHARS of them, ended by a NUL that lies in the first half of the chunk's data or
  beyond (a string allocated for itself, not a record that starts with a short name); a
  chunk whose visible bytes are all printable (a long text cut by the read) counts too.
- zeros: every visible byte is 0.
- pointers: among the first POINTER_WORDS words, at least two, and at least half of those
  that are not 0, point into the process's heap memory (arrays, hash tables, lists).
- unknown: the rest, grouped by chunk size in powers of two.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Sequence

from memforensics.model.census import Census, CensusRead, CensusType

TEXT_MIN_CHARS = 4
POINTER_WORDS = 32
_PRINTABLE = bytes(range(0x20, 0x7F)) + b"\t\n\r" + bytes(range(0x80, 0x100))


class HeapRanges:
    """The [start, end) spans of the process's heap memory, for the pointer test."""

    def __init__(self, spans: Sequence[tuple[int, int]]) -> None:
        merged: list[tuple[int, int]] = []
        for start, end in sorted(spans):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((start, end))
        # Machine words: bisect reads them, and the census's C loop takes them as buffers.
        self.starts = array("Q", [s for s, _ in merged])
        self.ends = array("Q", [e for _, e in merged])
        self.low = self.starts[0] if merged else 0
        self.high = self.ends[-1] if merged else 0

    def holds(self, address: int) -> bool:
        if not self.low <= address < self.high:
            return False
        index = bisect.bisect_right(self.starts, address) - 1
        return index >= 0 and address < self.ends[index]


def size_class(size_bytes: int) -> str:
    """The power-of-two class of a chunk size: "unknown 33-64 B", "unknown 1-2 KiB" …"""
    if size_bytes <= 32:
        return "unknown <=32 B"
    upper = 1 << (size_bytes - 1).bit_length()
    lower = upper // 2 + 1
    if upper <= 1024:
        return f"unknown {lower}-{upper} B"
    if upper <= 1 << 20:
        return f"unknown {upper >> 11}-{upper >> 10} KiB"
    if upper <= 1 << 30:
        return f"unknown {upper >> 21}-{upper >> 20} MiB"
    return "unknown >1 GiB"


def classify_bytes(data: bytes | memoryview, size_bytes: int, heap: HeapRanges) -> tuple[str, str]:
    """(name, kind) of a chunk's data (its visible first bytes) by content alone."""
    raw = bytes(data)
    if not raw.strip(b"\0"):
        return "zeros", "zeros"
    nul = raw.find(0)
    text_part = raw if nul < 0 else raw[:nul]
    if (
        len(text_part) >= TEXT_MIN_CHARS
        and not text_part.translate(None, _PRINTABLE)
        and (nul < 0 or 2 * (nul + 1) >= len(raw) or nul >= 64)
    ):
        try:
            text_part.decode("utf-8")
        except UnicodeDecodeError:
            if nul >= 0:  # cut mid-character only when the read cut it
                return size_class(size_bytes), "unknown"
        return "text", "text"
    words = memoryview(raw[: min(len(raw), 8 * POINTER_WORDS) // 8 * 8]).cast("Q")
    pointers = nonzero = 0
    for word in words:
        if word:
            nonzero += 1
            if not word & 7 and heap.holds(word):
                pointers += 1
    if pointers >= 2 and 2 * pointers >= nonzero:
        return "pointers", "pointers"
    return size_class(size_bytes), "unknown"


class Tally:
    """Counts and bytes per (name, kind), and the totals."""

    def __init__(self) -> None:
        self.lines: dict[tuple[str, str], list[int]] = {}
        self.live_chunks = 0
        self.live_bytes = 0
        self.unread_chunks = 0
        self.unread_bytes = 0

    def add(self, name: str, kind: str, size_bytes: int) -> None:
        # add_many's body written out: this runs once per chunk or pymalloc block.
        line = self.lines.get((name, kind))
        if line is None:
            self.lines[(name, kind)] = [1, size_bytes]
        else:
            line[0] += 1
            line[1] += size_bytes
        self.live_chunks += 1
        self.live_bytes += size_bytes

    def add_many(self, name: str, kind: str, count: int, size_bytes: int) -> None:
        """``count`` chunks of ``size_bytes`` in all."""
        line = self.lines.get((name, kind))
        if line is None:
            self.lines[(name, kind)] = [count, size_bytes]
        else:
            line[0] += count
            line[1] += size_bytes
        self.live_chunks += count
        self.live_bytes += size_bytes

    def unread(self, size_bytes: int) -> None:
        self.unread_chunks += 1
        self.unread_bytes += size_bytes
        self.add("unread", "unknown", size_bytes)


def build_census(
    tally: Tally, *, pid: int, process_name: str, time: str, read: CensusRead
) -> Census:
    """The census of ``tally``, its lines biggest first (then by name: stable for diffs)."""
    types = tuple(
        sorted(
            (
                CensusType(name, kind, count, size)
                for (name, kind), (count, size) in tally.lines.items()
            ),
            key=lambda t: (-t.total_bytes, t.name, t.kind),
        )
    )
    classified = sum(t.total_bytes for t in types if t.kind != "unknown")
    return Census(
        pid=pid,
        process_name=process_name,
        time=time,
        types=types,
        live_chunks=tally.live_chunks,
        live_bytes=tally.live_bytes,
        classified_bytes=classified,
        unread_chunks=tally.unread_chunks,
        unread_bytes=tally.unread_bytes,
        read=read,
    )
