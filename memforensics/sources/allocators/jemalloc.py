"""jemalloc's own statistics, read with its ``mallctl`` in the target, and its purge.

One hold refreshes the statistics (writing ``epoch``) and reads the process-wide figures;
later holds (a few dozen calls each: moment.CALLS_PER_HOLD) ask which arenas exist
(``arena.<i>.initialized``; ``arenas.narenas`` counts every arena jemalloc may create, 4 per
CPU by default) and read those arenas' figures. jemalloc keeps the figures of one epoch until
the next write, so every hold reads the same snapshot. Names and meanings are jemalloc's
(its manual, "MALLCTL NAMESPACE"); in the one vocabulary (model.allocator):

- in use: each arena's ``small.allocated`` + ``large.allocated`` (what the application holds);
- free: each arena's active pages less its allocated bytes (room inside slabs and runs that
  hold live objects too: fragmentation, given back only as those objects are freed) plus
  its dirty and muzzy pages (free pages jemalloc keeps, resident or lazily freed);
- releasable: the dirty and muzzy pages, which ``arena.<all>.purge`` gives back at once
  (jemalloc's decay would give them back over ``dirty_decay_ms``/``muzzy_decay_ms``).
"""

from __future__ import annotations

import os

from memforensics.model.allocator import ForeignArena, ForeignHeap
from memforensics.sources.allocators.library import ForeignImage
from memforensics.sources.allocators.moment import AllocatorCalls
from memforensics.sources.allocators.scratch import Scratch, read_out
from memforensics.sources.proc.ptrace_call import ScratchRef
from memforensics.sources.proc.ptrace_probe import ProbeCall

PURGE_CALL = 'mallctl("arena.4096.purge")'  # what trim calls
FUNCTIONS = frozenset({"mallctl"})
ALL_ARENAS = 4096  # MALLCTL_ARENAS_ALL: "every arena" in an arena.<i> name
_UNSIGNED = (1 << 64) - 1
_SSIZE_SENTINEL = (1 << 62) + 7  # no decay setting is this (-1 means "never")
_GLOBALS = ("allocated", "active", "metadata", "resident", "mapped", "retained")
_ARENA_FIGURES = ("pactive", "pdirty", "pmuzzy", "small.allocated", "large.allocated")


class _Batch:
    """mallctl reads (and writes) laid out for one hold."""

    def __init__(self, mallctl: int) -> None:
        self._mallctl = mallctl
        self.calls: list[ProbeCall] = []
        self._outs: list[tuple[str, int, int, bool]] = []  # name, offset, size, signed

    def read(self, name: str, size: int, *, signed: bool = False) -> None:
        scratch = Scratch()
        name_ref = scratch.string(name)
        sentinel = _SSIZE_SENTINEL if signed else (1 << (8 * size)) - 1
        out = scratch.out(size, sentinel)
        length = scratch.word(size)
        self.calls.append(ProbeCall(self._mallctl, (name_ref, out, length, 0, 0), scratch.data))
        self._outs.append((name, out.offset, size, signed))

    def write(self, name: str, value: int) -> None:
        scratch = Scratch()
        name_ref = scratch.string(name)
        new = scratch.word(value)
        self.calls.append(ProbeCall(self._mallctl, (name_ref, 0, 0, new, 8), scratch.data))
        self._outs.append(("", 0, 0, False))

    def values(self, results: list[bytes]) -> dict[str, int]:
        """Every name read and written by the allocator (a refused name is left out)."""
        values: dict[str, int] = {}
        for (name, offset, size, signed), data in zip(self._outs, results, strict=True):
            if not name:
                continue
            sentinel = _SSIZE_SENTINEL if signed else (1 << (8 * size)) - 1
            value = read_out(data, ScratchRef(offset), size, sentinel, signed=signed)
            if value is not None:
                values[name] = value
        return values


def _string_at(pid: int, address: int, limit: int = 128) -> str | None:
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.pread(fd, limit, address)
    except OSError:
        return None
    finally:
        os.close(fd)
    return raw.split(b"\0", 1)[0].decode(errors="replace") or None


