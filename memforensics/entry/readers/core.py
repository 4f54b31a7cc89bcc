"""The core-file way of reading a heap: the report of the process a core saved, read from the
core's memory as the memory way reads a live process's (no process is touched)."""

from __future__ import annotations

import os
import time
from dataclasses import replace

from memforensics.entry.readers.memory import (
    PINS_NOT_ASKED,
    dump_and_residency,
    layout_evidence,
)
from memforensics.errors import (
    NotGlibcMallocError,
    ReadOnlyRefusedError,
    ReadTimeRanOutError,
    TargetError,
)
from memforensics.model.capture import Capture
from memforensics.model.heapscan import ReadOnlyRead
from memforensics.model.inspection import Inspection
from memforensics.model.pins import HeapPicture
from memforensics.model.process import AllocatorInfo, ProcessFacts, ProcessMemory
from memforensics.sources.proc.binaries import glibc_banner_version
from memforensics.sources.proc.procmaps import Mapping
from memforensics.sources.proc.procmem import MemoryReader


def inspect_core(
    path: str, *, exe: str | None = None, sysroot: str | None = None, pins: bool = False
) -> tuple[Inspection, tuple[str, ...]]:
    """The heap report of the process a core file saved (the kernel's, gdb's gcore,
    systemd-coredump's once decompressed), and the core's warnings (truncated, another build
    of libc on disk …). libc is found through the core's NT_FILE note; its file, under
    ``sysroot`` when given, only names the release (the dialect of the document). A core
    has no page tables: the residency is unknown, and the report says so. InputDataError
    (exit 7) for what is not a usable core; TargetError (exit 3) for a heap it cannot read.
    ``pins``: also the pins and map of every heap (entry/pins.py), residency unknown."""
    from memforensics.analysis.heap import analyze
    from memforensics.sources.core.corefile import CoreFile
    from memforensics.sources.glibc.heap_chunks import libc_of
    from memforensics.sources.glibc.heapmaps import CORE_COPY_MAX_BYTES, scan_memory
    from memforensics.sources.glibc.malloc_info_image import RefusalWords

    started = time.monotonic()
    with CoreFile(path) as core:
        mem = core.memory()
        try:
            mappings = _core_mappings(core.mappings(), mem, core.heap_range_hint)
            libc_path = libc_of(mappings)  # (libc.so.6, or libc-2.NN.so before glibc 2.34)
            if libc_path is None:
                raise NotGlibcMallocError(
                    f"{path}: the process mapped no glibc libc (libc.so.6 or libc-2.NN.so)",
                    hint="only processes on glibc's malloc are read from cores",
                )
            libc_file = core.file_for(libc_path, sysroot)
            version = glibc_banner_version(libc_file) if libc_file is not None else None
            pid = core.pid or 0
            scan = scan_memory(mappings, mem, pid=pid, libc_path=libc_path)
            # (No stops in a core: what a list too long outgrew is the read's memory.)
            words = RefusalWords(
                locked="locked",  # (a core's arenas are read locked or not: never said)
                too_long=(
                    f"lists leading to more than the {CORE_COPY_MAX_BYTES >> 20} MiB of pages "
                    "a core's read keeps"
                ),
                gave_up="read by a sweep instead, given up",
            )
            try:
                xml, dump = dump_and_residency(scan, version, f"core {path}", words)
                heap_info, tcache = layout_evidence(scan, mem)
            except (ReadOnlyRefusedError, ReadTimeRanOutError) as exc:
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
        swept_arenas=sum(arena.swept for arena in scan.arenas),
    )
    unknown = ProcessMemory(None, None, None, None, None, None, None)
    picture: HeapPicture | None = None
    pins_error: str | None = PINS_NOT_ASKED
    if pins:
        from memforensics.entry.pins import read_core_picture

        picture, pins_error = read_core_picture(path)
    from memforensics.analysis.pins import pin_advice

    inspection = Inspection(
        facts=facts,
        memory=unknown,
        capture=Capture(xml=xml, pause_seconds=0.0, safe_point="core file: no process touched"),
        analysis=analyze(dump),
        residency=None,
        waterfall=None,
        extra_advice=pin_advice(picture.heaps) if picture is not None else (),
        residency_error="a core file has no page tables: which pages were resident is unknown",
        read_only=read,
        picture=picture,
        pins_error=pins_error,
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
