"""gdb started lean (gdb_spawn), the scan in a worker thread, what a session leaves."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from memforensics.entry.readers.gdb_scan import BackgroundScan
from memforensics.errors import GdbUnavailableError, NoSuchProcessError
from memforensics.sources.gdb import gdb_spawn
from memforensics.sources.gdb.gdb_capture import capture_malloc_info
from memforensics.sources.gdb.gdb_setup import SIGNALS_FILE
from memforensics.sources.glibc.heapmaps import scan_heap
from memforensics.sources.malloc_info.malloc_xml import parse_dump
from tests.support.targets import c_target, live_skip_reason

_SKIP = live_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]


def _private_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("memforensics-gdb-*")}


def _fake_gdb(prefix: Path, *, python: bool) -> Path:
    """A gdb installed under ``prefix`` as Debian lays one out (bin/gdb, share/gdb/…)."""
    fake = prefix / "bin" / "gdb"
    fake.parent.mkdir(parents=True)
    shutil.copy("/bin/true", fake)  # a file of its own: realpath stays under prefix
    data = prefix / "share" / "gdb"
    (data / "syscalls").mkdir(parents=True)
    (data / "system-gdbinit").mkdir()
    if python:
        (data / "python" / "gdb").mkdir(parents=True)
        (data / "python" / "gdb" / "__init__.py").write_text("")
    return fake


def test_lean_data_directory_is_gdbs_own_minus_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built once in this user's cache, reused, and rebuilt when it does not match."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for gdb in ("/usr/bin/gdb", str(_fake_gdb(tmp_path / "prefix", python=True))):
        installed = Path(os.path.realpath(gdb)).parent.parent / "share" / "gdb"
        lean = gdb_spawn.lean_data_directory(gdb)
        assert lean is not None and lean.startswith(str(tmp_path / "cache"))
        entries = {entry.name for entry in os.scandir(lean)}
        wanted = {entry.name for entry in os.scandir(installed)} - {"python"}
        assert entries == wanted | {SIGNALS_FILE}
        assert all(
            os.readlink(os.path.join(lean, name)) == str(installed / name) for name in wanted
        )
        assert gdb_spawn.gdb_argv(gdb, lean)[-1] == f"--data-directory={lean}"
        assert gdb_spawn.lean_data_directory(gdb) == lean  # reused as it is
        os.unlink(os.path.join(lean, SIGNALS_FILE))
        assert gdb_spawn.lean_data_directory(gdb) == lean  # mended
        assert os.path.isfile(os.path.join(lean, SIGNALS_FILE))
    assert not [p for p in (tmp_path / "cache" / "memforensics").iterdir() if p.name[0] == "."]


def test_a_custom_gdb_without_a_data_directory_starts_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gdb whose prefix holds no share/gdb/python/gdb package gets no data directory."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fake = _fake_gdb(tmp_path / "prefix", python=False)
    assert gdb_spawn.lean_data_directory(str(fake)) is None
    assert gdb_spawn.gdb_argv(str(fake), None) == [str(fake), "-nx", "-nh", "-q", "-i=mi"]


def test_a_killed_build_of_the_cache_leaves_nothing_a_later_run_trips_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run SIGKILLed while building leaves a hidden half-built folder, never a half-built
    cache: the next run builds its own and uses it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fake = _fake_gdb(tmp_path / "prefix", python=True)
    half = tmp_path / "cache" / "memforensics" / ".building-killed"
    half.mkdir(parents=True)
    (half / "syscalls").symlink_to(tmp_path / "prefix" / "share" / "gdb" / "syscalls")
    lean = gdb_spawn.lean_data_directory(str(fake))
    assert lean is not None and Path(lean).name.startswith("gdb-data-")


def _gdb_children() -> list[int]:
    """Our child processes named gdb (one that exits while looked at is not counted)."""
    found = []
    for child in psutil.Process().children():
        try:
            if "gdb" in child.name():
                found.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return found


def test_a_sessions_gdb_ends_with_it_and_nothing_is_left_behind() -> None:
    before = _private_dirs()
    with c_target("idle_arenas", "4") as target:
        capture = capture_malloc_info(target.pid, timeout_seconds=20)
        assert len(parse_dump(capture.xml).arenas) >= 4
        assert target.alive()
        # gdb exits in the background after the clean detach, and is reaped there.
        deadline = time.monotonic() + 5.0
        while _gdb_children():
            assert time.monotonic() < deadline, "gdb still running after the session"
            time.sleep(0.02)
    assert _private_dirs() == before  # no folder of its own in /tmp


def test_without_a_gdb_the_session_says_why() -> None:
    with pytest.raises(GdbUnavailableError, match="/nonexistent/gdb"):
        gdb_spawn.start_gdb(gdb_spawn.find_gdb("/nonexistent/gdb"))


def test_background_scan_gives_the_scan_or_its_error() -> None:
    with c_target("idle_arenas", "4") as target:
        in_thread = BackgroundScan(target.pid, libc_path=None).result()
        direct = scan_heap(target.pid)
        assert len(in_thread.arenas) == len(direct.arenas) >= 4
        assert in_thread.page_bytes == direct.page_bytes
    with pytest.raises(NoSuchProcessError):
        BackgroundScan(target.pid, libc_path=None).result()  # gone now