def read_heap(pid: int, image: ForeignImage, calls: AllocatorCalls) -> ForeignHeap:
    """jemalloc's figures in PID (see the module); DeadlineError when no safe moment came."""
    mallctl = image.functions["mallctl"]
    first = _Batch(mallctl)
    first.write("epoch", 1)
    first.read("version", 8)
    first.read("arenas.narenas", 4)
    first.read("arenas.page", 8)
    for name in _GLOBALS:
        first.read(f"stats.{name}", 8)
    first.read("arenas.dirty_decay_ms", 8, signed=True)
    first.read("arenas.muzzy_decay_ms", 8, signed=True)
    first.read("background_thread", 1)
    values = first.values(calls.run(first.calls))
    narenas = values.get("arenas.narenas", 0)
    page = values.get("arenas.page", 4096)
    exists = _Batch(mallctl)
    for index in range(narenas):
        exists.read(f"arena.{index}.initialized", 1)
    initialized = exists.values(calls.run_bounded(exists.calls)) if narenas else {}
    # An arena jemalloc never created has no statistics; where the question itself is refused
    # (a jemalloc without the name), every arena is read and the uncreated ones refuse.
    indexes = [i for i in range(narenas) if initialized.get(f"arena.{i}.initialized", 1)]
    second = _Batch(mallctl)
    for index in indexes:
        for figure in _ARENA_FIGURES:
            second.read(f"stats.arenas.{index}.{figure}", 8)
    arena_values = second.values(calls.run_bounded(second.calls)) if indexes else {}
    arenas = []
    for index in indexes:
        got = {f: arena_values.get(f"stats.arenas.{index}.{f}") for f in _ARENA_FIGURES}
        if any(value is None for value in got.values()):
            continue  # an arena never initialized: jemalloc has no statistics for it
        allocated = (got["small.allocated"] or 0) + (got["large.allocated"] or 0)
        releasable = ((got["pdirty"] or 0) + (got["pmuzzy"] or 0)) * page
        system = (got["pactive"] or 0) * page + releasable
        arenas.append(
            ForeignArena(
                index=index,
                in_use_bytes=allocated,
                free_bytes=max(system - allocated, 0),
                releasable_bytes=releasable,
                system_bytes=max(system, allocated),
            )
        )
    version_address = values.pop("version", None)
    version = _string_at(pid, version_address) if version_address else None
    if version is None:
        version = image.version
    in_use = sum(a.in_use_bytes for a in arenas)
    figures: list[tuple[str, int | str]] = sorted(values.items())
    figures += sorted(arena_values.items())
    notes = []
    if values.get("background_thread") == 1:
        notes.append("jemalloc's background threads purge dirty pages as they decay")
    active = values.get("stats.active")
    allocated_total = values.get("stats.allocated")
    return ForeignHeap(
        library=image.library,
        version=version.split("-", 1)[0] if version else None,
        in_use_bytes=in_use,
        free_bytes=sum(a.free_bytes for a in arenas),
        releasable_bytes=sum(a.releasable_bytes for a in arenas),
        fragmentation_bytes=(
            active - allocated_total if active is not None and allocated_total is not None else None
        ),
        metadata_bytes=values.get("stats.metadata"),
        resident_bytes=values.get("stats.resident"),
        mapped_bytes=values.get("stats.mapped"),
        retained_bytes=values.get("stats.retained"),
        arenas=tuple(arenas),
        figures=tuple(figures),
        notes=tuple(notes),
        stop_seconds=calls.stop_seconds,
        longest_stop_seconds=calls.longest_stop_seconds,
        holds=calls.holds,
    )


def purge(image: ForeignImage, calls: AllocatorCalls) -> None:
    """``arena.<all>.purge``: every arena's dirty and muzzy pages given back now."""
    scratch = Scratch()
    name = scratch.string(f"arena.{ALL_ARENAS}.purge")
    calls.run([ProbeCall(image.functions["mallctl"], (name, 0, 0, 0, 0), scratch.data)])
