"""A foreign allocator's reading (model.allocator.ForeignHeap) in the report's terms: the
heap document every renderer, gate, recording and Prometheus series reads, the RSS
waterfall, the advice, and the trim's forecast.

The document is the one glibc's report has (model.heap.HeapDump): one arena per jemalloc
arena (one for the whole heap of tcmalloc), its system bytes what the allocator holds for
objects, its "rest" the free bytes, so free, in use and the free ratio mean what they mean
for glibc (docs/allocators.md). There are no size lines (the allocators keep their own size
classes, not read) and no mmapped chunks (jemalloc and tcmalloc serve large blocks from
their own pages, counted in the arenas). mimalloc keeps no allocation statistics: its one
arena is what it has committed, all of it counted in use, an upper bound, as the notes say.
"""

from __future__ import annotations

from memforensics.analysis.heap import arena_figures
from memforensics.analysis.thresholds import ALLOCATOR_ADVICE_MIN_BYTES
from memforensics.model.advice import Advice
from memforensics.model.allocator import ForeignHeap
from memforensics.model.heap import Arena, HeapDump
from memforensics.model.heap_analysis import HeapAnalysis
from memforensics.model.process import (
    ArenaTrimForecast,
    ProcessMemory,
    TrimForecast,
    Waterfall,
    WaterfallLine,
)
from memforensics.units import format_bytes

# Where each allocator's free memory goes back to the kernel without a call.
_DECAY = {
    "jemalloc": "jemalloc gives dirty pages back as they decay (dirty_decay_ms, then "
    "muzzy_decay_ms; MALLOC_CONF=dirty_decay_ms:1000 shortens it, background_thread:true "
    "does it off the application's threads)",
    "tcmalloc": "tcmalloc gives page-heap pages back gradually (TCMALLOC_RELEASE_RATE; "
    "higher is sooner)",
    "mimalloc": "mimalloc resets unused pages after a delay (its MIMALLOC_* options)",
}


def _arenas(heap: ForeignHeap) -> tuple[Arena, ...]:
    if heap.arenas:
        return tuple(
            Arena(
                index=arena.index,
                sizes=(),
                fast_chunks=None,
                fast_bytes=None,
                rest_chunks=0,
                rest_bytes=arena.free_bytes,
                system_bytes=arena.system_bytes,
                system_max_bytes=arena.system_bytes,
            )
            for arena in heap.arenas
        )
    committed = heap.mapped_bytes or 0  # mimalloc: what it committed, use unknown
    return (Arena(0, (), None, None, 0, 0, committed, committed),)


def heap_dump(heap: ForeignHeap, source: str) -> HeapDump:
    """The report's heap document for ``heap`` (see the module)."""
    arenas = _arenas(heap)
    system = sum(a.system_bytes for a in arenas)
    return HeapDump(
        version="1",
        arenas=arenas,
        fast_chunks=None,
        fast_bytes=None,
        rest_chunks=0,
        rest_bytes=sum(a.rest_bytes for a in arenas),
        mmap_chunks=None,
        mmap_bytes=None,
        system_bytes=system,
        system_max_bytes=system,
        source=source,
        notes=heap.notes,
    )


def _notes(heap: ForeignHeap) -> tuple[str, ...]:
    name = heap.kind
    notes = [
        f"in use = what the application holds, by {name}'s own count; free = what {name} "
        "keeps for reuse (docs/allocators.md).",
    ]
    if heap.kind == "jemalloc":
        notes.append(
            "free = active pages less allocated bytes (room in slabs beside live objects) "
            "plus dirty and muzzy pages (whole free pages, given back by a purge)."
        )
    if heap.kind == "tcmalloc":
        notes.append(
            "free = the page heap's free pages (given back by ReleaseFreeMemory) plus the "
            "objects cached in the central, transfer and thread caches (kept)."
        )
    return (*notes, *heap.notes)


def advise(heap: ForeignHeap) -> tuple[Advice, ...]:
    """Plain-words advice from the allocator's own figures; stable codes."""
    advice: list[Advice] = []
    name = heap.kind
    releasable = heap.releasable_bytes or 0
    if releasable >= ALLOCATOR_ADVICE_MIN_BYTES:
        advice.append(
            Advice(
                f"{name}-releasable",
                f"{format_bytes(releasable)} of free pages {name} keeps can go back to the "
                f"kernel now: `memforensics trim PID` calls {name}'s own purge. Else "
                f"{_DECAY[name]}.",
                "warn",
            )
        )
    fragmentation = heap.fragmentation_bytes or 0
    if fragmentation >= ALLOCATOR_ADVICE_MIN_BYTES:
        where = (
            "active minus allocated: room in slabs beside live objects (what Redis calls "
            "allocator_frag_bytes)"
            if name == "jemalloc"
            else "objects cached in the central, transfer and thread caches"
        )
        advice.append(
            Advice(
                f"{name}-fragmentation",
                f"{format_bytes(fragmentation)} is {where}: no purge gives it back; it goes "
                "as the objects around it are freed (Redis: activedefrag).",
                "info",
            )
        )
    if heap.in_use_bytes is None:
        advice.append(
            Advice(
                f"{name}-no-statistics",
                f"{name} keeps no allocation statistics here: what of its "
                f"{format_bytes(heap.mapped_bytes)} committed the application holds is not "
                "known. `memforensics trim PID` calls mi_collect(true) and measures RSS.",
                "info",
            )
        )
    return tuple(advice)


