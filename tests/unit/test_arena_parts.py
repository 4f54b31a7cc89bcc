"""An arena cut into parts by bin (arena_parts), and the parts' scans made one (merge_parts).

The oracles are the tags themselves (which bins needed which page, laid out by hand) and
conservation: the merged scan's figures are the sums and unions of its parts', nothing lost
or counted twice.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from memforensics.model.heapscan import ArenaScan, BinFigures
from memforensics.sources.glibc import arena_parts
from memforensics.sources.glibc.arena_read import merge_parts


def _tags(needed: dict[int, tuple[int, int]], pages: int) -> tuple[bytearray, bytearray]:
    lo, hi = arena_parts.new_tags(pages)
    for page, (low, high) in needed.items():
        lo[page], hi[page] = low, high
    return lo, hi


def test_parts_are_runs_of_bins_covering_every_bin_each_within_the_page_budget() -> None:
    # 10 pages needed first by bin 1, 3 by bin 5, 4 by bin 6, 2 by bin 70.
    needed = dict.fromkeys(range(10), (1, 1))
    needed |= {10 + page: (5, 5) for page in range(3)}
    needed |= {13 + page: (6, 6) for page in range(4)}
    needed |= {17: (70, 70), 18: (70, 90)}
    lo, _ = _tags(needed, 20)
    parts = arena_parts.plan([lo], max_pages=8)
    # bin 1 alone is over the budget: a part of its own (with the empty bins after it); then
    # 3 + 4 fit, 2 more do not.
    assert parts == [(0, 4), (5, 69), (70, 127)]
    flat = [index for first, last in parts for index in range(first, last + 1)]
    assert flat == list(range(128))
    assert arena_parts.plan([lo], max_pages=100) == [(0, 127)]
    for tiny in (1, 2, 3):  # every run holds a bin, and the runs still cover 0..127
        runs = arena_parts.plan([lo], max_pages=tiny)
        assert all(first <= last for first, last in runs), runs
        assert [i for first, last in runs for i in range(first, last + 1)] == list(range(128))


def test_no_part_is_cut_for_a_handful_of_pages() -> None:
    """A part costs a stop whatever its size: a run is not cut before it holds a quarter of
    the budget (the fastbins' page joins the big unsorted bin), and a last run of less than
    that joins the one before (bin 100's page)."""
    needed = {0: (0, 0)}
    needed |= {1 + page: (1, 1) for page in range(8)}
    needed |= {9 + page: (20, 20) for page in range(6)}
    needed |= {15: (100, 100)}
    lo, _ = _tags(needed, 16)
    assert arena_parts.plan([lo], max_pages=8) == [(0, 19), (20, 127)]


def test_a_parts_pages_are_those_some_bin_of_it_needed() -> None:
    """A page needed by bins 5 and 40 belongs to every part overlapping [5, 40] (it may be
    copied in more than one stop, never missed by one); a page not scouted (filled 0) to
    none, whatever its tags."""
    lo, hi = _tags({0: (5, 5), 1: (5, 40), 2: (40, 40), 3: (90, 90), 4: (5, 5)}, 6)
    filled = bytearray([1, 1, 1, 1, 0, 0])
    assert arena_parts.part_mask(filled, lo, hi, (0, 10)) == b"\x01\x01\x00\x00\x00\x00"
    assert arena_parts.part_mask(filled, lo, hi, (11, 30)) == b"\x00\x01\x00\x00\x00\x00"
    assert arena_parts.part_mask(filled, lo, hi, (31, 127)) == b"\x00\x01\x01\x01\x00\x00"


def _part(part: tuple[int, int], **fields: object) -> ArenaScan:
    scan = ArenaScan(
        address=0x7F0000000890,
        is_main=False,
        system_bytes=64 << 20,
        layout_ok=True,
        segments=(),
        walked=True,
        scouted=True,
        parts=(part,),
    )
    return replace(scan, **fields)  # type: ignore[arg-type]


def _figures(bins: tuple[tuple[int, int, int, int, int], ...], top: int) -> BinFigures:
    return BinFigures(
        fastbin_chunks=(1, 0, 0, 0, 0, 0, 0, 0, 0, 0) if top else (),
        bins=bins,
        top_bytes=top,
        system_bytes=64 << 20,
        max_system_bytes=64 << 20,
        aspace_bytes=64 << 20,
        aspace_mprotect_bytes=64 << 20,
        subheaps=1,
    )


def test_the_parts_scans_add_up_to_the_arenas() -> None:
    first = _part(
        (0, 9),
        free_bytes=1000 + 4096,
        chunks=3,
        bins=((0, 1, 32), (1, 2, 968)),
        top_bytes=4096,
        top_address=0x7F0000100000,
        stop_copy_bytes=8192,
        figures=_figures(((1, 2, 400, 568, 968),), 4096),
    )
    second = _part(
        (10, 127),
        free_bytes=5000,
        chunks=4,
        bins=((12, 4, 5000),),
        unmeasured_bins=(70,),
        stop_copy_bytes=4096,
        lock_retries=1,
        figures=_figures(((12, 4, 1200, 1300, 5000),), 0),
    )
    merged = merge_parts([first, second])
    assert merged.parts == ((0, 9), (10, 127))
    assert merged.free_bytes == first.free_bytes + second.free_bytes
    assert merged.chunks == 7
    assert merged.bins == ((0, 1, 32), (1, 2, 968), (12, 4, 5000))
    assert merged.unmeasured_bins == (70,)
    assert merged.top_bytes == 4096 and merged.top_address == 0x7F0000100000
    assert merged.stop_copy_bytes == 12288
    assert merged.lock_retries == 1
    assert merged.figures is not None
    assert merged.figures.bins == ((1, 2, 400, 568, 968), (12, 4, 1200, 1300, 5000))
    assert merged.figures.top_bytes == 4096
    assert merged.figures.fastbin_chunks == first.figures.fastbin_chunks  # type: ignore[union-attr]


def test_a_part_without_figures_leaves_the_arena_without_them() -> None:
    first = _part((0, 9), figures=_figures((), 4096))
    second = _part((10, 127), figures=None)
    assert merge_parts([first, second]).figures is None


@pytest.mark.parametrize("position", [0, 1])
def test_an_arena_read_whole_among_its_parts_is_the_arenas_scan(position: int) -> None:
    whole = replace(_part((0, 127), free_bytes=777), parts=())
    scans = [_part((0, 9), free_bytes=1), _part((10, 127), free_bytes=2)]
    scans[position] = whole
    assert merge_parts(scans) is whole
