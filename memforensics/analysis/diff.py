"""What changed between two heap dumps: per arena (matched by index) and in total."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from memforensics.model.heap import Arena, HeapDump

ArenaChange = Literal["changed", "unchanged", "appeared", "vanished"]


@dataclass(frozen=True, slots=True)
class Figures:
    """The figures compared between two dumps (None: the arena does not exist there)."""

    system_bytes: int
    free_bytes: int
    in_use_bytes: int
    free_ratio: float


@dataclass(frozen=True, slots=True)
class ArenaDelta:
    """One arena index in the old and the new dump."""

    index: int
    change: ArenaChange
    old: Figures | None
    new: Figures | None

    def delta(self, name: str) -> int:
        """new − old of an integer figure; a missing side counts as zero."""
        old = getattr(self.old, name) if self.old else 0
        new = getattr(self.new, name) if self.new else 0
        return int(new - old)


@dataclass(frozen=True, slots=True)
class HeapDiff:
    """Totals and arenas of OLD against NEW."""

    old: HeapDump
    new: HeapDump
    total_old: Figures
    total_new: Figures
    arenas: tuple[ArenaDelta, ...]
    mmap_delta_bytes: int | None

    def total_delta(self, name: str) -> int:
        """new − old of an integer total."""
        return int(getattr(self.total_new, name) - getattr(self.total_old, name))


def _figures(item: Arena | HeapDump) -> Figures:
    return Figures(item.system_bytes, item.free_bytes, item.in_use_bytes, item.free_ratio)


def diff_dumps(old: HeapDump, new: HeapDump) -> HeapDiff:
    """Match arenas by index (glibc numbers them the same while none is created between).

    glibc inserts each new arena right after the main arena, so a dump taken after a new
    arena appeared shifts the numbers; the diff reports what the indexes show and says so
    in the docs rather than guess at identities malloc_info does not print.
    """
    old_by_index = {a.index: a for a in old.arenas}
    new_by_index = {a.index: a for a in new.arenas}
    deltas = []
    for index in sorted(old_by_index.keys() | new_by_index.keys()):
        before = old_by_index.get(index)
        after = new_by_index.get(index)
        change: ArenaChange
        if before is None:
            change = "appeared"
        elif after is None:
            change = "vanished"
        elif _figures(before) == _figures(after):
            change = "unchanged"
        else:
            change = "changed"
        deltas.append(
            ArenaDelta(
                index,
                change,
                _figures(before) if before else None,
                _figures(after) if after else None,
            )
        )
    mmap_delta = (
        new.mmap_bytes - old.mmap_bytes
        if new.mmap_bytes is not None and old.mmap_bytes is not None
        else None
    )
    return HeapDiff(old, new, _figures(old), _figures(new), tuple(deltas), mmap_delta)
