"""/proc/PID/smaps read ahead, in a thread, for an `inspect PID` whose command line says it
will read that process's heap: the kernel's walk of the target's page tables (tens of ms per
GiB resident) then runs on another CPU while Python imports the command, and the scan takes
the text (``take``) instead of reading smaps again.

Contract: ``take(pid)`` returns the text at most once, and only to a reader of the same
process (its PID, and its start time in /proc/PID/stat, the same as before the read ahead)
within MAX_AGE_SECONDS of that read's end; else None, and the caller reads smaps itself.
Nothing here raises: a read that fails leaves nothing to take, and the caller's own read
reports the error. Standard library only: this module is imported before click.
"""

from __future__ import annotations

import threading
import time

# A text older than this is not taken: the scan would begin from mappings that old.
MAX_AGE_SECONDS = 1.0


class _Ahead:
    __slots__ = ("pid", "read_at", "started", "text", "thread")

    def __init__(self, pid: int, started: bytes) -> None:
        self.pid = pid
        self.started = started  # /proc/PID/stat's start time (field 22), as it reads
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


_ahead: _Ahead | None = None


def start_time(pid: int) -> bytes | None:
    """The start time of process ``pid`` (clock ticks after boot, /proc/PID/stat field 22),
    which tells a process from a later one given the same PID; None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # from field 3 on (comm may hold spaces)
    return fields[19] if len(fields) > 19 else None


def start(pid: int) -> None:
    """Begin reading /proc/``pid``/smaps in a daemon thread (nothing when the process
    cannot be looked at)."""
    global _ahead
    started = start_time(pid)
    if started is None:
        return
    ahead = _Ahead(pid, started)
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
    if ahead.text is None or time.monotonic() - ahead.read_at > MAX_AGE_SECONDS:
        return None
    return ahead.text if start_time(pid) == ahead.started else None
