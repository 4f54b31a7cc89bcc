"""The sweep's count (sources.glibc.list_sweep) in C: each free chunk's node found among the
sorted chunk addresses (``chunk_index``), and the bin that following fd from it reaches
(``list_bins``), against lists built here by hand (a permutation of the chunks cut into one
ring per bin head, then links broken on purpose: the construction is the oracle) and against
the numpy code each one stands in for. And the count's figures per bin, over free chunks
laid out by hand in several bins (the construction the oracle)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from memforensics.sources.glibc import list_sweep

native = list_sweep._native

HEADS = 7


def _graph(seed: int, chunks: int) -> tuple[np.ndarray, np.ndarray, dict[int, int]]:
    """Sorted chunk addresses, their fd as node numbers (chunks 0 … n-1, heads n …) and the
    bin each chunk's ring belongs to (by construction)."""
    rng = random.Random(seed)
    at = np.array(
        sorted({0x5555_0000_0000 + 16 * rng.randrange(2, 1 << 24) for _ in range(chunks)}),
        dtype=np.uint64,
    )
    n = len(at)
    order = list(range(n))
    rng.shuffle(order)
    cuts = sorted(rng.sample(range(1, n), HEADS - 1))
    nexts = np.full(n + HEADS, -1, dtype=np.int32)
    bins: dict[int, int] = {}
    for head, part in enumerate(np.split(np.array(order), cuts)):
        ring = [n + head, *(int(i) for i in part)]
        for here, there in zip(ring, [*ring[1:], n + head], strict=True):
            nexts[here] = there
        bins.update({int(i): head + 1 for i in part})
    return at, nexts, bins


def _c_bins(nexts: np.ndarray, n: int) -> np.ndarray:
    """list_bins over ``nexts`` (its n chunks first): each chunk's bin, 0 for none."""
    if native is None:
        pytest.fail("the C module (_heapwindow) is not built: setup.py build_ext")
    out = np.full(n, -9, dtype=np.int32)
    native.list_bins(nexts, n, out)
    return out


def _numpy_bins(nexts: np.ndarray, n: int) -> np.ndarray:
    """list_sweep._lists' numpy way (the fallback), as it is written there."""
    total = len(nexts)
    reach = np.where(nexts >= 0, nexts, np.arange(total, dtype=np.int32)).astype(np.int32)
    reach[n:] = np.arange(n, total, dtype=np.int32)
    for _ in range(max(1, total.bit_length() + 1)):
        reach = reach[reach]
    return reach[:n] - (n - 1)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_each_value_is_found_at_its_chunk_and_others_nowhere(seed: int) -> None:
    if native is None:
        pytest.fail("the C module (_heapwindow) is not built: setup.py build_ext")
    at, _, _ = _graph(seed, 50_000)
    rng = np.random.default_rng(seed)
    inside = at[rng.permutation(len(at))]
    # Misses: between two chunks, below the first, past the last, the extremes.
    misses = np.concatenate(
        [at[:100] + np.uint64(8), at[:1] - np.uint64(16), at[-1:] + np.uint64(16)]
    )
    extremes = np.array([0, (1 << 64) - 1], dtype=np.uint64)
    values = np.concatenate([inside, misses, extremes])
    found = np.full(len(values), -2, dtype=np.int32)
    native.chunk_index(at, values, found)
    assert (at[found[: len(inside)]] == inside).all()
    assert (found[len(inside) :] == -1).all()
    with_numpy = np.searchsorted(at, values)
    clipped = np.minimum(with_numpy, len(at) - 1)
    assert (found == np.where(at[clipped] == values, clipped, -1)).all()


def test_clustered_addresses_and_no_chunks_at_all() -> None:
    if native is None:
        pytest.fail("the C module (_heapwindow) is not built: setup.py build_ext")
    # Most chunks in one dense run, one far away: most buckets are empty, one is crowded.
    at = np.array([*range(0x1000, 0x1000 + 32 * 5000, 32), 1 << 44], dtype=np.uint64)
    found = np.zeros(len(at), dtype=np.int32)
    native.chunk_index(at, at[::-1].copy(), found)
    assert (found == np.arange(len(at))[::-1]).all()
    none = np.zeros(3, dtype=np.int32)
    native.chunk_index(np.zeros(0, dtype=np.uint64), np.arange(3, dtype=np.uint64), none)
    assert none.tolist() == [-1, -1, -1]


@pytest.mark.parametrize(("seed", "chunks"), [(4, 30_000), (5, 30_000), (9, 50)])
def test_whole_rings_give_each_chunk_its_heads_bin(seed: int, chunks: int) -> None:
    # (Fewer chunks than the C code's splitters, and many more: lists cut in pieces.)
    at, nexts, bins = _graph(seed, chunks)
    n = len(at)
    out = _c_bins(nexts, n)
    assert out.tolist() == [bins[i] for i in range(n)]
    assert (out == _numpy_bins(nexts, n)).all()


@pytest.mark.parametrize(("seed", "chunks"), [(6, 30_000), (7, 30_000), (10, 60)])
def test_a_broken_ring_leaves_the_chunks_before_the_break_in_no_bin(seed: int, chunks: int) -> None:
    at, nexts, bins = _graph(seed, chunks)
    n = len(at)
    rng = random.Random(seed)
    looped, dangling = rng.sample(range(n), 2)
    # One fd sent back to a chunk earlier in its own ring (a loop that misses the head),
    # one to no node at all.
    ring = [looped]
    while nexts[ring[-1]] < n:
        ring.append(int(nexts[ring[-1]]))
    nexts[ring[-1]] = looped  # (the ring's last chunk back to `looped`: the head cut out)
    nexts[dangling] = -1
    out = _c_bins(nexts, n)
    reference = _numpy_bins(nexts, n)
    assert ((out >= 1) == (reference >= 1)).all()
    assert (out[out >= 1] == reference[reference >= 1]).all()
    assert (out[out < 1] == 0).all()
    assert all(out[i] == 0 for i in ring)  # the loop and all that leads into it: no bin
    assert out[dangling] == 0
    # A chunk whose ring was not touched keeps its bin.
    untouched = [i for i in range(n) if bins[i] not in (bins[looped], bins[dangling])]
    assert all(out[i] == bins[i] for i in untouched)


