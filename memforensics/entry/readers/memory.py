"""The memory way of reading a heap (the default; entry.inspect chooses it): the heap report of
a live process with no gdb and no call into it, malloc_info's document rebuilt from the
target's memory.

Each arena is read in a short stop of the whole target (ptrace seize and interrupt; nothing
written, no code run there: sources.glibc.arena_hold), so its figures are those of one
moment, as malloc_info's are under the arena's lock; the document is written as the target's
glibc would print it (sources.glibc.malloc_info_image) and parsed like any other, so every
renderer and gate sees what the gdb path would give. The residency walk is the same read:
the waterfall and the dump describe the same moment.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from memforensics.entry.common import exited_error
from memforensics.errors import (
    MemforensicsError,
    NoSuchProcessError,
    ReadOnlyRefusedError,
    TargetError,
)
from memforensics.model import glibc
from memforensics.model.advice import Advice
from memforensics.model.capture import Capture
from memforensics.model.heap import HeapDump, process_source
from memforensics.model.heapscan import HeapScan, ReadOnlyRead
from memforensics.model.inspection import Inspection
from memforensics.model.pins import HeapPicture
from memforensics.model.process import (
    HeapResidency,
    ProcessFacts,
    ProcessMemory,
    Waterfall,
)
from memforensics.sources.glibc.arena_hold import StopBatches
from memforensics.sources.glibc.heapmaps import WALK_BUDGET_SECONDS, scan_heap
from memforensics.sources.glibc.libc_elf import load_libc_image
from memforensics.sources.glibc.malloc_info_image import LIVE_WORDS, RefusalWords, malloc_info_xml
from memforensics.sources.proc import memory_figures, process_facts, procfs, target_check
from memforensics.sources.proc.binaries import glibc_banner_version
from memforensics.sources.proc.procfs import pid_alive
from memforensics.sources.proc.procmem import MemoryReader, ProcessMemoryReader

if TYPE_CHECKING:
    from memforensics.model.heap_analysis import HeapAnalysis


# Why an inspection has no pins when they were not asked for.
PINS_NOT_ASKED = "not read (pins were not asked for)"
# The malloc_par layout each heap_info size goes with.
_LAYOUT_OF_HEAP_INFO = {size: layout for layout, size in glibc.HEAP_INFO_BYTES_BY_LAYOUT.items()}


def layout_evidence(scan: HeapScan, mem: MemoryReader) -> tuple[int | None, int | None]:
    """(heap_info bytes, tcache chunk bytes) as the target's memory shows them, None where
    it shows nothing (no thread arena; a first chunk that is not the tcache).
    ReadOnlyRefusedError when the heap_info size and mp_'s layout name different glibc
    generations."""
    heap_info: int | None = None
    for arena in scan.arenas:
        if arena.is_main or arena.address is None:
            continue
        for segment in arena.segments:
            if segment.start < arena.address < segment.start + segment.mapped_bytes:
                heap_info = arena.address - segment.start
                break
        if heap_info is not None:
            break
    params = scan.malloc_params
    if heap_info is not None and params is not None:
        expected = _LAYOUT_OF_HEAP_INFO.get(heap_info)
        if expected != params.layout:
            raise ReadOnlyRefusedError(
                f"glibc layouts disagree: heap_info of {heap_info} bytes, "
                f"struct malloc_par of the {params.layout} layout",
                pid=scan.pid,
            )
    tcache: int | None = None
    if params is not None and params.sbrk_base:
        header = mem.read(params.sbrk_base, 16)
        size = int.from_bytes(header[8:], "little") & ~0x7 if header else 0
        tcache = size if size in glibc.TCACHE_CHUNK_BYTES else None
    return heap_info, tcache


def dump_and_residency(
    scan: HeapScan, version: str | None, source: str, words: RefusalWords = LIVE_WORDS
) -> tuple[bytes, HeapDump]:
    """malloc_info's document rebuilt from ``scan`` (heapmaps with ``figures``) and its parse;
    ``words``: how a refusal names why an arena was not read (malloc_info_xml)."""
    from memforensics.sources.malloc_info.malloc_xml import parse_dump

    xml = malloc_info_xml(scan, version, words)
    return xml, parse_dump(xml, name=source)


def report_parts(
    dump: HeapDump, scan: HeapScan, memory: ProcessMemory | None, pad_bytes: int = 0
) -> tuple[HeapAnalysis, HeapResidency | None, Waterfall | None, str | None]:
    """(analysis, residency, waterfall, why there is no residency) of a read-only dump: the
    residency is the same read's, so the dump and the waterfall describe one moment."""
    from memforensics.analysis.heap import analyze
    from memforensics.analysis.residency import one_verdict, residency_advice, waterfall
    from memforensics.analysis.residency_build import build_residency

    analysis = analyze(dump)
    try:
        residency = build_residency(dump, scan, pad_bytes=pad_bytes)
    except MemforensicsError as exc:
        return analysis, None, None, str(exc)
    flow = waterfall(memory, dump, residency) if memory is not None else None
    analysis = replace(
        analysis, advice=one_verdict(analysis.advice, residency_advice(dump, residency))
    )
    return analysis, residency, flow, None


