"""Library entry point of `inspect --read-only`: the heap report of a live process with no gdb
and no call into it, malloc_info's document rebuilt from the target's memory.

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

from memforensics.entry.live import Inspection
from memforensics.errors import MemforensicsError, NoSuchProcessError, TargetError
from memforensics.model.heap import HeapDump, process_source
from memforensics.model.heapscan import HeapScan, ReadOnlyRead
from memforensics.model.process import HeapResidency, ProcessFacts, ProcessMemory, Waterfall
from memforensics.sources.gdb.gdb_capture import Capture
from memforensics.sources.gdb.gdb_setup import pid_alive
from memforensics.sources.glibc.arena_hold import StopBatches
from memforensics.sources.glibc.heapmaps import scan_heap
from memforensics.sources.glibc.libc_elf import load_libc_image
from memforensics.sources.glibc.malloc_info_image import malloc_info_xml
from memforensics.sources.proc import procfs
from memforensics.sources.proc.binaries import glibc_banner_version
from memforensics.sources.proc.procmem import MemoryReader, ProcessMemoryReader

if TYPE_CHECKING:
    from memforensics.analysis.heap import HeapAnalysis


# sizeof(tcache_perthread_struct) as a chunk: char counts (2.26 … 2.29), uint16_t counts (2.30
# on), and the larger tables of later releases.
TCACHE_CHUNK_BYTES = (0x250, 0x290, 0x300)
# The malloc_par layout each heap_info size goes with (both changed in glibc 2.35).
_LAYOUT_OF_HEAP_INFO = {32: "2.26", 48: "2.35"}


def layout_evidence(scan: HeapScan, mem: MemoryReader) -> tuple[int | None, int | None]:
    """(heap_info bytes, tcache chunk bytes) as the target's memory shows them, None where
    it shows nothing (no thread arena; a first chunk that is not the tcache). TargetError
    when the heap_info size and mp_'s layout name different glibc generations."""
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
            raise TargetError(
                f"glibc layouts disagree: heap_info of {heap_info} bytes, "
                f"struct malloc_par of the {params.layout} layout",
                hint="use the gdb path (inspect without --read-only)",
                pid=scan.pid,
            )
    tcache: int | None = None
    if params is not None and params.sbrk_base:
        header = mem.read(params.sbrk_base, 16)
        size = int.from_bytes(header[8:], "little") & ~0x7 if header else 0
        tcache = size if size in TCACHE_CHUNK_BYTES else None
    return heap_info, tcache


def dump_and_residency(scan: HeapScan, version: str | None, source: str) -> tuple[bytes, HeapDump]:
    """malloc_info's document rebuilt from ``scan`` (heapmaps with ``figures``) and its parse."""
    from memforensics.sources.malloc_info.malloc_xml import parse_dump

    xml = malloc_info_xml(scan, version)
    return xml, parse_dump(xml, name=source)


def report_parts(
    dump: HeapDump, scan: HeapScan, memory: ProcessMemory | None
) -> tuple[HeapAnalysis, HeapResidency | None, Waterfall | None, str | None]:
    """(analysis, residency, waterfall, why there is no residency) of a read-only dump: the
    residency is the same read's, so the dump and the waterfall describe one moment."""
    from memforensics.analysis.heap import analyze
    from memforensics.analysis.residency import one_verdict, residency_advice, waterfall
    from memforensics.analysis.residency_build import build_residency

    analysis = analyze(dump)
    try:
        residency = build_residency(dump, scan)
    except MemforensicsError as exc:
        return analysis, None, None, str(exc)
    flow = waterfall(memory, dump, residency) if memory is not None else None
    analysis = replace(
        analysis, advice=one_verdict(analysis.advice, residency_advice(dump, residency))
    )
    return analysis, residency, flow, None


def inspect_read_only(
    pid: int, *, timeout_seconds: float = 1.0, allow_stopped: bool = False
) -> Inspection:
    """The heap report of ``pid`` read from its memory (see the module). Refuses what the gdb
    path refuses (procfs.check_target), and a heap it cannot read consistently (TargetError,
    exit 3, with a hint to use the gdb path). The target is left running (or stopped, if
    someone else had stopped it)."""
    facts = procfs.check_target(pid, allow_stopped=allow_stopped)
    try:
        return _inspect(pid, facts, timeout_seconds)
    except MemforensicsError as exc:
        if isinstance(exc, NoSuchProcessError) or not pid_alive(pid):
            from memforensics.entry.live import exited_error

            raise exited_error(pid, exc) from exc
        raise


def inspect_instead_of_gdb(
    pid: int,
    *,
    timeout_seconds: float,
    allow_stopped: bool = False,
    gdb_path: str | None = None,
    log: object = None,
) -> Inspection:
    """inspect_read_only with live.inspect_process's signature (``gdb_path`` and ``log``
    unused), for `watch --read-only` and `collect --read-only`."""
    del gdb_path, log
    return inspect_read_only(pid, timeout_seconds=timeout_seconds, allow_stopped=allow_stopped)


def _inspect(pid: int, facts: ProcessFacts, timeout_seconds: float) -> Inspection:
    libc_path = facts.libc_path
    libc = load_libc_image(pid, libc_path) if libc_path else None
    version = facts.glibc_version
    if version is None and libc_path:
        version = glibc_banner_version(Path(libc_path))
    batches = StopBatches(
        pid, libc=libc, single_threaded=facts.threads == 1, timeout_seconds=timeout_seconds
    )
    started = time.monotonic()
    try:
        scan = scan_heap(pid, libc_path=libc_path, figures=True, hold=batches)
    finally:
        batches.close()
    read_seconds = time.monotonic() - started
    xml, dump = dump_and_residency(scan, version, process_source(pid))
    with ProcessMemoryReader(pid) as mem:
        heap_info, tcache = layout_evidence(scan, mem)
    memory = procfs.read_memory(pid)
    analysis, residency, flow, residency_error = report_parts(dump, scan, memory)
    stops = batches.stops_seconds
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
    )
    capture = Capture(
        xml=xml,
        pause_seconds=read.total_stop_seconds,
        safe_point=(
            f"read-only: {read.stops} stops of every thread, longest "
            f"{read.longest_stop_seconds * 1000:.1f} ms; no gdb, nothing run in the target"
        ),
    )
    return Inspection(
        facts=procfs.read_process(pid),
        memory=memory,
        capture=capture,
        analysis=analysis,
        residency=residency,
        waterfall=flow,
        extra_advice=(),
        residency_error=residency_error,
        read_only=read,
    )
