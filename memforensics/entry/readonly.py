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

import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from memforensics.entry.inspection import Inspection
from memforensics.errors import (
    HeapCorruptionError,
    MemforensicsError,
    NoSuchProcessError,
    NotGlibcMallocError,
    ReadOnlyRefusedError,
    TargetError,
    TargetExitedError,
)
from memforensics.model.capture import Capture
from memforensics.model.heap import HeapDump, process_source
from memforensics.model.heapscan import HeapScan, ReadOnlyRead
from memforensics.model.process import (
    AllocatorInfo,
    HeapResidency,
    ProcessFacts,
    ProcessMemory,
    Waterfall,
)
from memforensics.sources.glibc.arena_hold import StopBatches
from memforensics.sources.glibc.heapmaps import scan_heap
from memforensics.sources.glibc.libc_elf import load_libc_image
from memforensics.sources.glibc.malloc_info_image import malloc_info_xml
from memforensics.sources.proc import procfs
from memforensics.sources.proc.binaries import glibc_banner_version
from memforensics.sources.proc.procfs import pid_alive
from memforensics.sources.proc.procmaps import Mapping
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
        tcache = size if size in TCACHE_CHUNK_BYTES else None
    return heap_info, tcache


def dump_and_residency(scan: HeapScan, version: str | None, source: str) -> tuple[bytes, HeapDump]:
    """malloc_info's document rebuilt from ``scan`` (heapmaps with ``figures``) and its parse."""
    from memforensics.sources.malloc_info.malloc_xml import parse_dump

    xml = malloc_info_xml(scan, version)
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


def inspect_read_only(
    pid: int,
    *,
    timeout_seconds: float = 1.0,
    allow_stopped: bool = False,
    pad_bytes: int = 0,
    facts: ProcessFacts | None = None,
) -> Inspection:
    """The heap report of ``pid`` read from its memory (see the module). Refuses what the gdb
    path refuses (procfs.check_target), and a heap it cannot read consistently (TargetError,
    exit 3, with a hint to use the gdb path). The target is left running (or stopped, if
    someone else had stopped it). Trimmable figures are for malloc_trim(``pad_bytes``).
    ``facts``: what procfs.check_target already gave for ``pid`` (its glibc refusals still
    apply), so that /proc and the executable are not read twice."""
    if facts is None or not facts.allocator.is_glibc_malloc:
        facts = procfs.check_target(pid, allow_stopped=allow_stopped)
    try:
        return _inspect(pid, facts, timeout_seconds, pad_bytes)
    except MemforensicsError as exc:
        if isinstance(exc, NoSuchProcessError) or not pid_alive(pid):
            # One message whichever step noticed (the hold says "while its threads were
            # being held"): the one the gdb path gives, documented in docs/inspect.md.
            raise TargetExitedError(f"PID {pid} exited while being inspected", pid=pid) from exc
        raise


def refuse_if_corrupt(
    pid: int, *, accept_risk: bool, timeout_seconds: float, allow_stopped: bool = False
) -> None:
    """The one policy on calling into a heap (malloc_info, malloc_trim, through gdb or not):
    never into one found corrupt. Before a call that no read of this run has cleared (an
    explicit ``--gdb``, or a fallback to gdb), the heap is read from memory, held still;
    HeapCorruptionError when it fails glibc's checks, unless ``accept_risk`` (the user
    accepts that the call may hang or crash the target, and that a hung call can leave an
    arena's lock held). A read that fails for another reason says nothing about corruption
    and does not refuse."""
    if accept_risk:
        return
    try:
        inspect_read_only(
            pid, timeout_seconds=min(timeout_seconds, 1.0), allow_stopped=allow_stopped
        )
    except HeapCorruptionError as exc:
        raise HeapCorruptionError(
            f"{exc.message}; no call is made into a corrupt heap",
            exc.findings,
            hint=exc.hint,
            pid=pid,
            partial=exc.partial,
        ) from exc
    except NoSuchProcessError:
        raise
    except MemforensicsError:
        return


InspectMethod = Literal["auto", "read-only", "gdb"]


def inspect_method(*, read_only: bool, gdb_path: str | None) -> InspectMethod:
    """The commands' choice: ``--read-only`` reads memory only, ``--gdb PATH`` calls
    malloc_info through that gdb, neither reads memory and calls through gdb only where the
    read is refused (ReadOnlyRefusedError)."""
    if read_only:
        return "read-only"
    return "gdb" if gdb_path is not None else "auto"


