"""This user's cache folder for memforensics: what the program keeps between runs."""

from __future__ import annotations

import os
from pathlib import Path


def cache_folder() -> Path:
    """``$XDG_CACHE_HOME/memforensics``, else ``~/.cache/memforensics`` (not created here)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "memforensics"
