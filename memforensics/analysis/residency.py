"""Where the RSS went: the waterfall from RSS down to malloc's arenas, and advice on it."""

from __future__ import annotations

from memforensics.analysis.thresholds import (
    NOT_RESIDENT_MIN_BYTES,
    NOT_RESIDENT_MIN_SHARE,
    TRIMMABLE_MIN_BYTES,
    TRIMMABLE_MIN_SHARE,
)
from memforensics.model.advice import Advice
from memforensics.model.heap import HeapDump
from memforensics.model.process import (
    HeapResidency,
    ProcessMemory,
    ResidencyFigures,
    Waterfall,
    WaterfallKind,
    WaterfallLine,
)
from memforensics.units import format_bytes


def _free_resident(dump: HeapDump, residency: HeapResidency) -> tuple[int, bool]:
    """Free bytes still resident over all arenas, and whether any part is an estimate."""
    if residency.arenas and len(residency.arenas) == len(dump.arenas):
        total = sum(a.free_resident_bytes or 0 for a in residency.arenas)
        estimate = any(
            a.free_method == "estimate" or a.estimated_free_bytes for a in residency.arenas
        )
        return total, estimate
    # No per-arena match: whatever is resident beyond in-use is free, at most all free.
    total = min(max(residency.heap_resident_bytes - dump.in_use_bytes, 0), dump.free_bytes)
    return total, True


def residency_figures(dump: HeapDump, residency: HeapResidency) -> ResidencyFigures:
    """The one definition of free resident, trimmable, free released, estimated, unaccounted
    and the measured share, for every output."""
    free_resident, estimated = _free_resident(dump, residency)
    return ResidencyFigures(
        free_resident_bytes=free_resident,
        free_resident_estimated=estimated,
        trimmable_bytes=residency.measured_trimmable_bytes,
        pad_bytes=residency.pad_bytes,
        free_released_bytes=residency.measured_not_resident_bytes,
        estimated_free_bytes=residency.estimated_free_bytes,
        unaccounted_free_bytes=residency.unaccounted_free_bytes,
        measured_share=residency.measured_share,
    )


