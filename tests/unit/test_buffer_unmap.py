"""Copy buffers given up are unmapped beside the read (heapcopy.UNMAPPER): every one of them,
by a thread of ours, with at most one batch under way, and a buffer still viewed left to its
last view."""

from __future__ import annotations

import mmap
import threading

import pytest

from memforensics.sources.glibc import heapcopy
from memforensics.sources.glibc.heapcopy import UNMAPPER, BufferPool, FreshBuffers

PAGE = mmap.PAGESIZE


def test_fresh_buffers_given_back_are_unmapped_by_a_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    closing_threads: list[str] = []
    real_close_all = heapcopy._close_all

    def close_all(buffers: list[mmap.mmap]) -> None:
        closing_threads.append(threading.current_thread().name)
        real_close_all(buffers)

    monkeypatch.setattr(heapcopy, "_close_all", close_all)
    pool = FreshBuffers(copy_max_bytes=1 << 30)
    buffers = [pool.take(64 * PAGE) for _ in range(3)]
    for buffer in buffers:
        buffer[:PAGE] = b"x" * PAGE  # faulted in: something to give back
    for buffer in buffers:
        pool.give(buffer)
    UNMAPPER.wait()
    assert all(buffer.closed for buffer in buffers)
    assert closing_threads == ["unmap-copies"] * 3
    assert threading.current_thread().name not in closing_threads


def test_a_pool_closed_unmaps_what_it_kept() -> None:
    pool = BufferPool(copy_max_bytes=1 << 30)
    kept = [pool.take(16 * PAGE), pool.take(32 * PAGE)]
    for buffer in kept:
        pool.give(buffer)
    assert pool.kept_bytes == 48 * PAGE
    pool.close()
    UNMAPPER.wait()
    assert pool.kept_bytes == 0
    assert all(buffer.closed for buffer in kept)


def test_a_buffer_still_viewed_is_left_to_its_last_view() -> None:
    pool = FreshBuffers(copy_max_bytes=1 << 30)
    buffer = pool.take(8 * PAGE)
    view = memoryview(buffer)  # a caller's bug: a view outlives the copy
    pool.give(buffer)
    UNMAPPER.wait()  # no exception escapes the thread, and the view still reads
    assert not buffer.closed
    assert view[0] == 0
    view.release()
    buffer.close()


def test_one_batch_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    under_way = [0]
    most = [0]
    lock = threading.Lock()
    real_close_all = heapcopy._close_all

    def close_all(buffers: list[mmap.mmap]) -> None:
        with lock:
            under_way[0] += 1
            most[0] = max(most[0], under_way[0])
        real_close_all(buffers)
        with lock:
            under_way[0] -= 1

    monkeypatch.setattr(heapcopy, "_close_all", close_all)
    pool = FreshBuffers(copy_max_bytes=1 << 30)
    buffers = [pool.take(256 * PAGE) for _ in range(20)]
    for buffer in buffers:
        buffer.madvise(mmap.MADV_WILLNEED)
        buffer[::PAGE] = b"y" * (len(buffer) // PAGE)
        pool.give(buffer)
    UNMAPPER.wait()
    assert most[0] == 1
    assert all(buffer.closed for buffer in buffers)


def test_a_pools_eviction_does_not_wait_for_a_batch_under_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A buffer the pool evicts (maybe in a stop) is unmapped in the caller while another
    batch is still being unmapped, not after it."""
    release = threading.Event()
    real_close_all = heapcopy._close_all
    closing_threads: list[str] = []

    def close_all(buffers: list[mmap.mmap]) -> None:
        closing_threads.append(threading.current_thread().name)
        if threading.current_thread().name == "unmap-copies":
            release.wait(10)
        real_close_all(buffers)

    monkeypatch.setattr(heapcopy, "_close_all", close_all)
    fresh = FreshBuffers(copy_max_bytes=1 << 30)
    slow = fresh.take(8 * PAGE)
    fresh.give(slow)  # a batch under way until released
    try:
        pool = BufferPool(copy_max_bytes=16 * PAGE)
        small, big = pool.take(8 * PAGE), pool.take(16 * PAGE)
        pool.give(small)
        pool.give(big)  # past the pool's bound: the smaller one is evicted
        assert small.closed and not slow.closed
        assert closing_threads == ["unmap-copies", threading.current_thread().name]
    finally:
        release.set()
        UNMAPPER.wait()
    assert slow.closed
