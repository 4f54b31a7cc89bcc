"""bin_relay's judgement that an arena's lists lie far apart (a block read per chunk), which
ends its relay in a sweep of the heaps: made from the first stop's short stretch only where
nearly every chunk took a block of its own, else from the stops after it.

The figures are those measured on seeds_heap's 2-million-chunk shapes (glibc 2.36): scattered
in the first stretch, 1,024 pages for 63 chunks; busy and in address order, 548 pages for 109
chunks of the short lists its threads had just freed, before lists of 222,000 chunks in
address order (judged on the first stretch, one read in five was swept, and a sweep of a busy
arena gives up).
"""

from __future__ import annotations

from memforensics.sources.glibc.bin_relay import RelayRead, _Relay
from memforensics.sources.glibc.glibc_walk import ArenaWalk


def _relay(stops: int, pages: int, chunks: int) -> _Relay:
    """A relay as its stop leaves it: ``stops`` stops made, ``pages`` read in all, ``chunks``
    followed in the lists finished (its walk) and none in the lists still followed."""
    relay = _Relay.__new__(_Relay)  # (no target: only what _scattered reads)
    relay.read = RelayRead()
    relay.read.stops, relay.read.pages_read = stops, pages
    relay.walk = ArenaWalk(chunks=chunks)
    relay.lists = {}
    relay.after_first = None
    return relay


def _go_on(relay: _Relay, pages: int, chunks: int) -> _Relay:
    """The same relay one stop further, having read ``pages`` and followed ``chunks`` more."""
    relay.read.stops += 1
    relay.read.pages_read += pages
    assert relay.walk is not None
    relay.walk.chunks += chunks
    return relay


def test_lists_far_apart_are_told_from_the_first_stretch() -> None:
    assert _relay(1, 1024, 63)._scattered()


def test_short_scattered_lists_first_are_not_taken_for_the_arenas_lists() -> None:
    relay = _relay(1, 548, 109)
    assert not relay._scattered()
    # The next stop follows a long list in address order: a block serves many chunks.
    assert not _go_on(relay, 1500, 60_000)._scattered()


def test_lists_still_far_apart_after_the_first_stop_are_scattered() -> None:
    relay = _relay(1, 548, 109)
    assert not relay._scattered()
    assert _go_on(relay, 4000, 250)._scattered()


def test_too_few_pages_say_nothing_yet() -> None:
    """Below _SCATTERED_MIN_PAGES a ratio is noise, at the first stop or after it."""
    relay = _relay(1, 300, 10)
    assert not relay._scattered()
    assert not _go_on(relay, 200, 10)._scattered()
    assert _go_on(relay, 2000, 10)._scattered()


def test_a_sweep_that_names_every_bin_leaves_each_unmeasured_once() -> None:
    """A relay left bin 18 unmeasured (a list that failed a check); the sweep of the lists
    still followed then found the heap corrupt, which leaves every bin unmeasured: bin 18 is
    listed once, and the sweep's figures for a bin it did read are kept."""
    from memforensics.sources.glibc.bin_relay import _List, _merge_swept
    from memforensics.sources.glibc.list_sweep import SweepResult

    walk = ArenaWalk(unmeasured_bins=[18])
    swept = SweepResult()
    swept.figures[40] = (3, 3 * 1024, 4096, 0, 1024, 1024, 3 * 1024)
    swept.unmeasured = list(range(1, 128))
    _merge_swept(walk, {40: _List(40, 0x1000), 41: _List(41, 0x2000)}, swept)
    assert walk.unmeasured_bins == list(range(1, 128))
    assert walk.bins[40] == (3, 3 * 1024) and walk.chunks == 3
