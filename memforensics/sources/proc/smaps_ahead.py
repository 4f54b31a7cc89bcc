"""/proc/PID/smaps read ahead, in a thread, for an `inspect PID` whose command line says it
will read that process's heap: the kernel's walk of the target's page tables (tens of ms per
GiB resident) then runs on another CPU while Python imports the command, and the scan takes
the text (``take``) instead of reading smaps again.

Contract: ``take(pid)`` returns the text at most once, only to a reader of the same PID, only
while the process it was read from has not exited (a pidfd opened before the read says so: a
PID is not given to another process while the first one lives), and only within
MAX_AGE_SECONDS of the read's end; else None, and the caller reads smaps itself. Nothing here
raises: a read that fails leaves nothing to take, and the caller's own read reports the
error. No other file of the target is read. Standard library only: this module is imported
before click.
"""

from __future__ import annotations

import os
import select
import threading
import time

# A text older than this is not taken: the scan would begin from mappings that old.
MAX_AGE_SECONDS = 1.0


class _Ahead:
    __slots__ = ("pid", "pidfd", "read_at", "text", "thread")

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self.pidfd = pidfd  # the process PID named when the read began
        self.text: str | None = None
        self.read_at = 0.0  # time.monotonic() at the read's end
        self.thread = threading.Thread(target=self._read, name="smaps-ahead", daemon=True)

    def _read(self) -> None:
        try:
            with open(f"/proc/{self.pid}/smaps", "rb") as handle:
                self.text = handle.read().decode(errors="replace")
        except OSError:
            self.text = None
        self.read_at = time.monotonic()

    def exited(self) -> bool:
        """The process has exited since the pidfd was opened (its pidfd reads as ready)."""
        poller = select.poll()
        poller.register(self.pidfd, select.POLLIN)
        return bool(poller.poll(0))


_ahead: _Ahead | None = None


def start(pid: int) -> None:
    """Begin reading /proc/``pid``/smaps in a daemon thread (nothing when the process
    cannot be looked at, or this kernel has no pidfds)."""
    global _ahead
    try:
        pidfd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return
    if _ahead is not None:  # (one read ahead at a time: an earlier one is dropped)
        os.close(_ahead.pidfd)
    ahead = _Ahead(pid, pidfd)
    _ahead = ahead
    ahead.thread.start()


def take(pid: int) -> str | None:
    """The smaps text read ahead for ``pid``, under the module's contract; None otherwise.
    Waits for a read still under way."""
    global _ahead
    ahead = _ahead
    if ahead is None or ahead.pid != pid:
        return None
    _ahead = None
    ahead.thread.join()
    try:
        if ahead.text is None or time.monotonic() - ahead.read_at > MAX_AGE_SECONDS:
            return None
        return None if ahead.exited() else ahead.text
    finally:
        os.close(ahead.pidfd)