def read_budget_seconds(timeout_seconds: float) -> float:
    """The read's own time for a command given ``--timeout``: the longer of the two, so that
    a read that ran out of it (ReadTimeRanOutError, exit 6) is given more by a longer
    ``--timeout``, as the CLI's hint says. A held read adds its share per arena and per GiB
    of heap to it (heapmaps)."""
    return max(WALK_BUDGET_SECONDS, timeout_seconds)


def inspect_read_only(
    pid: int,
    *,
    timeout_seconds: float = 1.0,
    allow_stopped: bool = False,
    pad_bytes: int = 0,
    facts: ProcessFacts | None = None,
    pins: bool = False,
    budget_seconds: float = WALK_BUDGET_SECONDS,
    one_stop_sweeps: bool = True,
) -> Inspection:
    """The heap report of ``pid`` read from its memory (see the module). Refuses what the gdb
    path refuses (target_check.check_target), and a heap it cannot read consistently (TargetError,
    exit 3, with a hint to use the gdb path). The target is left running (or stopped, if
    someone else had stopped it). Trimmable figures are for malloc_trim(``pad_bytes``).
    ``facts``: what target_check.check_target already gave for ``pid`` (its glibc refusals still
    apply), so that /proc and the executable are not read twice. ``pins``: also walk every
    heap's chunks for its pins and map (entry/pins.py), after the figures' stops.
    ``budget_seconds``: the read's own time (read_budget_seconds); arenas it did not reach
    end the read in ReadTimeRanOutError, never in a refusal. ``one_stop_sweeps``: an arena
    whose long lists move between stops is swept in one stop of every thread (scan_heap);
    else it is refused (a sample of `watch` or `collect`: a stop that long at every sample
    would be a gap in the process's service, not in the series)."""
    if facts is None or not facts.allocator.is_glibc_malloc:
        facts = target_check.check_target(pid, allow_stopped=allow_stopped)
    try:
        return _inspect(
            pid, facts, timeout_seconds, budget_seconds, pad_bytes, pins, one_stop_sweeps
        )
    except MemforensicsError as exc:
        if isinstance(exc, NoSuchProcessError) or not pid_alive(pid):
            # One message whichever step noticed (the hold says "while its threads were
            # being held"): the one the gdb path gives, documented in docs/inspect.md.
            raise exited_error(pid) from exc
        raise


