"""Files written whole or not at all: a temporary file beside the target, fsync, rename."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from memforensics.errors import ToolingError


def write_atomically(
    path: Path, data: bytes, *, hint: str | None = None, mode: int = 0o644
) -> None:
    """Replace ``path`` with ``data``: a reader sees the old file or the new one, never half.

    The temporary file lives in the same directory (a rename across filesystems is not
    atomic) under an unpredictable name; on failure it is removed and ToolingError says why.
    """
    # (Imported here: tempfile pulls in shutil, random and the compression modules, ~7 ms of
    # every command's start-up, and most runs write nothing.)
    import tempfile

    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise ToolingError(f"cannot write {path}: {exc.strerror}", hint=hint) from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise ToolingError(f"cannot write {path}: {exc.strerror}", hint=hint) from exc