def inspect_live(
    pid: int,
    *,
    method: InspectMethod,
    timeout_seconds: float,
    allow_stopped: bool = False,
    gdb_path: str | None = None,
    log: Any = None,
    accept_corrupt_risk: bool = False,
) -> Inspection:
    """One live inspection by ``method``. "auto" gives the read-only report, or, when the
    read is refused, gdb's with ``gdb_fallback`` saying why; the refusal comes before any
    gdb is started, so a target gdb cannot inspect is refused as the gdb path refuses it.
    A heap found corrupt is never called into (refuse_if_corrupt): HeapCorruptionError, on
    every method, "gdb" too unless ``accept_corrupt_risk``."""
    facts = procfs.check_target(pid, allow_stopped=allow_stopped, foreign_ok=True)
    foreign = facts.allocator.foreign
    if foreign is not None and foreign.serves_malloc:
        return _inspect_foreign(pid, facts, method, timeout_seconds)
    refused: str | None = None
    if method != "gdb":
        try:
            return inspect_read_only(
                pid, timeout_seconds=timeout_seconds, allow_stopped=allow_stopped, facts=facts
            )
        except ReadOnlyRefusedError as exc:
            if method == "read-only":
                raise
            refused = exc.message
    else:
        refuse_if_corrupt(
            pid,
            accept_risk=accept_corrupt_risk,
            timeout_seconds=timeout_seconds,
            allow_stopped=allow_stopped,
        )
    from memforensics.entry.live import inspect_process  # the gdb machinery: only now

    inspection = inspect_process(
        pid,
        timeout_seconds=timeout_seconds,
        gdb_path=gdb_path,
        allow_stopped=allow_stopped,
        log=log,
    )
    return inspection if refused is None else replace(inspection, gdb_fallback=refused)


def _inspect_foreign(
    pid: int, facts: ProcessFacts, method: InspectMethod, timeout_seconds: float
) -> Inspection:
    from memforensics.entry.foreign import inspect_foreign

    kind = facts.allocator.kind
    if method == "read-only":
        raise TargetError(
            f"PID {pid} runs on {kind}, whose figures come from its own statistics calls; "
            "--read-only makes none",
            hint=f"drop --read-only: {kind}'s calls are made without gdb, at a moment no "
            "thread is inside it",
            pid=pid,
        )
    if method == "gdb":
        raise TargetError(
            f"PID {pid} runs on {kind}: the gdb path reads glibc's malloc only",
            hint=f"drop --gdb: {kind}'s statistics are read without gdb",
            pid=pid,
        )
    if facts.state in ("T", "t"):
        raise TargetError(
            f"PID {pid} is stopped (state {facts.state}): {kind}'s statistics are read by "
            "calls, which a stopped process cannot make",
            hint="continue it (kill -CONT PID) and retry",
            pid=pid,
        )
    return inspect_foreign(pid, facts, timeout_seconds=timeout_seconds)


def inspector(method: InspectMethod) -> Callable[..., Inspection]:
    """inspect_live by ``method`` with live.inspect_process's signature, for `watch` and
    `collect`, which take the inspection function as a parameter."""

    def inspect(
        pid: int,
        *,
        timeout_seconds: float,
        allow_stopped: bool = False,
        gdb_path: str | None = None,
        log: Any = None,
    ) -> Inspection:
        return inspect_live(
            pid,
            method=method,
            timeout_seconds=timeout_seconds,
            allow_stopped=allow_stopped,
            gdb_path=gdb_path,
            log=log,
        )

    return inspect


def _inspect(
    pid: int, facts: ProcessFacts, timeout_seconds: float, pad_bytes: int = 0
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
    try:
        scan = scan_heap(pid, libc_path=libc_path, figures=True, hold=batches)
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
    memory = procfs.read_memory(pid)
    analysis, residency, flow, residency_error = report_parts(dump, scan, memory, pad_bytes)
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
            f"read-only: {read.stops} stop{'s' if read.stops != 1 else ''} of every thread, "
            f"longest "
            f"{read.longest_stop_seconds * 1000:.1f} ms; no gdb, nothing run in the target"
        ),
    )
    return Inspection(
        facts=procfs.read_process(pid, allocator=facts.allocator),
        memory=memory,
        capture=capture,
        analysis=analysis,
        residency=residency,
        waterfall=flow,
        extra_advice=(),
        residency_error=residency_error,
        read_only=read,
    )


