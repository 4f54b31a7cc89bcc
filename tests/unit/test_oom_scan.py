"""The default scan (memforensics.entry.oomscan.scan_default) on a host without journal files: the
syslog files, rotated and compressed, oldest first; a kill in two files reported once; what
was searched named in the result."""

from __future__ import annotations

import gzip
import lzma
import time
from pathlib import Path

import pytest

from memforensics.entry.oomscan import scan_default, syslog_files
from memforensics.render.oom import describe_sources

OOM = Path(__file__).resolve().parent.parent.parent / "fixtures" / "oom"


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()


@pytest.fixture
def var_log(tmp_path: Path) -> Path:
    """A /var/log as Debian's rsyslog leaves it: kern.log and syslog carry the same kernel
    lines; older weeks rotated and compressed."""
    log = tmp_path / "log"
    log.mkdir()
    recent = (OOM / "handmade-k8s-cgroup-paths.log").read_bytes()
    (log / "kern.log").write_bytes(recent)
    (log / "syslog").write_bytes(recent)  # the same kernel lines: reported once
    (log / "kern.log.1").write_bytes((OOM / "reportportal-203-5.4-uwsgi.log").read_bytes())
    (log / "kern.log.2.gz").write_bytes(
        gzip.compress((OOM / "lkml-5.0-rc-oom-group-kills-init.log").read_bytes())
    )
    (log / "messages-20240101.xz").write_bytes(
        lzma.compress((OOM / "cadvisor-4.8-docker.log").read_bytes())
    )
    (log / "kern.log.lock").write_text("")  # not a log
    (log / "auth.log").write_text("Killed process 1 (not a kernel log we read)\n")
    return log


def test_syslog_files_oldest_first(var_log: Path) -> None:
    names = [path.name for path in syslog_files(str(var_log))]
    assert names == ["kern.log.2.gz", "kern.log.1", "kern.log", "syslog", "messages-20240101.xz"]


def test_default_scan_without_journal_files(var_log: Path, tmp_path: Path) -> None:
    empty_journal = tmp_path / "journal"
    empty_journal.mkdir()
    missing_kmsg = tmp_path / "no-kmsg"
    result = scan_default(
        journal_dirs=(str(empty_journal),), log_dir=str(var_log), kmsg_path=str(missing_kmsg)
    )
    # 12 group members + 1 uwsgi + 8 container kills + 2 Docker kills; syslog's copies merged.
    assert len(result.events) == 23
    assert [e.pid for e in result.events].count(50624) == 1
    assert result.sources == tuple(
        str(var_log / name)
        for name in ("kern.log.2.gz", "kern.log.1", "kern.log", "syslog", "messages-20240101.xz")
    )
    assert f"no journal files in {empty_journal}" in result.notes
    assert any(str(missing_kmsg) in note and "does not exist" in note for note in result.notes)
    assert "8 kill(s) found in more than one source, reported once" in result.notes
    assert describe_sources(result.sources) == (
        f"{var_log}/kern.log (+2 rotated), {var_log}/syslog, {var_log}/messages-20240101.xz"
    )


def test_nothing_found_names_what_was_searched(tmp_path: Path) -> None:
    result = scan_default(
        journal_dirs=(str(tmp_path),), log_dir=str(tmp_path), kmsg_path=str(tmp_path / "kmsg")
    )
    assert result.events == () and result.sources == ()
    assert result.notes[0] == f"no journal files in {tmp_path}"
    assert f"no readable kern.log*, syslog*, messages* in {tmp_path}" in result.notes


def test_time_window_applies_to_every_source(var_log: Path, tmp_path: Path) -> None:
    from datetime import datetime, timezone

    result = scan_default(
        since=datetime(2020, 1, 1, tzinfo=timezone.utc),
        journal_dirs=(str(tmp_path),),
        log_dir=str(var_log),
        kmsg_path=str(tmp_path / "kmsg"),
    )
    # These files carry uptimes only: no wall-clock time to place them, so none is shown
    # and the notes say how many were left out.
    assert result.events == ()
    assert any("without a wall-clock time" in note for note in result.notes)
