"""The orders the per-arena table can be sorted in, importable without the renderer itself."""

from __future__ import annotations

from typing import Literal

SortKey = Literal["free", "in-use", "system", "index"]
SORT_KEYS: tuple[SortKey, ...] = ("free", "in-use", "system", "index")
