"""What a way of trimming supplies to the one trim routine (entry.trim): a read of the heap
with its forecast, and the call that gives memory back. Settings and records only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from memforensics.entry.common import Log
from memforensics.model.process import TrimForecast


@dataclass(frozen=True)
class TrimSettings:
    """How to trim: the options of `memforensics trim`, as the library wants them."""

    pad_bytes: int = 0
    dry_run: bool = False
    min_free_bytes: int = 0
    timeout_seconds: float = 10.0
    gdb_path: str | None = None
    log: Log | None = None
    # No gdb: the heap read from memory, malloc_trim called through a self-restoring signal
    # frame (trimmers.direct), where the machine allows it; a gdb_path given means gdb.
    direct: bool = True
    # Call malloc_trim through gdb even into a heap found corrupt (--accept-corrupt-heap-risk).
    accept_corrupt_risk: bool = False


@dataclass(frozen=True)
class TrimReading:
    """The heap as read for a trim, and what the call would release."""

    forecast: TrimForecast
    free_bytes: int  # the allocator's free bytes, resident or not
    heap_bytes: int  # the memory the allocator obtained from the OS for its heap
    arenas: int
    pause_seconds: float  # the target's stops for this read
    notes: tuple[str, ...]  # what the read could not see (after the forecast's own notes)


@dataclass(frozen=True)
class CallMade:
    """The call that gave memory back, as far as it is known."""

    pause_seconds: float  # the target's stops for the call
    returned: int | None  # malloc_trim's return value where the way keeps it (gdb), else None
    how: str  # appended to the note on the forecast's age ("" when there is nothing to say)


class Trimmer(Protocol):
    """One way of trimming one process; each instance serves one trim (read, then call)."""

    call_name: str  # "trim" or "purge": what the forecast's age is measured to
    purge: str | None  # TrimResult.purge: the foreign allocator's call, None for malloc_trim
    pad_bytes: int  # the pad the call uses (0 where the call has none)

    def read(self) -> TrimReading: ...

    def call(self) -> CallMade: ...
