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
# Conservation per arena: measured + estimated may miss the dump's free bytes by this share of
# them (or this many bytes, if more) and still balance.
CONSERVATION_SHARE = 0.01
CONSERVATION_MIN_BYTES = 256 * 1024


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


def _xml_free_bytes(arena: Arena, scan: ArenaScan | None = None) -> int:
    """The dump's free bytes of ``arena`` as chunk bytes (without the +1 per chunk that
    regular bins print), top included: what a complete walk would have found then. Where
    the dump does not count the top (glibc < 2.31), the walk's top stands in for it."""
    with_top = arena.free_chunk_bytes_with_top
    if with_top is not None:
        return with_top
    return arena.free_chunk_bytes + ((scan.top_bytes or 0) if scan is not None else 0)


def _estimate_free_resident(arena: Arena, resident_bytes: int) -> int:
    """Without a walk: whatever is resident beyond the in-use bytes is free, at most all free."""
    return min(max(resident_bytes - arena.in_use_bytes, 0), arena.free_bytes)


def conservation_tolerance_bytes(dump_free_bytes: int) -> int:
    """How far measured + estimated may miss the dump's free bytes and still balance: the
    churn between the dump and the walk (gdb's own call frees its buffer in between)."""
    return max(CONSERVATION_MIN_BYTES, int(dump_free_bytes * CONSERVATION_SHARE))


def _estimated_resident_share(scan: ArenaScan, estimated: int, resident: int, mapped: int) -> float:
    """How resident the estimated part is taken to be: like the measured binned chunks when
    they are at least as many bytes as the estimate, else like the arena's heap pages."""
    measured_binned = scan.free_bytes - (scan.top_bytes or 0)
    measured_binned_resident = scan.free_resident_bytes - (scan.top_resident_bytes or 0)
    if measured_binned > 0 and measured_binned >= estimated:
        return measured_binned_resident / measured_binned
    return resident / mapped if mapped else 1.0


def _top_trimmable(arena: Arena, scan: ArenaScan, pad_bytes: int, page_bytes: int) -> int:
    """Resident whole pages systrim gives back from the main arena's top with ``pad_bytes``:
    none from a non-main arena, none from a top that does not end at the program break."""
    top, runs = scan.top_bytes, scan.top_resident_runs
    if arena.index != 0 or top is None or scan.top_address is None or runs is None:
        return 0
    if scan.top_at_brk is False:
        return 0
    end = scan.top_address + top
    extra = glibc.systrim_release_bytes(top, page_bytes, pad_bytes)
    return glibc.runs_bytes_within(runs, end - extra, end)


def _arena_row(
    arena: Arena, scan: ArenaScan | None, page_bytes: int, pad_bytes: int = 0
) -> ArenaResidency:
    segments = scan.segments if scan is not None else ()
    resident = sum(s.resident_bytes for s in segments)
    mapped = sum(s.mapped_bytes for s in segments)
    dump_free = _xml_free_bytes(arena, scan)
    if scan is None or not scan.walked:
        return ArenaResidency(
            index=arena.index,
            address=scan.address if scan is not None else None,
            segments=segments,
            free_resident_bytes=_estimate_free_resident(arena, resident),
            free_method="estimate",
            trimmable_bytes=None,
            measured_free_bytes=0,
            estimated_free_bytes=dump_free,
            estimated_bins=tuple(sorted({bucket_bin(b) for b in arena.sizes})),
            dump_free_bytes=dump_free,
        )
    unmeasured = set(scan.unmeasured_bins)
    buckets = [b for b in arena.sizes if bucket_bin(b) in unmeasured and not b.suspect]
    lines_bytes = sum(b.chunk_bytes for b in buckets if b.kind != "fast")
    if _FASTBINS in unmeasured:
        lines_bytes += arena.fast_bytes or 0
    top_missing = scan.top_bytes is None and bool(arena.top_bytes)
    if top_missing:
        lines_bytes += arena.top_bytes or 0
    # The dump is a moment older (or younger) than the walk, and chunks move between bins
    # meanwhile: the dump's lines for the bins that kept moving can both miss chunks and
    # repeat ones the walk measured elsewhere. What the dump's free total leaves beyond the
    # measured bytes is what those bins hold; their lines only give the sizes (for the trim
    # estimate). Without unmeasured bins nothing is estimated: a difference to the dump is
    # unaccounted, said as such, never folded into another figure.
    estimated = max(dump_free - scan.free_bytes, 0) if unmeasured or top_missing else 0
    estimated = min(estimated, lines_bytes)
    unaccounted = dump_free - scan.free_bytes - estimated
    balanced = abs(unaccounted) <= conservation_tolerance_bytes(dump_free)
    size_scale = min(estimated / lines_bytes, 1.0) if lines_bytes else 0.0
    share = _estimated_resident_share(scan, estimated, resident, mapped)
    free_resident = scan.free_resident_bytes + int(estimated * share)
    estimated_trimmable = estimate_buckets_releasable(
        [b for b in buckets if b.kind != "fast"],
        share * size_scale,
        page_bytes=page_bytes,
        top_bytes=(
            (arena.top_bytes or 0)
            if top_missing and arena.index == 0 and scan.top_at_brk is not False
            else 0
        ),
        pad_bytes=pad_bytes,
    )
    top_trimmable = _top_trimmable(arena, scan, pad_bytes, page_bytes)
    method: FreeMethod = "partial" if unmeasured or top_missing or not balanced else "walked"
    if scan.free_bytes == 0 and estimated:
        method = "estimate"
    return ArenaResidency(
        index=arena.index,
        address=scan.address,
        segments=segments,
        free_resident_bytes=free_resident,
        free_method=method,
        trimmable_bytes=scan.trimmable_bytes + top_trimmable + estimated_trimmable,
        estimated_trimmable_bytes=estimated_trimmable,
        walked_chunks=scan.chunks,
        top_bytes=scan.top_bytes,
        top_resident_bytes=scan.top_resident_bytes,
        measured_free_bytes=scan.free_bytes,
        estimated_free_bytes=estimated,
        estimated_bins=tuple(sorted(unmeasured)),
        retries=scan.retries,
        budget_reached=scan.budget_reached,
        dump_free_bytes=dump_free,
        measured_resident_bytes=scan.free_resident_bytes,
        unaccounted_bytes=unaccounted,
        balanced=balanced,
        top_at_brk=scan.top_at_brk if arena.index == 0 else None,
        top_trimmable_bytes=top_trimmable,
    )


