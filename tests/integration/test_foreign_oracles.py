"""The oracles for processes on other allocators are right: foreign_alloc's figures are the
preloaded allocator's own statistics and agree with the bytes the program keeps, and the test
Redis runs on the system jemalloc, whose INFO figures follow what is loaded and deleted."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest

from tests.support.foreign_targets import (
    ALLOCATOR_LIBRARIES,
    GLIBC,
    ForeignTarget,
    allocator_skip_reason,
    foreign_target,
)
from tests.support.redis import RedisServer, redis_server, redis_skip_reason
from tests.support.targets import have_cc

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# 4 threads x 400 blocks of 64 KiB, every 4th kept: 25 MiB kept, 75 MiB freed. 64 KiB is a
# size class of both jemalloc and tcmalloc (no rounding), and above jemalloc's default
# tcache_max (32 KiB), so freed blocks are not counted as allocated by a thread cache.
BLOCKS = 400
BLOCK_BYTES = 64 * 1024
KEEP_EVERY = 4
THREADS = 4
MORE_BLOCKS = 50
KEPT_BYTES = THREADS * len(range(0, BLOCKS, KEEP_EVERY)) * BLOCK_BYTES
FREED_PER_THREAD = (BLOCKS - len(range(0, BLOCKS, KEEP_EVERY))) * BLOCK_BYTES
RATIO = 0.03


def startup_allowance(allocator: str, threads: int) -> int:
    """The most an allocator's "allocated" figure may exceed the program's kept bytes by:
    what the allocator and the C library allocate for themselves.

    Measured (foreign_alloc, 1 to 8 threads, jemalloc 5.3.0 and gperftools 2.10 on
    Debian 12): jemalloc 147,968 + 28,672 per thread, mostly the threads' tcaches, which
    jemalloc allocates from an arena and so counts as allocated; tcmalloc 73,752 + 320 per
    thread: the 72 KiB emergency exception pool of the libstdc++ tcmalloc_minimal links,
    and glibc's per-thread DTVs. Twice that, in round figures.
    """
    if allocator == "jemalloc":
        return 320 * 1024 + 64 * 1024 * threads
    if allocator == "tcmalloc":
        return 160 * 1024 + 1024 * threads
    raise ValueError(f"no allocated figure for {allocator}")


# How far one `more` may move "allocated" off the bytes it added: jemalloc's tcache garbage
# collection, which runs on allocation events, flushes cached small objects (counted as
# allocated while cached) during the run: measured -12,672 and -24,384 bytes.
MORE_ALLOWANCE = 64 * 1024


def _allocated(figures: dict[str, object]) -> int:
    key = "allocated" if figures["allocator"] == "jemalloc" else "generic.current_allocated_bytes"
    value = figures[key]
    assert isinstance(value, int), figures
    return value


def _skip_unless_runnable(allocator: str) -> None:
    if not have_cc():
        pytest.skip("no C compiler (cc) to build the target program")
    reason = allocator_skip_reason(allocator)
    if reason is not None:
        pytest.skip(reason)


def _assert_served_by(target: ForeignTarget, figures: dict[str, object], allocator: str) -> None:
    """The figures come from ``allocator`` and it serves the target's malloc (the preload
    took effect, the library did not merely load)."""
    assert figures["allocator"] == allocator, figures
    assert figures["ok"] is True, figures
    library = ALLOCATOR_LIBRARIES[allocator].library
    assert Path(str(figures["malloc_library"])).resolve() == library.resolve(), figures
    assert target.kept_bytes() == KEPT_BYTES


def test_glibc_target_reports_glibc() -> None:
    """Without a preload no foreign statistics entry point is found: the detection is not
    fooled by symbols the program or glibc define."""
    _skip_unless_runnable(GLIBC)
    with foreign_target(GLIBC, BLOCKS, BLOCK_BYTES, KEEP_EVERY, THREADS) as target:
        figures = target.figures()
        assert figures["allocator"] == "glibc", figures
        assert "libc.so" in str(figures["malloc_library"]), figures
        assert target.kept_bytes() == KEPT_BYTES


@pytest.mark.parametrize("allocator", ["jemalloc", "tcmalloc"])
def test_allocated_is_the_kept_bytes(allocator: str) -> None:
    """The allocator's allocated figure is the bytes the program keeps (within 3 % plus its
    own startup allocations), and grows by exactly what ``more`` adds."""
    _skip_unless_runnable(allocator)
    with foreign_target(allocator, BLOCKS, BLOCK_BYTES, KEEP_EVERY, THREADS) as target:
        before = target.figures()
        _assert_served_by(target, before, allocator)
        kept = target.kept_bytes()
        allocated = _allocated(before)
        assert kept <= allocated <= kept * (1 + RATIO) + startup_allowance(allocator, THREADS)

        total = target.more(MORE_BLOCKS)
        added = MORE_BLOCKS * BLOCK_BYTES
        assert total == kept + added
        grown = _allocated(target.figures()) - allocated
        assert abs(grown - added) <= added * RATIO + MORE_ALLOWANCE, (grown, added)
        assert target.alive()


def test_jemalloc_figures_hold_together_and_keep_freed_pages() -> None:
    """jemalloc's figures nest (allocated <= active <= resident <= mapped), come from the
    arenas the threads used, and the freed blocks stay as dirty pages: the free memory the
    later tests expect memforensics to find."""
    _skip_unless_runnable("jemalloc")
    with foreign_target("jemalloc", BLOCKS, BLOCK_BYTES, KEEP_EVERY, THREADS) as target:
        f = target.figures()
        _assert_served_by(target, f, "jemalloc")
        assert f["allocated"] <= f["active"] <= f["resident"] <= f["mapped"], f
        assert f["page"] == mmap.PAGESIZE, f
        assert 1 <= f["arenas_read"] <= f["narenas"], f
        assert f["metadata"] > 0, f
        # Every thread frees into its own arena, which purges only on later allocation
        # events (10 s decay): at least one thread's frees are still dirty or muzzy pages.
        unused = (f["pdirty"] + f["pmuzzy"]) * f["page"]
        assert unused >= FREED_PER_THREAD, (unused, FREED_PER_THREAD)


def test_tcmalloc_figures_add_up_and_keep_freed_bytes() -> None:
    """tcmalloc's heap is its allocated bytes plus its free lists (the identity it computes
    current_allocated_bytes by; exact while the threads are idle), and the freed blocks are
    still in those free lists."""
    _skip_unless_runnable("tcmalloc")
    with foreign_target("tcmalloc", BLOCKS, BLOCK_BYTES, KEEP_EVERY, THREADS) as target:
        f = target.figures()
        _assert_served_by(target, f, "tcmalloc")
        free = sum(
            f[f"tcmalloc.{name}"]
            for name in (
                "pageheap_free_bytes",
                "pageheap_unmapped_bytes",
                "central_cache_free_bytes",
                "transfer_cache_free_bytes",
                "thread_cache_free_bytes",
            )
        )
        assert f["generic.heap_size"] == f["generic.current_allocated_bytes"] + free, f
        # The heap never shrinks, and at its peak held one thread's blocks all at once while
        # the others' kept ones were live: at least that thread's frees are free memory now.
        assert free >= FREED_PER_THREAD - startup_allowance("tcmalloc", THREADS), f


def test_mimalloc_reports_its_process_info() -> None:
    """mimalloc (no allocated figure of its own) serves the target, reports its version,
    and has committed at least the bytes the program keeps, before and after ``more``."""
    _skip_unless_runnable("mimalloc")
    with foreign_target("mimalloc", BLOCKS, BLOCK_BYTES, KEEP_EVERY, THREADS) as target:
        f = target.figures()
        _assert_served_by(target, f, "mimalloc")
        assert isinstance(f.get("version"), int) and f["version"] > 0, f
        assert f["current_commit"] >= KEPT_BYTES, f
        assert f["peak_commit"] >= f["current_commit"], f
        assert f["current_rss"] > 0 and f["peak_rss"] > 0, f
        total = target.more(MORE_BLOCKS)
        after = target.figures()
        assert after["current_commit"] >= total, after
        assert after["peak_commit"] >= after["current_commit"], after


def _skip_unless_redis() -> None:
    reason = redis_skip_reason()
    if reason is not None:
        pytest.skip(reason)


def _int(info: dict[str, int | str], key: str) -> int:
    value = info[key]
    assert isinstance(value, int), (key, value)
    return value


# Redis's own count of what it allocated (used_memory, from malloc_usable_size) and jemalloc's
# stats.allocated differ by what sits in the tcaches and what Redis allocates outside its
# zmalloc: measured 0.45-0.75 MiB.
REDIS_ACCOUNTING_ALLOWANCE = 4 * 1024 * 1024


def test_redis_runs_on_the_system_jemalloc() -> None:
    """The server runs as redis-server, maps Debian's libjemalloc.so.2, says so in INFO, and
    jemalloc's allocated figure agrees with Redis's own count."""
    _skip_unless_redis()
    with redis_server() as server:
        assert Path(f"/proc/{server.pid}/comm").read_text().strip() == "redis-server"
        maps = Path(f"/proc/{server.pid}/maps").read_text()
        assert str(ALLOCATOR_LIBRARIES["jemalloc"].library) in maps
        info = server.settled_info_memory()
        assert str(info["mem_allocator"]).startswith("jemalloc-"), info
        allocated = _int(info, "allocator_allocated")
        assert abs(allocated - _int(info, "used_memory")) <= REDIS_ACCOUNTING_ALLOWANCE, info
        assert allocated <= _int(info, "allocator_active") <= _int(info, "allocator_resident")


def test_redis_load_and_delete_move_allocator_allocated() -> None:
    """Loading N values grows allocator_allocated by their bytes plus Redis's per-key
    overhead; deleting every other key gives back the deleted keys' share, and the pages
    they leave half empty stay active: fragmentation jemalloc reports itself."""
    _skip_unless_redis()
    keys, value_bytes = 200_000, 1000
    # Per key beyond the value: key and value headers, robj, dictEntry, size class rounding
    # (a 1000-byte value is a 1024-byte allocation), the hash table's slot; measured 109.
    overhead = 160
    with redis_server() as server:
        empty = server.settled_info_memory()
        server.load(keys, value_bytes, "k:")
        assert server.command("DBSIZE") == keys
        loaded = server.settled_info_memory()
        grown = _int(loaded, "allocator_allocated") - _int(empty, "allocator_allocated")
        assert keys * value_bytes <= grown <= keys * (value_bytes + overhead), grown

        deleted = server.delete("k:", 2)
        assert deleted == keys // 2
        assert server.command("DBSIZE") == keys - deleted
        after = server.settled_info_memory()
        freed = _int(loaded, "allocator_allocated") - _int(after, "allocator_allocated")
        # The hash table does not shrink at half full, so only per-key bytes come back.
        assert deleted * value_bytes <= freed <= deleted * (value_bytes + overhead), freed
        fragmentation = _int(after, "allocator_active") - _int(after, "allocator_allocated")
        assert fragmentation >= deleted * value_bytes // 2, after
        assert abs(_int(after, "allocator_allocated") - _int(after, "used_memory")) <= (
            REDIS_ACCOUNTING_ALLOWANCE
        ), after


def test_redis_benchmark_runs_clean_in_front_and_behind() -> None:
    """A short redis-benchmark reports SET and GET rates and no error, run to the end or in
    the background while the test talks to the server."""
    _skip_unless_redis()
    with redis_server() as server:
        result = server.benchmark(20_000, clients=4, timeout_seconds=30)
        assert result.ok, result.output
        assert set(result.requests_per_second) == {"SET", "GET"}, result.output
        assert all(rate > 0 for rate in result.requests_per_second.values())

        run = server.start_benchmark(20_000, clients=4, timeout_seconds=30)
        assert server.command("PING") == "PONG"
        assert isinstance(server.info_memory()["used_memory"], int)
        background = run.finish()
        assert background.ok, background.output
        assert not run.running


def test_redis_benchmark_errors_are_reported() -> None:
    """A benchmark the server refuses (a password it was not given) is reported as failed:
    the clean result above is not a parser that sees nothing."""
    _skip_unless_redis()
    with redis_server() as server:
        server.command("CONFIG", "SET", "requirepass", "not-given")
        try:
            result = server.benchmark(1000, clients=1, timeout_seconds=30)
        finally:
            # This connection is still authenticated; the shutdown in finally needs none.
            server.command("CONFIG", "SET", "requirepass", "")
        assert not result.ok
        assert result.returncode != 0
        assert any("NOAUTH" in line for line in result.errors), result.errors


def test_redis_benchmark_without_a_server_is_bounded() -> None:
    """redis-benchmark against a server that is gone fails within its deadline and is
    killed (redis-benchmark 7.0 spins on the refused connection instead of exiting)."""
    _skip_unless_redis()
    with redis_server() as server:
        server.stop()
        run = server.start_benchmark(1000, clients=1, timeout_seconds=1.5)
        try:
            result = run.finish()
        except TimeoutError:
            pass
        else:  # a redis-benchmark that gives up by itself must say it failed
            assert not result.ok, result.output
        assert not run.running


def test_redis_server_is_gone_after_the_block() -> None:
    """The server process and its dir do not outlive ``redis_server``."""
    _skip_unless_redis()
    with redis_server() as server:
        pid, root = server.pid, server.root
        assert isinstance(server, RedisServer) and server.alive()
    assert not Path(f"/proc/{pid}").exists()
    assert not root.exists()
