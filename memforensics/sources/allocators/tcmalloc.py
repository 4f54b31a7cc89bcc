"""gperftools tcmalloc's own statistics, read with ``MallocExtension_GetNumericProperty`` in
the target (one hold), and its release of free memory.

Names and meanings are gperftools' (src/gperftools/malloc_extension.h); in the one vocabulary
(model.allocator), over the whole heap (tcmalloc has no arenas):

- in use: ``generic.current_allocated_bytes`` (what the application holds);
- system: ``generic.heap_size`` less ``tcmalloc.pageheap_unmapped_bytes`` (pages backed);
- free: system less in use: the page heap's free pages and the objects cached in the
  central, transfer and thread caches;
- releasable: ``tcmalloc.pageheap_free_bytes``, which ``MallocExtension_ReleaseFreeMemory``
  gives back; the caches' objects are kept (they sit in spans with live objects).
"""

from __future__ import annotations

from memforensics.model.allocator import ForeignArena, ForeignHeap
from memforensics.sources.allocators.library import ForeignImage
from memforensics.sources.allocators.moment import AllocatorCalls
from memforensics.sources.allocators.scratch import Scratch, read_out
from memforensics.sources.proc.ptrace_call import ScratchRef
from memforensics.sources.proc.ptrace_probe import ProbeCall

PURGE_CALL = "MallocExtension_ReleaseFreeMemory()"  # what trim calls
FUNCTIONS = frozenset({"MallocExtension_GetNumericProperty", "MallocExtension_ReleaseFreeMemory"})
PROPERTIES = (
    "generic.current_allocated_bytes",
    "generic.heap_size",
    "generic.total_physical_bytes",
    "tcmalloc.pageheap_free_bytes",
    "tcmalloc.pageheap_unmapped_bytes",
    "tcmalloc.central_cache_free_bytes",
    "tcmalloc.transfer_cache_free_bytes",
    "tcmalloc.thread_cache_free_bytes",
    "tcmalloc.max_total_thread_cache_bytes",
)
_SENTINEL = (1 << 64) - 1


def read_heap(pid: int, image: ForeignImage, calls: AllocatorCalls) -> ForeignHeap:
    """tcmalloc's figures in PID (see the module); DeadlineError when no safe moment came."""
    del pid  # the figures come back through the calls' scratch
    function = image.functions["MallocExtension_GetNumericProperty"]
    probes: list[ProbeCall] = []
    outs: list[ScratchRef] = []
    for name in PROPERTIES:
        scratch = Scratch()
        name_ref = scratch.string(name)
        out = scratch.out(8, _SENTINEL)
        probes.append(ProbeCall(function, (name_ref, out), scratch.data))
        outs.append(out)
    results = calls.run(probes)
    values: dict[str, int] = {}
    for name, out, data in zip(PROPERTIES, outs, results, strict=True):
        value = read_out(data, out, 8, _SENTINEL)
        if value is not None:
            values[name] = value
    allocated = values.get("generic.current_allocated_bytes", 0)
    unmapped = values.get("tcmalloc.pageheap_unmapped_bytes", 0)
    system = max(values.get("generic.heap_size", 0) - unmapped, allocated)
    free = system - allocated
    releasable = min(values.get("tcmalloc.pageheap_free_bytes", 0), free)
    return ForeignHeap(
        library=image.library,
        version=image.version,
        in_use_bytes=allocated,
        free_bytes=free,
        releasable_bytes=releasable,
        fragmentation_bytes=free - releasable,
        metadata_bytes=None,
        resident_bytes=values.get("generic.total_physical_bytes"),
        mapped_bytes=system,
        retained_bytes=unmapped,
        arenas=(ForeignArena(0, allocated, free, releasable, system),),
        figures=tuple(sorted(values.items())),
        stop_seconds=calls.stop_seconds,
        longest_stop_seconds=calls.longest_stop_seconds,
        holds=calls.holds,
    )


def purge(image: ForeignImage, calls: AllocatorCalls) -> None:
    """``MallocExtension_ReleaseFreeMemory()``: the page heap's free pages given back."""
    calls.run([ProbeCall(image.functions["MallocExtension_ReleaseFreeMemory"], (), b"")])
