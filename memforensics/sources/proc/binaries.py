"""Which glibc a binary file carries: the banner of libc.so, the malloc tunables of a static
glibc, read once per file identity."""

from __future__ import annotations

import mmap
import os
import re
from pathlib import Path

from memforensics.sources.proc.regular_file import open_regular

# glibc embeds this banner in libc.so (csu/version.c); it is how a stripped libc tells its version.
_GLIBC_BANNER_RE = re.compile(rb"GNU C Library [^\n\0]*?release version (\d+\.\d+(?:\.\d+)?)")
_GLIBC_TUNABLE_MARK = b"glibc.malloc."
_scan_cache: dict[tuple[int, int, int], tuple[bool, str | None]] = {}


def scan_binary(path: Path, *, inode: int | None = None) -> tuple[bool, str | None]:
    """(has glibc inside, its version) for a binary, cached by file identity.

    libc.so carries glibc's banner; a static binary usually does not, but still names
    glibc's malloc tunables ("glibc.malloc.") which no other libc has. ``inode``: the
    mapping's, when the file is a mapped one (any other file is not read).
    """
    # A path a target names: opened as hostile input (regular_file: no FIFO, no device, a
    # bounded size), and identified by the descriptor, not by a stat of the path before.
    try:
        fd = open_regular(path, inode=inode)
    except OSError:
        return False, None
    try:
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino, st.st_mtime_ns)
        if key in _scan_cache:
            return _scan_cache[key]
        found: tuple[bool, str | None] = (False, None)
        try:
            with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as mem:
                match = _GLIBC_BANNER_RE.search(mem)
                if match:
                    found = (True, match.group(1).decode())
                elif mem.find(_GLIBC_TUNABLE_MARK) >= 0:
                    found = (True, None)
        except (OSError, ValueError):
            pass
        _scan_cache[key] = found
        return found
    finally:
        os.close(fd)


def glibc_banner_version(path: Path) -> str | None:
    """The glibc release ("2.36") named by the banner in the libc or binary at ``path``."""
    return scan_binary(path)[1]