def inspect_core(
    path: str, *, exe: str | None = None, sysroot: str | None = None
) -> tuple[Inspection, tuple[str, ...]]:
    """The heap report of the process a core file saved (the kernel's, gdb's gcore,
    systemd-coredump's once decompressed), and the core's warnings (truncated, another build
    of libc on disk …). libc is found through the core's NT_FILE note; its file, under
    ``sysroot`` when given, only names the release (the dialect of the document). A core
    has no page tables: the residency is unknown, and the report says so. InputDataError
    (exit 7) for what is not a usable core; TargetError (exit 3) for a heap it cannot read."""
    from memforensics.analysis.heap import analyze
    from memforensics.sources.core.corefile import CoreFile
    from memforensics.sources.glibc.heapmaps import scan_memory

    started = time.monotonic()
    with CoreFile(path) as core:
        mem = core.memory()
        try:
            mappings = _core_mappings(core.mappings(), mem, core.heap_range_hint)
            libc_path = next(
                (m.path for m in mappings if os.path.basename(m.path).startswith("libc.so")),
                None,
            )
            if libc_path is None:
                raise NotGlibcMallocError(
                    f"{path}: the process mapped no glibc libc.so",
                    hint="only processes on glibc's malloc are read from cores",
                )
            libc_file = core.file_for(libc_path, sysroot)
            version = glibc_banner_version(libc_file) if libc_file is not None else None
            pid = core.pid or 0
            scan = scan_memory(mappings, mem, pid=pid, libc_path=libc_path)
            try:
                xml, dump = dump_and_residency(scan, version, f"core {path}")
                heap_info, tcache = layout_evidence(scan, mem)
            except ReadOnlyRefusedError as exc:
                raise TargetError(
                    f"{path}: {exc.message}",
                    hint="a core is read from its memory only; gdb's call needs a live process",
                ) from exc
        finally:
            mem.close()
        info = core.process
        name = info.fname if info is not None else os.path.basename(exe or path)
        facts = ProcessFacts(
            pid=pid,
            name=name,
            cmdline=(info.psargs,) if info is not None else (),
            uid=info.uid if info is not None else None,
            threads=len(core.threads),
            state=info.state if info is not None else "?",
            allocator=AllocatorInfo(
                kind="glibc", detail=libc_path, libc_path=libc_path, glibc_version=version
            ),
            tracer_pid=0,
            exe=exe or core.executable_path,
        )
        warnings = tuple(warning.message for warning in core.warnings)
    read = ReadOnlyRead(
        source="core",
        stops=0,
        longest_stop_seconds=0.0,
        total_stop_seconds=0.0,
        lock_retries=0,
        malloc_par_layout=scan.malloc_params.layout if scan.malloc_params else "",
        glibc_version=version,
        heap_info_bytes=heap_info,
        tcache_chunk_bytes=tcache,
        read_seconds=time.monotonic() - started,
    )
    unknown = ProcessMemory(None, None, None, None, None, None, None)
    inspection = Inspection(
        facts=facts,
        memory=unknown,
        capture=Capture(xml=xml, pause_seconds=0.0, safe_point="core file: no process touched"),
        analysis=analyze(dump),
        residency=None,
        waterfall=None,
        extra_advice=(),
        residency_error="a core file has no page tables: which pages were resident is unknown",
        read_only=read,
    )
    return inspection, warnings


def _core_mappings(
    mappings: list[Mapping], mem: MemoryReader, heap: tuple[int, int] | None
) -> list[Mapping]:
    """The core's mappings as the heap's readers expect /proc's: the likely [heap] named so,
    and each mapping's bytes held in the core as its "resident" bytes (what can be read)."""
    out: list[Mapping] = []
    for mapping in mappings:
        held = mem.pagemap(mapping.start_address, mapping.end_address).total_resident_bytes
        path = mapping.path
        if heap is not None and (mapping.start_address, mapping.end_address) == heap:
            path = "[heap]"
        anon = held if mapping.inode == 0 else 0
        out.append(replace(mapping, path=path, rss_bytes=held, anon_bytes=anon))
    return out