def _summary_notes(rows: list[ArenaResidency], scan: HeapScan) -> list[str]:
    """One line per reason, however many arenas share it (1,500 arenas, not 1,500 notes)."""
    reasons: Counter[str] = Counter()
    for row in rows:
        if row.budget_reached:
            reasons["estimated: walk budget of {budget:g} s reached"] += 1
        elif row.free_method == "estimate" and row.estimated_free_bytes:
            reasons["estimated: not walked (layout not read consistently)"] += 1
        elif row.free_method == "partial" and row.estimated_free_bytes:
            reasons["partly estimated: free lists kept moving after {retries} re-reads"] += 1
        if not row.balanced:
            reasons[
                "out of balance with the dump: the walk and the dump describe different "
                "moments (see unaccounted_bytes)"
            ] += 1
    notes = []
    for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
        label = f"{count:,} arena{'s' if count != 1 else ''}"
        text = reason.format(budget=scan.walk_budget_seconds, retries=BIN_RETRIES)
        notes.append(f"{label} {text}")
    return notes


def build_residency(dump: HeapDump, scan: HeapScan, *, pad_bytes: int = 0) -> HeapResidency:
    """Per arena of ``dump``: heap mapped and resident bytes, free bytes still resident,
    bytes malloc_trim(``pad_bytes``) releases; what was measured, what was estimated and what
    is unaccounted (the three add up to the dump's free bytes, arena by arena)."""
    notes = list(scan.notes)
    method, pairs = _match(dump, scan, notes)
    rows: list[ArenaResidency] = []
    if method != "totals":
        for arena in dump.arenas:
            position = pairs.get(arena.index)
            matched = scan.arenas[position] if position is not None else None
            rows.append(_arena_row(arena, matched, scan.page_bytes, pad_bytes))
        notes.extend(_summary_notes(rows, scan))
    elif dump.arenas:
        notes.append("heaps could not be matched to the dump's arenas; totals only")
    heap_resident = scan.heap_resident_bytes
    chunk_resident, chunk_estimated = _mmap_chunk_resident(dump, scan, notes)
    other = max(
        scan.anon_resident_bytes - heap_resident - chunk_resident - scan.stack_resident_bytes, 0
    )
    measured = sum(r.measured_free_bytes for r in rows)
    dump_free = (
        sum(r.dump_free_bytes for r in rows)
        if rows
        else sum(_xml_free_bytes(a) for a in dump.arenas)
    )
    estimated = sum(r.estimated_free_bytes for r in rows) if rows else dump_free
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
        dump_free_bytes=dump_free,
        pad_bytes=pad_bytes,
        mmap_chunk_estimated_bytes=chunk_estimated,
        mmap_chunks_found=None if scan.arenas_only else scan.mmap_chunks,
    )


def _mmap_chunk_resident(dump: HeapDump, scan: HeapScan, notes: list[str]) -> tuple[int, int]:
    """Resident bytes of the mmapped chunks, and the part of them estimated: chunks the dump
    counts but the search did not find (it stopped, or the count moved) are taken to be as
    resident as those found, so they do not land in "other anonymous"."""
    if scan.arenas_only:
        return 0, 0
    found = scan.mmap_chunk_resident_bytes
    if dump.mmap_chunks is None or dump.mmap_bytes is None:
        return found, 0
    if scan.mmap_chunks != dump.mmap_chunks:
        notes.append(
            f"found {scan.mmap_chunks} mmapped chunks in the maps, the dump counts "
            f"{dump.mmap_chunks}"
        )
    missing = dump.mmap_bytes - scan.mmap_chunk_bytes
    if missing <= 0 or (scan.mmap_chunks >= dump.mmap_chunks and scan.mmap_search_complete):
        return found, 0
    share = found / scan.mmap_chunk_bytes if scan.mmap_chunk_bytes else 1.0
    estimated = int(missing * share)
    return found + estimated, estimated
