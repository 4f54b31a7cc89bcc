"""bin_relay's judgement of a failed check: corrupt where the list was followed in one stop, or
where it fails the same check at the same chunk again when followed from its head; moved (the
list followed again) where it was followed over several stops and fails once.

A held-out busy heap (tests/integration/test_seeds_held_out.py, seed 1355727581) was called
corrupt in 3 to 4 reads of 10: a small bin's or the unsorted bin's list, resumed in a later
stop from a chunk that a busy thread had since moved to another bin, led to that bin's head
inside malloc_state, whose words are no chunk's size. The stretches are stood in for here
(what _chunkwalk.relay returns, in order); the live reads are the integration tests'.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from memforensics.model.corruption import HeapCorruption
from memforensics.sources.glibc import bin_relay
from memforensics.sources.glibc.bin_relay import _BK, _DONE, _SIZE, _TIME, RelayRead, _List
from memforensics.sources.glibc.glibc_arenas import ArenaState

ARENA = 0x7F0000000020
INDEX = 62  # a small bin
HEAD = ARENA + 0x60 + (INDEX - 1) * 16
LAST = 0x7F0000100000  # the list's last chunk, the bin's bk
ELSEWHERE = ARENA + 0x430  # another bin's head: no chunk's size there
MEM = SimpleNamespace(pid=1, mem_fd=-1, pagemap_fd=-1, page_bytes=4096)


def _state() -> ArenaState:
    bins = [0] * 254
    bins[2 * (INDEX - 1)], bins[2 * (INDEX - 1) + 1] = 0x7F0000000900, LAST
    return ArenaState(ARENA, 0, 0x1000, 0, bins=tuple(bins), fastbins=(0,) * 10)


def _cursor(previous: int, chunk: int, count: int = 10) -> tuple[int, ...]:
    return (previous, chunk, count, count * 1000, 0, 0, 992, 992, count * 992, HEAD, 1, 0)


class _Relays:
    """Stands in for _chunkwalk.relay: each call returns the next of ``outcomes``
    (status, cursor, detail) and records whether it resumed a cursor."""

    def __init__(self, *outcomes: tuple[int, tuple[int, ...], int]) -> None:
        self.outcomes = list(outcomes)
        self.resumed: list[bool] = []

    def relay(self, *args: Any) -> tuple[int, tuple[int, ...], int, int]:
        self.resumed.append(bool(args[11]))
        status, cursor, detail = self.outcomes.pop(0)
        return status, cursor, detail, 1


def _stretch(relays: _Relays, each: _List, read: RelayRead, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(bin_relay, "_native", relays)
    return bin_relay._stretch(MEM, None, each, _state(), [], 0, float("inf"), read)  # type: ignore[arg-type]


def _resumed_list(read: RelayRead) -> _List:
    """A list started in an earlier stop than ``read``'s, its stretch to be resumed."""
    each = _List(INDEX, HEAD)
    each.start(0x7F0000000900, read.stops - 1)
    each.cursor = _cursor(0x7F0000050000, 0x7F0000060000)
    return each


def test_a_check_failed_on_a_list_resumed_from_an_earlier_stop_is_followed_again() -> None:
    read = RelayRead()
    read.stops = 2
    each = _resumed_list(read)
    relays = _Relays(
        (_SIZE, _cursor(0x7F0000070000, ELSEWHERE), 0x7F0000000910),
        (_DONE, _cursor(LAST, HEAD, 40), 0),
    )
    with pytest.MonkeyPatch.context() as patch:
        figures = _stretch(relays, each, read, patch)
    assert figures == _cursor(LAST, HEAD, 40)[2:9]
    assert relays.resumed == [True, False]  # followed again from its head, in this stop
    assert each.restarts == 1


def test_the_same_failure_again_from_the_head_is_corruption() -> None:
    read = RelayRead()
    read.stops = 2
    each = _resumed_list(read)
    failure = (_SIZE, _cursor(0x7F0000070000, ELSEWHERE), 0x7F0000000910)
    relays = _Relays(failure, failure)
    with pytest.MonkeyPatch.context() as patch:
        found = _stretch(relays, each, read, patch)
    assert isinstance(found, HeapCorruption)
    assert found.chunk_address == ELSEWHERE and found.bin == "small bin 62"


def test_a_failure_seen_again_in_a_later_stop_is_corruption() -> None:
    """Followed again from its head, the list runs out of the stop's time, and fails at the
    same chunk with the same word in the next stop: corrupt, though over two stops."""
    read = RelayRead()
    read.stops = 2
    each = _resumed_list(read)
    failure = (_BK, _cursor(0x7F0000070000, 0x7F0000080000), 0x7F0000090000)
    relays = _Relays(failure, (_TIME, _cursor(0x7F0000010000, 0x7F0000020000), 0))
    with pytest.MonkeyPatch.context() as patch:
        assert _stretch(relays, each, read, patch) is None
        read.stops = 3
        relays.outcomes.append(failure)
        found = _stretch(relays, each, read, patch)
    assert isinstance(found, HeapCorruption) and found.chunk_address == 0x7F0000080000
    assert relays.resumed == [True, False, True]


def test_a_list_that_fails_differently_each_time_is_given_up_as_moving() -> None:
    read = RelayRead()
    read.stops = 2
    each = _resumed_list(read)
    outcomes = []
    for turn in range(bin_relay.RELAY_RESTARTS + 1):
        chunk = 0x7F0000100000 + turn * 0x1000
        outcomes += [
            (_SIZE, _cursor(0x7F0000070000, chunk), 0x30 + turn),
            (_TIME, _cursor(0x7F0000010000, 0x7F0000020000), 0),
        ]
    relays = _Relays(*outcomes)
    with pytest.MonkeyPatch.context() as patch:
        found: Any = None
        for _ in range(bin_relay.RELAY_RESTARTS + 1):
            found = _stretch(relays, each, read, patch)
            if found is not None:
                break
            read.stops += 1
    assert found == "gave up"


def test_a_failure_on_a_list_followed_in_one_stop_is_corruption_at_once() -> None:
    read = RelayRead()
    read.stops = 1
    each = _List(INDEX, HEAD)
    relays = _Relays((_SIZE, _cursor(0x7F0000070000, ELSEWHERE), 0x7F0000000910))
    with pytest.MonkeyPatch.context() as patch:
        found = _stretch(relays, each, read, patch)
    assert isinstance(found, HeapCorruption)
    assert relays.resumed == [False]


def test_a_failure_seen_again_after_another_in_between_is_corruption() -> None:
    """A corrupt link deep in a busy list: followed again, the walk first fails elsewhere
    (the list moved on its way), then at the corrupt link again: corrupt, not given up
    (which would let the default call malloc_info into a corrupt heap)."""
    read = RelayRead()
    read.stops = 2
    each = _resumed_list(read)
    corrupt = (_BK, _cursor(0x7F0000070000, 0x7F0000080000), 0x7F0000090000)
    moved = (_SIZE, _cursor(0x7F0000030000, ELSEWHERE), 0x7F0000000910)
    pause = (_TIME, _cursor(0x7F0000010000, 0x7F0000020000), 0)
    relays = _Relays(corrupt, pause)
    with pytest.MonkeyPatch.context() as patch:
        assert _stretch(relays, each, read, patch) is None
        read.stops = 3
        relays.outcomes += [moved, pause]
        assert _stretch(relays, each, read, patch) is None
        read.stops = 4
        relays.outcomes.append(corrupt)
        found = _stretch(relays, each, read, patch)
    assert isinstance(found, HeapCorruption) and found.chunk_address == 0x7F0000080000
