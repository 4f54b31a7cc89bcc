"""How far a live heap read got, told to whoever listens (the CLI's progress line on a
terminal). The read only reports: it never prints, and with no listener a report costs a
context variable's lookup. A listener is called in the reading thread, maybe inside a stop of
the target: it must return at once (keep the news, show it from elsewhere), never block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Protocol


class Listener(Protocol):
    def arenas(self, pid: int, done: int, total: int) -> None:
        """``done`` of the ``total`` arenas of ``pid`` are read (the main one counts)."""

    def detail(self, pid: int, text: str) -> None:
        """What the read of ``pid`` is doing at length now ("" : nothing more to say)."""


_listener: ContextVar[Listener | None] = ContextVar("memforensics_read_progress", default=None)


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Reads in this context report to ``listener``."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)


def arenas(pid: int, done: int, total: int) -> None:
    listener = _listener.get()
    if listener is not None:
        listener.arenas(pid, done, total)


def detail(pid: int, text: str) -> None:
    listener = _listener.get()
    if listener is not None:
        listener.detail(pid, text)
