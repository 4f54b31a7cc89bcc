"""The byte search of a saved log, started in a child process before the command is imported.

`oom --file LOG` spends ~80 ms importing click and its modules and ~90 ms searching LOG's
bytes (logprefilter.candidate_spans), each on one core. ``start`` forks a child that runs the
same search over its own mapping of the file while the parent imports; the child sends the
spans back through a pipe as 64-bit integers and exits. ``take`` hands them to the reader
(logfile._mapped_records) when it opens the same file (same device, inode, size and mtime);
anything else, or a child that failed, and the reader searches itself, as without this.

This module imports the standard library and logprefilter only: it runs first.
"""

from __future__ import annotations

import array
import contextlib
import mmap
import os
import stat
from collections.abc import Callable, Iterator
from typing import NamedTuple

from memforensics.sources.logs.logprefilter import LOOKBACK_BYTES, candidate_spans

# Same as logfile's: the mapped file is searched this many bytes at a time and released
# behind the search (the child's memory stays flat too).
WINDOW_BYTES = 16 << 20
_HEAD_BYTES = 1 << 16
# Inputs the reader does not map and search as they are: compressed, binary journal files.
_NOT_PLAIN = (b"\x1f\x8b", b"\xfd7zXZ\x00", b"BZh", b"\x28\xb5\x2f\xfd", b"LPKSHHRH")
_DONE = -1  # the child's last pair is (_DONE, _DONE): it searched the whole file


class _Identity(NamedTuple):
    device: int
    inode: int
    size: int
    mtime_ns: int


def identity(info: os.stat_result) -> tuple[int, int, int, int]:
    """What says two opens saw the same file, unchanged."""
    return _Identity(info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


class _Search:
    def __init__(self, pid: int, reader: int, ident: tuple[int, int, int, int]) -> None:
        self.pid = pid
        self.reader = reader
        self.identity = ident


_searches: dict[str, _Search] = {}


def start(path: str) -> None:
    """Fork a child that searches ``path`` (a plain regular file) for candidate lines."""
    if not hasattr(os, "fork") or path in _searches:
        return
    try:
        info = os.stat(path)
    except OSError:
        return
    if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
        return
    reader, writer = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(reader)
        os.close(writer)
        return
    if pid == 0:  # the child: search, send, exit without running any cleanup of the parent's
        code = 1
        try:
            os.close(reader)
            code = _search_into(path, identity(info), writer)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(writer)
    _searches[path] = _Search(pid, reader, identity(info))


def _search_into(path: str, expected: tuple[int, int, int, int], writer: int) -> int:
    with open(path, "rb", buffering=0) as handle:
        if identity(os.fstat(handle.fileno())) != expected:
            return 1
        head = os.pread(handle.fileno(), _HEAD_BYTES, 0)
        if head.startswith(_NOT_PLAIN) or b"\x00" in head:
            return 1
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            released = 0
            found = array.array("q")

            def next_window(offset: int) -> None:
                # Everything before ``offset`` is found: send it, and drop the pages behind.
                nonlocal released
                _send(writer, found)
                del found[:]
                upto = (offset - LOOKBACK_BYTES - _HEAD_BYTES) // mmap.PAGESIZE * mmap.PAGESIZE
                if upto > released and hasattr(mmap, "MADV_DONTNEED"):
                    with contextlib.suppress(OSError, ValueError):
                        mapped.madvise(mmap.MADV_DONTNEED, released, upto - released)
                    released = upto

            for line_start, line_end in candidate_spans(
                mapped, 0, len(mapped), 0, window=WINDOW_BYTES, on_window=next_window
            ):
                found.append(line_start)
                found.append(line_end)
    found.extend((_DONE, _DONE))
    _send(writer, found)
    os.close(writer)
    return 0


def _send(writer: int, found: array.array[int]) -> None:
    data = memoryview(found.tobytes())
    while data:
        data = data[os.write(writer, data) :]


def take(
    path: str, info: os.stat_result, search_here: Callable[[], Iterator[tuple[int, int]]]
) -> Iterator[tuple[int, int]]:
    """The spans of ``path``: as the child finds them, if it searches this very file; else
    from ``search_here()``. Should the child fail midway, ``search_here()`` finds the rest."""
    search = _searches.pop(path, None)
    if search is None:
        return search_here()
    if search.identity != identity(info):
        _end(search)
        return search_here()
    return _received(search, search_here)


def _received(
    search: _Search, search_here: Callable[[], Iterator[tuple[int, int]]]
) -> Iterator[tuple[int, int]]:
    rest = b""
    done = False
    last_end = -1
    with open(search.reader, "rb", buffering=0, closefd=True) as pipe:
        while not done and (block := pipe.read(1 << 20)):
            data = rest + block
            cut = len(data) // 16 * 16
            rest = data[cut:]
            found = array.array("q")
            found.frombytes(data[:cut])
            pairs = iter(found)
            for line_start, line_end in zip(pairs, pairs, strict=True):
                if line_start == _DONE:
                    done = True
                    break
                last_end = line_end
                yield line_start, line_end
    with contextlib.suppress(OSError):
        os.waitpid(search.pid, 0)
    if not done:
        for span in search_here():
            if span[0] > last_end:
                yield span


def _end(search: _Search) -> None:
    os.close(search.reader)  # the child's next write fails: it exits
    with contextlib.suppress(OSError):
        os.waitpid(search.pid, 0)
