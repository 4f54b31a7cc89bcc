"""malloc_info's document written from figures read out of the target's memory, byte for byte
as the target's own glibc would print it.

The figures come from a read-only scan (memforensics.sources.glibc.heapmaps with
``figures=True``); the text follows glibc's __malloc_info (malloc/malloc.c) for the release
found: per arena the non-empty fastbins (``from`` = size − 15, ``to`` = size, ``total`` =
count × size), then bins 2 … 127 and the unsorted bin last, each with the smallest, largest
and summed size word with its flag bits; "rest" counts the top chunk from glibc 2.31 on (BZ
#24026), and before 2.31 every ``<size>`` line carries the stray indentation of that
release's source (BZ #24867). The process totals are the sums of the arenas' lines, plus the
mmapped chunks' counters of ``mp_``. Parsing the result (memforensics.sources.malloc_info)
gives the same HeapDump as parsing the target's own malloc_info would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memforensics.errors import (
    ArenaLockedError,
    HeapCorruptionError,
    ReadOnlyRefusedError,
    ReadTimeRanOutError,
)
from memforensics.model import glibc
from memforensics.model.heapscan import BinFigures, HeapScan, MallocParams

FIRST_RELEASE_WITH_TOP = (2, 31)  # "rest" includes the top chunk, clean indentation
# The indentation of a <size> line before 2.31: the string literal's continuation kept
# seven tabs and six spaces of source indentation in front of its own two.
_OLD_SIZE_INDENT = "\t" * 7 + " " * 6


@dataclass(frozen=True)
class RefusalWords:
    """How a refusal names why an arena was not read: a live read's stops, or a core's."""

    locked: str  # its lock was held
    too_long: str  # its lists led further than the read can follow at once
    gave_up: str  # then read another way (relays, a sweep), which gave up too


LIVE_WORDS = RefusalWords(
    locked="locked at every stop",
    too_long="lists too long to follow within a stop",
    gave_up="read in relays, given up",
)


@dataclass(frozen=True)
class Dialect:
    """How a glibc release prints malloc_info."""

    rest_counts_top: bool
    size_indent: str  # in front of "  <size"

    @classmethod
    def of_release(cls, version: str | None) -> Dialect:
        """The dialect of glibc ``version`` ("2.36"); an unknown one prints as the current."""
        numbers = tuple(int(part) for part in (version or "").split(".")[:2] if part.isdigit())
        modern = len(numbers) < 2 or numbers >= FIRST_RELEASE_WITH_TOP
        return cls(rest_counts_top=modern, size_indent="" if modern else _OLD_SIZE_INDENT)


def _arena_text(number: int, arena: BinFigures, dialect: Dialect, is_main: bool) -> list[str]:
    lines = [f'<heap nr="{number}">', "<sizes>"]
    fast_chunks = fast_bytes = 0
    for index, count in enumerate(arena.fastbin_chunks):
        if count:
            size = (index + 2) * glibc.MALLOC_ALIGNMENT
            fast_chunks += count
            fast_bytes += count * size
            lines.append(
                f'{dialect.size_indent}  <size from="{size - (glibc.MALLOC_ALIGNMENT - 1)}" '
                f'to="{size}" total="{count * size}" count="{count}"/>'
            )
    rest_chunks, rest_bytes = (1, arena.top_bytes) if dialect.rest_counts_top else (0, 0)
    unsorted: str | None = None
    for index, count, smallest, largest, total in arena.bins:
        rest_chunks += count
        rest_bytes += total
        line = f'from="{smallest}" to="{largest}" total="{total}" count="{count}"/>'
        if index == 1:
            unsorted = f"  <unsorted {line}"
        else:
            lines.append(f"{dialect.size_indent}  <size {line}")
    if unsorted is not None:
        lines.append(unsorted)
    lines += [
        "</sizes>",
        f'<total type="fast" count="{fast_chunks}" size="{fast_bytes}"/>',
        f'<total type="rest" count="{rest_chunks}" size="{rest_bytes}"/>',
        f'<system type="current" size="{arena.system_bytes}"/>',
        f'<system type="max" size="{arena.max_system_bytes}"/>',
        f'<aspace type="total" size="{arena.aspace_bytes}"/>',
        f'<aspace type="mprotect" size="{arena.aspace_mprotect_bytes}"/>',
    ]
    if not is_main:
        lines.append(f'<aspace type="subheaps" size="{arena.subheaps}"/>')
    lines.append("</heap>")
    return lines


def _totals(arenas: Sequence[BinFigures], dialect: Dialect) -> tuple[int, int, int, int]:
    """(fast chunks, fast bytes, rest chunks, rest bytes) over every arena, as printed."""
    fast_chunks = fast_bytes = rest_chunks = rest_bytes = 0
    for arena in arenas:
        for index, count in enumerate(arena.fastbin_chunks):
            fast_chunks += count
            fast_bytes += count * (index + 2) * glibc.MALLOC_ALIGNMENT
        if dialect.rest_counts_top:
            rest_chunks += 1
            rest_bytes += arena.top_bytes
        for _index, count, _smallest, _largest, total in arena.bins:
            rest_chunks += count
            rest_bytes += total
    return fast_chunks, fast_bytes, rest_chunks, rest_bytes


def raise_if_corrupt(scan: HeapScan) -> None:
    """HeapCorruptionError (exit 8) with every finding, numbered by arena in malloc_info's
    order, when any arena failed glibc's checks in a read made while the target was held."""
    findings = tuple(
        finding.numbered(number)
        for number, arena in enumerate(scan.arenas)
        for finding in arena.corruption
    )
    if not findings:
        return
    first = findings[0]
    more = f" (and {len(findings) - 1} more)" if len(findings) > 1 else ""
    raise HeapCorruptionError(
        f"the heap is corrupt: arena {first.arena}, {first.bin}, chunk "
        f"{first.chunk_address:#x}: {first.check}{more}",
        findings,
        pid=scan.pid,
        partial=scan,
    )


