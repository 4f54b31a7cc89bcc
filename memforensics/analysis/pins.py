"""The pins of a heap (the live chunks that keep its free memory from going back) and its
page-aggregated map, from a walk of its chunks and its resident pages: pure functions.

A heap shrinks only from its top (glibc's systrim and shrink_heap), so free memory below the
topmost live chunk stays with the process whatever free() does. Each live chunk with at
least a threshold of free memory directly below it (down to the next chunk that is not free)
is a pin: it and the pins above it hold that memory in place. model/pins.py has the records.
"""

from __future__ import annotations

from array import array

import numpy as np

from memforensics.model.advice import Advice
from memforensics.model.chunks import ChunkState, HeapChunks
from memforensics.model.pins import HeapMap, HeapPins, Pin, ResidentPages
from memforensics.units import format_bytes

MIB = 1024 * 1024
# A pin is listed when it holds at least 1 MiB, or 1% of its heap where that is less (a
# small thread heap's pin matters at its own scale), never less than 64 KiB.
PIN_FLOOR_BYTES = 64 * 1024
MAX_PINS_PER_HEAP = 16
MAX_MAP_CELLS = 4096
CHUNK_HEADER_BYTES = 16  # prev_size and size: the user pointer is the chunk's address + 16

_FREE_STATES = (ChunkState.FREE, ChunkState.FAST, ChunkState.TCACHE)