def test_nodes_that_do_not_agree_are_refused() -> None:
    if native is None:
        pytest.fail("the C module (_heapwindow) is not built: setup.py build_ext")
    with pytest.raises(ValueError):
        native.list_bins(np.zeros(4, dtype=np.int32), 5, np.zeros(5, dtype=np.int32))


def test_a_windows_free_columns_in_c_are_numpys(monkeypatch: pytest.MonkeyPatch) -> None:
    """_Free.visit's five columns (address, size word, fd, bk, footer check), C against the
    numpy fallback, over a window of random words whose chunks are laid out here: free ones
    whose footer repeats the size, ones whose footer does not, and ones whose footer lies
    past the window (counted as agreeing)."""
    if native is None:
        pytest.fail("the C module (_heapwindow) is not built: setup.py build_ext")
    rng = random.Random(8)
    base, window_bytes = 0x5555_0000_0000, 1 << 16
    data = bytearray(rng.randbytes(window_bytes))
    addresses, sizes, states = [], [], bytearray()
    at = base + 16
    while at + 64 < base + window_bytes:
        size = 16 * rng.randrange(2, 40)
        addresses.append(at)
        sizes.append(size)
        states.append(rng.choice((0, 1, 1, 2)))
        offset = at - base
        if rng.random() < 0.7 and offset + size + 8 <= window_bytes:
            data[offset + size : offset + size + 8] = size.to_bytes(8, "little")
        at += size
    columns = {}
    for built in (native, None):
        monkeypatch.setattr(list_sweep, "_native", built)
        free = list_sweep._Free()
        free.visit(None, memoryview(data), base, addresses, sizes, bytes(states))  # type: ignore[arg-type]
        columns[built is None] = [c.tolist() for c in free.arrays()]
    assert columns[False] == columns[True]
    assert len(columns[False][0]) == states.count(1)
    assert 0 < sum(columns[False][4]) < states.count(1)  # some footers agree, some do not


@pytest.mark.parametrize("seed", [3, 4])
def test_the_count_gives_each_bin_the_figures_of_the_chunks_built_into_it(seed: int) -> None:
    """count_lists over free chunks laid out by hand in rings of several small bins of one
    arena (each chunk's size its bin's, its fd and bk its ring's, every one in RAM): each
    bin's count, total and raw extremes are those of the chunks built into it, an empty bin
    reads as empty, and a bin with no head among the chunks is not mistaken for another."""
    from memforensics.model import glibc
    from memforensics.sources.glibc.arena_figures import StillMemory
    from memforensics.sources.glibc.glibc_arenas import ArenaState, Heap
    from memforensics.sources.glibc.heap_checks import bin_head

    rng = random.Random(seed)
    arena = 0x7F00_0000_0000
    start = 0x5555_0000_0000
    used = [2, 5, 9, 30, 63]  # small bins, chunks of 16 x the bin's number
    members: dict[int, list[int]] = {number: [] for number in used}
    at_list, raw_list, next_at = [], [], start
    for _ in range(4000):  # chunks side by side, each in a random bin of ``used``
        number = rng.choice(used)
        size = 16 * number
        members[number].append(next_at)
        at_list.append(next_at)
        raw_list.append(size | 1)  # (PREV_INUSE: the chunk before is in use)
        next_at += size + 64  # (a live chunk between: none coalesce)
    fd_of, bk_of = {}, {}
    bins = [0] * (2 * (glibc.NBINS - 1))
    for number in range(1, glibc.NBINS):
        head = bin_head(ArenaState(arena, 0, arena, 0, (), ()), number)
        ring = members.get(number, [])
        rng.shuffle(ring)
        nodes = [head, *ring]
        for here, there in zip(nodes, [*nodes[1:], head], strict=True):
            fd_of[here], bk_of[there] = there, here
        bins[2 * (number - 1)], bins[2 * (number - 1) + 1] = fd_of[head], bk_of[head]
    state = ArenaState(arena, next_at, arena, next_at - start, tuple(bins), (0,) * 10)
    at = np.array(at_list, dtype=np.uint64)
    free = (
        at,
        np.array(raw_list, dtype=np.uint64),
        np.array([fd_of[a] for a in at_list], dtype=np.uint64),
        np.array([bk_of[a] for a in at_list], dtype=np.uint64),
        np.ones(len(at), dtype=bool),
    )
    heap = Heap(start, 0, next_at - start, next_at - start)
    asked = [*used, 7]  # bin 7: empty
    walked = list_sweep.WalkedLists(state, [heap], asked, free, list_sweep.SweepResult())
    memory = type("Pages", (), {"page_bytes": 4096})()  # (nothing is read: every chunk agrees)
    result = list_sweep.count_lists(memory, StillMemory(), walked)
    assert isinstance(result, list_sweep.SweepResult), result
    assert not result.corruption and not result.unmeasured
    assert result.figures[7][:2] == (0, 0)
    for number in used:
        count, total, *_, raw_min, raw_max, raw_total = result.figures[number]
        size = 16 * number
        assert (count, total) == (len(members[number]), size * len(members[number])), number
        assert (raw_min, raw_max, raw_total) == (size | 1, size | 1, (size | 1) * count)
