"""The allocator's-own-statistics way of reading a heap (entry.inspect chooses it for a process
on jemalloc, tcmalloc or mimalloc): their statistics calls made in the target without gdb
(sources.allocators), at a moment no thread is inside the allocator.

The report is the one glibc's processes get (analysis.foreign): the same Inspection, the
allocator named, its own figures kept beside (``Inspection.foreign``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from memforensics.entry.common import exited_error
from memforensics.errors import (
    MemforensicsError,
    NotGlibcMallocError,
    TargetError,
)
from memforensics.model.allocator import ForeignHeap
from memforensics.model.capture import Capture
from memforensics.model.heap import process_source
from memforensics.model.process import ProcessFacts
from memforensics.sources.allocators import jemalloc, mimalloc, tcmalloc
from memforensics.sources.allocators.library import ForeignImage, load_foreign
from memforensics.sources.allocators.moment import AllocatorCalls
from memforensics.sources.glibc.libc_elf import load_libc_image
from memforensics.sources.proc import memory_figures, process_facts
from memforensics.sources.proc.procfs import pid_alive
from memforensics.sources.proc.ptrace_call import shadow_stack_enabled

if TYPE_CHECKING:
    from memforensics.model.inspection import Inspection


class StatisticsReader(Protocol):
    FUNCTIONS: frozenset[str]
    PURGE_CALL: str

    def read_heap(self, pid: int, image: ForeignImage, calls: AllocatorCalls) -> ForeignHeap: ...

    def purge(self, image: ForeignImage, calls: AllocatorCalls) -> None: ...


READERS: dict[str, StatisticsReader] = {
    "jemalloc": jemalloc,
    "tcmalloc": tcmalloc,
    "mimalloc": mimalloc,
}


def allocator_calls(
    pid: int, facts: ProcessFacts, timeout_seconds: float
) -> tuple[ForeignImage, AllocatorCalls]:
    library = facts.allocator.foreign
    if library is None or not library.serves_malloc or facts.libc_path is None:
        raise NotGlibcMallocError(f"PID {pid} ({facts.name}): {facts.allocator.detail}", pid=pid)
    if shadow_stack_enabled(pid):
        raise TargetError(
            f"PID {pid} runs with a shadow stack (CET): {library.kind}'s statistics are read "
            "by calls that return through a signal frame, which it would refuse",
            pid=pid,
        )
    reader = READERS[library.kind]
    image = load_foreign(pid, library, reader.FUNCTIONS)
    libc = load_libc_image(pid, facts.libc_path)
    code = image.code
    return image, AllocatorCalls(pid, libc=libc, code=code, timeout_seconds=timeout_seconds)


def read_foreign(pid: int, facts: ProcessFacts, timeout_seconds: float) -> ForeignHeap:
    """The allocator's own figures in ``pid``, read at a safe moment (no gdb)."""
    image, calls = allocator_calls(pid, facts, timeout_seconds)
    return READERS[image.library.kind].read_heap(pid, image, calls)


def _holds(heap: ForeignHeap) -> str:
    """How the target was held for the calls, in words."""
    if heap.holds <= 1:
        return f"{heap.stop_seconds * 1000:.1f} ms"
    return (
        f"{heap.holds} holds, longest {heap.longest_stop_seconds * 1000:.1f} ms, "
        f"{heap.stop_seconds * 1000:.1f} ms in all"
    )


def target_error(pid: int, exc: Exception) -> Exception:
    """The error to raise for ``exc``: that the target exited when it is gone, a system
    call's refusal as the target's problem (exit 3, no traceback), else ``exc`` itself."""
    if not pid_alive(pid):
        return exited_error(pid)
    if isinstance(exc, OSError) and not isinstance(exc, MemforensicsError):
        return TargetError(f"PID {pid}: {exc.strerror or exc}", pid=pid)
    return exc


def inspect_foreign(pid: int, facts: ProcessFacts, *, timeout_seconds: float) -> Inspection:
    """`inspect` of a process on a foreign allocator (see the module)."""
    from memforensics.analysis.foreign import analyze_foreign, waterfall
    from memforensics.model.inspection import Inspection

    try:
        heap = read_foreign(pid, facts, timeout_seconds)
        memory = memory_figures.read_memory(pid)
        after = process_facts.read_process(pid, allocator=facts.allocator)
    except Exception as exc:
        raise target_error(pid, exc) from exc
    capture = Capture(
        xml=b"",
        pause_seconds=heap.stop_seconds,
        safe_point=(
            f"{heap.kind}'s own statistics, called on a thread outside it while every thread "
            f"was held ({_holds(heap)}); no gdb"
        ),
    )
    return Inspection(
        facts=after,
        memory=memory,
        capture=capture,
        analysis=analyze_foreign(heap, process_source(pid)),
        residency=None,
        waterfall=waterfall(memory, heap),
        extra_advice=(),
        residency_error=f"{heap.kind}'s heap is described by its own statistics, not walked",
        foreign=heap,
    )