def waterfall(memory: ProcessMemory, dump: HeapDump, residency: HeapResidency) -> Waterfall:
    """RSS -> file-backed + shmem + anonymous; anonymous -> arena in-use + arena free still
    resident + mmapped chunks + thread stacks + other anonymous + unexplained.

    Each line says its kind: "measured" (the kernel's or the walk's figure), "estimated" (in
    part from the dump's size lines) or "difference" (a whole minus its parts). Resident
    figures come from the same smaps/pagemap pass; RSS, file, shmem and anonymous from
    smaps_rollup read at another instant, so "unexplained" also absorbs what changed in
    between (it may be slightly negative on a busy process). Beside the RSS: free bytes the
    walk measured as not resident ("free, released"), and the dump's free bytes the walk
    could not account for (their residency unknown).
    """
    free_resident, free_estimated = _free_resident(dump, residency)
    heap_resident = residency.heap_resident_bytes
    in_use_resident = max(heap_resident - free_resident, 0)
    mmap_resident = residency.mmap_chunk_resident_bytes
    mmap_estimated = mmap_resident is None or residency.mmap_chunk_estimated_bytes > 0
    if mmap_resident is None:
        mmap_resident = dump.mmap_bytes or 0
    mmap_note = "large malloc blocks"
    if residency.mmap_chunk_resident_bytes is None:
        mmap_note += " (malloc_info's total)"
    elif residency.mmap_chunk_estimated_bytes:
        mmap_note += f": found {residency.mmap_chunks_found} of {dump.mmap_chunks}, the rest ~"
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
            f"{residency.measured_share:.0%} of the dump's free bytes measured ({walked:,} free "
            "chunks checked page by page), the rest estimated from the XML"
        )
    else:
        free_note = "estimate: resident heap minus in-use"
    unaccounted = max(residency.unaccounted_free_bytes, 0)
    in_use_note = "includes tcache, chunk headers, arena bookkeeping"
    if unaccounted:
        in_use_note += "; may hold the unaccounted free bytes"
    notes = list(residency.notes)
    if free_resident > heap_resident:
        notes.append(
            f"free resident ({format_bytes(free_resident)}) exceeds the arenas' heap mappings "
            f"found ({format_bytes(heap_resident)}): part of an arena lies outside them"
        )
    kind_free: WaterfallKind = "estimated" if free_estimated else "measured"
    lines = [
        WaterfallLine("rss", "RSS", memory.rss_bytes, 0),
        WaterfallLine(
            "file",
            "file-backed",
            memory.file_bytes,
            1,
            note="program, libraries, mapped files",
            kind="difference",
        ),
        WaterfallLine("shmem", "shared memory", memory.shmem_bytes, 1, note="shmem, tmpfs, memfd"),
        WaterfallLine("anon", "anonymous", memory.anon_bytes, 1),
        WaterfallLine(
            "arena_in_use",
            "arenas: in use",
            in_use_resident,
            2,
            estimate=free_estimated,
            note=in_use_note,
            kind="difference",
        ),
        WaterfallLine(
            "arena_free_resident",
            "arenas: free, resident",
            free_resident,
            2,
            estimate=free_estimated,
            note=free_note,
            kind=kind_free,
        ),
        WaterfallLine(
            "mmap_chunks",
            "mmapped chunks",
            mmap_resident,
            2,
            estimate=mmap_estimated,
            note=mmap_note,
            kind="estimated" if mmap_estimated else "measured",
        ),
        WaterfallLine("stacks", "thread stacks", residency.stack_resident_bytes, 2),
        WaterfallLine(
            "other_anon",
            "other anonymous",
            residency.other_anon_resident_bytes,
            2,
            note="not malloc's: the program's mmaps, runtimes' heaps",
            kind="difference",
        ),
        WaterfallLine(
            "unexplained",
            "unexplained",
            unexplained,
            2,
            note="changed between reads",
            kind="difference",
        ),
        WaterfallLine(
            "free_not_resident",
            "arenas: free, released",
            residency.measured_not_resident_bytes,
            0,
            note="measured free chunks no longer in RAM",
            in_rss=False,
        ),
        WaterfallLine(
            "free_unaccounted",
            "arenas: free, unaccounted",
            unaccounted,
            0,
            note="free in the dump, not found by the walk: residency unknown",
            in_rss=False,
            kind="difference",
        ),
        WaterfallLine("swap", "swapped out", memory.swap_bytes, 0, in_rss=False),
    ]
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
    """Advice on what the free memory costs, from measured figures only (never from estimated
    or unaccounted bytes): what malloc_trim would release now, what is already gone, what
    sits in holes too small to release, what thread arenas' tops hold."""
    advice: list[Advice] = []
    gone = residency.measured_not_resident_bytes
    free = residency.dump_free_bytes or dump.free_bytes
    if gone >= NOT_RESIDENT_MIN_BYTES and gone >= NOT_RESIDENT_MIN_SHARE * max(free, 1):
        advice.append(
            Advice(
                "free-not-resident",
                f"{format_bytes(gone)} of the {format_bytes(free)} free in bins is no "
                "longer resident (released by malloc_trim, or never touched): it costs no RAM "
                "and trimming cannot give it back",
            )
        )
    walked = [a for a in residency.arenas if a.trimmable_bytes is not None]
    trimmable = residency.measured_trimmable_bytes
    floor = TRIMMABLE_MIN_SHARE * max(residency.heap_resident_bytes, 1)
    if walked and trimmable >= TRIMMABLE_MIN_BYTES and trimmable >= floor:
        advice.append(
            Advice(
                "trim-would-release",
                f"malloc_trim({residency.pad_bytes}) would give back about "
                f"{format_bytes(trimmable)} of resident free pages now: "
                "`memforensics trim PID` forecasts, trims and measures",
                "warn",
            )
        )
    # A thread arena's top is free and resident, but malloc_trim leaves it (only free()
    # shrinks it, through heap_trim), and it is no hole between live blocks either.
    thread_tops = sum(
        a.top_resident_bytes or 0 for a in residency.arenas if a.index != 0 and a.walked_chunks
    )
    binned_resident = sum(
        a.measured_resident_bytes - (a.top_resident_bytes or 0) for a in residency.arenas
    )
    stuck = binned_resident - (trimmable - sum(a.top_trimmable_bytes for a in residency.arenas))
    if walked and stuck >= TRIMMABLE_MIN_BYTES and stuck >= floor:
        advice.append(
            Advice(
                "free-resident-fragmented",
                f"{format_bytes(stuck)} free but resident sits in chunks too small to hold a "
                "whole page (free holes between live blocks): trimming cannot release it; "
                "fewer arenas (GLIBC_TUNABLES=glibc.malloc.arena_max=2) or pooling helps",
                "warn",
            )
        )
    if walked and thread_tops >= TRIMMABLE_MIN_BYTES and thread_tops >= floor:
        advice.append(
            Advice(
                "thread-arena-tops",
                f"{format_bytes(thread_tops)} free and resident sits at the top of thread "
                "arenas: malloc_trim does not shrink them (only free() does, once the top "
                "exceeds M_TRIM_THRESHOLD); fewer arenas (glibc.malloc.arena_max) keeps less",
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
