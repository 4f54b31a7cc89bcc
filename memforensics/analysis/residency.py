"""Where the RSS went: the waterfall from RSS down to malloc's arenas, and advice on it."""

from __future__ import annotations

from memforensics.model.advice import Advice
from memforensics.model.heap import HeapDump
from memforensics.model.process import HeapResidency, ProcessMemory, Waterfall, WaterfallLine
from memforensics.units import format_bytes

MIB = 1024 * 1024
# Free-but-gone memory worth a sentence: at least this much and this share of the free bytes.
NOT_RESIDENT_MIN_BYTES = 16 * MIB
NOT_RESIDENT_MIN_SHARE = 0.10
# Resident free memory worth a trim suggestion.
TRIMMABLE_MIN_BYTES = 32 * MIB
TRIMMABLE_MIN_SHARE = 0.25


def _free_resident(dump: HeapDump, residency: HeapResidency) -> tuple[int, bool]:
    """Free bytes still resident over all arenas, and whether any part is an estimate."""
    if residency.arenas and len(residency.arenas) == len(dump.arenas):
        total = sum(a.free_resident_bytes or 0 for a in residency.arenas)
        estimate = any(a.free_method != "walked" for a in residency.arenas)
        return min(total, residency.heap_resident_bytes), estimate
    # No per-arena match: whatever is resident beyond in-use is free, at most all free.
    total = min(max(residency.heap_resident_bytes - dump.in_use_bytes, 0), dump.free_bytes)
    return total, True


def free_not_resident_bytes(dump: HeapDump, residency: HeapResidency) -> int:
    """Free bytes malloc_info reports whose pages are no longer in RAM."""
    free_resident, _ = _free_resident(dump, residency)
    free_chunk_bytes = sum(b.chunk_bytes for a in dump.arenas for b in a.sizes) + sum(
        (a.top_bytes or 0) for a in dump.arenas
    )
    # Prefer chunk bytes (without glibc's +1 per chunk artefact) when the parser split top out.
    free_total = free_chunk_bytes if any(a.top_bytes is not None for a in dump.arenas) else None
    return max((free_total if free_total is not None else dump.free_bytes) - free_resident, 0)


def waterfall(memory: ProcessMemory, dump: HeapDump, residency: HeapResidency) -> Waterfall:
    """RSS -> file-backed + shmem + anonymous; anonymous -> arena in-use + arena free still
    resident + mmapped chunks + thread stacks + other anonymous + unexplained.

    Resident figures come from the same smaps/pagemap pass; RSS, file, shmem and anonymous
    from smaps_rollup read at another instant, so "unexplained" also absorbs what changed in
    between (it may be slightly negative on a busy process).
    """
    free_resident, free_estimated = _free_resident(dump, residency)
    heap_resident = residency.heap_resident_bytes
    in_use_resident = max(heap_resident - free_resident, 0)
    mmap_resident = residency.mmap_chunk_resident_bytes
    mmap_estimated = mmap_resident is None
    if mmap_resident is None:
        mmap_resident = dump.mmap_bytes or 0
    parts = (
        in_use_resident
        + free_resident
        + mmap_resident
        + residency.stack_resident_bytes
        + residency.other_anon_resident_bytes
    )
    unexplained = memory.anon_bytes - parts if memory.anon_bytes is not None else None
    walked = sum(a.walked_chunks for a in residency.arenas)
    if not free_estimated:
        free_note = f"measured: {walked:,} free chunks checked page by page"
    elif walked:
        free_note = (
            f"{residency.measured_share:.0%} measured ({walked:,} free chunks checked page by "
            "page), the rest estimated from the XML"
        )
    else:
        free_note = "estimate: resident heap minus in-use"
    lines = [
        WaterfallLine("rss", "RSS", memory.rss_bytes, 0),
        WaterfallLine(
            "file", "file-backed", memory.file_bytes, 1, note="program, libraries, mapped files"
        ),
        WaterfallLine("shmem", "shared memory", memory.shmem_bytes, 1, note="shmem, tmpfs, memfd"),
        WaterfallLine("anon", "anonymous", memory.anon_bytes, 1),
        WaterfallLine(
            "arena_in_use",
            "arenas: in use",
            in_use_resident,
            2,
            estimate=free_estimated,
            note="includes tcache, chunk headers, arena bookkeeping",
        ),
        WaterfallLine(
            "arena_free_resident",
            "arenas: free, resident",
            free_resident,
            2,
            estimate=free_estimated,
            note=free_note,
        ),
        WaterfallLine(
            "mmap_chunks",
            "mmapped chunks",
            mmap_resident,
            2,
            estimate=mmap_estimated,
            note="large malloc blocks" + (" (malloc_info's total)" if mmap_estimated else ""),
        ),
        WaterfallLine("stacks", "thread stacks", residency.stack_resident_bytes, 2),
        WaterfallLine(
            "other_anon",
            "other anonymous",
            residency.other_anon_resident_bytes,
            2,
            note="the program's own mmaps, libraries' data",
        ),
        WaterfallLine("unexplained", "unexplained", unexplained, 2, note="changed between reads"),
        WaterfallLine(
            "free_not_resident",
            "arenas: free, released",
            free_not_resident_bytes(dump, residency),
            0,
            estimate=free_estimated,
            note="free in bins but no longer in RAM: costs nothing",
            in_rss=False,
        ),
        WaterfallLine("swap", "swapped out", memory.swap_bytes, 0, in_rss=False),
    ]
    notes = list(residency.notes)
    if residency.method == "totals":
        notes.append("arenas were not matched one by one: arena figures are process totals")
    return Waterfall(lines=tuple(lines), notes=tuple(notes))


