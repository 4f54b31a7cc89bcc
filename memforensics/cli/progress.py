"""A one-line progress report on the terminal while a long heap read runs (`inspect`): which
arena of how many, and what a long read is doing (its long lists followed in relays).

Contract: shown only where stderr is a terminal, and only once a read has lasted SHOW_AFTER
seconds (a quick read prints nothing); written by a thread of its own, never by the reading
thread: a terminal's write may block (flow control, a slow connection), and the reading
thread may be inside a stop of the target. The line is erased when the read ends, before
anything else is printed.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

from memforensics.sources.glibc import read_progress

SHOW_AFTER = 0.5  # seconds a read runs before its progress is shown
REFRESH_SECONDS = 0.2  # the line is written again at most this often
_WIDTH = 100  # at most this many characters (a line that wraps cannot be erased)


class ProgressLine:
    """A read_progress.Listener that keeps the latest news; ``run`` writes it to ``stream``."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._lock = threading.Lock()
        self._pid = 0
        self._arenas = ""
        self._detail = ""
        self._started = time.monotonic()
        self._shown = ""  # the text on the terminal now
        self._stop = threading.Event()

    # read_progress.Listener: called by the reading thread, so they only keep the news.
    def arenas(self, pid: int, done: int, total: int) -> None:
        with self._lock:
            self._pid, self._arenas = pid, f"arena {min(done, total):,} of {total:,}"

    def detail(self, pid: int, text: str) -> None:
        with self._lock:
            self._pid, self._detail = pid, text

    def text(self) -> str:
        """The line as it reads now ("" before any news)."""
        with self._lock:
            parts = [part for part in (self._arenas, self._detail) if part]
            pid = self._pid
        if not parts:
            return ""
        return f"reading PID {pid}'s heap: {' · '.join(parts)}"[:_WIDTH]

    def run(self) -> None:
        """Until ``stop``: write the line where it changed, past SHOW_AFTER."""
        while not self._stop.wait(REFRESH_SECONDS):
            if time.monotonic() - self._started < SHOW_AFTER:
                continue
            text = self.text()
            if text and text != self._shown:
                self._write(f"\r{text}\x1b[K")
                self._shown = text

    def stop(self) -> None:
        """End ``run`` (its thread may stay blocked in a write: it is a daemon)."""
        self._stop.set()

    def erase(self) -> None:
        """The line taken off the terminal, where one was shown."""
        if self._shown:
            self._write("\r\x1b[K")
            self._shown = ""

    def _write(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.write(text)
            self.stream.flush()


@contextlib.contextmanager
def progress_line(stream: TextIO | None = None) -> Iterator[ProgressLine | None]:
    """Within it, heap reads report to a ProgressLine on ``stream`` (stderr), when that is a
    terminal; else nothing is shown (None)."""
    stream = sys.stderr if stream is None else stream
    if not _is_terminal(stream):
        yield None
        return
    line = ProgressLine(stream)
    writer = threading.Thread(target=line.run, name="progress-line", daemon=True)
    writer.start()
    try:
        with read_progress.listening(line):
            yield line
    finally:
        line.stop()
        writer.join(timeout=1.0)
        if not writer.is_alive():  # (else a write blocks: leave the terminal to it)
            line.erase()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