def pin_threshold(heap_bytes: int) -> int:
    """The free bytes a live chunk must pin to be listed in a heap of ``heap_bytes``."""
    return max(PIN_FLOOR_BYTES, min(MIB, heap_bytes // 100))


def _arrays(chunks: HeapChunks) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    count = len(chunks.addresses)
    addresses = np.frombuffer(chunks.addresses, dtype=np.uint64, count=count).astype(np.int64)
    sizes = np.frombuffer(chunks.sizes, dtype=np.uint64, count=count).astype(np.int64)
    states = np.frombuffer(chunks.states, dtype=np.uint8, count=count)
    return addresses, sizes, states


def resident_bytes(pages: ResidentPages, start: int, end: int) -> int:
    """Bytes of [start, end) on resident pages (a partial page counts its part); pages
    outside what ``pages`` covers count as not resident."""
    page = pages.page_bytes
    total = 0
    address = start
    # Whole pages are counted by the bytes object's own count() (C speed, no per-page loop).
    first_whole = -(-(start - pages.start) // page)
    last_whole = (end - pages.start) // page
    if last_whole <= first_whole:
        while address < end:
            index = (address - pages.start) // page
            next_boundary = pages.start + (index + 1) * page
            if 0 <= index < len(pages.present) and pages.present[index]:
                total += min(end, next_boundary) - address
            address = next_boundary
        return total
    lo, hi = max(first_whole, 0), min(last_whole, len(pages.present))
    if hi > lo:
        total += pages.present.count(1, lo, hi) * page
    head_end = pages.start + first_whole * page
    if start < head_end:
        total += resident_bytes(pages, start, head_end)
    tail_start = pages.start + last_whole * page
    if tail_start < end:
        total += resident_bytes(pages, tail_start, end)
    return total


def heap_pins(
    chunks: HeapChunks,
    pages: ResidentPages | None,
    *,
    threshold_bytes: int | None = None,
    max_pins: int = MAX_PINS_PER_HEAP,
) -> HeapPins:
    """The pins of one heap, from the top down (see the module); ``pages`` None: residency
    unknown (a core), so each pin's ``resident_bytes`` is None."""
    heap_bytes = chunks.mapped_end - chunks.start
    threshold = pin_threshold(heap_bytes) if threshold_bytes is None else threshold_bytes
    addresses, sizes, states = _arrays(chunks)
    is_free = np.isin(states, np.array(_FREE_STATES, dtype=np.uint8))
    free_sizes = np.where(is_free, sizes, 0)
    cumfree = np.concatenate(([0], np.cumsum(free_sizes)))
    live = states == ChunkState.LIVE
    live_bytes = int(sizes[live].sum())
    top_bytes = int(sizes[states == ChunkState.TOP].sum())
    live_index = np.flatnonzero(live)
    held = int(cumfree[live_index[-1]]) if len(live_index) else 0
    # Each non-free chunk's gap: the free bytes between the previous non-free chunk and it.
    solid = np.flatnonzero(~is_free)
    below = np.concatenate(([-1], solid[:-1]))
    gaps = cumfree[solid] - cumfree[below + 1]
    candidates = solid[(states[solid] == ChunkState.LIVE) & (gaps >= threshold)]
    candidate_below = below[(states[solid] == ChunkState.LIVE) & (gaps >= threshold)]
    listed: list[Pin] = []
    for rank, position in enumerate(range(len(candidates) - 1, -1, -1), start=1):
        if rank > max_pins:
            break
        index = int(candidates[position])
        under = int(candidate_below[position])
        gap_start = int(addresses[under] + sizes[under]) if under >= 0 else chunks.start
        gap_end = int(addresses[index])
        listed.append(
            Pin(
                arena=chunks.arena,
                heap=chunks.heap,
                address=gap_end + CHUNK_HEADER_BYTES,
                chunk_bytes=int(sizes[index]),
                pinned_free_bytes=int(cumfree[index] - cumfree[under + 1]),
                resident_bytes=(
                    None if pages is None else resident_bytes(pages, gap_start, gap_end)
                ),
                rank=rank,
            )
        )
    return HeapPins(
        arena=chunks.arena,
        heap=chunks.heap,
        start=chunks.start,
        end=chunks.mapped_end,
        heap_bytes=heap_bytes,
        live_bytes=live_bytes,
        free_bytes=int(cumfree[-1]),
        top_bytes=top_bytes,
        held_free_bytes=held,
        threshold_bytes=threshold,
        pins=tuple(listed),
        pins_omitted=max(0, len(candidates) - max_pins),
        complete=chunks.complete,
    )


def _to_array(values: np.ndarray) -> array[int]:
    out: array[int] = array("Q")
    out.frombytes(values.astype(np.uint64).tobytes())
    return out


def heap_map(
    chunks: HeapChunks, pages: ResidentPages | None, *, max_cells: int = MAX_MAP_CELLS
) -> HeapMap:
    """The heap drawn by cells of a power of two pages each, at most ``max_cells`` of them:
    each cell's live, free (resident / released), top and other bytes. ``pages`` None: the
    residency is unknown and all free bytes count as resident."""
    page = pages.page_bytes if pages is not None else 4096
    base = chunks.start - chunks.start % page
    end = max(chunks.mapped_end, chunks.walked_end)
    page_count = max(1, -(-(end - base) // page))
    per_cell = 1
    while -(-page_count // per_cell) > max_cells:
        per_cell *= 2
    addresses, sizes, states = _arrays(chunks)
    bounds = base + np.arange(page_count + 1, dtype=np.int64) * page
    bounds[-1] = min(int(bounds[-1]), end)
    containing = np.searchsorted(addresses, bounds, side="right") - 1
    safe = np.maximum(containing, 0)
    into = np.clip(bounds - addresses[safe], 0, sizes[safe]) if len(sizes) else bounds * 0

    def per_page(mask: np.ndarray) -> np.ndarray:
        if not len(sizes):
            return np.zeros(page_count, dtype=np.int64)
        cumulative = np.concatenate(([0], np.cumsum(np.where(mask, sizes, 0))))
        covered = cumulative[safe] + np.where(mask[safe], into, 0)
        covered = np.where(containing >= 0, covered, 0)
        return np.diff(covered)

    free = per_page(np.isin(states, np.array(_FREE_STATES, dtype=np.uint8)))
    live = per_page(states == ChunkState.LIVE)
    top = per_page(states == ChunkState.TOP)
    span = np.diff(np.clip(bounds, chunks.start, end))
    other = span - free - live - top
    if pages is None:
        present = np.ones(page_count, dtype=np.int64)
    else:
        offset = (base - pages.start) // page
        known = np.frombuffer(pages.present, dtype=np.uint8).astype(np.int64)
        present = np.zeros(page_count, dtype=np.int64)
        lo, hi = max(0, -offset), min(page_count, len(known) - offset)
        if hi > lo:
            present[lo:hi] = known[lo + offset : hi + offset]
    cells = -(-page_count // per_cell)

    def to_cells(values: np.ndarray) -> array[int]:
        padded = np.zeros(cells * per_cell, dtype=np.int64)
        padded[:page_count] = values
        return _to_array(padded.reshape(cells, per_cell).sum(axis=1))

    return HeapMap(
        arena=chunks.arena,
        heap=chunks.heap,
        start=base,
        end=end,
        page_bytes=page,
        pages_per_cell=per_cell,
        live=to_cells(live),
        free_resident=to_cells(free * present),
        free_released=to_cells(free * (1 - present)),
        top=to_cells(top),
        other=to_cells(other),
    )


def content_kind(data: bytes) -> tuple[str, str | None]:
    """What a chunk's first bytes look like: ("zeros", None), ("text", its text up to the
    first NUL, at most 40 characters), or ("binary", None)."""
    if not data or not any(data):
        return "zeros", None
    text = data.split(b"\0", 1)[0]
    printable = sum(1 for byte in text if 32 <= byte < 127 or byte in (9, 10, 13))
    if len(text) >= 4 and printable == len(text):
        shown = text[:40].decode("ascii").replace("\n", "\\n").replace("\r", "\\r")
        return "text", shown.replace("\t", "\\t") + ("…" if len(text) > 40 else "")
    return "binary", None


def heap_name(arena: int, heap: int) -> str:
    """How a report names a heap: "the main heap", "arena 2's heap", "arena 2's heap 1"."""
    if arena == 0:
        return "the main heap" if heap == 0 else f"the main arena's segment {heap}"
    return f"arena {arena}'s heap" if heap == 0 else f"arena {arena}'s heap {heap}"


def pin_sentence(pin: Pin) -> str:
    """One sentence naming a pin, what it is, what it holds and what can be done about it."""
    what = {
        "text": "text",
        "zeros": "zeros",
        "binary": "binary data",
        "pointers": "pointers",
        "unknown": "of no type the census names",
    }.get(pin.kind or "", "contents unread")
    if pin.type is not None:
        what = f"a {pin.type}"
    elif pin.kind == "text" and pin.preview is not None:
        what = f'text "{pin.preview}"'
    sentence = (
        f"one live {format_bytes(pin.chunk_bytes)} chunk at {pin.address:#x}, {what}, keeps "
        f"{format_bytes(pin.pinned_free_bytes)} of free memory in "
        f"{heap_name(pin.arena, pin.heap)} below it: free() cannot return it"
    )
    if pin.resident_bytes is None:
        return sentence + " (which of its pages are resident is unknown)"
    if pin.resident_bytes >= max(PIN_FLOOR_BYTES, pin.pinned_free_bytes // 100):
        return (
            sentence + f"; `memforensics trim` can release its "
            f"{format_bytes(pin.resident_bytes)} of resident pages"
        )
    return sentence + "; its pages are already released (the address space stays)"


def pin_advice(heaps: tuple[HeapPins, ...]) -> tuple[Advice, ...]:
    """Advice from the pins found: what to change so freed memory can go back."""
    pins = [pin for heap in heaps for pin in heap.pins]
    if not pins:
        return ()
    pinned = sum(pin.pinned_free_bytes for pin in pins)
    resident = sum(pin.resident_bytes or 0 for pin in pins)
    biggest = max(pins, key=lambda pin: pin.pinned_free_bytes)
    steps = [
        "allocate long-lived objects before short-lived bursts (or from a pool of their own) "
        "so that none sits above memory freed later"
    ]
    if any(pin.arena != 0 for pin in pins):
        steps.append(
            "cap the thread arenas (MALLOC_ARENA_MAX=2 or GLIBC_TUNABLES=glibc.malloc.arena_max=2)"
        )
    if resident >= max(PIN_FLOOR_BYTES, pinned // 100):
        steps.append(
            f"a periodic `memforensics trim` releases the {format_bytes(resident)} of their "
            "pages still resident (the address space stays)"
        )
    steps.append("or an allocator that returns memory page by page (jemalloc, tcmalloc, mimalloc)")
    count = f"{len(pins)} live chunk{'s' if len(pins) != 1 else ''}"
    return (
        Advice(
            "pinned-free",
            f"{count} hold{'s' if len(pins) == 1 else ''} {format_bytes(pinned)} of free memory "
            f"below {'it' if len(pins) == 1 else 'them'} (the largest: "
            f"{format_bytes(biggest.pinned_free_bytes)} in "
            f"{heap_name(biggest.arena, biggest.heap)}, "
            f"under the chunk at {biggest.address:#x}); a heap shrinks only from its top: "
            + "; ".join(steps)
            + ".",
            "warn",
        ),
    )


def coarser(cells: HeapMap, max_cells: int) -> HeapMap:
    """The same map with cells of twice the pages, again, until at most ``max_cells``."""
    per_cell = cells.pages_per_cell
    factor = 1
    while -(-cells.cells // factor) > max_cells:
        factor *= 2
    if factor == 1:
        return cells

    def merged(values: array[int]) -> array[int]:
        padded = np.zeros(-(-len(values) // factor) * factor, dtype=np.int64)
        padded[: len(values)] = np.frombuffer(values, dtype=np.uint64).astype(np.int64)
        return _to_array(padded.reshape(-1, factor).sum(axis=1))

    return HeapMap(
        arena=cells.arena,
        heap=cells.heap,
        start=cells.start,
        end=cells.end,
        page_bytes=cells.page_bytes,
        pages_per_cell=per_cell * factor,
        live=merged(cells.live),
        free_resident=merged(cells.free_resident),
        free_released=merged(cells.free_released),
        top=merged(cells.top),
        other=merged(cells.other),
    )
