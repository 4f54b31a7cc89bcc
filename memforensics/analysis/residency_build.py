"""A heap scan set against a malloc_info dump: arenas matched one by one, what the walk could
not read estimated from the XML's per-size counts, and the measured share said.

Matching degrades per arena: an arena that cannot be paired or read is estimated alone, the
others keep their measurement. Within an arena, a bin whose list kept moving is estimated
from the dump's line for that bin; the rest of the arena stays measured.
"""

from __future__ import annotations

from collections import Counter

from memforensics.analysis.trim_forecast import estimate_buckets_releasable
from memforensics.model import glibc
from memforensics.model.heap import Arena, HeapDump, SizeBucket
from memforensics.model.heapscan import ArenaScan, HeapScan
from memforensics.model.process import ArenaResidency, FreeMethod, HeapResidency, MatchMethod
from memforensics.sources.glibc.glibc_walk import BIN_RETRIES

_FASTBINS = 0


def bucket_bin(bucket: SizeBucket) -> int:
    """The bin a dump line describes: 0 for the fastbins, 1 unsorted, else its normal bin."""
    if bucket.kind == "fast":
        return _FASTBINS
    if bucket.kind == "unsorted":
        return 1
    return glibc.bin_index(bucket.from_bytes)


def _match(dump: HeapDump, scan: HeapScan, notes: list[str]) -> tuple[MatchMethod, dict[int, int]]:
    """Dump index -> position in scan.arenas, and how the pairs were made."""
    main_rows = [i for i, a in enumerate(scan.arenas) if a.is_main]
    others = [i for i, a in enumerate(scan.arenas) if not a.is_main]
    pairs: dict[int, int] = {}
    if main_rows and dump.arenas:
        pairs[0] = main_rows[0]
    if scan.chained and len(others) + 1 == len(dump.arenas):
        pairs.update(dict(enumerate(others, start=1)))
        return "arena-chain", pairs
    if scan.chained:
        notes.append(
            f"the process has {len(others) + 1} arenas, the dump {len(dump.arenas)}: "
            "arenas were created or the dump is from another moment"
        )
    # Pair by equal system_mem, arena by arena: whatever pairs is measured, the rest estimated.
    unpaired = list(others)
    for arena in dump.arenas[1:]:
        row = next((r for r in unpaired if scan.arenas[r].system_bytes == arena.system_bytes), None)
        if row is not None:
            unpaired.remove(row)
            pairs[arena.index] = row
    if len(pairs) > (1 if 0 in pairs else 0) or (len(dump.arenas) == 1 and pairs):
        notes.append("arenas matched by equal system_mem: equal-sized arenas may be swapped")
        return "system-mem", pairs
    return "totals", {}


def _xml_free_bytes(arena: Arena) -> int:
    """The dump's free bytes of ``arena`` as chunk bytes (without the +1 per chunk that
    regular bins print), top included: what a complete walk would have found then."""
    if arena.top_bytes is None:
        return arena.free_bytes
    return sum(b.chunk_bytes for b in arena.sizes if not b.suspect) + arena.top_bytes


def _estimate_free_resident(arena: Arena, resident_bytes: int) -> int:
    """Without a walk: whatever is resident beyond the in-use bytes is free, at most all free."""
    return min(max(resident_bytes - arena.in_use_bytes, 0), arena.free_bytes)


