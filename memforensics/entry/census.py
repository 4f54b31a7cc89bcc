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
from array import array
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from memforensics.analysis.census import (
    HeapRanges,
    Tally,
    build_census,
    classify_bytes,
    size_class,
)
from memforensics.errors import InputDataError
from memforensics.model.census import Census, CensusRead
from memforensics.model.chunks import ProcessChunks
from memforensics.sources import optional_native
from memforensics.sources.census.filemem import FileBackedReads
from memforensics.sources.census.pymalloc import scan_pools
from memforensics.sources.census.pyobjects import PythonTypes
from memforensics.sources.census.rtti import RttiResolver
from memforensics.sources.glibc.heap_window import ChunkRef, first_words
from memforensics.sources.proc.procmaps import Mapping
from memforensics.sources.proc.procmem import MemoryReader

LOOK_BYTES = 512  # of a chunk's data, what its classification looks at
_COOKIE_MAX = 1 << 24  # an array cookie (the element count) is below this
_KNOWN_MAX = 1 << 16  # distinct vptrs remembered with their line
_MAKE_SHARED = "std::_Sp_counted_ptr_inplace<"
_SHARED_PTR = "std::_Sp_counted_ptr<"
_PLAIN_KINDS = ("zeros", "text", "pointers")  # plain_census' order
_native = optional_native("memforensics.sources.census._censuswindow")


def _as_words(values: Sequence[int]) -> array[int]:
    """``values`` as an array of machine words (the C loops take buffers)."""
    return values if isinstance(values, array) else array("Q", values)


def live_groups(
    firsts: Sequence[int], sizes: Sequence[int], states: bytes | bytearray
) -> dict[int, list[int]]:
    """The live chunks (state 0) grouped by their first data word: {word: [count, bytes]}
    (in C where built)."""
    if _native is not None:
        groups: dict[int, list[int]] = _native.live_groups(firsts, sizes, states)
        return groups
    groups = {}
    for word, size, state in zip(firsts, sizes, states, strict=True):
        if state:
            continue
        line = groups.get(word)
        if line is None:
            groups[word] = [1, size]
        else:
            line[0] += 1
            line[1] += size
    return groups


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
        if pages is not None and not pages.all_resident:
            self._one_by_one(ref, view, base, addresses, sizes, states)
            return
        addresses, sizes = _as_words(addresses), _as_words(sizes)
        firsts = first_words(view, base, addresses)
        undecided: set[int] = set()
        for word, (count, size_bytes) in live_groups(firsts, sizes, states).items():
            key = self._known.get(word) or self._vptr_key(word)
            if key is None:
                undecided.add(word)
            else:
                self.tally.add_many(key[0], key[1], count, size_bytes)
        if undecided:
            self._by_bytes(view, base, addresses, sizes, states, firsts, undecided)

    def _vptr_key(self, word: int) -> tuple[str, str] | None:
        """The line of the chunks whose first word is ``word`` when it is a vptr (RTTI names
        it: name() would say the same of each), remembered; None when it is not one."""
        if not self.rtti.usable:
            return None
        found = self.rtti.name(word)
        if found is None:
            return None
        key = (cxx_name(found), "c++")
        if len(self._known) < _KNOWN_MAX:
            self._known[word] = key
        return key

    def _by_bytes(
        self,
        view: memoryview,
        base: int,
        addresses: Sequence[int],
        sizes: Sequence[int],
        states: bytes | bytearray,
        firsts: Sequence[int],
        words: set[int],
    ) -> None:
        """The live chunks whose first word is in ``words`` (no vptr), each named by name():
        in one C pass where built and no Python object can be among them, the chunks it
        cannot judge alone (a possible array cookie, non-ASCII text) then one by one."""
        tally = self.tally
        picks: Sequence[int]
        if _native is not None and not self.python.usable:
            kinds, by_size, picks = _native.plain_census(
                view,
                base,
                addresses,
                sizes,
                states,
                firsts,
                array("Q", sorted(words)),
                LOOK_BYTES,
                self.heap.starts,
                self.heap.ends,
                _COOKIE_MAX if self.rtti.usable else 0,
            )
            for kind, (count, size_bytes) in zip(_PLAIN_KINDS, kinds, strict=True):
                if count:
                    tally.add_many(kind, kind, count, size_bytes)
            for size, (count, size_bytes) in by_size.items():
                tally.add_many(size_class(size), "unknown", count, size_bytes)
        else:
            picks = [i for i, word in enumerate(firsts) if not states[i] and word in words]
        for i in picks:
            size = sizes[i]
            offset = addresses[i] + 16 - base
            key = self.name(view[offset : offset + min(size - 16, LOOK_BYTES)], size)
            if key[1] == "c++" and not key[0].endswith("[]") and len(self._known) < _KNOWN_MAX:
                self._known[firsts[i]] = key
            tally.add(key[0], key[1], size)

    def _one_by_one(
        self,
        ref: ChunkRef,
        view: memoryview,
        base: int,
        addresses: Sequence[int],
        sizes: Sequence[int],
        states: bytes | bytearray,
    ) -> None:
        """Chunks of a heap with pages not in memory: each checked for its page first."""
        pages = ref.pages
        assert pages is not None
        for address, size, state in zip(addresses, sizes, states, strict=True):
            if state:
                continue
            data_at = address + 16
            page = (data_at - pages.start) // pages.page_bytes
            if not (0 <= page < len(pages.present) and pages.present[page]):
                self.tally.unread(size)
                continue
            offset = data_at - base
            key = self.name(view[offset : offset + min(size - 16, LOOK_BYTES)], size)
            self.tally.add(key[0], key[1], size)


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
    from memforensics.sources.glibc.heap_chunks import PAUSE_BUDGET_SPENT

    notes = list(walked.notes)
    incomplete = [h for h in walked.heaps if not h.complete]
    for heap in incomplete:
        if heap.stop_reason == PAUSE_BUDGET_SPENT:
            continue  # one note for them all (_budget_notes)
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


