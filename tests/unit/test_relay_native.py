"""_chunkwalk.relay (bin_relay's stretch of a list) on free lists built in this process's
own memory: read back through /proc/self/mem as it reads a held target's."""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import time

import pytest

from memforensics.model import glibc
from memforensics.sources import optional_native
from memforensics.sources.proc.procmem import ProcessMemoryReader

_native = optional_native("memforensics.sources.glibc._chunkwalk")
pytestmark = pytest.mark.skipif(_native is None, reason="the C module is not built")

RELAY_DONE, RELAY_TIME, RELAY_BK = 0, 1, 6
CHUNK = 0x90  # one small bin's size


def _relay(
    chunks: int, *, loop: bool = False, max_chunks: int | None = None
) -> tuple[int, tuple[int, ...]]:
    """A circular list of ``chunks`` free chunks of CHUNK bytes (live 32-byte chunks between
    them) behind a head outside the span, as a bin's; with ``loop``, the last chunk's fd
    names the first instead of the head. (status, cursor) of one relay stretch over it, of
    at most ``max_chunks`` chunks where given."""
    assert _native is not None
    page = mmap.PAGESIZE
    heap = mmap.mmap(-1, 16 * page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    head_buffer = mmap.mmap(-1, page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        start = ctypes.addressof(ctypes.c_char.from_buffer(heap))
        head = ctypes.addressof(ctypes.c_char.from_buffer(head_buffer)) + 0x100
        stride = CHUNK + 32
        addresses = [start + 0x20 + i * stride for i in range(chunks)]
        for i, at in enumerate(addresses):
            offset = at - start
            fd = addresses[i + 1] if i + 1 < chunks else (addresses[0] if loop else head)
            bk = addresses[i - 1] if i else head
            struct.pack_into("<QQQQ", heap, offset, 0, CHUNK | 1, fd, bk)
            struct.pack_into("<QQ", heap, offset + CHUNK, CHUNK, 32)  # the live chunk after
        low, high = glibc.bin_size_range(glibc.bin_index(CHUNK))
        cache = mmap.mmap(-1, 4 * (16 * page + 8 + 16), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        cursor = (head, addresses[0], 0, 0, 0, 0, 0, 0, 0, head, 1, 0)
        with ProcessMemoryReader(os.getpid()) as mem:
            status, cursor, _detail, _pages = _native.relay(
                0,  # (no pinned reads: this process is not held)
                mem.mem_fd,
                mem.pagemap_fd,
                [(start, start + len(heap))],
                head,
                low,
                high,
                page,
                1 << 20,
                time.monotonic() + 5.0,
                cache,
                False,
                cursor,
                *(() if max_chunks is None else (False, max_chunks)),
            )
        cache.close()
        return status, tuple(cursor)
    finally:
        heap.close()
        head_buffer.close()


@pytest.mark.parametrize("chunks", [1, 2, 3, 7])
def test_a_list_back_at_its_head_is_done_whatever_its_length(chunks: int) -> None:
    """A list of one chunk comes back to its head at its first step, where Brent's mark
    still is the head: that is the list's end, not a loop (before: a one-chunk bin read in
    relays was named corrupt, "free list loops")."""
    status, cursor = _relay(chunks)
    assert status == RELAY_DONE
    assert cursor[2:4] == (chunks, chunks * CHUNK)  # count, total bytes


def test_a_list_that_comes_back_to_its_first_chunk_fails_the_bk_check() -> None:
    """The last chunk's fd names the first, whose bk names the head, not it: glibc's
    "corrupted double-linked list" check, found where the list comes round."""
    status, cursor = _relay(5, loop=True)
    assert status == RELAY_BK
    assert cursor[2] == 5


def test_a_stretch_bounded_in_chunks_ends_as_at_its_deadline_where_the_next_one_begins() -> None:
    """max_chunks: the stretch stops after that many chunks, its cursor on the next one (the
    lists of an arena take turns so, bin_relay._Relay.stop); 0 is no bound."""
    status, cursor = _relay(7, max_chunks=3)
    assert status == RELAY_TIME
    assert cursor[2:4] == (3, 3 * CHUNK)
    status, cursor = _relay(7, max_chunks=0)
    assert status == RELAY_DONE and cursor[2] == 7
