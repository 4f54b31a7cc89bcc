"""heap_lists.fast_chunks: a fastbin followed to its end says so; one cut short by its chunk
or time bound says it is not complete (heap_chunks then notes that fast chunks count live)."""

from __future__ import annotations

from memforensics.model import glibc
from memforensics.sources.glibc import heap_lists
from memforensics.sources.glibc.glibc_arenas import ArenaState

_BASE = 0x5555_0000_0000
_SIZE = 0x20  # fastbin 0


def _list(count: int, *, safe_linked: bool) -> tuple[dict[int, bytes], int]:
    """``count`` chunks of fastbin 0, each 0x20 bytes apart, linked first to last."""
    chunks = [_BASE + 0x1000 + i * _SIZE for i in range(count)]
    words: dict[int, bytes] = {}
    for i, chunk in enumerate(chunks):
        following = chunks[i + 1] if i + 1 < count else 0
        if safe_linked:
            following ^= (chunk + 16) >> 12
        words[chunk] = (
            (0).to_bytes(8, "little")
            + (_SIZE | 1).to_bytes(8, "little")
            + following.to_bytes(8, "little")
        )
    return words, chunks[0]


def _state(head: int) -> ArenaState:
    return ArenaState(
        address=_BASE,
        top=0,
        next_arena=_BASE,
        system_bytes=0,
        bins=(0,) * 254,
        fastbins=(head,) + (0,) * (glibc.NFASTBINS - 1),
    )


def _follow(count: int, **kwargs: float) -> tuple[set[int], bool]:
    words, head = _list(count, safe_linked=True)
    return heap_lists.fast_chunks(
        None,  # type: ignore[arg-type]  # every read goes through ``read``
        _state(head),
        _BASE,
        _BASE + (1 << 24),
        read=words.get,
        **kwargs,
    )


def test_a_list_followed_to_its_end_is_complete() -> None:
    found, complete = _follow(500)
    assert complete and len(found) == 500


def test_a_list_cut_by_the_time_bound_is_not_complete() -> None:
    found, complete = _follow(500, seconds=-1.0)
    assert not complete and 0 < len(found) < 500


def test_a_list_cut_by_the_chunk_bound_is_not_complete(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(heap_lists, "FASTBIN_MAX_CHUNKS", 100)
    found, complete = _follow(500)
    assert not complete and len(found) == 100
