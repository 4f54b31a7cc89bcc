"""Heap and RSS samples built from an analysed dump and /proc figures (what watch records)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from memforensics.analysis.heap import analyze
from memforensics.model.advice import Advice
from memforensics.model.heap import HeapDump
from memforensics.model.heap_analysis import HeapAnalysis
from memforensics.model.process import ProcessMemory, Waterfall
from memforensics.model.series import ArenaPoint, Sample, SizeClassPoint


def heap_totals(analysis: HeapAnalysis) -> dict[str, Any]:
    """The ``memforensics/heap/1`` totals keys of one analysed dump."""
    dump = analysis.dump
    return {
        "arenas": len(dump.arenas),
        "system_bytes": dump.system_bytes,
        "system_max_bytes": dump.system_max_bytes,
        "free_bytes": dump.free_bytes,
        "fast_bytes": dump.fast_bytes,
        "fast_chunks": dump.fast_chunks,
        "rest_bytes": dump.rest_bytes,
        "rest_chunks": dump.rest_chunks,
        "in_use_bytes": dump.in_use_bytes,
        "mmap_bytes": dump.mmap_bytes,
        "mmap_chunks": dump.mmap_chunks,
        "free_ratio": round(dump.free_ratio, 6),
        "page_or_larger_free_bytes": analysis.page_or_larger_free_bytes,
    }


def heap_sample(
    analysis: HeapAnalysis,
    *,
    time: datetime | None,
    pid: int | None,
    process: str,
    memory: ProcessMemory | None = None,
    pause_seconds: float | None = None,
    free_resident_bytes: int | None = None,
    waterfall: Waterfall | None = None,
    extra_advice: tuple[Advice, ...] = (),
    sequence: int = 0,
    runtime: str | None = None,
) -> Sample:
    """A heap sample: totals, per-arena figures, the free-chunk histogram, waterfall, advice."""
    return Sample(
        kind="heap",
        time=time,
        pid=pid,
        process=process,
        rss_bytes=memory.rss_bytes if memory else None,
        anon_bytes=memory.anon_bytes if memory else None,
        totals=heap_totals(analysis),
        pause_seconds=pause_seconds,
        free_resident_bytes=free_resident_bytes,
        arenas=tuple(
            ArenaPoint(
                index=a.index,
                system_bytes=a.system_bytes,
                in_use_bytes=a.in_use_bytes,
                free_bytes=a.free_bytes,
                free_ratio=a.free_ratio,
                top_bytes=a.top_bytes,
            )
            for a in analysis.arenas
        ),
        histogram=tuple(
            SizeClassPoint(r.from_bytes, r.to_bytes, r.chunks, r.bytes) for r in analysis.histogram
        ),
        waterfall=waterfall,
        advice=analysis.advice + extra_advice,
        sequence=sequence,
        runtime=runtime,
    )


def sample_from_dump(
    dump: HeapDump, *, time: datetime | None, process: str, sequence: int
) -> Sample:
    """A heap sample from a saved malloc_info dump (no process, RSS or residency figures)."""
    return heap_sample(analyze(dump), time=time, pid=None, process=process, sequence=sequence)


def rss_sample(
    memory: ProcessMemory, *, time: datetime, pid: int, process: str, sequence: int = 0
) -> Sample:
    """A cheap sample: RSS and anonymous bytes from /proc, no attach."""
    return Sample(
        kind="rss",
        time=time,
        pid=pid,
        process=process,
        rss_bytes=memory.rss_bytes,
        anon_bytes=memory.anon_bytes,
        sequence=sequence,
    )
