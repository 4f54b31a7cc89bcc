"""Trend of one process over time: is it a leak, and where in the RSS does it grow?

Each line of the RSS waterfall the heap samples recorded gets a fit (memforensics/analysis/
fit.py: least squares, growth tests, step check): arena in use, mmapped chunks, free
resident, other anonymous, thread stacks, shared memory, file-backed; RSS gets one over every
reading. *Live* memory is arena in use + mmapped chunks: what malloc has handed out, so a
block moving between mmap and the heap (glibc's dynamic mmap threshold) cancels out.

The verdict, first that applies:

1. ``unknown``: fewer than ``MIN_POINTS`` (3) heap samples.
2. live memory grows: ``mmap-growing`` when the mmapped chunks rose more than the arenas'
   in use did (large blocks, each its own mapping, not freed), else ``in-use-growing``.
3. ``outside-malloc-growing``: memory malloc does not know grows — other anonymous (a
   runtime's heap: CPython's object arenas, a JVM's heap; the program's own mmaps), thread
   stacks, shared memory or file-backed pages; the evidence names the lines and the tool
   for the runtime when the process's runtime is known.
4. ``free-growing``: free resident grows (fragmentation) while live memory stays flat —
   free chunks still in RAM, so pages a trim released and never-touched tops do not count.
5. ``rss-growing``: RSS grows and no recorded line explains it (no waterfall was recorded,
   or the growth fell between the lines).
6. ``stable``.

Recordings without a waterfall (older ones, malloc_info dumps) take arena in use and mmapped
chunks from malloc_info's totals, free resident from ``free_resident_bytes`` (else malloc_info's
free), and have no outside-malloc lines. The figures are per hour when the samples carry
times; a malloc_info series without times is fitted against its sample number.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import get_args

from memforensics.analysis.fit import (
    GROWTH_MIN_SHARE,
    MIN_POINTS,
    NOISE_MULTIPLE,
    STEP_RESIDUAL_RATIO,
    fit_line,
)
from memforensics.model.series import Sample
from memforensics.model.trend import GROWTH_MIN_BYTES, SIGNIFICANCE_T, Fit, Trend, Verdict
from memforensics.units import format_bytes

__all__ = [
    "GROWTH_MIN_BYTES",
    "GROWTH_MIN_SHARE",
    "LEAK_VERDICTS",
    "MIN_POINTS",
    "NOISE_MULTIPLE",
    "RUNTIME_NAMES",
    "SIGNIFICANCE_T",
    "STEP_RESIDUAL_RATIO",
    "VERDICTS",
    "Fit",
    "Trend",
    "Verdict",
    "compute_trend",
    "fit_line",
]

VERDICTS: tuple[Verdict, ...] = get_args(Verdict)
# Memory that keeps growing whatever malloc_trim does: what `--fail-on growing` also means
# together with free-growing.
LEAK_VERDICTS: tuple[Verdict, ...] = (
    "in-use-growing",
    "mmap-growing",
    "outside-malloc-growing",
    "rss-growing",
)

RUNTIME_NAMES = {"cpython": "CPython", "jvm": "a JVM", "go": "Go", "node": "Node.js"}
# What to use next when memory outside malloc grows, per runtime.
_OUTSIDE_TOOL = {
    "cpython": "CPython's object allocator keeps small objects in its own mmapped arenas: "
    "tracemalloc (python -X tracemalloc, snapshots compared) or memray (memray attach PID) "
    "show which objects pile up",
    "jvm": "a JVM's heap, metaspace, code cache and thread stacks are its own mmaps: "
    "-XX:NativeMemoryTracking=summary with `jcmd PID VM.native_memory summary` says which "
    "part grows; a heap histogram (jcmd PID GC.class_histogram) which classes",
    "go": "the Go runtime maps its own heap: a heap profile (net/http/pprof, "
    "go tool pprof …/debug/pprof/heap) shows what holds it",
    "node": "V8 keeps its heap in its own mmaps: process.memoryUsage() and a heap snapshot "
    "(node --heapsnapshot-signal=SIGUSR2, or the inspector) show what holds it",
}
_OUTSIDE_GENERIC = (
    "not malloc's: the program's own mmaps or a runtime's heap; /proc/PID/smaps shows which "
    "mappings grow"
)
# Waterfall lines outside malloc: key, words.
_OUTSIDE_LINES = (
    ("other_anon", "other anonymous"),
    ("stacks", "thread stacks"),
    ("shmem", "shared memory"),
    ("file", "file-backed"),
)


def _axis(samples: Sequence[Sample]) -> tuple[list[float], bool]:
    """Seconds since the first sample when every sample has a time, else sample numbers."""
    if samples and all(s.time is not None for s in samples):
        first = samples[0].time
        assert first is not None
        return [(s.time - first).total_seconds() for s in samples if s.time is not None], True
    return [float(i) for i in range(len(samples))], False


def _fit(samples: Sequence[Sample], values: Sequence[int | None]) -> Fit | None:
    pairs = [(s, v) for s, v in zip(samples, values, strict=False) if v is not None]
    if len(pairs) < MIN_POINTS:
        return None
    xs, timed = _axis([s for s, _ in pairs])
    return fit_line(xs, [float(v) for _, v in pairs], timed=timed)


def _rate(fit: Fit) -> str:
    if fit.per_hour is not None:
        return f"{format_bytes(fit.per_hour, signed=True)}/h"
    return f"{format_bytes(fit.slope_per_unit, signed=True)} per sample"


def _describe(name: str, fit: Fit | None) -> str | None:
    if fit is None:
        return None
    change = format_bytes(fit.change_bytes, signed=True)
    base = f"{name} {change} over the window ({_rate(fit)}, from {format_bytes(fit.start_bytes)})"
    if fit.growing:
        noise = format_bytes(fit.noise_bytes)
        return f"{base}: growing (t = {min(fit.t_stat, 999):.1f}, noise ±{noise})"
    if fit.step:
        return (
            f"{base}: one step of {format_bytes(fit.step_bytes, signed=True)}, not a trend "
            "(a single step fits better than a line; watch longer to see whether it repeats)"
        )
    if fit.falling:
        return f"{base}: falling"
    return f"{base}: flat within the thresholds (noise ±{format_bytes(fit.noise_bytes)})"


def _by_time(samples: Sequence[Sample]) -> list[Sample]:
    if all(s.time is not None for s in samples):
        return sorted(samples, key=lambda s: (s.time, s.sequence))
    return sorted(samples, key=lambda s: s.sequence)


def _line(key: str) -> Callable[[Sample], int | None]:
    def value(sample: Sample) -> int | None:
        return None if sample.waterfall is None else sample.waterfall.get(key)

    return value


def _sum(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


def _runtime(heap: Sequence[Sample]) -> str | None:
    for sample in reversed(heap):
        if sample.runtime:
            return sample.runtime
    return None


@dataclass(frozen=True, slots=True)
class _Figures:
    live: Fit | None
    arena_in_use: Fit | None
    mmap_chunks: Fit | None
    free_resident: Fit | None
    outside: dict[str, Fit | None]
    from_waterfall: bool


def _figures(heap: Sequence[Sample]) -> _Figures:
    """The fits the verdict reads, from the waterfall when every heap sample recorded one."""
    in_use, mmap = _line("arena_in_use"), _line("mmap_chunks")
    from_waterfall = bool(heap) and all(in_use(s) is not None and mmap(s) is not None for s in heap)
    if from_waterfall:
        arena = [in_use(s) for s in heap]
        chunks = [mmap(s) for s in heap]
        outside = {key: _fit(heap, [_line(key)(s) for s in heap]) for key, _ in _OUTSIDE_LINES}
    else:
        arena = [s.in_use_bytes for s in heap]
        chunks = [s.total("mmap_bytes") for s in heap]
        outside = {key: None for key, _ in _OUTSIDE_LINES}
    if all(c is not None for c in chunks):
        live = [_sum(a, c) for a, c in zip(arena, chunks, strict=True)]
    else:
        live, chunks = arena, [None] * len(heap)
    resident = [
        s.free_resident_bytes
        if s.free_resident_bytes is not None
        else _line("arena_free_resident")(s)
        for s in heap
    ]
    return _Figures(
        live=_fit(heap, live),
        arena_in_use=_fit(heap, arena),
        mmap_chunks=_fit(heap, chunks),
        free_resident=_fit(heap, resident),
        outside=outside,
        from_waterfall=from_waterfall,
    )


def _growing(fits: Sequence[tuple[str, Fit | None]]) -> list[str]:
    """Keys of the growing fits, the largest change first."""
    found = [(key, fit) for key, fit in fits if fit is not None and fit.growing]
    found.sort(key=lambda item: -item[1].change_bytes)
    return [key for key, _ in found]


def _outside_words(keys: Sequence[str], outside: dict[str, Fit | None]) -> str:
    words = dict(_OUTSIDE_LINES)
    parts = []
    for key in keys:
        fit = outside[key]
        assert fit is not None
        parts.append(f"{words[key]} {format_bytes(fit.change_bytes, signed=True)}")
    return ", ".join(parts)


def _verdict(
    heap_samples: int,
    figures: _Figures,
    free: Fit | None,
    rss: Fit | None,
    runtime: str | None,
    outside_growing: list[str],
) -> tuple[Verdict, str]:
    """The verdict, first that applies (see the module), and the sentence that says why."""
    live, arena, chunks = figures.live, figures.arena_in_use, figures.mmap_chunks
    # Fragmentation is judged on free chunks still in RAM when they were measured.
    fragmentation = figures.free_resident if figures.free_resident is not None else free
    verdict: Verdict
    if live is None or free is None:
        verdict = "unknown"
        why = (
            f"{heap_samples} heap sample(s): at least {MIN_POINTS} are needed to tell a leak "
            "from fragmentation"
        )
    elif live.growing:
        arena_rise = arena.change_bytes if arena is not None else 0.0
        mmap_rise = chunks.change_bytes if chunks is not None else 0.0
        if mmap_rise > arena_rise:
            verdict = "mmap-growing"
            why = (
                "live memory grows in mmapped chunks: large malloc blocks (above the mmap "
                "threshold, each its own mapping) are not freed; trimming cannot help, find "
                "who allocates them (heaptrack, valgrind --tool=massif)"
            )
        else:
            verdict = "in-use-growing"
            why = (
                "memory in use grows (arena in use + mmapped chunks): a leak, or a cache or "
                "queue that keeps growing; trimming cannot help, find what holds the memory"
            )
    elif outside_growing:
        verdict = "outside-malloc-growing"
        tool = _OUTSIDE_TOOL.get(runtime or "", _OUTSIDE_GENERIC)
        why = (
            "memory malloc does not know grows ("
            + _outside_words(outside_growing, figures.outside)
            + ") while malloc's own memory stays flat; "
            + tool
        )
    elif fragmentation is not None and fragmentation.growing:
        verdict = "free-growing"
        which = "free resident" if fragmentation is figures.free_resident else "malloc_info free"
        why = (
            f"free chunks pile up while live memory stays flat ({which} grows): fragmentation; "
            "fewer arenas (MALLOC_ARENA_MAX=2) or a periodic malloc_trim may help"
        )
    elif rss is not None and rss.growing:
        verdict = "rss-growing"
        unexplained = "" if figures.from_waterfall else " (no RSS waterfall was recorded)"
        why = (
            "RSS grows but no line of the waterfall does" + unexplained + ": memory "
            "changed between heap samples, or the heap samples are too few; `memforensics "
            "inspect PID` shows the waterfall, /proc/PID/smaps which mappings grow"
        )
    else:
        verdict = "stable"
        why = "neither live, free resident nor other memory grows beyond the noise"
    return verdict, why


def compute_trend(samples: Sequence[Sample]) -> Trend:
    """The trend of one process from its samples (heap and RSS, any order)."""
    ordered = _by_time(samples)
    heap = [s for s in ordered if s.kind == "heap"]
    with_rss = [s for s in ordered if s.rss_bytes is not None]
    in_use = _fit(heap, [s.in_use_bytes for s in heap])
    free = _fit(heap, [s.free_bytes for s in heap])
    rss = _fit(with_rss, [s.rss_bytes for s in with_rss])
    figures = _figures(heap)
    runtime = _runtime(heap)
    live, arena, chunks = figures.live, figures.arena_in_use, figures.mmap_chunks
    outside_growing = _growing(list(figures.outside.items()))
    verdict, why = _verdict(len(heap), figures, free, rss, runtime, outside_growing)
    evidence: list[str] = [why]
    if (
        live is not None
        and not live.growing
        and arena is not None
        and arena.growing
        and chunks is not None
        and chunks.falling
    ):
        evidence.append(
            f"arena in use {format_bytes(arena.change_bytes, signed=True)} while mmapped chunks "
            f"{format_bytes(chunks.change_bytes, signed=True)}: blocks moved from mmap to the "
            "heap (glibc's dynamic mmap threshold rose), live memory flat: not a leak"
        )
    if runtime is not None:
        evidence.append(f"runtime: {RUNTIME_NAMES.get(runtime, runtime)}")
    trend = Trend(
        verdict=verdict,
        in_use=in_use,
        free=free,
        free_resident=figures.free_resident,
        rss=rss,
        heap_samples=len(heap),
        rss_samples=len(with_rss),
        first_time=None,
        last_time=None,
        evidence=(),
        live=live,
        arena_in_use=arena,
        mmap_chunks=chunks,
        other_anon=figures.outside["other_anon"],
        stacks=figures.outside["stacks"],
        shmem=figures.outside["shmem"],
        file=figures.outside["file"],
        runtime=runtime,
        figures="waterfall" if figures.from_waterfall else "malloc_info",
    )
    fits = trend.fits()
    for _key, name, fit in fits:
        line = _describe(name, fit)
        if line is not None:
            evidence.append(line)
    times = [s.time for s in ordered if s.time is not None]
    lines = [(key, fit) for key, _, fit in fits if key not in ("live", "in_use", "free", "rss")]
    return replace(
        trend,
        first_time=min(times) if times else None,
        last_time=max(times) if times else None,
        evidence=tuple(evidence),
        growing_lines=tuple(_growing(lines)),
        step_lines=tuple(key for key, fit in lines if fit is not None and fit.step),
    )
