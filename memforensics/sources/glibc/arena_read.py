"""One arena's read: its free lists walked over copies of its heaps (glibc_walk), as an
ArenaScan, handed back as a ``Finish`` to call for the result.

A read made in a stop of a held target may be split (``defer``): the arena is copied whole in
the stop, and the walk of that copy, which reads nothing more from the target, is made when
``Finish`` is called, after the stop has ended. The stop then lasts as long as the copy, not
the copy and the walk, and a stop's budget takes more arenas. Where the walk must read the
target as it goes (an arena above the copy budget, a malloc_state or top chunk the copy does
not hold whole) it is made at once, inside the stop, as without ``defer``. A scouted arena
(ArenaWalker.scout: its lists followed before the stop) is copied in the stop only where its
lists lie, and walked there. A scouted arena split into parts (ArenaWalker.split) is read
one part per call, each in its own stop; ``merge_parts`` makes the arena's scan of theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from memforensics.model.heapscan import ArenaScan, BinFigures
from memforensics.model.process import HeapSegment
from memforensics.sources.glibc.arena_figures import bin_figures
from memforensics.sources.glibc.bin_relay import RelayRead
from memforensics.sources.glibc.glibc_arenas import ArenaState, Heap
from memforensics.sources.glibc.glibc_walk import ArenaWalk, ArenaWalker
from memforensics.sources.glibc.heapcopy import BufferPool
from memforensics.sources.proc.procmem import MemoryReader

Finish = Callable[[], ArenaScan]


def read_arena(
    mem: MemoryReader,
    pool: BufferPool,
    state: ArenaState | None,
    heaps: list[Heap],
    *,
    is_main: bool,
    layout_ok: bool,
    deadline: float,
    retry_deadline: float | None = None,
    pause: Callable[[], object] | None = None,
    figures: bool = False,
    held: bool = False,
    defer: bool = False,
    scouted: ArenaWalker | None = None,
    walk: bool = True,
) -> Finish:
    """The read of one arena (see the module); its buffers go back to ``pool`` when the
    walk is done. With ``defer``, whatever must come from the target is read now and the
    rest when the result is asked for; call it once. ``scouted``: a walker whose scout
    (ArenaWalker.scout) found the pages of this arena's lists before the stop: where it
    read the same ``heaps``, only those pages are copied in the stop, and the walk is made
    there (not deferred); it is closed either way. ``walk`` False: its heaps are read, not its
    lists (``lists_too_long``: a read just before found them too long to follow). A scouted
    walker split into parts (ArenaWalker.split) reads the part it is at, and is kept open for
    the next (ArenaWalker.next_part, between stops) until its last; the scan is that part's."""
    segments = _segments_of(heaps)
    if state is None or not layout_ok or not walk:
        unread = ArenaScan(
            address=None if state is None else state.address,
            is_main=is_main,
            system_bytes=None if state is None else state.system_bytes,
            layout_ok=layout_ok,
            segments=segments,
            walked=False,
            budget_reached=state is not None and layout_ok and not walk,
            lists_too_long=state is not None and layout_ok and not walk,
        )
        if scouted is not None:
            scouted.close()
        return lambda: unread
    if scouted is not None and held and scouted.adopt(heaps):
        walker, defer = scouted, False
    else:
        if scouted is not None:
            scouted.close()
        walker = ArenaWalker(mem, heaps, is_main=is_main, pool=pool, pause=pause, held=held)
    try:
        snapshot = walker.capture(state) if defer else None
    except BaseException:
        walker.close()
        raise

    closing = [True]  # the walker is closed after this read (its last part, or an error)

    def finish(close: bool = True) -> ArenaScan:
        try:
            walk = walker.walk(
                state, deadline=deadline, retry_deadline=retry_deadline, snapshot=snapshot
            )
            closing[0] = walker.parts_left == 0
        finally:
            if closing[0] and close:
                walker.close()
        copied, walker.stop_copy_bytes = walker.stop_copy_bytes, 0  # (this part's)
        # A deferred walk's arena is the copy's: the one its lists were read from.
        read_state = snapshot or state
        return _arena_scan(
            mem,
            read_state,
            heaps,
            segments,
            walk,
            is_main,
            layout_ok,
            figures,
            copied,
            walker.scouted,
            walker.kept_scout,
            walker.walked_before_stop,
        )

    if snapshot is not None:
        return finish
    # A scouted walker's buffers are its own (FreshBuffers): closing it hands a copy of up
    # to hundreds of MiB to be unmapped (heapcopy.UNMAPPER, which may first wait for the
    # copy handed before), milliseconds no thread of the target need wait for, so it is
    # closed once the stop is over. Any other gives its buffers back to the pool at once: the next
    # arena of the same stop takes them (a fresh buffer would fault its pages in there).
    later = walker is scouted
    try:
        done = finish(close=not later)
    except BaseException:
        walker.close()
        raise

    def closed() -> ArenaScan:
        if later and closing[0]:
            walker.close()
        return done

    return closed