def _budget_notes(walked: ProcessChunks, budget_seconds: float) -> list[str]:
    """What the pause budget left unread, when it did."""
    from memforensics.sources.glibc.heap_chunks import PAUSE_BUDGET_SPENT
    from memforensics.units import format_bytes

    cut = [h for h in walked.heaps if h.stop_reason == PAUSE_BUDGET_SPENT]
    if not cut:
        return []
    unread = sum(max(h.mapped_end - h.walked_end, 0) for h in cut)
    return [
        f"the pause budget ({budget_seconds * 1e3:.0f} ms of stops) was spent: "
        f"{len(cut)} of {len(walked.heaps)} heaps not walked to their end, "
        f"{format_bytes(unread)} of heap not read (counted in no type)"
    ]


def _scan_pools_held(
    pid: int,
    mem: MemoryReader,
    mappings: Sequence[Mapping],
    walked: ProcessChunks,
    classifier: Classifier,
    timeout_seconds: float,
) -> tuple[str, int, int, list[float]]:
    """pymalloc's pools read window by window in short stops of every thread (a pool whose
    blocks disagree with its header changed mid-operation: read again after the target
    ran); the stops' lengths last."""
    from memforensics.sources.glibc.arena_hold import StopBatches

    batches = StopBatches(pid, libc=None, single_threaded=False, timeout_seconds=timeout_seconds)

    def hold(read: Callable[[], bytes]) -> bytes:
        try:
            with batches.arena():
                return read()
        finally:
            batches.release()

    try:
        note, pools, blocks = scan_pools(mem, mappings, walked, classifier, hold)
    finally:
        batches.close()
    return note, pools, blocks, batches.stops_seconds


def census_live(
    pid: int, *, timeout_seconds: float = 1.0, pause_budget_seconds: float | None = None
) -> Census:
    """The census of live ``pid`` (see the module). Once its stops sum to
    ``pause_budget_seconds`` (None: no budget) no more memory is read: the heaps not walked
    to their end count in ``read.unwalked_bytes``, a note says how many, and CPython's pools
    are not read either."""
    from memforensics.sources.glibc.heap_chunks import walk_process_chunks
    from memforensics.sources.proc import target_check
    from memforensics.sources.proc.procmaps import read_smaps
    from memforensics.sources.proc.procmem import ProcessMemoryReader

    started = time.monotonic()
    facts = target_check.check_target(pid)
    mappings = read_smaps(pid)
    root = Path(f"/proc/{pid}/root")
    files = {m.path: root / m.path.lstrip("/") for m in mappings if m.file_backed}
    stops: list[float] = []
    with ProcessMemoryReader(pid) as mem:
        classifier = Classifier(mem, mappings, files)
        walked = walk_process_chunks(
            pid,
            visit=classifier,
            keep=False,
            timeout_seconds=timeout_seconds,
            stops_seconds=stops,
            pause_budget_seconds=pause_budget_seconds,
        )
        spent = pause_budget_seconds is not None and sum(stops) >= pause_budget_seconds
        pools = None
        if classifier.python.usable and not spent:
            pools = _scan_pools_held(pid, mem, mappings, walked, classifier, timeout_seconds)
            stops.extend(pools[3])
    read = _read(walked, classifier, "live", started, stops, pools[:3] if pools else None)
    if pause_budget_seconds is not None:
        read = replace(read, notes=(*read.notes, *_budget_notes(walked, pause_budget_seconds)))
    return build_census(classifier.tally, pid=pid, process_name=facts.name, time=_now(), read=read)


def census_core(path: str, *, sysroot: str | None = None) -> tuple[Census, tuple[str, ...]]:
    """The census of the process a core file saved, and the core's warnings."""
    from memforensics.sources.core.corefile import CoreFile
    from memforensics.sources.glibc.heap_chunks import (
        core_mappings,
        libc_of,
        walk_memory_chunks,
    )

    started = time.monotonic()
    with CoreFile(path) as core:
        mem = core.memory()
        try:
            mappings = core_mappings(core, mem)
            libc_path = libc_of(mappings)
            if libc_path is None:
                raise InputDataError(
                    f"{path}: the process mapped no glibc libc.so",
                    hint="only processes on glibc's malloc are read from cores",
                )
            files: dict[str, Path] = {}
            # Only code objects (a mapping of theirs executable): type names live in ELF
            # files, and data files (locales) have no build-id to check the core against.
            elf_paths = {m.path for m in mappings if m.file_backed and "x" in m.perms}
            for mapping in mappings:
                if mapping.path in elf_paths and mapping.path not in files:
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
