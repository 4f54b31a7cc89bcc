"""bin_relay's stop: an arena's lists followed side by side, a slice of RELAY_SLICE_CHUNKS
chunks at a time, the list that has followed the fewest chunks next (over all stops), the
block cache kept within the stop and forgotten at its first call; and at least one slice a
stop, however little of the stop's time its own reads left.

The stretches are stood in for here (the order and the arguments of the calls are what is
tested); the reads themselves are tests/integration/test_seeds_read.py's, on a real heap of 9
interleaved lists, whose stops must read each page about once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from memforensics.sources.glibc import bin_relay
from memforensics.sources.glibc.bin_relay import RELAY_SLICE_CHUNKS, RelayRead, _List, _Relay
from memforensics.sources.glibc.glibc_arenas import ArenaState
from memforensics.sources.glibc.glibc_walk import ArenaWalk

SLICE = RELAY_SLICE_CHUNKS


class _Hold:
    def in_allocator(self) -> bool:
        return False


class _Deadline:
    def at(self) -> float:
        return math.inf


def _state() -> ArenaState:
    return ArenaState(0x1000, 0, 0x1000, 0, bins=(0,) * 254, fastbins=(0,) * 10)


def _relay(lengths: dict[int, int]) -> _Relay:
    """A relay past its first stop, following one list per bin of ``lengths`` (chunks)."""
    relay = _Relay.__new__(_Relay)  # (no target: the stretches are stood in for)
    relay.mem = None
    relay.address = 0x1000
    relay.heaps_now = lambda state, pages: []
    relay.deadline = _Deadline()
    relay.cache = None
    relay.scouted_pages = {}
    relay.read = RelayRead()
    relay.read.stops = 1
    relay.walk = ArenaWalk()
    relay.lists = {index: _List(index, 0x2000 + index) for index in lengths}
    relay.over = relay.scattered = False
    relay.after_first = (0, 0)
    relay.last_state = None
    return relay


class _Stretches:
    """Stands in for bin_relay._stretch: each call follows its slice (a list's rest where it
    is shorter) and records (bin, followed before, keep_cache, max_chunks); ``budget`` calls
    in all before the stop's time is taken to be spent."""

    def __init__(self, lengths: dict[int, int], budget: int) -> None:
        self.lengths, self.budget = lengths, budget
        self.calls: list[tuple[int, int, bool, int]] = []
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def __call__(
        self, mem: Any, cache: Any, each: _List, state: Any, spans: Any, limit: int,
        end: float, read: RelayRead, keep_cache: bool = False, max_chunks: int = 0,
    ) -> tuple[int, ...] | None:  # fmt: skip
        before = each.followed()
        self.calls.append((each.index, before, keep_cache, max_chunks))
        after = min(before + (max_chunks or self.lengths[each.index]), self.lengths[each.index])
        each.cursor = (0, 0, after, 0, 0, 0, 0, 0, 0, 0, 1, 0)
        if len(self.calls) >= self.budget:
            self.now = end + 1.0  # (this stop's time is spent)
        return (
            (after, after * 32, 0, 0, 33, 33, after * 33)
            if after == self.lengths[each.index]
            else None
        )


def _stop(
    relay: _Relay,
    stretches: _Stretches,
    monkeypatch: pytest.MonkeyPatch,
    seconds: float = 1.0,
    clock: Callable[[], float] | None = None,
) -> None:
    """One stop of ``relay``, its following ``seconds`` long on ``clock`` (the stand-in's
    own where None)."""
    stretches.now = 0.0
    monkeypatch.setattr(bin_relay, "_stretch", stretches)
    monkeypatch.setattr(bin_relay, "read_state", lambda mem, address: _state())
    monkeypatch.setattr(bin_relay, "stop_reading_seconds", lambda usual: seconds)
    monkeypatch.setattr(bin_relay, "time", SimpleNamespace(monotonic=clock or stretches.clock))
    assert relay.stop(_Hold()) is False


def test_an_arenas_lists_take_turns_a_slice_each_within_a_slice_of_each_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lengths = {9: 3 * SLICE, 10: 3 * SLICE, 11: SLICE // 2}
    relay = _relay(lengths)
    stretches = _Stretches(lengths, budget=1_000)
    _stop(relay, stretches, monkeypatch)
    assert [(index, before) for index, before, _, _ in stretches.calls] == [
        (9, 0), (10, 0), (11, 0), (9, SLICE), (10, SLICE), (9, 2 * SLICE), (10, 2 * SLICE),
    ]  # fmt: skip
    # The cache is forgotten at the stop's first call only; a list left alone is not sliced.
    assert [keep for _, _, keep, _ in stretches.calls] == [False] + [True] * 6
    assert [chunks for _, _, _, chunks in stretches.calls] == [SLICE] * 6 + [0]
    assert relay.over and relay.read.walk is relay.walk
    assert relay.walk.chunks == sum(lengths.values())


def test_the_next_stop_begins_with_the_list_furthest_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stop whose time ends mid-round leaves one list a slice behind; the next stop begins
    with it (in a fixed rotation, the lists drift apart by a slice a stop)."""
    lengths = {9: 10 * SLICE, 10: 10 * SLICE, 11: 10 * SLICE}
    relay = _relay(lengths)
    stretches = _Stretches(lengths, budget=2)  # bins 9 and 10 followed, then time is up
    _stop(relay, stretches, monkeypatch)
    stretches.calls.clear()
    stretches.budget = 3
    _stop(relay, stretches, monkeypatch)
    assert [(index, before, keep) for index, before, keep, _ in stretches.calls] == [
        (11, 0, False), (9, SLICE, True), (10, SLICE, True),
    ]  # fmt: skip
    followed = [each.followed() for each in relay.lists.values()]
    assert max(followed) - min(followed) <= SLICE


def test_a_stop_whose_own_reads_took_its_time_still_follows_one_slice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under a CPU quota a stop's following can be shorter than its own reads: the stop
    still moves a list on, or a relay would spin to the end of its budget."""
    lengths = {9: 4 * SLICE, 10: 4 * SLICE}
    relay = _relay(lengths)
    stretches = _Stretches(lengths, budget=1_000)
    clock = iter([0.0])  # the stop's start; every later look finds its time spent
    _stop(relay, stretches, monkeypatch, seconds=0.0, clock=lambda: next(clock, 1.0))
    assert [(index, before) for index, before, _, _ in stretches.calls] == [(9, 0)]