def _inspect(
    pid: int,
    facts: ProcessFacts,
    timeout_seconds: float,
    budget_seconds: float,
    pad_bytes: int = 0,
    pins: bool = False,
    one_stop_sweeps: bool = True,
) -> Inspection:
    libc_path = facts.libc_path
    libc = load_libc_image(pid, libc_path) if libc_path else None
    version = facts.glibc_version
    if version is None and libc_path:
        version = glibc_banner_version(Path(libc_path))
    batches = StopBatches(
        pid, libc=libc, single_threaded=facts.threads == 1, timeout_seconds=timeout_seconds
    )
    started = time.monotonic()
    # The executable's class as check_target read it (its 32-bit refusal), not read again.
    is_64 = None if facts.elf_class is None else facts.elf_class == target_check.ELFCLASS64
    try:
        scan = scan_heap(
            pid,
            libc_path=libc_path,
            figures=True,
            hold=batches,
            is_64=is_64,
            budget_seconds=budget_seconds,
            one_stop_sweeps=one_stop_sweeps,
        )
    finally:
        batches.close()
    read_seconds = time.monotonic() - started
    try:
        xml, dump = dump_and_residency(scan, version, process_source(pid))
    except TargetError as exc:
        if facts.state not in ("T", "t"):
            raise
        raise TargetError(
            f"{exc.message}; PID {pid} is stopped (state {facts.state}), so a lock held when "
            "it stopped stays held",
            hint="continue it (kill -CONT PID) and retry, or use the gdb path",
            pid=pid,
        ) from exc
    with ProcessMemoryReader(pid) as mem:
        heap_info, tcache = layout_evidence(scan, mem)
    # One read of status for the memory figures and the report's closing facts (the state,
    # threads and tracer after the read; who the process is, as check_target found it).
    status = procfs.read_text(pid, "status")
    # (RSS and the rest as of the smaps read the scan began with: its page-table walk is
    # not made twice.)
    memory = memory_figures.read_memory(pid, status=status, rollup=dict(scan.smaps_totals) or None)
    analysis, residency, flow, residency_error = report_parts(dump, scan, memory, pad_bytes)
    picture: HeapPicture | None = None
    pins_error: str | None = PINS_NOT_ASKED
    stops = list(batches.stops_seconds)
    if pins:
        from memforensics.entry.pins import read_picture

        # After the figures' stops: the walk holds the threads in stops of its own, counted
        # in the pause the report gives.
        picture, pins_error = read_picture(
            pid, timeout_seconds=timeout_seconds, stops_seconds=stops
        )
        status = procfs.read_text(pid, "status")  # the closing facts come after the walk too
    extra_advice: tuple[Advice, ...] = ()
    if picture is not None:
        from memforensics.analysis.pins import pin_advice

        extra_advice = pin_advice(picture.heaps)
    read = ReadOnlyRead(
        source="live",
        stops=len(stops),
        longest_stop_seconds=max(stops, default=0.0),
        total_stop_seconds=sum(stops),
        lock_retries=sum(arena.lock_retries for arena in scan.arenas),
        malloc_par_layout=scan.malloc_params.layout if scan.malloc_params else "",
        glibc_version=version,
        heap_info_bytes=heap_info,
        tcache_chunk_bytes=tcache,
        read_seconds=read_seconds,
        stop_copy_bytes=sum(arena.stop_copy_bytes for arena in scan.arenas),
        scouted_arenas=sum(arena.scouted for arena in scan.arenas),
        scout_kept_arenas=sum(arena.scout_kept for arena in scan.arenas),
        walked_before_stop_arenas=sum(arena.walked_before_stop for arena in scan.arenas),
        parted_arenas=sum(bool(arena.parts) for arena in scan.arenas),
        arena_parts=sum(len(arena.parts) for arena in scan.arenas),
        relayed_arenas=sum(bool(arena.relay_stops) for arena in scan.arenas),
        relay_stops=sum(arena.relay_stops for arena in scan.arenas),
        swept_arenas=sum(arena.swept for arena in scan.arenas),
        swept_in_one_stop_arenas=sum(arena.swept_in_one_stop for arena in scan.arenas),
    )
    capture = Capture(
        xml=xml,
        pause_seconds=read.total_stop_seconds,
        safe_point=(
            f"read-only: {read.stops} stop{'s' if read.stops != 1 else ''} of every thread, "
            f"longest "
            f"{read.longest_stop_seconds * 1000:.1f} ms{_one_stop_words(read)}; no gdb, "
            "nothing run in the target"
        ),
    )
    return Inspection(
        facts=process_facts.facts_after(facts, status),
        memory=memory,
        capture=capture,
        analysis=analysis,
        residency=residency,
        waterfall=flow,
        extra_advice=extra_advice,
        residency_error=residency_error,
        read_only=read,
        picture=picture,
        pins_error=pins_error,
    )


def _one_stop_words(read: ReadOnlyRead) -> str:
    """What the safe point says of the arenas swept in one stop (none: nothing): the long
    stops, and why they were taken."""
    count = read.swept_in_one_stop_arenas
    if not count:
        return ""
    if count == 1:
        return " (an arena swept in one stop: its lists moved between shorter stops)"
    return f" ({count} arenas swept in one stop each: their lists moved between shorter stops)"
