"""The pins and the map of every heap of a live process (or a core): the census's walk of
each heap's chunks, each heap's resident pages, and the first bytes of each pin, read from
memory (never by a call into the target), made into model.pins records."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from memforensics.analysis.pins import content_kind, heap_map, heap_pins
from memforensics.errors import MemforensicsError
from memforensics.model.chunks import HeapChunks, ProcessChunks
from memforensics.model.pins import HeapMap, HeapPicture, HeapPins, Pin, ResidentPages
from memforensics.sources.proc.procmem import MemoryReader

PREVIEW_BYTES = 64
# Of a pin's data, what the census's classifier looks at (entry.census.LOOK_BYTES).
NAME_BYTES = 512

Walk = Callable[..., ProcessChunks]
# The census's naming of a chunk's data: (name, kind), kind "c++", "python", "text", "zeros",
# "pointers" or "unknown" (entry.census.Classifier.name).
Namer = Callable[[bytes, int], tuple[str, str]]
_NAMED_KINDS = ("c++", "python")


class PictureBuilder:
    """A heap picture made heap by heap, as the walk hands each heap over (the walk's
    ``each_heap``): the chunk arrays of one heap at a time are held, not every heap's."""

    def __init__(
        self,
        mem: MemoryReader,
        page_bytes: int,
        *,
        resident_known: bool = True,
        namer: Namer | None = None,
    ) -> None:
        self._mem, self._page_bytes = mem, page_bytes
        self._resident_known, self._namer = resident_known, namer
        self._heaps: list[HeapPins] = []
        self._maps: list[HeapMap] = []

    def add(self, heap: HeapChunks) -> None:
        """``heap``'s pins (each named from its first bytes, read now) and map."""
        page = self._page_bytes
        base = heap.start - heap.start % page
        end = max(heap.mapped_end, heap.walked_end)
        pages: ResidentPages | None = None
        if self._resident_known:
            present = self._mem.pagemap(base, -(-end // page) * page).present
            pages = ResidentPages(base, page, bytes(present))
        found = heap_pins(heap, pages)
        named = tuple(_named(pin, self._mem, self._namer) for pin in found.pins)
        self._heaps.append(replace(found, pins=named))
        self._maps.append(heap_map(heap, pages))

    def picture(self) -> HeapPicture:
        """The heaps added so far, in the order added."""
        return HeapPicture(
            heaps=tuple(self._heaps), maps=tuple(self._maps), resident_known=self._resident_known
        )


def picture_of(
    chunks: ProcessChunks,
    mem: MemoryReader,
    *,
    resident_known: bool = True,
    namer: Namer | None = None,
) -> HeapPicture:
    """The pins and maps of ``chunks``' heaps: resident pages from ``mem``'s pagemap (unknown
    for a core: ``resident_known`` False), each pin's kind and text from its first bytes, and
    its type by ``namer`` (the census's) where that names one."""
    builder = PictureBuilder(mem, chunks.page_bytes, resident_known=resident_known, namer=namer)
    for heap in chunks.heaps:
        builder.add(heap)
    return builder.picture()


def _named(pin: Pin, mem: MemoryReader, namer: Namer | None) -> Pin:
    data = mem.read(pin.address, min(NAME_BYTES, pin.chunk_bytes - 16))
    if data is None:
        return pin
    kind, preview = content_kind(data[:PREVIEW_BYTES])
    if namer is None:
        return replace(pin, kind=kind, preview=preview)
    name, census_kind = namer(data, pin.chunk_bytes)
    return replace(
        pin,
        type=name if census_kind in _NAMED_KINDS else None,
        kind=census_kind,
        preview=preview if census_kind == "text" else None,
    )


def census_namer(pid: int, mem: MemoryReader) -> Namer:
    """The census's classifier of ``pid``'s chunks (C++ by RTTI, CPython by type, then by
    content), reading through ``mem``."""
    from pathlib import Path

    from memforensics.entry.census import Classifier
    from memforensics.sources.proc.procmaps import read_smaps

    mappings = read_smaps(pid)
    root = Path(f"/proc/{pid}/root")
    files = {m.path: root / m.path.lstrip("/") for m in mappings if m.file_backed}
    classifier = Classifier(mem, mappings, files)

    def name(data: bytes, size: int) -> tuple[str, str]:
        return classifier.name(data, size)

    return name


def default_walk() -> Walk | None:
    """The census's walk of a live process's chunks, or None where this build has none."""
    try:
        from memforensics.sources.glibc import heap_chunks
    except ImportError:
        return None
    walk: Walk = heap_chunks.walk_process_chunks
    return walk


def read_picture(
    pid: int,
    *,
    walk: Walk | None = None,
    timeout_seconds: float = 1.0,
    stops_seconds: list[float] | None = None,
) -> tuple[HeapPicture | None, str | None]:
    """(the picture of ``pid``'s heaps, None) or (None, why it could not be read); the
    walk's own errors become the reason, the rest of the report stands without pins.
    ``stops_seconds`` receives the length of every stop the walk made."""
    from memforensics.sources.proc.procmem import ProcessMemoryReader

    walk = walk or default_walk()
    if walk is None:
        return None, "this build has no walk of the heap's chunks (the census's)"
    try:
        with ProcessMemoryReader(pid) as mem:
            builder = PictureBuilder(mem, mem.page_bytes, namer=census_namer(pid, mem))
            walk(
                pid,
                timeout_seconds=timeout_seconds,
                stops_seconds=stops_seconds,
                each_heap=builder.add,
            )
            return builder.picture(), None
    except MemforensicsError as exc:
        return None, exc.message


def read_core_picture(path: str) -> tuple[HeapPicture | None, str | None]:
    """(the picture of the heaps a core file saved, None) or (None, why not): residency is
    unknown (a core has no page tables), each pin's kind read from the core's memory."""
    from memforensics.sources.core.corefile import CoreFile
    from memforensics.sources.glibc.heap_chunks import walk_core_chunks

    try:
        with CoreFile(path) as core:
            mem = core.memory()
            try:
                builder = PictureBuilder(mem, mem.page_bytes, resident_known=False)
                walk_core_chunks(path, each_heap=builder.add)
                return builder.picture(), None
            finally:
                mem.close()
    except MemforensicsError as exc:
        return None, exc.message
