"""What one inspection of a process learned, whichever way it was read: the record every
command's report and JSON are made from (gdb's call, the read from memory, a core file, a
foreign allocator's own statistics)."""

from __future__ import annotations

from dataclasses import dataclass

from memforensics.model.advice import Advice
from memforensics.model.allocator import ForeignHeap
from memforensics.model.capture import Capture
from memforensics.model.heap_analysis import HeapAnalysis
from memforensics.model.heapscan import ReadOnlyRead
from memforensics.model.pins import HeapPicture
from memforensics.model.process import HeapResidency, ProcessFacts, ProcessMemory, Waterfall


@dataclass(frozen=True)
class Fallback:
    """Another way stood in for the read from memory, which was refused as impossible."""

    way: str  # "call": the target's malloc_info called without gdb (entry.readers.call)
    reason: str  # why the read from memory was refused


@dataclass(frozen=True)
class Inspection:
    """Everything inspect learned about one process."""

    facts: ProcessFacts
    memory: ProcessMemory
    capture: Capture
    analysis: HeapAnalysis
    residency: HeapResidency | None
    waterfall: Waterfall | None
    extra_advice: tuple[Advice, ...]
    residency_error: str | None = None
    read_only: ReadOnlyRead | None = None  # how a read-only report was read (no gdb)
    fallback: Fallback | None = None  # the way that stood in for a refused read, and why
    foreign: ForeignHeap | None = None  # jemalloc's, tcmalloc's or mimalloc's own figures
    picture: HeapPicture | None = None  # each heap's pins and map (entry/pins.py)
    pins_error: str | None = None  # why there is no picture, when there is none
