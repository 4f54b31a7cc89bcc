"""What every way of reading or trimming a live process needs: the clock, RSS after a change,
the error for a target that went away. A leaf: it imports no other entry module."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone

from memforensics.errors import MemforensicsError, TargetExitedError
from memforensics.model.process import ProcessMemory
from memforensics.sources.proc import memory_figures

Log = Callable[[str], None]

_SETTLE_FIRST_SECONDS = 0.05
_SETTLE_STEP_SECONDS = 0.05
_SETTLE_MAX_READS = 6
_SETTLE_SAME_BYTES = 64 * 1024


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def settled_memory(pid: int) -> ProcessMemory:
    """RSS after a trim, measured until it stops moving (not guessed from the forecast)."""
    time.sleep(_SETTLE_FIRST_SECONDS)
    memory = memory_figures.read_memory(pid)
    for _ in range(_SETTLE_MAX_READS - 1):
        time.sleep(_SETTLE_STEP_SECONDS)
        again = memory_figures.read_memory(pid)
        same = (
            memory.rss_bytes is not None
            and again.rss_bytes is not None
            and abs(memory.rss_bytes - again.rss_bytes) <= _SETTLE_SAME_BYTES
        )
        memory = again
        if same:
            break
    return memory


def exited_error(pid: int, exc: MemforensicsError | None = None) -> TargetExitedError:
    """A process that was there when we started and is gone now: one message, whatever
    step noticed (documented in docs/inspect.md)."""
    if isinstance(exc, TargetExitedError):
        return exc
    return TargetExitedError(f"PID {pid} exited while being inspected", pid=pid)
