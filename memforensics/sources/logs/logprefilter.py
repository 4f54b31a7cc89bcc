"""Which lines of a big log are worth parsing: a byte-level search for OOM victim lines.

Speed: a 1 GB log is mostly unrelated kernel noise. Instead of decoding every line we search
the raw bytes for a few literal anchors that every victim line contains (``bytes.find`` runs
at memchr-like speed) and, for each hit, search backwards for its incident's
``invoked oom-killer`` header and take the lines in between (task table, memcg block,
``oom-kill:`` summary). Only those lines are decoded and parsed (sources/logs/logline.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

# Every line that defines an OOM event is found by one of three searches, each one pass over
# the file. One-byte searches are a plain memchr, several times faster than CPython's
# multi-byte search, so two rare capitals carry most of the work, each hit checked in place:
#   "K": the kernel's "Killed process"/"Kill process", systemd-oomd's "Killed <cgroup> due to",
#        earlyoom's "sending SIGKILL to process";
#   "M": systemd-oomd's newest "Marked <cgroup> for killing", earlyoom's "SIGTERM to process";
#   "oom-kill:constraint=CONSTRAINT_": the kernel's summary line (a log filtered to those
#        lines still shows its kills); every constraint the kernel prints is CONSTRAINT_*,
#        and the longer the needle, the further the multi-byte search skips (31 bytes search
#        300 MB about twice as fast as the 20 of "oom-kill:constraint=").
ANCHORS = (b"K", b"M", b"oom-kill:constraint=CONSTRAINT_")
_TO_PROCESS = b" to process "
# Only kill lines are followed by oom_reaper's confirmation.
_KILL_ANCHORS = frozenset({0})
_HEADER = b" invoked oom-killer: "
_REAPER = b"oom_reaper: "
# How far back from a victim line we look for its incident's header (task tables of big
# hosts run to a few hundred KiB); a header further away only costs us trigger/top tasks.
LOOKBACK_BYTES = 1 << 20
# oom_reaper confirms a kill up to seconds later; look this far ahead for it.
_REAPER_LOOKAHEAD_BYTES = 1 << 16
# Without a header, this many lines (within this many bytes) before a victim line are
# parsed too: its oom-kill: summary, the memory.oom.group notice, an interleaved reaper line.
_NEAR_LINES = 4
_NEAR_BYTES = 4096


class Buffer(Protocol):
    def find(self, sub: bytes, start: int = ..., end: int = ...) -> int: ...
    def rfind(self, sub: bytes, start: int = ..., end: int = ...) -> int: ...
    def __getitem__(self, index: slice) -> bytes: ...


def _find_anchor(buf: Buffer, index: int, start: int, end: int) -> int:
    """Offset of the next hit of ``ANCHORS[index]`` in ``buf[start:end]`` that is one of the
    phrases it stands for (see ANCHORS), or -1."""
    anchor = ANCHORS[index]
    position = buf.find(anchor, start, end)
    if index == 0:
        while position >= 0 and not (
            buf[position : position + 4] == b"Kill"
            or buf[position + 4 : position + 16] == _TO_PROCESS  # SIGKILL to process
        ):
            position = buf.find(anchor, position + 1, end)
    elif index == 1:
        while position >= 0 and not (
            buf[position : position + 8] == b"Marked /"
            or buf[position + 1 : position + 13] == _TO_PROCESS  # SIGTERM to process
        ):
            position = buf.find(anchor, position + 1, end)
    return position


def _window_end(buf: Buffer, start: int, end: int, window: int | None) -> int:
    """Where the search window starting at ``start`` ends: after a newline, or at ``end``."""
    if window is None or start + window >= end:
        return end
    return buf.find(b"\n", start + window, end) + 1 or end


def candidate_spans(
    buf: Buffer,
    start: int,
    end: int,
    floor: int,
    emitted: int | None = None,
    *,
    window: int | None = None,
    on_window: Callable[[int], None] | None = None,
) -> Iterator[tuple[int, int]]:
    """Yield ``(line_start, line_end)`` of the lines worth parsing in ``buf[start:end]``, in order.

    ``buf[start:end]`` holds whole lines; bytes from ``floor`` to ``start`` are look-behind
    from the previous buffer, searched for headers. Nothing before ``emitted`` (default
    ``start``: what the previous buffer already yielded) is yielded again.

    ``window``: search the anchors about this many bytes at a time (cut after a newline), so
    that a memory-mapped file is touched in order; ``on_window(offset)`` is called before the
    window starting at ``offset`` is searched, once everything before it has been yielded and
    consumed (bytes more than LOOKBACK_BYTES before it are not needed again).
    """
    window_end = _window_end(buf, start, end, window)
    nexts = [_find_anchor(buf, index, start, window_end) for index in range(len(ANCHORS))]
    emitted = start if emitted is None else emitted
    # A header before the previous victim line belongs to that victim's incident.
    last_victim_end = max(floor, min(emitted, start))
    while True:
        live = [p for p in nexts if p >= 0]
        if not live:
            if window_end >= end:
                return
            window_end, nexts = _next_window(buf, window_end, end, window, on_window)
            continue
        hit = min(live)
        kind = nexts.index(hit)
        line_start = buf.rfind(b"\n", floor, hit) + 1 or floor
        line_end = buf.find(b"\n", hit, end)
        if line_end < 0:
            line_end = end
        if line_start >= emitted:
            low = max(floor, last_victim_end, line_start - LOOKBACK_BYTES)
            pos = max(_entry_start(buf, low, _context_start(buf, low, line_start)), emitted)
            while pos < line_start:
                newline = buf.find(b"\n", pos, line_start)
                if newline < 0:
                    break
                yield pos, newline
                pos = newline + 1
            yield line_start, line_end
            emitted = last_victim_end = line_end + 1
            if _wrapped_oomd(buf[line_start:line_end]) and line_end < end:
                # systemd-oomd's "due to …" wrapped onto the next line: take that line too.
                next_end = buf.find(b"\n", line_end + 1, end)
                next_end = end if next_end < 0 else next_end
                if b"due to " in buf[line_end + 1 : next_end]:
                    yield line_end + 1, next_end
                    emitted = last_victim_end = next_end + 1
                    line_end = next_end
            reaper = _reaper_span(buf, line_end, end) if kind in _KILL_ANCHORS else None
            if reaper is not None:
                yield reaper
        for index, position in enumerate(nexts):
            if 0 <= position <= line_end:
                nexts[index] = _find_anchor(buf, index, line_end + 1, window_end)


def _next_window(
    buf: Buffer,
    window_start: int,
    end: int,
    window: int | None,
    on_window: Callable[[int], None] | None,
) -> tuple[int, list[int]]:
    """The next window of the search (its end) and each anchor's first hit in it."""
    if on_window is not None:
        on_window(window_start)
    window_end = _window_end(buf, window_start, end, window)
    return window_end, [_find_anchor(buf, i, window_start, window_end) for i in range(len(ANCHORS))]


