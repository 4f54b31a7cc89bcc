"""Signal deferral for a session on a live process: cleanup must finish before we die.

SIGTERM and SIGHUP become an exception during a session (so that ``finally`` blocks detach the
target), and Ctrl-C/SIGTERM/SIGHUP are held while cleaning up, then delivered.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any


class TerminatedError(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived during a session; raised so that cleanup runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_status = 128 + signum  # the shell's convention for death by a signal


_SHIELDED_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def _raise_terminated(signum: int, _frame: FrameType | None) -> None:
    raise TerminatedError(signum)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold Ctrl-C/SIGTERM while cleaning up; they are delivered (and raise) afterwards."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SHIELDED_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class TerminationHandlers:
    """SIGTERM/SIGHUP raise TerminatedError between ``install()`` and ``restore()``."""

    def __init__(self) -> None:
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        """Set the handlers (only the main thread may set signal handlers)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError, OSError):
                self._old[signum] = signal.signal(signum, _raise_terminated)

    def restore(self) -> None:
        """Put back whatever handlers were there before ``install()``."""
        for signum, handler in self._old.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signum, handler)
        self._old = {}
