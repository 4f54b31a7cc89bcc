"""Library entry points for processes on jemalloc, tcmalloc or mimalloc: `inspect` and `trim`
through the allocator's own statistics and purge, called in the target without gdb
(sources.allocators), at a moment no thread is inside the allocator.

The report is the one glibc's processes get (analysis.foreign): the same Inspection and
TrimResult, the allocator named, its own figures kept beside (``Inspection.foreign``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from memforensics.errors import (
    MemforensicsError,
    NotGlibcMallocError,
    TargetError,
    TargetExitedError,
)
from memforensics.model.allocator import ForeignHeap
from memforensics.model.capture import Capture
from memforensics.model.heap import process_source
from memforensics.model.process import ProcessFacts
from memforensics.sources.allocators import jemalloc, mimalloc, tcmalloc
from memforensics.sources.allocators.library import ForeignImage, load_foreign
from memforensics.sources.allocators.moment import AllocatorCalls
from memforensics.sources.glibc.libc_elf import load_libc_image
from memforensics.sources.proc import procfs
from memforensics.sources.proc.procfs import pid_alive
from memforensics.sources.proc.ptrace_call import shadow_stack_enabled

if TYPE_CHECKING:
    from memforensics.entry.inspection import Inspection
    from memforensics.model.trim import TrimResult


class _Reader(Protocol):
    FUNCTIONS: frozenset[str]
    PURGE_CALL: str

    def read_heap(self, pid: int, image: ForeignImage, calls: AllocatorCalls) -> ForeignHeap: ...

    def purge(self, image: ForeignImage, calls: AllocatorCalls) -> None: ...


_READERS: dict[str, _Reader] = {"jemalloc": jemalloc, "tcmalloc": tcmalloc, "mimalloc": mimalloc}


def _calls(
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
    reader = _READERS[library.kind]
    image = load_foreign(pid, library, reader.FUNCTIONS)
    libc = load_libc_image(pid, facts.libc_path)
    code = image.code
    return image, AllocatorCalls(pid, libc=libc, code=code, timeout_seconds=timeout_seconds)


def read_foreign(pid: int, facts: ProcessFacts, timeout_seconds: float) -> ForeignHeap:
    """The allocator's own figures in ``pid``, read at a safe moment (no gdb)."""
    image, calls = _calls(pid, facts, timeout_seconds)
    return _READERS[image.library.kind].read_heap(pid, image, calls)


def _holds(heap: ForeignHeap) -> str:
    """How the target was held for the calls, in words."""
    if heap.holds <= 1:
        return f"{heap.stop_seconds * 1000:.1f} ms"
    return (
        f"{heap.holds} holds, longest {heap.longest_stop_seconds * 1000:.1f} ms, "
        f"{heap.stop_seconds * 1000:.1f} ms in all"
    )


def _exited(pid: int, exc: Exception) -> Exception:
    """The error to raise for ``exc``: that the target exited when it is gone, a system
    call's refusal as the target's problem (exit 3, no traceback), else ``exc`` itself."""
    if not pid_alive(pid):
        return TargetExitedError(f"PID {pid} exited while being inspected", pid=pid)
    if isinstance(exc, OSError) and not isinstance(exc, MemforensicsError):
        return TargetError(f"PID {pid}: {exc.strerror or exc}", pid=pid)
    return exc


def inspect_foreign(pid: int, facts: ProcessFacts, *, timeout_seconds: float) -> Inspection:
    """`inspect` of a process on a foreign allocator (see the module)."""
    from memforensics.analysis.foreign import analyze_foreign, waterfall
    from memforensics.entry.inspection import Inspection

    try:
        heap = read_foreign(pid, facts, timeout_seconds)
        memory = procfs.read_memory(pid)
        after = procfs.read_process(pid, allocator=facts.allocator)
    except Exception as exc:
        raise _exited(pid, exc) from exc
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


def trim_foreign(
    pid: int,
    facts: ProcessFacts,
    *,
    dry_run: bool,
    min_free_bytes: int,
    timeout_seconds: float,
) -> TrimResult:
    """Measure RSS, read the allocator's figures, forecast, purge with its own call (unless
    skipped), measure again: the TrimResult glibc's trim gives, ``trim_called`` when the
    purge was made (its return value is not kept)."""
    from memforensics.analysis.foreign import forecast as foreign_forecast
    from memforensics.analysis.trim import skip_reason
    from memforensics.entry.live import now_utc, settled_memory
    from memforensics.model.trim import TrimResult, before_after

    started = now_utc()
    before = procfs.read_memory(pid)
    if before.rss_bytes is None:
        raise TargetExitedError(f"PID {pid} exited while being inspected", pid=pid)
    try:
        image, calls = _calls(pid, facts, timeout_seconds)
        reader = _READERS[image.library.kind]
        heap = reader.read_heap(pid, image, calls)
        forecast = foreign_forecast(heap)
        skipped, detail = skip_reason(forecast, min_free_bytes=min_free_bytes, dry_run=dry_run)
        notes = list(forecast.notes)
        if skipped is None:
            read_at = time.monotonic()
            reader.purge(image, calls)
            notes.append(
                f"forecast figures were at most {time.monotonic() - read_at:.2f} s old at the "
                f"purge; {heap.kind}'s purge was called without gdb"
            )
    except Exception as exc:
        raise _exited(pid, exc) from exc
    after = settled_memory(pid) if skipped is None else None
    return TrimResult(
        pid=pid,
        name=facts.name,
        time=started,
        **before_after(before, after),
        forecast=forecast,
        free_bytes=heap.free_bytes or 0,
        heap_bytes=heap.mapped_bytes or 0,
        arenas=len(heap.arenas),
        pad_bytes=0,
        dry_run=dry_run,
        trim_returned=None,
        trim_called=skipped is None,
        pause_seconds=calls.stop_seconds,
        skipped=skipped,
        skipped_detail=detail,
        notes=tuple(dict.fromkeys(notes)),
        purge=f"{heap.kind}: {reader.PURGE_CALL}",
    )
