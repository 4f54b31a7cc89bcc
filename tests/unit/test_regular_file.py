"""Paths a target names are hostile: a FIFO, a device, a symlink to either, another file of
the same name or a huge file put where the maps said a library was is refused on the open
descriptor, without blocking and without reading more than the file's size."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from memforensics.sources.proc import regular_file
from memforensics.sources.proc.binaries import scan_binary
from memforensics.sources.proc.regular_file import open_regular, read_regular

BANNER = b"GNU C Library (Debian GLIBC 2.36-9) stable release version 2.36.\n"


def _within(seconds: float, call: Callable[[], object]) -> object:
    """``call()`` in a thread, its result or its exception; fails the test if it has not
    returned in ``seconds`` (a blocking open of a FIFO would hang here)."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # handed to the test's thread
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked"
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "libc.so.6"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to(fifo)
    for path in (fifo, link):
        with pytest.raises(OSError):
            _within(5, lambda p=path: open_regular(p))
        assert _within(5, lambda p=path: scan_binary(p)) == (False, None)


def test_a_device_is_refused() -> None:
    with pytest.raises(OSError):
        read_regular("/dev/zero")
    assert scan_binary(Path("/dev/zero")) == (False, None)


def test_another_inode_is_refused_and_the_mapped_one_read(tmp_path: Path) -> None:
    libc = tmp_path / "libc.so.6"
    libc.write_bytes(b"\0" * 100 + BANNER)
    inode = libc.stat().st_ino
    assert read_regular(libc, inode=inode).endswith(BANNER)
    assert scan_binary(libc, inode=inode) == (True, "2.36")
    with pytest.raises(OSError):
        read_regular(libc, inode=inode + 1)
    assert scan_binary(libc, inode=inode + 1) == (False, None)


def test_a_file_past_the_size_bound_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = tmp_path / "big"
    with big.open("wb") as handle:
        handle.truncate(4096)
    monkeypatch.setattr(regular_file, "MAX_FILE_BYTES", 1024)
    with pytest.raises(OSError):
        read_regular(big)
