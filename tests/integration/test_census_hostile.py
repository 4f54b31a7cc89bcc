"""Hostile heaps are bad input, never a crash or a hang: a real process whose heap was broken
on purpose (tests/targets/census_hostile.c) is censused; the broken heap's walk stops at the
bad header with glibc's words, counted as incomplete, the chunks before it and the intact
thread arena still counted, within a bounded time."""

from __future__ import annotations

import time

import pytest

from memforensics.entry.census import census_live
from tests.support.targets import c_target, ptrace_skip_reason

_SKIP = ptrace_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]


@pytest.mark.parametrize(
    ("mode", "words"),
    [("size", "corrupted size vs. prev_size"), ("loop", "invalid size"), ("garbage", "")],
)
def test_broken_heap_is_reported_not_crashed_on(mode: str, words: str) -> None:
    with c_target("census_hostile", mode) as target:
        began = time.monotonic()
        census = census_live(target.pid)
        seconds = time.monotonic() - began
        assert target.alive() and target.settled_state() == "S"
    assert seconds < 30
    assert census.read.heaps_incomplete >= 1
    assert any(words in note for note in census.read.notes)
    text = {t.name: t.count for t in census.types if t.kind == "text"}
    # The thread arena's 1,000 texts of 199 'w' and, before the break, the main heap's.
    assert text.get("text", 0) >= 1000 + 400
