"""The OOM cursor: a kill counted once across runs, counters that only grow, atomic state.

Kills come from real kernel log text (the 5.x memcg summary + victim lines, in syslog's ISO
format) read through the same sources collect uses, not from hand-built events.
"""

from __future__ import annotations

import itertools
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from memforensics.entry.collect import OomSources, read_oom
from memforensics.entry.collect_state import (
    LOCK_FILE,
    OVERLAP,
    STATE_FILE,
    CollectState,
    load_state,
    save_state,
    state_lock,
)
from memforensics.errors import ToolingError
from memforensics.model.collect import OomKillCount

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=timezone.utc)
CID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
POD = "1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d"
MEMCG = (
    f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice"
)


def memcg_kill(at: datetime, pid: int, name: str) -> str:
    stamp = at.strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")
    later = (at + timedelta(microseconds=100)).strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")
    return (
        f"{stamp} node1 kernel: oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),"
        f"cpuset=cri-containerd-{CID}.scope,mems_allowed=0,oom_memcg={MEMCG},"
        f"task_memcg={MEMCG}/cri-containerd-{CID}.scope,task={name},pid={pid},uid=0\n"
        f"{later} node1 kernel: Memory cgroup out of memory: Killed process {pid} ({name}) "
        "total-vm:32812kB, anon-rss:23856kB, file-rss:1700kB, shmem-rss:0kB, UID:0 "
        "pgtables:112kB oom_score_adj:994\n"
    )


def global_kill(at: datetime, pid: int, name: str) -> str:
    stamp = at.strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")
    return (
        f"{stamp} node1 kernel: Out of memory: Killed process {pid} ({name}) "
        "total-vm:8000000kB, anon-rss:6000000kB, file-rss:1000kB, shmem-rss:0kB, UID:1000 "
        "pgtables:12000kB oom_score_adj:0\n"
    )


def counts(entries: tuple[OomKillCount, ...]) -> dict[tuple[str, str, str, str], int]:
    return {
        (e.key.process, e.key.scope, e.key.pod_uid, e.key.container_id): e.count for e in entries
    }


def test_a_kill_is_counted_once_and_counters_only_grow(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    state = tmp_path / "state"
    sources = OomSources(files=(str(log),))
    # A kill before the first run is history: the first run only starts the cursor.
    log.write_text(global_kill(T0 - timedelta(hours=1), 100, "java"))
    first, _ = read_oom(state, sources, now=T0)
    assert first.ok and first.baseline and first.new_kills == 0 and first.counts == ()

    with log.open("a") as handle:
        handle.write(memcg_kill(T0 + timedelta(minutes=2), 966, "manager"))
        handle.write(global_kill(T0 + timedelta(minutes=3), 101, "java"))
    second, _ = read_oom(state, sources, now=T0 + timedelta(minutes=5))
    assert second.new_kills == 2
    assert counts(second.counts) == {
        ("manager", "memcg", POD, CID): 1,
        ("java", "global", "", ""): 1,
    }

    # Same log again, later: nothing new, nothing recounted.
    third, _ = read_oom(state, sources, now=T0 + timedelta(minutes=10))
    assert third.new_kills == 0
    assert counts(third.counts) == counts(second.counts)

    # A late line dated before the previous run (within the overlap) still counts, once.
    with log.open("a") as handle:
        handle.write(global_kill(T0 + timedelta(minutes=9), 102, "java"))
    fourth, _ = read_oom(state, sources, now=T0 + timedelta(minutes=15))
    fifth, _ = read_oom(state, sources, now=T0 + timedelta(minutes=20))
    assert (fourth.new_kills, fifth.new_kills) == (1, 0)
    assert counts(fifth.counts)[("java", "global", "", "")] == 2

    history = [counts(r.counts) for r in (second, third, fourth, fifth)]
    for before, after in itertools.pairwise(history):
        assert all(after.get(key, 0) >= value for key, value in before.items())


def test_kills_older_than_the_overlap_are_not_recounted(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    state = tmp_path / "state"
    sources = OomSources(files=(str(log),))
    log.write_text("")
    read_oom(state, sources, now=T0)
    log.write_text(global_kill(T0 + timedelta(minutes=1), 7, "worker"))
    read_oom(state, sources, now=T0 + timedelta(minutes=2))
    # Hours later, the seen-keys window has moved on; the old kill is before the cursor.
    later, _ = read_oom(state, sources, now=T0 + OVERLAP * 10)
    assert later.new_kills == 0
    assert counts(later.counts) == {("worker", "global", "", ""): 1}
    saved = json.loads((state / STATE_FILE).read_text())
    assert saved["oom"]["seen_keys"] == []


def test_unreadable_log_keeps_counts_and_is_reported(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    state = tmp_path / "state"
    log.write_text("")
    read_oom(state, OomSources(files=(str(log),)), now=T0)
    log.write_text(global_kill(T0 + timedelta(minutes=1), 7, "worker"))
    read_oom(state, OomSources(files=(str(log),)), now=T0 + timedelta(minutes=2))
    broken, _ = read_oom(
        state, OomSources(files=(str(tmp_path / "missing.log"),)), now=T0 + timedelta(minutes=4)
    )
    assert not broken.ok and broken.error
    assert counts(broken.counts) == {("worker", "global", "", ""): 1}


def test_corrupt_state_is_moved_aside_and_counting_restarts(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).write_text("{not json")
    state, note = load_state(tmp_path)
    assert state.cursor is None and note and "unreadable" in note
    assert (tmp_path / f"{STATE_FILE}.corrupt").read_text() == "{not json"
    assert not (tmp_path / STATE_FILE).exists()


def test_state_round_trips_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    state_dir = tmp_path / "state"
    read_oom(state_dir, OomSources(files=(str(log),)), now=T0)
    log.write_text(memcg_kill(T0 + timedelta(minutes=1), 966, "manager"))
    read_oom(state_dir, OomSources(files=(str(log),)), now=T0 + timedelta(minutes=2))
    assert sorted(p.name for p in state_dir.iterdir()) == sorted([LOCK_FILE, STATE_FILE])
    loaded, note = load_state(state_dir)
    assert note is None
    save_state(state_dir, loaded)
    again, _ = load_state(state_dir)
    assert again == loaded
    assert isinstance(again, CollectState)


def test_first_run_counts_only_kills_after_it(tmp_path: Path) -> None:
    """History before the first run is not counted; a kill logged after its start is."""
    log = tmp_path / "kern.log"
    log.write_text(
        global_kill(T0 - timedelta(minutes=30), 1, "old")
        + global_kill(T0 + timedelta(seconds=5), 2, "new")
    )
    first, _ = read_oom(tmp_path / "state", OomSources(files=(str(log),)), now=T0)
    assert first.baseline and first.new_kills == 1
    assert counts(first.counts) == {("new", "global", "", ""): 1}
    second, _ = read_oom(tmp_path / "state", OomSources(files=(str(log),)), now=T0 + OVERLAP)
    assert second.new_kills == 0


def test_a_second_run_waits_for_the_state_lock(tmp_path: Path) -> None:
    """Two runs at once (the timer and a manual one) must not both read-modify-write."""
    second = state_lock(tmp_path, timeout_seconds=0.2)
    with state_lock(tmp_path), pytest.raises(ToolingError, match="another collect run"):
        second.__enter__()
    with state_lock(tmp_path, timeout_seconds=0.2):
        pass  # released when the first holder left
