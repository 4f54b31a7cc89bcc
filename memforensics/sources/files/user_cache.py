"""This user's cache folder for memforensics, and its files read and written so that no one
else can have put in them what the program trusts.

Contract: ``read_private`` returns a file's bytes only when it is a regular file of this
user's that no one else may write, in a folder no one else may write; ``write_private``
replaces a file whole or not at all (atomic_file's write, mode 0600), and a
cache that cannot be written is no error.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from memforensics.errors import ToolingError
from memforensics.sources.files.atomic_file import write_atomically


def cache_folder() -> Path:
    """``$XDG_CACHE_HOME/memforensics``, else ``~/.cache/memforensics`` (not created here)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "memforensics"


def private(info: os.stat_result) -> bool:
    """Owned by this user and writable by no one else."""
    return info.st_uid == os.geteuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def read_private(path: Path, max_bytes: int) -> bytes | None:
    """The bytes of ``path``; None where it is missing, not a regular file, bigger than
    ``max_bytes``, or not this user's alone (the file or its folder)."""
    try:
        with open(path, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
                return None
            if not (private(info) and private(os.stat(path.parent))):
                return None
            data = handle.read(max_bytes + 1)
    except OSError:
        return None
    return data if len(data) <= max_bytes else None


def write_private(path: Path, data: bytes) -> bool:
    """Replace ``path`` with ``data`` (its folder made, mode 0700, where missing): whole or
    not at all (atomic_file), readable by this user alone. False where it could not be
    written."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomically(path, data, mode=0o600)
    except (OSError, ValueError, ToolingError):
        return False
    return True
