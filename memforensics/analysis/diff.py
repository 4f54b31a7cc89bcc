"""What changed between two heap dumps: per arena (paired as glibc numbers them) and in total."""

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
    """One arena in the old and the new dump.

    ``old_index``/``new_index``: its number in each dump (None where it is absent);
    ``index`` is its number in the new dump, or in the old one for an arena NEW lacks.
    """

    index: int
    change: ArenaChange
    old: Figures | None
    new: Figures | None
    old_index: int | None = None
    new_index: int | None = None

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
    notes: tuple[str, ...] = ()

    def total_delta(self, name: str) -> int:
        """new − old of an integer total."""
        return int(getattr(self.total_new, name) - getattr(self.total_old, name))


def _figures(item: Arena | HeapDump) -> Figures:
    return Figures(item.system_bytes, item.free_bytes, item.in_use_bytes, item.free_ratio)


def arena_pairs(old_count: int, new_count: int) -> list[tuple[int | None, int | None]]:
    """(old position, new position) of every arena, main first, then newest to oldest.

    glibc links a new arena right after ``main_arena`` (arena.c ``_int_new_arena``:
    ``a->next = main_arena.next; main_arena.next = a``) and malloc_info numbers arenas along
    ``next``: 0 is main, 1 the newest, the oldest last. Arenas are never destroyed, so
    between two dumps of one process main stays 0 and the others keep their place counted
    from the end: old k is new k + (new_count − old_count), for k >= 1. Arenas without a
    partner are the newest ones of the dump with more (appeared in NEW, or vanished from it
    when NEW has fewer: not a later dump of the same process).
    """
    pairs: list[tuple[int | None, int | None]] = []
    if old_count or new_count:
        pairs.append((0 if old_count else None, 0 if new_count else None))
    shift = new_count - old_count
    if shift >= 0:  # new 1..shift appeared
        pairs += [(j - shift if j - shift >= 1 else None, j) for j in range(1, new_count)]
    else:  # old 1..-shift have no partner
        pairs += [(k, k + shift if k + shift >= 1 else None) for k in range(1, old_count)]
    return pairs


def diff_dumps(old: HeapDump, new: HeapDump) -> HeapDiff:
    """Pair the arenas as glibc numbers them (:func:`arena_pairs`) and compare each pair.

    Arenas are paired by their position in each dump, which is glibc's number for them.
    """
    deltas = []
    for old_at, new_at in arena_pairs(len(old.arenas), len(new.arenas)):
        before = old.arenas[old_at] if old_at is not None else None
        after = new.arenas[new_at] if new_at is not None else None
        change: ArenaChange
        if before is None:
            change = "appeared"
        elif after is None:
            change = "vanished"
        elif _figures(before) == _figures(after):
            change = "unchanged"
        else:
            change = "changed"
        shown = after if after is not None else before
        assert shown is not None
        deltas.append(
            ArenaDelta(
                shown.index,
                change,
                _figures(before) if before else None,
                _figures(after) if after else None,
                old_index=before.index if before else None,
                new_index=after.index if after else None,
            )
        )
    notes: list[str] = []
    if len(new.arenas) < len(old.arenas):
        notes.append(
            f"NEW has fewer arenas than OLD ({len(new.arenas)} < {len(old.arenas)}): glibc "
            "never destroys an arena, so NEW is not a later dump of the same process; "
            "arenas are paired from the oldest as if it were"
        )
    mmap_delta = (
        new.mmap_bytes - old.mmap_bytes
        if new.mmap_bytes is not None and old.mmap_bytes is not None
        else None
    )
    return HeapDiff(old, new, _figures(old), _figures(new), tuple(deltas), mmap_delta, tuple(notes))
