"""An arena's free lists cut into parts by bin, each part's pages known from its scout, so
that a read may copy and walk one part per stop instead of the whole arena in one.

The scout (glibc_walk.ArenaWalker.scout, its C loop in _listscout.c) tags every page a list
needed with the lowest and highest bin whose list needed it (``lo``, ``hi``; 255 and 0 where
no list was). A part is a run of bins [first, last]; its pages are the scouted pages some bin
of the run needed: those whose tags overlap the run (lo <= last and hi >= first). That set
holds every page a bin of the run needed, and may hold a few more (a page needed by a bin
below the run and one above it): a stop that copies them reads each of its lists whole,
as it was scouted. The fastbins count as bin 0, so the first part (from bin 0) holds them,
the unsorted bin, and the top.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from memforensics.sources.glibc.heapcopy import both

NO_BIN_LOW, NO_BIN_HIGH = 255, 0  # a page's tags where no list needed it
BINS = 128  # 0 (the fastbins) to 127


def new_tags(pages: int) -> tuple[bytearray, bytearray]:
    """Fresh (lo, hi) tags for a heap of ``pages`` pages: no list has needed any page."""
    return bytearray([NO_BIN_LOW]) * pages, bytearray([NO_BIN_HIGH]) * pages


def plan(lows: Sequence[bytes | bytearray], max_pages: int) -> list[tuple[int, int]]:
    """Runs of bins [first, last] covering 0..127, in order, of about ``max_pages`` pages
    each (a page counted once, at the lowest bin that needed it): the parts a stop each
    reads. A run is cut before a bin with pages that would take it past ``max_pages``, once
    it holds a quarter of that: a bin needing more is a run of its own, or with the few pages
    of the bins before it; a last run of less than a quarter joins the one before (each part
    costs a stop, whatever its size). One run, (0, 127), when the whole fits."""
    counts = [0] * BINS
    for lo in lows:
        for value, count in Counter(bytes(lo)).items():
            if value < BINS:
                counts[value] += count
    least = max(1, max_pages // 4)
    cuts: list[int] = []  # the first bin of each run after the first
    taken = 0
    for index, count in enumerate(counts):
        if taken >= least and count and taken + count > max_pages:
            cuts.append(index)
            taken = 0
        taken += count
    if cuts and taken < least:
        cuts.pop()  # the last run, too small for a stop of its own, joins the one before
    firsts = [0, *cuts]
    return [(first, end - 1) for first, end in zip(firsts, [*cuts, BINS], strict=True)]


def part_mask(
    filled: bytes | bytearray, lo: bytes | bytearray, hi: bytes | bytearray, part: tuple[int, int]
) -> bytes:
    """One byte per page of ``filled`` (the scouted pages), 1 where a bin of ``part`` needed
    the page (its tags overlap the part's bins), as long as ``filled``."""
    first, last = part
    low_enough = bytes(lo).translate(bytes(int(value <= last) for value in range(256)))
    high_enough = bytes(hi).translate(bytes(int(value >= first) for value in range(256)))
    flagged = bytes(int(value == 1) for value in range(256))
    mask = both(both(bytes(filled).translate(flagged), low_enough), high_enough)
    return mask.ljust(len(filled), b"\x00")