# Advice codes that answer "what would a trim give back, and what can it not?": from the
# residency when there is one, from the XML otherwise, never from both (one verdict per
# question). The residency's answers: trim-would-release, free-not-resident and
# free-resident-fragmented (the XML's small-free-chunks says the last without knowing
# which pages are still in RAM).
_TRIM_VERDICT_CODES = frozenset({"trim-would-release", "small-free-chunks"})


def one_verdict(
    heap_advice: tuple[Advice, ...], residency_advice: tuple[Advice, ...] | None
) -> tuple[Advice, ...]:
    """The advice of a report: the XML's, with its trim verdict replaced by the residency's
    when a residency was read (it knows which free pages are still in RAM; the XML does not)."""
    if residency_advice is None:
        return heap_advice
    kept = tuple(a for a in heap_advice if a.code not in _TRIM_VERDICT_CODES)
    return kept + residency_advice


def residency_advice(dump: HeapDump, residency: HeapResidency) -> tuple[Advice, ...]:
    """Advice on what the free memory costs: resident and trimmable, or already gone."""
    advice: list[Advice] = []
    free_resident, _ = _free_resident(dump, residency)
    gone = free_not_resident_bytes(dump, residency)
    if gone >= NOT_RESIDENT_MIN_BYTES and gone >= NOT_RESIDENT_MIN_SHARE * max(dump.free_bytes, 1):
        advice.append(
            Advice(
                "free-not-resident",
                f"{format_bytes(gone)} of the {format_bytes(dump.free_bytes)} free in bins is no "
                "longer resident (released by malloc_trim, or never touched): it costs no RAM "
                "and trimming cannot give it back",
            )
        )
    measured = [a.trimmable_bytes for a in residency.arenas if a.trimmable_bytes is not None]
    trimmable = sum(measured)
    if (
        measured
        and trimmable >= TRIMMABLE_MIN_BYTES
        and trimmable >= TRIMMABLE_MIN_SHARE * max(residency.heap_resident_bytes, 1)
    ):
        advice.append(
            Advice(
                "trim-would-release",
                f"malloc_trim(0) would give back about {format_bytes(trimmable)} of resident "
                "free pages now: `memforensics trim PID` forecasts, trims and measures",
                "warn",
            )
        )
    stuck = free_resident - trimmable
    if (
        measured
        and stuck >= TRIMMABLE_MIN_BYTES
        and stuck >= TRIMMABLE_MIN_SHARE * max(residency.heap_resident_bytes, 1)
    ):
        advice.append(
            Advice(
                "free-resident-fragmented",
                f"{format_bytes(stuck)} free but resident sits in chunks too small to hold a "
                "whole page (free holes between live blocks): trimming cannot release it; "
                "fewer arenas (GLIBC_TUNABLES=glibc.malloc.arena_max=2) or pooling helps",
                "warn",
            )
        )
    if residency.method == "totals" and dump.arenas:
        advice.append(
            Advice(
                "residency-totals-only",
                "heap mappings could not be matched to arenas one by one; residency is shown "
                "for the process as a whole",
            )
        )
    return tuple(advice)
