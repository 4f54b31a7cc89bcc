"""CI gates over a heap dump: thresholds given on the command line, checked purely."""

from __future__ import annotations

from dataclasses import dataclass

from memforensics.model.heap import HeapDump
from memforensics.units import format_bytes

# A ratio on a tiny arena says nothing (the main arena of an idle process is mostly its
# top chunk), so per-arena ratio gates only judge arenas at least this big.
RATIO_GATE_MIN_ARENA_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class GateViolation:
    """One exceeded threshold; ``arena_index`` None means the whole process."""

    gate: str
    arena_index: int | None
    value: float
    limit: float
    message: str


def check_gates(
    dump: HeapDump,
    *,
    max_free_ratio: float | None = None,
    max_free_bytes: int | None = None,
    max_arenas: int | None = None,
) -> tuple[GateViolation, ...]:
    """Every gate ``dump`` violates, process totals first, then arenas by index."""
    found: list[GateViolation] = []
    if max_free_ratio is not None:
        if dump.free_ratio > max_free_ratio:
            found.append(
                GateViolation(
                    "max-free-ratio",
                    None,
                    dump.free_ratio,
                    max_free_ratio,
                    f"all arenas: free ratio {dump.free_ratio:.2f} > {max_free_ratio:.2f}",
                )
            )
        for arena in sorted(dump.arenas, key=lambda a: a.index):
            if arena.system_bytes < RATIO_GATE_MIN_ARENA_BYTES or arena.suspect:
                continue
            if arena.free_ratio > max_free_ratio:
                found.append(
                    GateViolation(
                        "max-free-ratio",
                        arena.index,
                        arena.free_ratio,
                        max_free_ratio,
                        f"arena {arena.index}: free ratio {arena.free_ratio:.2f} > "
                        f"{max_free_ratio:.2f} ({format_bytes(arena.free_bytes)} free of "
                        f"{format_bytes(arena.system_bytes)})",
                    )
                )
    if max_free_bytes is not None and dump.free_bytes > max_free_bytes:
        largest = max(dump.arenas, key=lambda a: a.free_bytes, default=None)
        where = (
            f"; largest arena {largest.index} holds {format_bytes(largest.free_bytes)}"
            if largest is not None
            else ""
        )
        found.append(
            GateViolation(
                "max-free",
                None,
                dump.free_bytes,
                max_free_bytes,
                f"all arenas: free {format_bytes(dump.free_bytes)} > "
                f"{format_bytes(max_free_bytes)}{where}",
            )
        )
    if max_arenas is not None and len(dump.arenas) > max_arenas:
        found.append(
            GateViolation(
                "max-arenas",
                None,
                len(dump.arenas),
                max_arenas,
                f"arenas: {len(dump.arenas)} > {max_arenas}",
            )
        )
    return tuple(found)
