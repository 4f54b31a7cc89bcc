"""One malloc_info document from a live process: a gdb session, again if a thread vanished."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from memforensics.errors import ThreadVanishedError
from memforensics.model.capture import Capture
from memforensics.sources.gdb.gdb import GdbSession

# A thread exiting under gdb (ThreadVanishedError) costs one more attempt, at most this many.
CAPTURE_ATTEMPTS = 3


def capture_malloc_info(
    pid: int,
    *,
    timeout_seconds: float = 10.0,
    gdb_path: str | None = None,
    log: Callable[[str], None] | None = None,
    allow_stopped: bool = False,
    quiet_while_stopping: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
    while_held: Callable[[], object] | None = None,
) -> Capture:
    """Attach, take one malloc_info document at a safe point, detach: the whole inspect dance.

    A thread that exits while gdb reads it costs a new attempt (malloc_info only reads the
    heap, so repeating it is harmless); the pause reported is that of every attempt.
    ``while_held`` is GdbSession.malloc_info's: run with the caller held, right after the dump.
    """
    paused_seconds = 0.0
    if while_held is not None:
        while_held = _never_raising(while_held, log)
    for attempt in range(1, CAPTURE_ATTEMPTS + 1):
        session = GdbSession(
            pid,
            timeout_seconds=timeout_seconds,
            gdb_path=gdb_path,
            log=log,
            allow_stopped=allow_stopped,
            quiet_while_stopping=quiet_while_stopping,
        )
        try:
            with session:
                xml = session.malloc_info(while_held)
        except ThreadVanishedError:
            if attempt == CAPTURE_ATTEMPTS:
                raise
        else:
            return Capture(
                xml, paused_seconds + session.pause_seconds, session.safe_point, session.held_result
            )
        paused_seconds += session.pause_seconds
    raise AssertionError("unreachable: the last attempt returns or raises")


def _never_raising(
    read: Callable[[], object], log: Callable[[str], None] | None
) -> Callable[[], object]:
    """``read`` whose failure gives None (logged): a failed read must not cost the dump."""

    def guarded() -> object:
        try:
            return read()
        except Exception as exc:
            if log is not None:
                log(f"-- the read while held failed: {exc!r}")
            return None

    return guarded
