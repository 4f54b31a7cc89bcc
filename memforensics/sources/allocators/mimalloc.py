"""mimalloc's own figures, read with ``mi_process_info`` in the target (one hold), and its
collection of free memory.

A release build of mimalloc keeps no allocation statistics (its ``mi_stats_*`` count only
with MI_STAT): what it knows of itself is what ``mi_process_info`` reports, the memory it
has committed (``current_commit``) and the process's RSS. In the one vocabulary
(model.allocator) the committed bytes are the heap's system bytes; what of them the
application holds is not known, so in use, free and releasable are None and the report
says so. ``mi_collect(true)`` gives back what mimalloc can.
"""

from __future__ import annotations

from memforensics.model.allocator import ForeignHeap
from memforensics.sources.allocators.library import ForeignImage
from memforensics.sources.allocators.moment import AllocatorCalls
from memforensics.sources.allocators.scratch import Scratch, read_out
from memforensics.sources.proc.ptrace_probe import ProbeCall

PURGE_CALL = "mi_collect(true)"  # what trim calls
FUNCTIONS = frozenset({"mi_process_info", "mi_collect"})
# mi_process_info's out-parameters, in its order (mimalloc.h).
FIELDS = (
    "elapsed_msecs",
    "user_msecs",
    "system_msecs",
    "current_rss",
    "peak_rss",
    "current_commit",
    "peak_commit",
    "page_faults",
)
_SENTINEL = (1 << 64) - 1


def read_heap(pid: int, image: ForeignImage, calls: AllocatorCalls) -> ForeignHeap:
    """mimalloc's figures in PID (see the module); DeadlineError when no safe moment came."""
    del pid  # the figures come back through the call's scratch
    scratch = Scratch()
    outs = [scratch.out(8, _SENTINEL) for _ in FIELDS]
    (data,) = calls.run([ProbeCall(image.functions["mi_process_info"], tuple(outs), scratch.data)])
    values = {
        name: value
        for name, out in zip(FIELDS, outs, strict=True)
        if (value := read_out(data, out, 8, _SENTINEL)) is not None
    }
    return ForeignHeap(
        library=image.library,
        version=image.version,
        in_use_bytes=None,
        free_bytes=None,
        releasable_bytes=None,
        fragmentation_bytes=None,
        metadata_bytes=None,
        resident_bytes=None,  # its current_rss is its commit on Linux, not a measurement
        mapped_bytes=values.get("current_commit"),
        retained_bytes=None,
        arenas=(),
        figures=tuple(sorted(values.items())),
        notes=(
            "mimalloc keeps no allocation statistics in a release build: in use and free are "
            "not known, only what it has committed",
        ),
        stop_seconds=calls.stop_seconds,
        longest_stop_seconds=calls.longest_stop_seconds,
        holds=calls.holds,
    )


def purge(image: ForeignImage, calls: AllocatorCalls) -> None:
    """``mi_collect(true)``: free pages and segments given back where mimalloc can."""
    calls.run([ProbeCall(image.functions["mi_collect"], (1,), b"")])