def _positions(positions: list[int]) -> str:
    """Arena positions (ascending) for a one-line message, runs of three or more as ranges:
    "1, 2, 1063-1499"."""
    parts: list[str] = []
    start = 0
    for index in range(1, len(positions) + 1):
        if index < len(positions) and positions[index] == positions[index - 1] + 1:
            continue
        run = positions[start:index]
        parts += [f"{run[0]}-{run[-1]}"] if len(run) >= 3 else [str(p) for p in run]
        start = index
    return ", ".join(parts)


def _arenas(positions: list[int]) -> str:
    """Arena positions named as such in a message ("arena 0", "arenas 1, 2, 1063-1499"): a
    bare number in brackets read as a count."""
    return f"arena{'s' if len(positions) > 1 else ''} {_positions(positions)}"


def malloc_info_xml(scan: HeapScan, release: str | None, words: RefusalWords = LIVE_WORDS) -> bytes:
    """The malloc_info(0) document of the heap ``scan`` read (with ``figures``), as glibc
    ``release`` ("2.36") prints it. ReadOnlyRefusedError when any arena's figures or the
    ``mp_`` counters are missing, or the arenas are not in malloc_info's order: a document
    with a part guessed would not be malloc_info's; ReadTimeRanOutError instead where the
    arenas missing were only not reached in the read's time (or locked), none of them
    refused as too long to follow: that read is possible, only slower than its budget.
    ``words``: how the refusal names why (a core's read has no stops)."""
    params: MallocParams | None = scan.malloc_params
    raise_if_corrupt(scan)
    missing = [str(position) for position, arena in enumerate(scan.arenas) if arena.figures is None]
    if not scan.chained or not scan.arenas or not scan.arenas[0].is_main:
        raise ReadOnlyRefusedError(
            "the arenas could not be put in malloc_info's order (main_arena not found)",
            pid=scan.pid,
        )
    if missing:
        unread = [(p, a) for p, a in enumerate(scan.arenas) if a.figures is None]
        locked = [p for p, a in unread if a.lock_retries]
        long = [p for p, a in unread if a.lists_too_long]
        late = [p for p, a in unread if a.budget_reached and not a.lists_too_long]
        why = f" ({words.locked}: {_arenas(locked)})" if locked else ""
        if long:
            why += f" ({words.too_long}: {_arenas(long)})"
            relayed = sorted({a.relay_gave_up for _, a in unread if a.relay_gave_up})
            if relayed:
                why += f"; {words.gave_up}: {'; '.join(relayed)}"
        if late and len({*late, *locked}) == len(unread):
            # Only slow (or locked too): not a refusal of the read, so no call stands in.
            were = "were" if len(late) > 1 else "was"
            locked_too = f"; {words.locked}: {_arenas(locked)}" if locked else ""
            raise ReadTimeRanOutError(
                f"the read's time ({scan.walk_budget_seconds:.1f} s) ran out before "
                f"{_arenas(late)} {were} read{locked_too}",
                pid=scan.pid,
            )
        if late:
            why += f" (the read's time ran out: {_arenas(late)})"
        refusal = ArenaLockedError if len(locked) == len(missing) else ReadOnlyRefusedError
        raise refusal(
            f"{_arenas([p for p, _ in unread])} could not be read consistently{why}",
            hint="try again, or read it through the gdb path (gdb calls malloc_info)",
            pid=scan.pid,
            too_long=tuple(
                a.address
                for a in scan.arenas
                if a.figures is None and a.lists_too_long and a.address is not None
            ),
            partial=scan,
        )
    if params is None:
        raise ReadOnlyRefusedError(
            "glibc's mp_ was not found in libc's data: the mmapped chunks' counters are unknown",
            pid=scan.pid,
        )
    dialect = Dialect.of_release(release)
    figures = [arena.figures for arena in scan.arenas if arena.figures is not None]
    lines = ['<malloc version="1">']
    for number, (arena, scanned) in enumerate(zip(figures, scan.arenas, strict=True)):
        lines += _arena_text(number, arena, dialect, scanned.is_main)
    fast_chunks, fast_bytes, rest_chunks, rest_bytes = _totals(figures, dialect)
    system = sum(a.system_bytes for a in figures)
    lines += [
        f'<total type="fast" count="{fast_chunks}" size="{fast_bytes}"/>',
        f'<total type="rest" count="{rest_chunks}" size="{rest_bytes}"/>',
        f'<total type="mmap" count="{params.mmap_chunks}" size="{params.mmapped_bytes}"/>',
        f'<system type="current" size="{system}"/>',
        f'<system type="max" size="{sum(a.max_system_bytes for a in figures)}"/>',
        f'<aspace type="total" size="{sum(a.aspace_bytes for a in figures)}"/>',
        f'<aspace type="mprotect" size="{sum(a.aspace_mprotect_bytes for a in figures)}"/>',
        "</malloc>",
    ]
    return ("\n".join(lines) + "\n").encode()
