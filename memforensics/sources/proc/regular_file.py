"""Files a target names, opened as hostile input: never a FIFO (no blocking open), never a
device or /dev/zero (regular files only), never an unbounded read (at most the size fstat
gave, and at most MAX_FILE_BYTES), and, where the mapping's inode is known, only that file.

Between reading a target's maps and opening the path they name, the target (or its
container) can put a symlink, a FIFO or a device there, and a symlink followed through
/proc/PID/root resolves against our root, not the target's. What was opened is therefore
checked on the open descriptor (fstat), never on the path before the open.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_FILE_BYTES = 1 << 30  # no libc or executable is this big; a bigger "binary" is refused
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def open_regular(path: Path | str, *, inode: int | None = None) -> int:
    """A descriptor of the regular file at ``path`` (of inode ``inode`` when given), opened
    without blocking; OSError for anything else (the descriptor is closed then)."""
    fd = os.open(path, _FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(0, f"{path} is not a regular file")
        if inode is not None and st.st_ino != inode:
            raise OSError(0, f"{path} is not the mapped file (inode {st.st_ino}, not {inode})")
        if st.st_size > MAX_FILE_BYTES:
            raise OSError(0, f"{path} is larger than {MAX_FILE_BYTES} bytes")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: Path | str, *, inode: int | None = None) -> bytes:
    """The whole regular file at ``path`` (see open_regular), read up to the size fstat
    gave: a file growing meanwhile is not followed."""
    fd = open_regular(path, inode=inode)
    try:
        size = os.fstat(fd).st_size
        parts: list[bytes] = []
        done = 0
        while done < size:
            piece = os.read(fd, min(size - done, 16 << 20))
            if not piece:
                break
            parts.append(piece)
            done += len(piece)
        return b"".join(parts)
    finally:
        os.close(fd)
