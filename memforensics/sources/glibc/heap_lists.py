"""Which chunks that look in use to a heap walk are glibc's free lists' or its own: a
fastbin's chunks (an arena's lists followed, bounded), the tcache's (its key) and the
tcache_perthread_structs themselves (validated from their bytes). heap_chunks uses these.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from memforensics.model import glibc
from memforensics.sources.glibc.glibc_arenas import ArenaState
from memforensics.sources.proc.procmem import MemoryReader

FASTBIN_MAX_CHUNKS = 20_000  # per arena, followed in a stop; beyond, fast chunks count LIVE
FASTBIN_SECONDS = 0.008  # and for no longer than this per arena (the stop stays short)
# sizeof(tcache_perthread_struct) as a chunk, and its counts' width: char counts (2.26-2.29),
# uint16_t (2.30 on).
TCACHE_LAYOUTS = {0x250: 1, 0x290: 2}


@dataclass
class Tcache:
    """What identifies tcache chunks: the keys their second word holds."""

    keys: set[int]
    structs: set[int]  # chunk addresses of validated tcache_perthread_structs


def tcache_struct(data: bytes | memoryview, size: int) -> list[int] | None:
    """The entries of a tcache_perthread_struct whose chunk (header included) is ``data``
    (None when it is not one: a count and its entry disagree, an entry is unaligned, or
    every list is empty, which a zero-filled chunk would look like too)."""
    width = TCACHE_LAYOUTS.get(size)
    if width is None or len(data) < size:
        return None
    body = bytes(data[16:size])
    fmt = "<64B" if width == 1 else "<64H"
    counts = struct.unpack_from(fmt, body, 0)
    entries = struct.unpack_from("<64Q", body, 64 * width)
    if not any(entries):
        return None
    for count, entry in zip(counts, entries, strict=True):
        if (count == 0) != (entry == 0) or entry % glibc.MALLOC_ALIGNMENT:
            return None
    return [e for e in entries if e]


def learn_key(mem: MemoryReader, tcache: Tcache, chunk: int, entries: list[int]) -> None:
    """The key of the tcache at ``chunk``: the second word of its first entry."""
    tcache.structs.add(chunk)
    for entry in entries[:4]:
        word = mem.read(entry + 8, 8)
        if word is None:
            continue
        key = int.from_bytes(word, "little")
        # 2.29-2.33 store the struct's own user pointer; 2.34+ a random word.
        if key == chunk + 16 or key > 0xFFFF:
            tcache.keys.add(key)
            return


def fast_chunks(
    mem: MemoryReader,
    state: ArenaState,
    low: int,
    high: int,
    seconds: float = FASTBIN_SECONDS,
    read: Callable[[int], bytes | None] | None = None,
) -> tuple[set[int], bool]:
    """Chunk addresses on the arena's fastbin lists, and whether every list was followed to
    its end: at most FASTBIN_MAX_CHUNKS of them and for at most ``seconds`` (False past
    either: the chunks not reached then count as live); safe-linking (2.32+: next =
    (pos >> 12) ^ ptr) recognised from the list itself. ``read(address)``: a chunk's first
    24 bytes (None: not readable), else ``mem.read``."""
    deadline = time.monotonic() + seconds
    found: set[int] = set()
    complete = True
    for index, head in enumerate(state.fastbins):
        size = (index + 2) * glibc.MALLOC_ALIGNMENT
        for mangled in (True, False):
            chain: list[int] = []
            at = head
            good = True
            while at:
                if len(found) + len(chain) >= FASTBIN_MAX_CHUNKS or (
                    len(chain) % 64 == 63 and time.monotonic() > deadline
                ):
                    complete = False  # its chunks or its time are up: what was followed stands
                    break
                data = read(at) if read is not None else mem.read(at, 24)
                if (
                    data is None
                    or at % glibc.MALLOC_ALIGNMENT
                    or not low <= at < high
                    or int.from_bytes(data[8:16], "little") & ~glibc.SIZE_FLAGS != size
                    or at in chain[-1:]
                ):
                    good = False
                    break
                chain.append(at)
                raw = int.from_bytes(data[16:24], "little")
                at = ((at + 16) >> 12) ^ raw if mangled else raw
            if good or not mangled:
                found.update(chain)
                break
    return found, complete
