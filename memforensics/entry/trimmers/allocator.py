"""Trimming a process on jemalloc, tcmalloc or mimalloc: the allocator's own statistics as the
read, its own purge as the call, both made without gdb at a moment no thread is inside it."""

from __future__ import annotations

from memforensics.entry.readers.allocator import READERS, allocator_calls, target_error
from memforensics.entry.trimmers.protocol import CallMade, TrimReading, TrimSettings
from memforensics.model.process import ProcessFacts


class AllocatorTrimmer:
    """The purge of a foreign allocator (see the module)."""

    call_name = "purge"
    pad_bytes = 0

    def __init__(self, pid: int, facts: ProcessFacts, settings: TrimSettings) -> None:
        self.pid = pid
        self.facts = facts
        self.settings = settings
        self.purge: str | None = None
        self._kind = facts.allocator.kind

    def read(self) -> TrimReading:
        from memforensics.analysis.foreign import forecast

        try:
            self._image, self._calls = allocator_calls(
                self.pid, self.facts, self.settings.timeout_seconds
            )
            self._reader = READERS[self._image.library.kind]
            heap = self._reader.read_heap(self.pid, self._image, self._calls)
        except Exception as exc:
            raise target_error(self.pid, exc) from exc
        self.purge = f"{heap.kind}: {self._reader.PURGE_CALL}"
        self._kind = heap.kind
        predicted = forecast(heap)
        return TrimReading(
            forecast=predicted,
            free_bytes=heap.free_bytes or 0,
            heap_bytes=heap.mapped_bytes or 0,
            arenas=len(heap.arenas),
            pause_seconds=self._calls.stop_seconds,
            notes=(),
        )

    def call(self) -> CallMade:
        before = self._calls.stop_seconds
        try:
            self._reader.purge(self._image, self._calls)
        except Exception as exc:
            raise target_error(self.pid, exc) from exc
        return CallMade(
            pause_seconds=self._calls.stop_seconds - before,
            returned=None,
            how=f"{self._kind}'s purge was called without gdb",
        )