def analyze_foreign(heap: ForeignHeap, source: str) -> HeapAnalysis:
    """The heap report's analysis of ``heap``: the document, per-arena figures, advice."""
    dump = heap_dump(heap, source)
    return HeapAnalysis(
        dump=dump,
        arenas=tuple(arena_figures(a) for a in dump.arenas),
        histogram=(),
        advice=advise(heap),
        notes=_notes(heap),
        page_or_larger_free_bytes=heap.releasable_bytes or 0,
        trim_release_bytes=heap.releasable_bytes or 0,
    )


def waterfall(memory: ProcessMemory, heap: ForeignHeap) -> Waterfall:
    """RSS -> file-backed + shmem + anonymous; anonymous -> the allocator's in use, its free
    pages still resident, its metadata, and what it does not hold. Its resident, in-use
    and metadata figures are its own; the rest are differences with the kernel's."""
    name = heap.kind
    resident = heap.resident_bytes
    in_use = heap.in_use_bytes
    metadata = heap.metadata_bytes or 0
    free_resident = (
        max(resident - in_use - metadata, 0)
        if resident is not None and in_use is not None
        else None
    )
    held = resident if resident is not None else heap.mapped_bytes
    other = memory.anon_bytes - held if memory.anon_bytes is not None and held else None
    lines = [
        WaterfallLine("rss", "RSS", memory.rss_bytes, 0),
        WaterfallLine(
            "file", "file-backed", memory.file_bytes, 1, note="program, libraries, mapped files"
        ),
        WaterfallLine("shmem", "shared memory", memory.shmem_bytes, 1, note="shmem, tmpfs, memfd"),
        WaterfallLine("anon", "anonymous", memory.anon_bytes, 1),
        WaterfallLine(
            "arena_in_use",
            f"{name}: in use",
            in_use,
            2,
            note=f"{name}'s own count of what the application holds",
        ),
        WaterfallLine(
            "arena_free_resident",
            f"{name}: free, resident",
            free_resident,
            2,
            note=f"{name}'s resident pages less in use and metadata",
            kind="difference",
        ),
        WaterfallLine(
            "mmap_chunks",
            "mmapped chunks",
            0,
            2,
            note=f"none apart: {name} serves large blocks from its own pages, counted in use",
        ),
        WaterfallLine(
            "allocator_metadata",
            f"{name}: metadata",
            heap.metadata_bytes,
            2,
            note=f"{name}'s own bookkeeping",
        ),
        WaterfallLine(
            "other_anon",
            "other anonymous",
            other,
            2,
            note=f"not {name}'s: stacks, the program's mmaps, runtimes' heaps",
            kind="difference",
        ),
        WaterfallLine(
            "retained",
            f"{name}: retained",
            heap.retained_bytes,
            0,
            note="address space kept, not backed by memory",
            in_rss=False,
        ),
    ]
    if in_use is None:  # mimalloc: no statistics
        lines[4:7] = [
            WaterfallLine(
                "allocator_committed",
                f"{name}: committed",
                heap.mapped_bytes,
                2,
                note="in use and free not known (no statistics)",
            )
        ]
    notes = (
        ()
        if resident is not None
        else (f"{name} gives no resident figure: its mapped bytes stand in",)
    )
    return Waterfall(lines=tuple(lines), notes=notes)


def forecast(heap: ForeignHeap) -> TrimForecast:
    """What the allocator's purge should give back: its releasable bytes, per arena (none
    known for mimalloc, whose purge is measured only)."""
    arenas = tuple(
        ArenaTrimForecast(index=a.index, releasable_bytes=a.releasable_bytes, measured=True)
        for a in heap.arenas
    )
    notes = [f"forecast: {heap.kind}'s own count of the free pages its purge gives back"]
    if heap.releasable_bytes is None:
        notes = [f"{heap.kind} counts no free pages: its purge is measured, not forecast"]
    return TrimForecast(
        releasable_bytes=heap.releasable_bytes or 0,
        arenas=arenas,
        measured=heap.releasable_bytes is not None,
        free_not_resident_bytes=None,
        notes=tuple(notes),
    )
