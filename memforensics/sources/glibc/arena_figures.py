"""malloc_info's per-arena figures out of a walk, and the reads of a live arena held still
(ArenaHold) that give each arena's figures one moment, as malloc_info's lock does.

heapmaps calls both: ``held_read`` around the read of each arena when a hold is given,
``bin_figures`` on each arena's walk when the figures are asked for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Protocol

from memforensics.model import glibc
from memforensics.model.heapscan import ArenaScan, BinFigures
from memforensics.sources.glibc.glibc_arenas import ArenaState, Heap
from memforensics.sources.glibc.glibc_walk import ArenaWalk
from memforensics.sources.proc.procmem import MemoryReader

# An arena found locked (a thread inside malloc holds its mutex) in a stop is read again after
# the target ran a while (ArenaHold.let_run: longer each time), at most this many times, and
# for no longer than the caller's timeout.
LOCK_RETRIES = 60
LOCKED_EVERY_TRY = "the arena was locked at every try"  # why a read that found that gave up


class ArenaHold(Protocol):
    """Holds every thread of the target still around the read of one arena (the read-only
    path: memforensics.entry.readers.memory), so that arena's bins are read at one moment."""

    def arena(self, weight_bytes: int = 0) -> contextlib.AbstractContextManager[None]:
        """Entered around one arena's read (of about ``weight_bytes`` of heap): the target
        is stopped inside."""
        ...

    def in_allocator(self) -> bool:
        """Inside ``arena()``: a thread of a single-threaded target is stopped inside the
        allocator (glibc takes no lock there, so no mutex says so)."""
        ...

    def let_run(self, attempt: int) -> bool:
        """Outside ``arena()``: let the target run a while (a thread holds an arena), the
        longer the higher ``attempt`` (0 first); False when running cannot help (the target
        is stopped by someone else: its lock stays held)."""
        ...

    def make_room(self, weight_bytes: int) -> None:
        """Outside ``arena()``: end the stop begun there if the next arena's read (of about
        ``weight_bytes``) would not fit in it."""
        ...

    @property
    def stopped(self) -> bool:
        """Outside ``arena()``: a stop begun there still holds the target (it may take the
        next arena too)."""
        ...

    def release(self) -> None:
        """End the stop now, if one holds the target: it runs."""
        ...


class StillMemory:
    """The ArenaHold of a memory that does not move (a core file's): nothing to stop, no
    thread to let run; an arena whose lock the core caught held is read all the same (its
    lists cannot change)."""

    @contextlib.contextmanager
    def arena(self, weight_bytes: int = 0) -> Iterator[None]:
        yield

    def in_allocator(self) -> bool:
        return False

    def let_run(self, attempt: int) -> bool:
        return False

    def make_room(self, weight_bytes: int) -> None:
        return None

    @property
    def stopped(self) -> bool:
        return False

    def release(self) -> None:
        return None


def held_read(
    hold: ArenaHold | None,
    read: Callable[[ArenaState | None], Callable[[], ArenaScan]],
    fresh_state: Callable[[], ArenaState | None],
    weight_bytes: int = 0,
) -> Callable[[], ArenaScan]:
    """``read()`` of one arena, inside ``hold`` when there is one: an arena found locked (its
    mutex held, or a single-threaded target stopped inside the allocator, which takes no
    lock) is not read then; the target runs a moment and it is read again, at most
    LOCK_RETRIES times (then its figures stay unknown). ``weight_bytes``: about how much heap
    the read copies (the hold plans its stops with it). ``read`` is handed the state
    ``fresh_state`` gave in its stop (None outside a stop: it reads its own), and gives the
    read's finish (arena_read.Finish: what it left to do once the stop is over), as this
    does."""
    if hold is None:
        return read(None)
    for attempt in range(LOCK_RETRIES + 1):
        with hold.arena(weight_bytes):
            state = fresh_state()
            if not ((state is not None and state.mutex != 0) or hold.in_allocator()):
                finish = read(state)
                retries = attempt
                return lambda: replace(finish(), lock_retries=retries)
        if not hold.let_run(attempt):
            break
    # Locked at every stop: read while it runs, for the residency alone.
    unheld = read(None)
    return lambda: replace(unheld(), figures=None, lock_retries=attempt + 1)


def bin_figures(
    mem: MemoryReader,
    state: ArenaState,
    heaps: Sequence[Heap],
    walk: ArenaWalk,
    is_main: bool,
) -> BinFigures | None:
    """malloc_info's figures of an arena whose every bin ``walk`` read consistently (None
    when any was left unmeasured): per bin as glibc counts them, the top, system and aspace
    (a non-main arena's: its heaps, as glibc follows them from the top's heap)."""
    if walk.unmeasured_bins or walk.budget_reached or walk.fastbin_chunks is None:
        return None
    top_bytes = walk.top_bytes
    if walk.part is not None and walk.part[0] > 0:
        top_bytes = 0  # a part without the top (arena_read.merge_parts takes the first's)
    elif top_bytes is None:  # a top outside the heaps read: the initial one, inside the arena
        header = mem.read(state.top, glibc.CHUNK_HEADER_BYTES)
        if header is None:
            return None
        top_bytes = int.from_bytes(header[8:], "little") & ~glibc.SIZE_FLAGS
    bins = tuple((index, *sizes) for index, sizes in sorted(walk.bin_sizes.items()) if sizes[0])
    if is_main:
        aspace = mprotect = state.system_bytes
        subheaps = 0
    else:
        aspace = sum(h.size_bytes for h in heaps)
        mprotect = sum(h.mprotect_bytes for h in heaps)
        subheaps = len(heaps)
    return BinFigures(
        fastbin_chunks=walk.fastbin_chunks,
        bins=bins,
        top_bytes=top_bytes,
        system_bytes=state.system_bytes,
        max_system_bytes=state.max_system_bytes,
        aspace_bytes=aspace,
        aspace_mprotect_bytes=mprotect,
        subheaps=subheaps,
    )
