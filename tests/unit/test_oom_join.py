"""An OOM kill joined to the heap it died with (analysis/oom_join.py, entry/oomjoin.py, the
`oom --recording` / `--state-dir` options and `report`), on synthetic samples and kills; and
a partial memcg-v1 record without its Killed line keeping the victim's uid and
oom_score_adj from the task table."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from memforensics.analysis.oom_join import join_kill, last_sample_before
from memforensics.analysis.oom_select import scan
from memforensics.cli import cli
from memforensics.entry.collect_heap import HEAP_FILE, kept, read_heap_samples
from memforensics.entry.collect_heap import update_heap_samples as save_heap
from memforensics.model.collect import ContainerIdentity, TargetFigures, TargetResult
from memforensics.model.series import Sample, SeriesEvent
from memforensics.sources.logs.logfile import read_text_log
from tests.support.schema import missing_keys
from tests.support.timezone import pinned_timezone

GiB = 1 << 30
MiB = 1 << 20
KILLED = datetime(2024, 5, 9, 14, 52, 38, tzinfo=timezone.utc)
KILL_LINE = (
    "2024-05-09T14:52:38+0000 node kernel: Memory cgroup out of memory: Killed process 4242 "
    "(worker) total-vm:16777216kB, anon-rss:14784921kB, file-rss:1024kB, shmem-rss:0kB, "
    "UID:1000 pgtables:1024kB oom_score_adj:0\n"
)
OOM = Path(__file__).resolve().parent.parent.parent / "fixtures" / "oom"


@pytest.fixture(autouse=True)
def utc() -> Iterator[None]:
    with pinned_timezone("UTC"):
        yield


def heap(
    seconds_before: float, *, free: int, in_use: int, pid: int = 4242, name: str = "worker"
) -> Sample:
    return Sample(
        kind="heap",
        time=KILLED - timedelta(seconds=seconds_before),
        pid=pid,
        process=name,
        rss_bytes=in_use + free,
        totals={
            "in_use_bytes": in_use,
            "free_bytes": free,
            "system_bytes": in_use + free,
            "arenas": 64,
        },
    )


def fragmenting() -> list[Sample]:
    """In use flat at 3 GiB, free growing to 11 GiB: fragmentation; the last 40 s before."""
    return [
        heap(40 + 60 * (5 - step), free=int((6 + step) * GiB), in_use=3 * GiB) for step in range(6)
    ]


def test_the_last_sample_before_the_kill_is_joined_with_the_verdict() -> None:
    samples = fragmenting()
    joined = join_kill(
        samples,
        pid=4242,
        process="worker",
        killed=KILLED,
        anon_rss_bytes=int(14.1 * GiB),
        source="rec.jsonl",
    )
    assert joined is not None
    assert joined.sample is samples[-1]
    assert joined.seconds_before == 40
    assert joined.verdict == "free-growing"
    assert joined.sentence == (
        "killed at anon-rss 14.1 GiB; 40 s before: 11.0 GiB free in 64 arenas, "
        "in use flat: fragmentation, not a leak"
    )


def test_a_sample_older_than_an_hour_is_not_joined() -> None:
    old = [heap(3601, free=GiB, in_use=GiB)]
    assert last_sample_before(old, pid=4242, process="worker", killed=KILLED) is None
    assert last_sample_before(old[:0], pid=4242, process="worker", killed=KILLED) is None


def test_a_sample_after_the_kill_or_a_kill_without_time_is_not_joined() -> None:
    later = [heap(-30, free=GiB, in_use=GiB)]
    assert last_sample_before(later, pid=4242, process="worker", killed=KILLED) is None
    earlier = [heap(10, free=GiB, in_use=GiB)]
    assert last_sample_before(earlier, pid=4242, process="worker", killed=None) is None


def test_another_name_under_the_same_pid_is_not_joined() -> None:
    samples = [heap(30, free=GiB, in_use=GiB, name="other")]
    assert last_sample_before(samples, pid=4242, process="worker", killed=KILLED) is None
    # comm is cut at 15 bytes: a recording's full name still matches the kernel's.
    long = [heap(30, free=GiB, in_use=GiB, name="a-very-long-process-name")]
    assert last_sample_before(long, pid=4242, process="a-very-long-pro", killed=KILLED)


def test_a_reused_pid_is_not_joined() -> None:
    samples = [heap(600, free=GiB, in_use=GiB)]
    exited = SeriesEvent(
        kind="exit",
        time=KILLED - timedelta(seconds=500),
        pid=4242,
        process="worker",
        message="the process exited",
    )
    # The recorded process exited; a new one got its pid and name and was killed later.
    assert (
        last_sample_before(samples, pid=4242, process="worker", killed=KILLED, events=[exited])
        is None
    )
    # Another process held the pid between the sample and the kill.
    between = [*samples, heap(300, free=GiB, in_use=GiB, name="other")]
    assert last_sample_before(between, pid=4242, process="worker", killed=KILLED) is None
    # A sample before the process's start belongs to an earlier holder of the pid.
    assert (
        last_sample_before(
            samples,
            pid=4242,
            process="worker",
            killed=KILLED,
            started=KILLED - timedelta(seconds=60),
        )
        is None
    )
    # The watch noticing the exit after the kill is the kill's own exit: still joined.
    after = SeriesEvent(
        kind="exit", time=KILLED + timedelta(seconds=1), pid=4242, process="worker", message=""
    )
    assert last_sample_before(samples, pid=4242, process="worker", killed=KILLED, events=[after])


def _recording(path: Path, samples: list[Sample]) -> Path:
    lines = []
    for sample in samples:
        assert sample.time is not None
        lines.append(
            {
                "schema": "memforensics/sample/1",
                "kind": "heap",
                "time": sample.time.isoformat().replace("+00:00", "Z"),
                "pid": sample.pid,
                "process": sample.process,
                "rss_bytes": sample.rss_bytes,
                "anon_bytes": None,
                "totals": dict(sample.totals or {}),
            }
        )
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_oom_json_has_the_joined_sample(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(KILL_LINE)
    record = _recording(tmp_path / "worker.jsonl", fragmenting())
    result = CliRunner().invoke(
        cli, ["oom", "--file", str(log), "--recording", str(record), "--json"]
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert missing_keys(document, "memforensics/oom/1") == []
    (event,) = document["events"]
    joined = event["heap_sample"]
    assert joined["before_kill_seconds"] == 40
    assert joined["free_bytes"] == 11 * GiB
    assert joined["arenas"] == 64
    assert joined["verdict"] == "free-growing"
    assert joined["source"] == str(record)
    assert joined["message"].startswith("killed at anon-rss 14.1 GiB; 40 s before: 11.0 GiB free")

    table = CliRunner().invoke(cli, ["oom", "--file", str(log), "--recording", str(record)])
    assert "worker (4242) killed at anon-rss 14.1 GiB; 40 s before" in table.stdout

    alone = json.loads(CliRunner().invoke(cli, ["oom", "--file", str(log), "--json"]).stdout)
    assert alone["events"][0]["heap_sample"] is None


def test_oom_joins_what_collect_kept_in_its_state_directory(tmp_path: Path) -> None:
    figures = TargetFigures(
        heap_free_bytes=11 * GiB,
        heap_in_use_bytes=3 * GiB,
        heap_system_bytes=14 * GiB,
        heap_free_resident_bytes=None,
        heap_arenas=64,
        process_resident_bytes=14 * GiB,
        pause_seconds=0.01,
    )
    up = TargetResult(pid=4242, process="worker", container=ContainerIdentity(), figures=figures)
    down = TargetResult(pid=7, process="x", container=ContainerIdentity(), figures=None)
    # A run at the time of the samples (the retention is counted from the run's clock).
    taken = [(up, KILLED - timedelta(seconds=40)), (down, KILLED)]
    assert save_heap(tmp_path, taken, now=KILLED) == []
    samples, notes = read_heap_samples(tmp_path)
    assert notes == []
    (sample,) = samples  # the down target has no heap sample
    assert (sample.pid, sample.process, sample.free_bytes) == (4242, "worker", 11 * GiB)
    assert kept(samples, now=datetime.now(timezone.utc)) == []  # a day later: dropped
    log = tmp_path / "kern.log"
    log.write_text(KILL_LINE)
    result = CliRunner().invoke(
        cli, ["oom", "--file", str(log), "--state-dir", str(tmp_path), "--json"]
    )
    assert result.exit_code == 0, result.output
    joined = json.loads(result.stdout)["events"][0]["heap_sample"]
    assert joined["source"] == str(tmp_path / HEAP_FILE)
    assert joined["verdict"] == "unknown"  # one sample: no trend
    assert "11.0 GiB free in 64 arenas" in joined["message"]


def test_report_shows_a_recorded_kill_beside_the_last_sample(tmp_path: Path) -> None:
    record = _recording(tmp_path / "worker.jsonl", fragmenting())
    kill = {
        "schema": "memforensics/sample/1",
        "kind": "event",
        "time": KILLED.isoformat().replace("+00:00", "Z"),
        "pid": 4242,
        "process": "worker",
        "rss_bytes": None,
        "event": "oom-kill",
        "message": "killed by the kernel OOM killer (memcg)",
        "detail": {"killer": "kernel", "scope": "memcg", "anon_rss_bytes": int(14.1 * GiB)},
    }
    with record.open("a") as handle:
        handle.write(json.dumps(kill) + "\n")
    result = CliRunner().invoke(cli, ["report", str(record), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert missing_keys(document, "memforensics/report/1") == []
    (killed,) = document["oom_kills"]
    assert killed["scope"] == "memcg"
    assert killed["heap_sample"]["message"] == (
        "killed at anon-rss 14.1 GiB; 40 s before: 11.0 GiB free in 64 arenas, "
        "in use flat: fragmentation, not a leak"
    )
    text = CliRunner().invoke(cli, ["report", str(record)], env={"COLUMNS": "200"})
    assert "OOM kill: killed at anon-rss 14.1 GiB; 40 s before" in text.stdout


def test_partial_memcg_v1_record_without_killed_line_keeps_uid_and_adj_from_the_table(
    tmp_path: Path,
) -> None:
    """RHEL 7 (3.10, cgroup v1): the record starts at "Memory cgroup stats"; the selection
    line names the chosen thread (24572), the table lists the process under its leader
    (28438). With the Killed line cut off, uid and oom_score_adj come from that row."""
    text = (OOM / "k8s-56891-rhel7-3.10-dmesg-T.log").read_text()
    lines = [line for line in text.splitlines(keepends=True) if "Killed process 28438" not in line]
    partial = "".join(lines).replace("[28438]     0 28438", "[28438]  1000 28438")
    log = tmp_path / "partial.log"
    log.write_text(partial)
    events = [e for e in scan([("t", read_text_log(str(log)))]).events if e.pid == 24572]
    (event,) = events
    assert event.confirmed is False
    assert (event.process, event.uid, event.oom_score_adj) == ("java", 1000, -998)
    assert event.scope == "memcg"
    assert event.rss_bytes == 119961 * 4096  # the row's rss (pages)


def test_every_verdict_has_words_beside_a_kill() -> None:
    """A kill's sentence speaks every verdict the trend can give, none shown raw."""
    from memforensics.analysis import oom_join, trend

    assert set(trend.VERDICTS) <= set(oom_join._VERDICT_WORDS)