def _arena_row(arena: Arena, scan: ArenaScan | None, page_bytes: int) -> ArenaResidency:
    segments = scan.segments if scan is not None else ()
    resident = sum(s.resident_bytes for s in segments)
    mapped = sum(s.mapped_bytes for s in segments)
    if scan is None or not scan.walked:
        return ArenaResidency(
            index=arena.index,
            address=scan.address if scan is not None else None,
            segments=segments,
            free_resident_bytes=_estimate_free_resident(arena, resident),
            free_method="estimate",
            trimmable_bytes=None,
            measured_free_bytes=0,
            estimated_free_bytes=arena.free_bytes,
            estimated_bins=tuple(sorted({bucket_bin(b) for b in arena.sizes})),
        )
    unmeasured = set(scan.unmeasured_bins)
    buckets = [b for b in arena.sizes if bucket_bin(b) in unmeasured and not b.suspect]
    lines_bytes = sum(b.chunk_bytes for b in buckets if b.kind != "fast")
    if _FASTBINS in unmeasured:
        lines_bytes += arena.fast_bytes or 0
    top_missing = scan.top_bytes is None and bool(arena.top_bytes)
    if top_missing:
        lines_bytes += arena.top_bytes or 0
    # The dump is a moment older than the walk, and chunks move between bins meanwhile (the
    # unsorted bin, the hottest, is sorted into the others by the next malloc): its lines
    # for the bins that kept moving can both miss chunks and repeat ones the walk measured
    # elsewhere. What the dump's free total leaves beyond the measured bytes is what those
    # bins hold; their lines only give the sizes (for the trim estimate).
    remainder = max(_xml_free_bytes(arena) - scan.free_bytes, 0)
    estimated = remainder if unmeasured or top_missing else 0
    size_scale = min(estimated / lines_bytes, 1.0) if lines_bytes else 0.0
    # The estimated part is as resident as what was measured of the same arena (or its heap).
    measured_binned = scan.free_bytes - (scan.top_bytes or 0)
    measured_binned_resident = scan.free_resident_bytes - (scan.top_resident_bytes or 0)
    if measured_binned > 0:
        share = measured_binned_resident / measured_binned
    else:
        share = resident / mapped if mapped else 1.0
    free_resident = scan.free_resident_bytes + int(estimated * share)
    estimated_trimmable = estimate_buckets_releasable(
        [b for b in buckets if b.kind != "fast"],
        share * size_scale,
        page_bytes=page_bytes,
        top_bytes=(arena.top_bytes or 0) if top_missing and arena.index == 0 else 0,
    )
    method: FreeMethod = "partial" if unmeasured or top_missing else "walked"
    if scan.free_bytes == 0 and estimated:
        method = "estimate"
    return ArenaResidency(
        index=arena.index,
        address=scan.address,
        segments=segments,
        free_resident_bytes=free_resident,
        free_method=method,
        trimmable_bytes=scan.trimmable_bytes + estimated_trimmable,
        estimated_trimmable_bytes=estimated_trimmable,
        walked_chunks=scan.chunks,
        top_bytes=scan.top_bytes,
        top_resident_bytes=scan.top_resident_bytes,
        measured_free_bytes=scan.free_bytes,
        estimated_free_bytes=estimated,
        estimated_bins=tuple(sorted(unmeasured)),
        retries=scan.retries,
        budget_reached=scan.budget_reached,
    )


def _summary_notes(rows: list[ArenaResidency], scan: HeapScan) -> list[str]:
    """One line per reason, however many arenas share it (1,500 arenas, not 1,500 notes)."""
    reasons: Counter[str] = Counter()
    for row in rows:
        if row.budget_reached:
            reasons["estimated: walk budget of {budget:g} s reached"] += 1
        elif row.free_method == "estimate" and row.estimated_free_bytes:
            reasons["estimated: not walked (layout not read consistently)"] += 1
        elif row.free_method == "partial":
            reasons["partly estimated: free lists kept moving after {retries} re-reads"] += 1
    notes = []
    for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
        label = f"{count:,} arena{'s' if count != 1 else ''}"
        text = reason.format(budget=scan.walk_budget_seconds, retries=BIN_RETRIES)
        notes.append(f"{label} {text}")
    return notes


def build_residency(dump: HeapDump, scan: HeapScan) -> HeapResidency:
    """Per arena of ``dump``: heap mapped and resident bytes, free bytes still resident,
    trimmable bytes; what was measured and what was estimated."""
    notes = list(scan.notes)
    method, pairs = _match(dump, scan, notes)
    rows: list[ArenaResidency] = []
    if method != "totals":
        for arena in dump.arenas:
            position = pairs.get(arena.index)
            matched = scan.arenas[position] if position is not None else None
            rows.append(_arena_row(arena, matched, scan.page_bytes))
        notes.extend(_summary_notes(rows, scan))
    elif dump.arenas:
        notes.append("heaps could not be matched to the dump's arenas; totals only")
    if dump.mmap_chunks is not None and scan.mmap_chunks != dump.mmap_chunks:
        notes.append(
            f"found {scan.mmap_chunks} mmapped chunks in the maps, the dump counts "
            f"{dump.mmap_chunks}"
        )
    heap_resident = scan.heap_resident_bytes
    chunk_resident = scan.mmap_chunk_resident_bytes
    other = max(
        scan.anon_resident_bytes - heap_resident - chunk_resident - scan.stack_resident_bytes, 0
    )
    measured = sum(r.measured_free_bytes for r in rows)
    estimated = sum(r.estimated_free_bytes for r in rows) if rows else dump.free_bytes
    return HeapResidency(
        pid=scan.pid,
        page_bytes=scan.page_bytes,
        method=method,
        arenas=tuple(rows),
        heap_mapped_bytes=scan.heap_mapped_bytes,
        heap_resident_bytes=heap_resident,
        mmap_chunk_bytes=scan.mmap_chunk_bytes,
        mmap_chunk_resident_bytes=chunk_resident,
        stack_resident_bytes=scan.stack_resident_bytes,
        other_anon_resident_bytes=other,
        anon_resident_bytes=scan.anon_resident_bytes,
        notes=tuple(notes),
        measured_free_bytes=measured,
        estimated_free_bytes=estimated,
        walk_seconds=scan.walk_seconds,
        walk_budget_seconds=scan.walk_budget_seconds,
    )