def _context_start(buf: Buffer, low: int, line_start: int) -> int:
    """Where the lines worth parsing before a victim line at ``line_start`` begin: its
    report's header line, else (rate-limited, grep-filtered, or a group kill's next victim)
    the few lines just before, which may hold its oom-kill: summary or the memory.oom.group
    notice; never before ``low``."""
    header = buf.rfind(_HEADER, low, line_start)
    if header >= 0:
        return buf.rfind(b"\n", low, header) + 1 or low
    near = max(low, line_start - _NEAR_BYTES)
    if buf[line_start : line_start + 12].startswith((b"MESSAGE", b"    MESSAGE")):
        # journalctl export/verbose: an entry spans many lines; go by bytes.
        return low if near == low else (buf.find(b"\n", near, line_start) + 1 or near)
    pos = line_start
    for _ in range(_NEAR_LINES):
        if pos <= near:
            break
        pos = buf.rfind(b"\n", near, pos - 1) + 1 or near
    return pos


def _reaper_span(buf: Buffer, line_end: int, end: int) -> tuple[int, int] | None:
    """The oom_reaper line shortly after a kill line ending at ``line_end``, if any."""
    reaper = buf.find(_REAPER, line_end, min(end, line_end + _REAPER_LOOKAHEAD_BYTES))
    if reaper < 0:
        return None
    reaper_end = buf.find(b"\n", reaper, end)
    return (
        buf.rfind(b"\n", line_end, reaper) + 1 or line_end,
        end if reaper_end < 0 else reaper_end,
    )


def _wrapped_oomd(line: bytes) -> bool:
    """A systemd-oomd kill line cut before its " due to …" part."""
    return (b"Killed /" in line or b"Marked /" in line) and b" due to " not in line


# journalctl -o export / -o verbose spread one entry over several lines: the fields before
# MESSAGE (boot ID, time, transport) are part of the incident's context.
_ENTRY_BYTES = 8192


def _entry_start(buf: Buffer, low: int, pos: int) -> int:
    """Where the journal entry holding the line at ``pos`` starts, if that line is a field
    of journalctl's export or verbose output; else ``pos``."""
    if not buf[pos : pos + 12].startswith((b"MESSAGE", b"    MESSAGE")):
        return pos
    floor = max(low, pos - _ENTRY_BYTES)
    cursor = buf.rfind(b"\n__CURSOR=", floor, pos)  # export: the entry's first field
    verbose = buf.rfind(b" [s=", floor, pos)  # verbose: the entry's header line
    if cursor < 0 and verbose < 0:
        return pos
    if cursor > verbose:
        return cursor + 1
    return buf.rfind(b"\n", floor, verbose) + 1 or floor
