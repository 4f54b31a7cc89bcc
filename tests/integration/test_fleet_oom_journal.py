"""The OOM cursor against a real journal (built by systemd-journal-remote, read by the real
journalctl with --since from the cursor): a kill is counted once across runs, a later kill
in a new journal file adds one, and the counters only grow."""

from __future__ import annotations

import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from memforensics.entry.collect import OomSources, read_oom
from tests.integration.test_oom_journal import (
    BOOT_A,
    JOURNAL_REMOTE,
    T0,
    export_entry,
    need_journal_tools,
    real_6_18_incident,
)

pytestmark = pytest.mark.integration

KILL_AT = datetime.fromtimestamp(T0 / 1_000_000, tz=timezone.utc)


def write_journal_file(path: Path, start_usec: int) -> None:
    """One real journal file holding the real 6.18 memcg incident at ``start_usec``."""
    stream = b"".join(export_entry(e) for e in real_6_18_incident(BOOT_A, start_usec))
    subprocess.run(
        [JOURNAL_REMOTE, f"--output={path}", "--split-mode=none", "-"],
        input=stream,
        check=True,
        capture_output=True,
        timeout=60,
    )


def test_journal_kill_counted_once_across_runs(tmp_path: Path) -> None:
    need_journal_tools()
    journal = tmp_path / "journal"
    journal.mkdir()
    state = tmp_path / "state"
    sources = OomSources(journal_directory=str(journal))

    # Installed before the kill: the first run finds no journal yet and starts the cursor.
    baseline, notes = read_oom(state, sources, now=KILL_AT - timedelta(minutes=1))
    assert baseline.ok and baseline.baseline and baseline.counts == ()
    assert any("no journal files" in note for note in notes)
    write_journal_file(journal / "system.journal", T0)

    runs = [read_oom(state, sources, now=KILL_AT + timedelta(minutes=m))[0] for m in (2, 4, 6)]
    assert [r.new_kills for r in runs] == [1, 0, 0]
    for run in runs:
        assert [(e.key.process, e.key.scope, e.count) for e in run.counts] == [
            ("python3", "memcg", 1)
        ]

    # A second kill lands in another journal file of the same directory, 7 minutes later.
    write_journal_file(journal / "system@second.journal", T0 + 7 * 60 * 1_000_000)
    later, _ = read_oom(state, sources, now=KILL_AT + timedelta(minutes=9))
    again, _ = read_oom(state, sources, now=KILL_AT + timedelta(minutes=12))
    assert (later.new_kills, again.new_kills) == (1, 0)
    assert [(e.key.process, e.count) for e in again.counts] == [("python3", 2)]
    assert later.sources == (f"journal:{journal}",)
