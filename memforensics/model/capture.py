"""One malloc_info document taken from a live process, and how the target was held for it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capture:
    """One malloc_info document taken from a live process: by gdb's call (sources.gdb), or
    rebuilt from its memory (the read-only path), or empty where an allocator's own
    statistics stood in for it (entry.readers.allocator)."""

    xml: bytes
    pause_seconds: float
    safe_point: str
    held_result: object = None  # what ``while_held`` returned in the attempt that succeeded
