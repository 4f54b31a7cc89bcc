"""Frozen dataclasses for a live process: facts, memory, heap residency, waterfall, forecast."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

AllocatorKind = Literal["glibc", "musl", "jemalloc", "tcmalloc", "mimalloc", "static", "unknown"]

# How arenas of a dump were matched to heap mappings (see docs/residency.md):
# "arena-chain": heap_info.ar_ptr and the arenas' `next` list read through /proc/PID/mem;
# "system-mem": arenas paired with heap groups by equal system_mem; "totals": no per-arena match.
MatchMethod = Literal["arena-chain", "system-mem", "totals"]

# How the free bytes still resident were obtained: "walked" = every bin's free chunks read
# consistently and checked page by page in /proc/PID/pagemap; "partial" = some bins walked,
# the rest estimated from the XML's per-size counts; "estimate" = nothing walked: resident
# heap minus in-use, clamped (see docs/residency.md).
FreeMethod = Literal["walked", "partial", "estimate"]


@dataclass(frozen=True, slots=True)
class AllocatorInfo:
    """Which allocator and libc a process uses, as seen in /proc/PID/maps and /proc/PID/exe."""

    kind: AllocatorKind
    detail: str  # what was found, in words: a library path, "static binary …"
    libc_path: str | None = None
    glibc_version: str | None = None

    @property
    def is_glibc_malloc(self) -> bool:
        """True when glibc's malloc serves the process, so malloc_info describes it."""
        return self.kind == "glibc"


@dataclass(frozen=True, slots=True)
class ProcessFacts:
    """Who the process is: identity, state and allocator, from psutil and /proc."""

    pid: int
    name: str
    cmdline: tuple[str, ...]
    uid: int | None
    threads: int | None
    state: str  # one letter from /proc/PID/stat: R S D T t Z X I …
    allocator: AllocatorInfo
    tracer_pid: int  # 0 when nobody traces the process
    kernel_thread: bool = False
    exe: str | None = None

    @property
    def glibc_version(self) -> str | None:
        """The glibc release the process runs ("2.36"), when found."""
        return self.allocator.glibc_version

    @property
    def libc_path(self) -> str | None:
        """Path of the libc mapped into the process, as the process sees it."""
        return self.allocator.libc_path


@dataclass(frozen=True, slots=True)
class ProcessMemory:
    """Memory of a process in bytes (smaps_rollup); None where the kernel has no figure."""

    rss_bytes: int | None
    anon_bytes: int | None
    file_bytes: int | None
    shmem_bytes: int | None
    swap_bytes: int | None
    pss_bytes: int | None
    uss_bytes: int | None


@dataclass(frozen=True, slots=True)
class HeapSegment:
    """One heap mapping of an arena: the [heap] (brk) area or one 64 MiB-aligned sub-heap."""

    start: int
    mapped_bytes: int  # bytes in use by the heap (brk extent or heap_info.size)
    resident_bytes: int


@dataclass(frozen=True, slots=True)
class ArenaResidency:
    """How much of one arena's heap is resident, and how much of its free memory is."""

    index: int  # Arena.index in the dump (0 = main arena, 1 = newest)
    address: int | None  # address of the arena's malloc_state in the target, when read
    segments: tuple[HeapSegment, ...]
    free_resident_bytes: int | None  # bytes of free chunks (bins + top) still in RAM
    free_method: FreeMethod
    # Bytes malloc_trim would hand back (whole resident pages inside binned free chunks, plus
    # for the main arena the resident part of the top it gives back with sbrk); None = unknown.
    trimmable_bytes: int | None = None
    walked_chunks: int = 0
    top_bytes: int | None = None
    top_resident_bytes: int | None = None
    # Free bytes read from the target's bins (and top) vs taken from the XML for the bins
    # whose lists kept moving, or were not reached in the time budget.
    measured_free_bytes: int = 0
    estimated_free_bytes: int = 0
    estimated_trimmable_bytes: int = 0  # part of trimmable_bytes estimated from the XML
    estimated_bins: tuple[int, ...] = ()  # 0 = the fastbins, 1 = unsorted, 2 … 126
    retries: int = 0  # lists read again because they moved under the reads
    budget_reached: bool = False

    @property
    def mapped_bytes(self) -> int:
        """Bytes of heap mappings in use by this arena."""
        return sum(s.mapped_bytes for s in self.segments)

    @property
    def resident_bytes(self) -> int:
        """Bytes of this arena's heap mappings that are in RAM."""
        return sum(s.resident_bytes for s in self.segments)


