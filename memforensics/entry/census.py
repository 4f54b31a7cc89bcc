"""Library entry point of `memforensics census`: every live chunk of a live process (or of a
core) classified by type, read from memory with no gdb and no call into the target.

The heap walk (sources.glibc.heap_chunks) hands each window of chunks here while its bytes
are at hand, so the census costs one read of the heap; each live chunk is named by the first
rule that holds: a C++ object by RTTI (sources.census.rtti; also behind an array cookie), a
CPython object by its type (sources.census.pyobjects), then by its bytes alone (text, zeros,
pointers, unknown by size class: analysis.census). CPython's small objects live in
pymalloc's pools, outside malloc's chunks: those pools are found and their blocks in use
classified the same way (sources.census.pymalloc).
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Sequence
from pathlib import Path

from memforensics.analysis.census import HeapRanges, Tally, build_census, classify_bytes
from memforensics.errors import InputDataError
from memforensics.model.census import Census, CensusRead
from memforensics.model.chunks import ProcessChunks
from memforensics.sources.census.filemem import FileBackedReads
from memforensics.sources.census.pymalloc import scan_pools
from memforensics.sources.census.pyobjects import PythonTypes
from memforensics.sources.census.rtti import RttiResolver
from memforensics.sources.glibc.heap_window import ChunkRef
from memforensics.sources.proc.procmaps import Mapping
from memforensics.sources.proc.procmem import MemoryReader

LOOK_BYTES = 512  # of a chunk's data, what its classification looks at
_COOKIE_MAX = 1 << 24  # an array cookie (the element count) is below this
_KNOWN_MAX = 1 << 16  # distinct vptrs remembered with their line
_MAKE_SHARED = "std::_Sp_counted_ptr_inplace<"
_SHARED_PTR = "std::_Sp_counted_ptr<"


def _first_argument(name: str, prefix: str) -> str:
    """The first template argument of ``prefix...>``."""
    depth = 0
    for index in range(len(prefix), len(name)):
        char = name[index]
        if char == "<":
            depth += 1
        elif char == ">":
            depth -= 1
        if depth < 0 or (char == "," and depth == 0):
            return name[len(prefix) : index].strip()
    return name[len(prefix) :]


def cxx_name(name: str) -> str:
    """A C++ type as the census shows it: a make_shared control block by its T."""
    if name.startswith(_MAKE_SHARED):
        return f"std::make_shared<{_first_argument(name, _MAKE_SHARED)}>"
    if name.startswith(_SHARED_PTR):
        pointee = _first_argument(name, _SHARED_PTR).rstrip("*").strip()
        return f"std::shared_ptr<{pointee}> control block"
    return name


class Classifier:
    """The heap walk's visitor: each live chunk named and tallied (see the module)."""

    def __init__(
        self,
        mem: MemoryReader | FileBackedReads,
        mappings: Sequence[Mapping],
        files: dict[str, Path] | None = None,
    ) -> None:
        self.rtti = RttiResolver(mem, mappings, files=files)
        self.python = PythonTypes(mem, mappings, files=files)
        self.heap = HeapRanges(
            [
                (m.start_address, m.end_address)
                for m in mappings
                if m.perms.startswith("rw") and (m.anonymous or m.path == "[heap]")
            ]
        )
        self.tally = Tally()
        self._known: dict[int, tuple[str, str]] = {}  # vptr -> its line's (name, kind)

    def name(self, data: bytes | memoryview, size: int) -> tuple[str, str]:
        """(name, kind) of a chunk's (or block's) data."""
        if len(data) >= 16:
            if self.rtti.usable:
                first = int.from_bytes(data[:8], "little")
                found = self.rtti.name(first)
                if found is not None:
                    return cxx_name(found), "c++"
                if 0 < first < _COOKIE_MAX:
                    found = self.rtti.name(int.from_bytes(data[8:16], "little"))
                    if found is not None:
                        return cxx_name(found) + "[]", "c++"
            if self.python.usable:
                found = self.python.object_in(data)
                if found is not None:
                    return found, "python"
        return classify_bytes(data, size, self.heap)

    def __call__(
        self,
        ref: ChunkRef,
        view: memoryview,
        base: int,
        addresses: Sequence[int],
        sizes: Sequence[int],
        states: bytes | bytearray,
    ) -> None:
        pages = ref.pages
        all_present = pages is None or pages.all_resident
        tally = self.tally
        lines = tally.lines
        known = self._known
        words = view[: len(view) // 8 * 8].cast("Q")
        nwords = len(words)
        live = bytes_total = 0
        for address, size, state in zip(addresses, sizes, states, strict=True):
            if state:  # only LIVE (0) chunks are counted
                continue
            data_at = address + 16
            if not all_present and pages is not None:
                page = (data_at - pages.start) // pages.page_bytes
                if not (0 <= page < len(pages.present) and pages.present[page]):
                    tally.unread(size)
                    continue
            index = (data_at - base) >> 3
            # A vptr seen before names its chunk at the cost of one dictionary look-up.
            key = known.get(words[index]) if index < nwords else None
            if key is None:
                offset = data_at - base
                data = view[offset : offset + min(size - 16, LOOK_BYTES)]
                key = self.name(data, size)
                if key[1] == "c++" and not key[0].endswith("[]") and len(known) < _KNOWN_MAX:
                    known[words[index]] = key
            line = lines.get(key)
            if line is None:
                lines[key] = [1, size]
            else:
                line[0] += 1
                line[1] += size
            live += 1
            bytes_total += size
        tally.live_chunks += live
        tally.live_bytes += bytes_total


def _now() -> str:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _read(
    walked: ProcessChunks,
    classifier: Classifier,
    source: str,
    started: float,
    stops: Sequence[float],
    pools: tuple[str, int, int] | None,
) -> CensusRead:
    notes = list(walked.notes)
    incomplete = [h for h in walked.heaps if not h.complete]
    for heap in incomplete:
        notes.append(
            f"arena {heap.arena} heap {heap.heap}: walk stopped at "
            f"{heap.stopped_at or 0:#x}: {heap.stop_reason}"
        )
    if not walked.tcache_keys:
        notes.append("no tcache key found: chunks in a thread's tcache may count as live")
    if not classifier.rtti.usable:
        notes.append("no C++ runtime (libstdc++) mapped: C++ objects are not named")
    if pools is not None:
        notes.append(pools[0])
    return CensusRead(
        source=source,
        read_seconds=time.monotonic() - started,
        stops=len(stops),
        longest_stop_seconds=max(stops, default=0.0),
        total_stop_seconds=sum(stops),
        heaps=len(walked.heaps),
        heaps_incomplete=len(incomplete),
        unwalked_bytes=sum(max(h.mapped_end - h.walked_end, 0) for h in incomplete),
        python_layout=classifier.python.layout if classifier.python.usable else None,
        cxx_runtime=classifier.rtti.usable,
        notes=tuple(notes),
        pymalloc_pools=pools[1] if pools else 0,
        pymalloc_blocks=pools[2] if pools else 0,
    )


def census_live(pid: int, *, timeout_seconds: float = 1.0) -> Census:
    """The census of live ``pid`` (see the module)."""
    from memforensics.sources.glibc.heap_chunks import walk_process_chunks
    from memforensics.sources.proc import procfs
    from memforensics.sources.proc.procmaps import read_smaps
    from memforensics.sources.proc.procmem import ProcessMemoryReader

    started = time.monotonic()
    facts = procfs.check_target(pid)
    mappings = read_smaps(pid)
    root = Path(f"/proc/{pid}/root")
    files = {m.path: root / m.path.lstrip("/") for m in mappings if m.file_backed}
    stops: list[float] = []
    with ProcessMemoryReader(pid) as mem:
        classifier = Classifier(mem, mappings, files)
        walked = walk_process_chunks(
            pid, visit=classifier, keep=False, timeout_seconds=timeout_seconds, stops_seconds=stops
        )
        pools = scan_pools(mem, mappings, walked, classifier) if classifier.python.usable else None
    read = _read(walked, classifier, "live", started, stops, pools)
    return build_census(classifier.tally, pid=pid, process_name=facts.name, time=_now(), read=read)


def census_core(path: str, *, sysroot: str | None = None) -> tuple[Census, tuple[str, ...]]:
    """The census of the process a core file saved, and the core's warnings."""
    from memforensics.sources.core.corefile import CoreFile
    from memforensics.sources.glibc.heap_chunks import core_mappings, walk_memory_chunks

    started = time.monotonic()
    with CoreFile(path) as core:
        mem = core.memory()
        try:
            mappings = core_mappings(core, mem)
            libc_path = next(
                (m.path for m in mappings if os.path.basename(m.path).startswith("libc.so")),
                None,
            )
            if libc_path is None:
                raise InputDataError(
                    f"{path}: the process mapped no glibc libc.so",
                    hint="only processes on glibc's malloc are read from cores",
                )
            files: dict[str, Path] = {}
            for mapping in mappings:
                if mapping.file_backed and mapping.path not in files:
                    found = core.file_for(mapping.path, sysroot)
                    if found is not None:
                        files[mapping.path] = found
            names = FileBackedReads(mem, mappings, files)
            classifier = Classifier(names, mappings, files)
            pid = core.pid or 0
            walked = walk_memory_chunks(
                mappings, mem, pid=pid, libc_path=libc_path, visit=classifier, keep=False
            )
            pools = (
                scan_pools(mem, mappings, walked, classifier) if classifier.python.usable else None
            )
            names.close()
        finally:
            mem.close()
        info = core.process
        name = info.fname if info is not None else os.path.basename(path)
        warnings = tuple(warning.message for warning in core.warnings)
    read = _read(walked, classifier, "core", started, (), pools)
    census = build_census(classifier.tally, pid=pid, process_name=name, time=_now(), read=read)
    return census, warnings
