"""Held-out heaps of the seeds' shape (issue 31): a seeds_heap shape drawn from a seed, so that a
test or benchmark reads a heap no read was tuned on (tests/targets/seeds_heap.c's SEEDS_SEED,
SEEDS_SMALL_FREES and SEEDS_SMALL_PERCENT)."""

from __future__ import annotations

import os
import random
import secrets
from dataclasses import dataclass

HEAP_MAX_MIB = 2560  # a held-out heap's thread arenas together, at most
SEED_VARIABLE = "MEMFORENSICS_HELD_OUT_SEED"


@dataclass(frozen=True)
class HeldOut:
    """One held-out seeds shape: ``threads`` thread arenas of ``mib_per_arena`` MiB (4-10 of
    100 MiB to 1 GiB, at most HEAP_MAX_MIB in all), about ``small_frees`` small chunks freed
    in each (1,000-9,000), ``small_percent`` of its bytes in small blocks (10-40), the sizes
    in the order ``seed`` gives."""

    seed: int
    threads: int
    mib_per_arena: int
    small_frees: int
    small_percent: int

    @classmethod
    def drawn(cls, seed: int) -> HeldOut:
        """The shape of ``seed``: the same seed, the same shape and heap."""
        draw = random.Random(seed)
        threads = draw.randint(4, 10)
        return cls(
            seed=seed,
            threads=threads,
            mib_per_arena=draw.randint(100, min(1024, HEAP_MAX_MIB // threads)),
            small_frees=draw.randint(1000, 9000),
            small_percent=draw.randint(10, 40),
        )

    @classmethod
    def of_session(cls) -> HeldOut:
        """The shape of $MEMFORENSICS_HELD_OUT_SEED, else of a seed drawn now and put there
        (every later call of this process, and the session's summary, name the same)."""
        if not os.environ.get(SEED_VARIABLE):
            os.environ[SEED_VARIABLE] = str(secrets.randbits(32))
        return cls.drawn(int(os.environ[SEED_VARIABLE]))

    def args(self, *, busy: bool) -> list[str]:
        """seeds_heap's arguments (its XML path not included)."""
        return [str(self.threads), str(self.mib_per_arena), "1" if busy else "0"]

    def env(self) -> dict[str, str]:
        """What seeds_heap's environment adds for this shape."""
        return {
            "SEEDS_SEED": str(self.seed),
            "SEEDS_SMALL_FREES": str(self.small_frees),
            "SEEDS_SMALL_PERCENT": str(self.small_percent),
        }

    def __str__(self) -> str:
        return (
            f"held-out shape ({SEED_VARIABLE}={self.seed}): {self.threads} arenas of "
            f"{self.mib_per_arena} MiB, ~{self.small_frees} small frees each, "
            f"{self.small_percent}% small"
        )
