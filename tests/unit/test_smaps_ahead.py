"""smaps_ahead: /proc/PID/smaps read in a thread before the command is imported, taken once by
the scan's reader of the same process, and only while fresh."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from memforensics.errors import NoSuchProcessError
from memforensics.sources.proc import procmaps, smaps_ahead


def _drop_untaken() -> None:
    """Forget a read ahead no test took, closing its pidfd."""
    if smaps_ahead._ahead is not None:
        smaps_ahead._ahead.thread.join()
        os.close(smaps_ahead._ahead.pidfd)
        smaps_ahead._ahead = None


@pytest.fixture
def sleeper() -> Iterator[int]:
    """A process whose mappings do not change while it sleeps."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print(1, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline()
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
        _drop_untaken()


def _no_reads(pid: int, name: str) -> str:
    raise AssertionError(f"/proc/{pid}/{name} read again")


def test_the_scan_takes_the_text_read_ahead_once_and_it_is_the_kernels(
    sleeper: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = procmaps.read_smaps_and_totals(sleeper)
    smaps_ahead.start(sleeper)
    with monkeypatch.context() as patched:
        patched.setattr(procmaps, "_read_proc_text", _no_reads)
        mappings, totals = procmaps.read_smaps_and_totals(sleeper)
        # Taken once: the next read is the reader's own.
        with pytest.raises(AssertionError, match="read again"):
            procmaps.read_smaps_and_totals(sleeper)
    assert [(m.start_address, m.end_address, m.path) for m in mappings] == [
        (m.start_address, m.end_address, m.path) for m in expected[0]
    ]
    assert totals.keys() == expected[1].keys()
    assert totals["Rss"] > 0


def test_a_text_read_ahead_goes_only_to_its_own_process(sleeper: int) -> None:
    smaps_ahead.start(sleeper)
    assert smaps_ahead.take(sleeper + 1) is None
    text = smaps_ahead.take(sleeper)  # still there for its own
    assert text is not None and "Rss:" in text


def test_a_text_too_old_or_of_a_process_that_exited_since_is_not_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        monkeypatch.setattr(smaps_ahead, "MAX_AGE_SECONDS", 0.0)
        smaps_ahead.start(proc.pid)
        assert smaps_ahead.take(proc.pid) is None
        monkeypatch.setattr(smaps_ahead, "MAX_AGE_SECONDS", 60.0)
        smaps_ahead.start(proc.pid)
        assert smaps_ahead._ahead is not None
        smaps_ahead._ahead.thread.join()
        # The process exits after the read (its PID may then name another): not taken.
        proc.kill()
        proc.wait()
        assert smaps_ahead.take(proc.pid) is None
    finally:
        proc.kill()
        proc.wait()
        _drop_untaken()


def test_nothing_is_read_ahead_for_a_process_that_is_not_there() -> None:
    smaps_ahead.start(999_999_999)
    assert smaps_ahead._ahead is None
    with pytest.raises(NoSuchProcessError):
        procmaps.read_smaps_and_totals(999_999_999)