@dataclass(frozen=True, slots=True)
class HeapResidency:
    """Residency of every arena of one dump plus mmapped chunks and other anonymous memory."""

    pid: int
    page_bytes: int
    method: MatchMethod
    arenas: tuple[ArenaResidency, ...]  # in dump order when matched; empty for "totals"
    heap_mapped_bytes: int  # all arena heaps, matched or not
    heap_resident_bytes: int
    mmap_chunk_bytes: int | None  # mmapped chunks found in the maps (None: not looked for)
    mmap_chunk_resident_bytes: int | None
    stack_resident_bytes: int  # thread stacks and [stack]: anonymous, below a guard page
    other_anon_resident_bytes: int  # everything else anonymous (program mmaps, library COW)
    anon_resident_bytes: int  # all anonymous resident bytes, summed over the same smaps pass
    notes: tuple[str, ...] = ()
    # Free bytes (bins, fastbins, top) measured by the walk, and those estimated from the
    # XML (lists that kept moving, arenas not matched or not reached in the time budget).
    measured_free_bytes: int = 0
    estimated_free_bytes: int = 0
    walk_seconds: float = 0.0
    walk_budget_seconds: float | None = None

    @property
    def measured_share(self) -> float:
        """Share of the free bytes that was measured, 0 … 1 (1.0 when nothing is free)."""
        total = self.measured_free_bytes + self.estimated_free_bytes
        return self.measured_free_bytes / total if total else 1.0

    def arena(self, index: int) -> ArenaResidency | None:
        """The residency of the arena with this dump index, if matched."""
        for arena in self.arenas:
            if arena.index == index:
                return arena
        return None

    @property
    def free_resident_bytes(self) -> int | None:
        """Free bytes still resident over all matched arenas (None when unknown)."""
        if not self.arenas or any(a.free_resident_bytes is None for a in self.arenas):
            return None
        return sum(a.free_resident_bytes or 0 for a in self.arenas)


@dataclass(frozen=True, slots=True)
class WaterfallLine:
    """One line of the RSS waterfall: a share of memory, indented under its parent."""

    key: str  # stable name for JSON: "rss", "file", "anon", "arena_in_use", …
    label: str
    bytes: int | None
    depth: int
    estimate: bool = False
    note: str = ""
    in_rss: bool = True  # False: shown beside the waterfall (swap, free pages already released)


@dataclass(frozen=True, slots=True)
class Waterfall:
    """RSS broken down: file-backed, shmem, anonymous = heap in-use + free + mmap + other."""

    lines: tuple[WaterfallLine, ...]
    notes: tuple[str, ...] = ()

    def get(self, key: str) -> int | None:
        """Bytes of the line with this key (None when absent or unknown)."""
        for line in self.lines:
            if line.key == key:
                return line.bytes
        return None


@dataclass(frozen=True, slots=True)
class ArenaTrimForecast:
    """What malloc_trim should release from one arena."""

    index: int
    releasable_bytes: int
    measured: bool  # True: wholly from the walked free chunks' resident pages
    estimated_bytes: int = 0  # part of releasable_bytes estimated from the XML


@dataclass(frozen=True, slots=True)
class TrimForecast:
    """Bytes malloc_trim(0) is expected to give back to the OS, per arena and in total."""

    releasable_bytes: int
    arenas: tuple[ArenaTrimForecast, ...]
    measured: bool  # every arena measured (no estimate in the total)
    free_not_resident_bytes: int | None  # free bytes whose pages are already gone
    notes: tuple[str, ...] = ()
    estimated_bytes: int = 0  # part of releasable_bytes estimated from the XML
    measured_share: float = 1.0  # share of the free bytes the residency measured
