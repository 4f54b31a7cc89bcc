"""cli/progress.py: a long read's progress on a terminal's stderr, written by its own thread,
nothing for a quick read or where stderr is not a terminal, erased at the end; and
read_progress, which only tells whoever listens."""

from __future__ import annotations

import io
import threading
import time

import pytest

from memforensics.cli import progress
from memforensics.sources.glibc import read_progress


class Terminal(io.StringIO):
    """A stream that says it is a terminal, and tells when it was written to."""

    def __init__(self) -> None:
        super().__init__()
        self.written = threading.Event()

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        done = super().write(text)
        self.written.set()
        return done


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    def arenas(self, pid: int, done: int, total: int) -> None:
        self.events.append(("arenas", pid, done, total))

    def detail(self, pid: int, text: str) -> None:
        self.events.append(("detail", pid, text))


def test_reports_reach_the_listener_of_their_context_only() -> None:
    recorder = Recorder()
    read_progress.arenas(7, 1, 3)  # (no listener: nothing)
    with read_progress.listening(recorder):
        read_progress.arenas(7, 2, 3)
        read_progress.detail(7, "long lists")
    read_progress.arenas(7, 3, 3)
    assert recorder.events == [("arenas", 7, 2, 3), ("detail", 7, "long lists")]


def test_a_stream_that_is_not_a_terminal_shows_nothing() -> None:
    stream = io.StringIO()
    with progress.progress_line(stream) as line:
        assert line is None
        read_progress.arenas(7, 1, 2)
    assert stream.getvalue() == ""


def test_the_line_shows_the_latest_news_and_is_erased(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "SHOW_AFTER", 0.0)
    monkeypatch.setattr(progress, "REFRESH_SECONDS", 0.01)
    terminal = Terminal()
    with progress.progress_line(terminal) as line:
        assert line is not None
        read_progress.arenas(4242, 3, 1500)
        read_progress.detail(4242, "long lists: 1,000 chunks followed in 2 stops")
        assert terminal.written.wait(30)
        while "long lists" not in terminal.getvalue():  # (both may come in one write or two)
            time.sleep(0.01)
    shown = terminal.getvalue()
    assert shown.startswith("\rreading PID 4242's heap: arena 3 of 1,500")
    assert "arena 3 of 1,500 · long lists: 1,000 chunks followed in 2 stops\x1b[K" in shown
    assert shown.endswith("\r\x1b[K")  # (erased once the read ended)


def test_a_quick_read_shows_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "SHOW_AFTER", 3600.0)
    monkeypatch.setattr(progress, "REFRESH_SECONDS", 0.01)
    terminal = Terminal()
    with progress.progress_line(terminal):
        read_progress.arenas(4242, 1, 2)
        time.sleep(0.1)  # (a few refreshes go by)
    assert terminal.getvalue() == ""


def test_the_line_never_wraps() -> None:
    line = progress.ProgressLine(Terminal())
    line.arenas(4242, 1, 2)
    line.detail(4242, "x" * 500)
    assert len(line.text()) <= progress._WIDTH
