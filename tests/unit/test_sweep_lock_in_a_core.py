"""A sweep reads an arena in a stop where its lock is free; a core's arena (a memory that
does not move, arena_figures.StillMemory) is read with its lock held as well: a core saved by
an abort inside the allocator (glibc's malloc_printerr) has it held, and the walk of the
same core reads that arena (before, the sweep alone refused it: "locked at every try").
The malloc_state is built here by hand, its mutex word set."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from memforensics.model import glibc
from memforensics.sources.glibc import list_sweep
from memforensics.sources.glibc.arena_figures import StillMemory

ADDRESS = 0x7F00_0000_1000


class _State:
    """A memory holding one malloc_state whose mutex word is ``mutex``."""

    page_bytes = 4096

    def __init__(self, mutex: int) -> None:
        self.words = bytearray(glibc.STATE_BYTES)
        self.words[:4] = mutex.to_bytes(4, "little")

    def read(self, address: int, length: int) -> bytes | None:
        offset = address - ADDRESS
        return bytes(self.words[offset : offset + length])


class _LiveHold:
    """A hold whose target runs between stops (as a live one does), three stops in all."""

    def __init__(self) -> None:
        self.tries = 0

    @contextlib.contextmanager
    def arena(self, weight_bytes: int = 0) -> Iterator[None]:
        self.tries += 1
        yield

    def in_allocator(self) -> bool:
        return False

    def let_run(self, attempt: int) -> bool:
        return attempt < 2


def test_a_cores_locked_arena_is_swept() -> None:
    read = list_sweep._in_a_stop(StillMemory(), _State(1), ADDRESS, lambda: "read")  # type: ignore[arg-type]
    assert read == "read"


def test_a_live_arena_locked_at_every_stop_is_not() -> None:
    hold = _LiveHold()
    read = list_sweep._in_a_stop(hold, _State(1), ADDRESS, lambda: "read")  # type: ignore[arg-type]
    assert read is list_sweep._LOCKED
    assert hold.tries == 3
    assert list_sweep._in_a_stop(hold, _State(0), ADDRESS, lambda: "read") == "read"  # type: ignore[arg-type]
