"""Frozen dataclasses for a live process: facts, memory, heap residency, waterfall, forecast."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from memforensics.model.allocator import ForeignLibrary

AllocatorKind = Literal["glibc", "musl", "jemalloc", "tcmalloc", "mimalloc", "static", "unknown"]

# How arenas of a dump were matched to heap mappings (see docs/residency.md):
# "arena-chain": heap_info.ar_ptr and the arenas' `next` list read through /proc/PID/mem;
# "system-mem": arenas paired with heap groups by equal system_mem; "totals": no per-arena match.
MatchMethod = Literal["arena-chain", "system-mem", "totals"]

# How the free bytes still resident were obtained: "walked" = every bin's free chunks read
# consistently, checked page by page in /proc/PID/pagemap, and their total balances with the
# dump's (within the conservation tolerance); "partial" = some bins walked, the rest estimated
# from the XML's per-size counts, or a walk that does not balance with the dump (the
# difference is unaccounted); "estimate" = nothing walked (see docs/residency.md).
FreeMethod = Literal["walked", "partial", "estimate"]

WaterfallKind = Literal["measured", "estimated", "difference"]


@dataclass(frozen=True, slots=True)
class AllocatorInfo:
    """Which allocator and libc a process uses, as seen in /proc/PID/maps and /proc/PID/exe."""

    kind: AllocatorKind
    detail: str  # what was found, in words: a library path, "static binary …"
    libc_path: str | None = None
    glibc_version: str | None = None
    # A foreign allocator found in the process: the one that serves malloc (``kind`` is
    # then its kind), or a prefixed copy beside glibc's malloc (``kind`` is "glibc").
    foreign: ForeignLibrary | None = None
    # ``kind`` "static": glibc's banner was found in the executable (its malloc linked in).
    glibc_linked_in: bool = False

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
    # EI_CLASS of /proc/PID/exe (1 = 32-bit, 2 = 64-bit) where check_target read it; None
    # where it was not read, or the executable is unreadable or no ELF file.
    elf_class: int | None = None

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
    # Conservation: dump_free_bytes = measured_free_bytes + estimated_free_bytes
    # + unaccounted_bytes, always (unaccounted is negative when the walk found more free
    # bytes than the dump counted). measured_free_bytes splits into measured_resident_bytes
    # and the rest, measured not resident.
    dump_free_bytes: int = 0  # the dump's free chunk bytes of this arena, top included
    measured_resident_bytes: int = 0  # measured free bytes lying on resident pages
    unaccounted_bytes: int = 0  # the dump's free bytes neither measured nor estimated
    balanced: bool = True  # |unaccounted_bytes| within the conservation tolerance
    top_at_brk: bool | None = None  # main arena: its top ends at the program break
    top_trimmable_bytes: int = 0  # resident whole pages systrim gives back (main, at brk)

    @property
    def measured_not_resident_bytes(self) -> int:
        """Measured free bytes whose pages are not in RAM (released, or never touched)."""
        return self.measured_free_bytes - self.measured_resident_bytes

    @property
    def measured_share(self) -> float:
        """Share of the dump's free bytes that was measured, 0 … 1 (1.0 when none is free)."""
        if self.dump_free_bytes <= 0:
            return 1.0
        return min(self.measured_free_bytes, self.dump_free_bytes) / self.dump_free_bytes

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
    # The dump's free bytes (chunk bytes, tops included) over all arenas: the denominator of
    # measured_share, and what measured + estimated + unaccounted add up to.
    dump_free_bytes: int = 0
    pad_bytes: int = 0  # the malloc_trim pad the trimmable figures assume
    # Part of mmap_chunk_resident_bytes estimated for chunks the dump counts and the search
    # did not find; how many it found (None: not searched).
    mmap_chunk_estimated_bytes: int = 0
    mmap_chunks_found: int | None = None

    @property
    def measured_share(self) -> float:
        """Share of the dump's free bytes that was measured, 0 … 1 (1.0 when none is free):
        per arena at most that arena's dump figure, so a surplus in one arena never hides a
        shortfall in another."""
        if not self.arenas:
            return 0.0 if self.dump_free_bytes > 0 else 1.0
        if self.dump_free_bytes <= 0:
            return 1.0
        measured = sum(min(a.measured_free_bytes, a.dump_free_bytes) for a in self.arenas)
        return measured / self.dump_free_bytes

    @property
    def unaccounted_free_bytes(self) -> int:
        """The dump's free bytes neither measured nor estimated, over all arenas (signed)."""
        return sum(a.unaccounted_bytes for a in self.arenas)

    @property
    def measured_resident_free_bytes(self) -> int:
        """Measured free bytes on resident pages, over all arenas."""
        return sum(a.measured_resident_bytes for a in self.arenas)

    @property
    def measured_not_resident_bytes(self) -> int:
        """Measured free bytes whose pages are not in RAM: "free, released"."""
        return sum(a.measured_not_resident_bytes for a in self.arenas)

    @property
    def measured_trimmable_bytes(self) -> int:
        """What malloc_trim(pad) releases by the walked chunks alone (no estimate)."""
        return sum(
            (a.trimmable_bytes or 0) - a.estimated_trimmable_bytes
            for a in self.arenas
            if a.trimmable_bytes is not None
        )

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
class ResidencyFigures:
    """The headline figures of a heap set against the kernel, one definition each, used by
    every output (terminal, JSON, recordings, Prometheus). Computed only by
    memforensics.analysis.residency.residency_figures."""

    free_resident_bytes: int  # free chunks (bins and tops) on resident pages
    free_resident_estimated: bool  # part of free_resident_bytes is estimated from the XML
    trimmable_bytes: int  # measured: what malloc_trim(pad_bytes) releases now
    pad_bytes: int
    free_released_bytes: int  # measured free bytes whose pages are not in RAM
    estimated_free_bytes: int  # from the dump's lines, for bins that could not be read
    unaccounted_free_bytes: int  # the dump's free bytes neither measured nor estimated
    measured_share: float  # measured free bytes / the dump's free bytes, 0 … 1


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
    # How the figure was obtained: "measured" (read from the kernel or the walk), "estimated"
    # (in part from the dump's per-size lines) or "difference" (a whole minus its parts).
    kind: WaterfallKind = "measured"


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
