"""The XML-only advice ``trim-would-release`` gives the trim forecast's own estimate.

One estimator (analysis/trim_forecast.py ``estimate_buckets_releasable``): whole pages inside
the free chunks of the bins, plus what systrim gives back of the main arena's top; only the
main arena's top (malloc_trim keeps the others'). The page size is a parameter: a dump read
on another machine may come from one with other pages.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memforensics.analysis.heap import analyze
from memforensics.analysis.trim_forecast import estimate_buckets_releasable
from memforensics.model.heap import HeapDump
from memforensics.sources.malloc_info.malloc_xml import parse_dump
from memforensics.units import MiB

FIXTURES = Path(__file__).resolve().parent.parent.parent / "fixtures"


def _fragmented() -> HeapDump:
    return parse_dump((FIXTURES / "threads-fragmented.xml").read_bytes())


def _estimator(dump: HeapDump, page_bytes: int) -> int:
    lines = [b for arena in dump.arenas for b in arena.sizes if not b.suspect]
    top = dump.arenas[0].top_bytes or 0
    return estimate_buckets_releasable(lines, 1.0, page_bytes=page_bytes, top_bytes=top)


def test_xml_trim_advice_says_what_the_trim_estimator_says() -> None:
    """One figure for one dump: the advice's is the estimator's (19.0 MiB here), not the
    page-or-larger chunk bytes plus every arena's top (26.3 MiB)."""
    dump = _fragmented()
    analysis = analyze(dump, page_bytes=4096)
    expected = _estimator(dump, 4096)
    assert analysis.trim_release_bytes == expected
    (advice,) = [a for a in analysis.advice if a.code == "trim-would-release"]
    assert f"{expected / MiB:.1f} MiB" in advice.message
    assert advice.message.startswith("19.0 MiB")
    assert "4 KiB pages" in advice.message


@pytest.mark.parametrize("page_bytes", [4096, 16384, 65536])
def test_the_page_size_is_a_parameter(page_bytes: int) -> None:
    dump = _fragmented()
    analysis = analyze(dump, page_bytes=page_bytes)
    assert analysis.trim_release_bytes == _estimator(dump, page_bytes)


def test_without_a_page_size_the_machines_is_used_and_said() -> None:
    dump = _fragmented()
    analysis = analyze(dump)
    machine = os.sysconf("SC_PAGE_SIZE")
    assert analysis.trim_release_bytes == _estimator(dump, machine)
    advice = [a for a in analysis.advice if a.code == "trim-would-release"]
    assert all("this machine's page size" in a.message for a in advice)
