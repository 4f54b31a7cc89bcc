"""Trimming through gdb: malloc_info called at a safe point as the read (with the residency
walked through /proc), then a second short attach that calls malloc_trim.

Two short stops rather than one long one: the residency walk (~0.4 s on 100,000 free
chunks) runs while the target runs again, so the forecast describes the heap a moment
before the trim.
"""

from __future__ import annotations

import os

from memforensics.entry.readers.gdb import (
    close_to_dump,
    closer_to_dump,
    read_heap_residency,
    read_while_held,
)
from memforensics.entry.trimmers.protocol import CallMade, TrimReading, TrimSettings
from memforensics.errors import MemforensicsError, NoSuchProcessError, NotGlibcMallocError
from memforensics.model.heap import process_source
from memforensics.model.heapscan import HeapScan
from memforensics.model.process import HeapResidency, ProcessFacts


class GdbTrimmer:
    """malloc_trim through gdb (see the module)."""

    call_name = "trim"
    purge: str | None = None

    def __init__(self, pid: int, facts: ProcessFacts, settings: TrimSettings) -> None:
        self.pid = pid
        self.facts = facts
        self.settings = settings
        self.pad_bytes = settings.pad_bytes

    def read(self) -> TrimReading:
        from memforensics.analysis.residency_build import build_residency
        from memforensics.analysis.trim_forecast import forecast_trim
        from memforensics.sources.gdb.gdb_capture import capture_malloc_info
        from memforensics.sources.malloc_info.malloc_xml import parse_dump

        pid, facts, settings = self.pid, self.facts, self.settings
        capture = capture_malloc_info(
            pid,
            timeout_seconds=settings.timeout_seconds,
            gdb_path=settings.gdb_path,
            log=settings.log,
            while_held=read_while_held(pid, facts),
        )
        dump = parse_dump(capture.xml, name=process_source(pid))
        if dump.all_zero:
            # glibc's malloc holds nothing (never ran, or another allocator replaced it):
            # trimming is pointless.
            raise NotGlibcMallocError(
                f"PID {pid} ({facts.name}) maps glibc but its malloc holds no memory: "
                "nothing of it to trim (malloc never took memory here; what the process "
                "allocates, another allocator serves)",
                pid=pid,
            )
        residency: HeapResidency | None = None
        notes: tuple[str, ...] = ()
        try:
            if isinstance(capture.held_result, HeapScan):
                residency = build_residency(dump, capture.held_result, pad_bytes=self.pad_bytes)
            else:
                residency = read_heap_residency(
                    pid, dump, libc_path=facts.libc_path, pad_bytes=self.pad_bytes
                )
            if not close_to_dump(residency):
                again = read_heap_residency(
                    pid, dump, libc_path=facts.libc_path, pad_bytes=self.pad_bytes
                )
                if closer_to_dump(again) > closer_to_dump(residency):
                    residency = again
            notes = residency.notes
        except NoSuchProcessError:
            raise
        except MemforensicsError as exc:
            notes = (f"no residency figures: {exc.message}",)
        page = residency.page_bytes if residency is not None else os.sysconf("SC_PAGE_SIZE")
        return TrimReading(
            forecast=forecast_trim(dump, residency, page_bytes=page, pad_bytes=self.pad_bytes),
            free_bytes=dump.free_bytes,
            heap_bytes=dump.system_bytes,
            arenas=len(dump.arenas),
            pause_seconds=capture.pause_seconds,
            notes=notes,
        )

    def call(self) -> CallMade:
        from memforensics.sources.gdb.gdb import GdbSession

        settings = self.settings
        with GdbSession(
            self.pid,
            timeout_seconds=settings.timeout_seconds,
            gdb_path=settings.gdb_path,
            log=settings.log,
        ) as session:
            returned = session.malloc_trim(self.pad_bytes)
        return CallMade(pause_seconds=session.pause_seconds, returned=returned, how="")