def _arena_scan(
    mem: MemoryReader,
    state: ArenaState,
    heaps: list[Heap],
    segments: Sequence[HeapSegment],
    walk: ArenaWalk,
    is_main: bool,
    layout_ok: bool,
    figures: bool,
    stop_copy_bytes: int,
    scouted: bool,
    scout_kept: bool = False,
    walked_before_stop: bool = False,
) -> ArenaScan:
    return ArenaScan(
        address=state.address,
        is_main=is_main,
        system_bytes=state.system_bytes,
        layout_ok=layout_ok,
        segments=tuple(segments),
        walked=True,
        free_bytes=walk.free_bytes,
        free_resident_bytes=walk.resident_bytes,
        trimmable_bytes=walk.trimmable_bytes,
        chunks=walk.chunks,
        unmeasured_bins=tuple(sorted(set(walk.unmeasured_bins))),  # (each once, in order)
        retries=walk.retries,
        budget_reached=walk.budget_reached,
        lists_too_long=walk.lists_too_long,
        top_bytes=walk.top_bytes,
        top_resident_bytes=walk.top_resident_bytes,
        top_address=walk.top_address,
        top_resident_runs=walk.top_resident_runs,
        bins=tuple((index, *counts) for index, counts in sorted(walk.bins.items())),
        figures=bin_figures(mem, state, heaps, walk, is_main) if figures else None,
        corruption=tuple(walk.corruption),
        stop_copy_bytes=stop_copy_bytes,
        scouted=scouted,
        scout_kept=scout_kept,
        walked_before_stop=walked_before_stop,
        parts=() if walk.part is None else (walk.part,),
    )


def relayed_scan(
    mem: MemoryReader,
    relayed: RelayRead,
    *,
    is_main: bool,
    figures: bool,
    scouted: bool = False,
) -> ArenaScan | None:
    """The scan of an arena read in relays (bin_relay.relay_arena), None when it was not;
    ``scouted``: a part of an arena whose lists were scouted (the other parts are copied)."""
    if relayed.walk is None or relayed.state is None:
        return None
    heaps = relayed.heaps
    scan = _arena_scan(
        mem,
        relayed.state,
        heaps,
        _segments_of(heaps),
        relayed.walk,
        is_main,
        True,
        figures,
        relayed.pages_read * mem.page_bytes + relayed.swept_bytes,
        scouted,
    )
    return replace(
        scan,
        relay_stops=relayed.stops,
        swept=relayed.swept,
        swept_in_one_stop=relayed.one_stop,
    )


def merge_parts(scans: Sequence[ArenaScan]) -> ArenaScan:
    """One arena's scan of the scans of its parts, in order (``ArenaScan.parts``: each bin
    read in one of them, the top, the fastbins, the arena's size and its heaps in the first).
    A scan among them that is not a part (the arena read whole: its heaps changed since the
    scout, or it was locked at every stop and read running) is the arena's, as it is."""
    whole = [scan for scan in scans if not scan.parts]
    if whole or len(scans) == 1:
        return whole[0] if whole else scans[0]
    first = scans[0]
    return replace(
        first,
        layout_ok=all(scan.layout_ok for scan in scans),
        walked=all(scan.walked for scan in scans),
        free_bytes=sum(scan.free_bytes for scan in scans),
        free_resident_bytes=sum(scan.free_resident_bytes for scan in scans),
        trimmable_bytes=sum(scan.trimmable_bytes for scan in scans),
        chunks=sum(scan.chunks for scan in scans),
        unmeasured_bins=tuple(sorted({i for scan in scans for i in scan.unmeasured_bins})),
        retries=sum(scan.retries for scan in scans),
        budget_reached=any(scan.budget_reached for scan in scans),
        lists_too_long=any(scan.lists_too_long for scan in scans),
        bins=tuple(sorted(row for scan in scans for row in scan.bins)),
        figures=_merged_figures([scan.figures for scan in scans]),
        lock_retries=sum(scan.lock_retries for scan in scans),
        corruption=tuple(found for scan in scans for found in scan.corruption),
        stop_copy_bytes=sum(scan.stop_copy_bytes for scan in scans),
        parts=tuple(part for scan in scans for part in scan.parts),
    )


def _merged_figures(parts: Sequence[BinFigures | None]) -> BinFigures | None:
    """malloc_info's figures of an arena read in parts: the first part's (the fastbins, the
    top, the arena's size) with every part's bins; None unless every part has them."""
    if not parts or any(figures is None for figures in parts):
        return None
    first = parts[0]
    assert first is not None
    rows = sorted(row for figures in parts if figures is not None for row in figures.bins)
    return replace(first, bins=tuple(rows))


def _segments_of(heaps: Sequence[Heap]) -> tuple[HeapSegment, ...]:
    """The heaps as the scan reports them, with their resident bytes."""
    return tuple(
        HeapSegment(h.start, h.size_bytes, h.pages.total_resident_bytes)
        for h in heaps
        if h.pages is not None
    )
