"""A REAL kernel OOM kill of a recorded process, joined to the heap it died with.

A Python hog joins a 64 MiB memory cgroup (tests/integration/test_oom_kernel.py's helper),
`memforensics watch PID --interval 1s --record F` records it, the hog grows past the limit
(at most 600 MiB within 20 s) and is killed; then `report F --json` shows the kill beside
the last heap sample, and `oom --kmsg --since START --recording F --json` has that sample
joined to the kernel's event.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from memforensics.cli import cli
from tests.support.oom_hog import watch_until_oom_killed
from tests.support.schema import missing_keys
from tests.support.targets import live_skip_reason

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_real_oom_kill_is_joined_to_the_last_heap_sample(tmp_path: Path) -> None:
    skip = live_skip_reason()
    if skip:
        pytest.skip(skip)
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg is not readable here: the kill cannot be looked up")
    record = tmp_path / "hog.jsonl"
    started = datetime.now(timezone.utc).replace(microsecond=0)
    killed = watch_until_oom_killed(
        record,
        interval="1s",
        rss_interval="0.2s",
        duration="60s",
        grow_pause_seconds=0.1,
        first_sample_poll_seconds=0.05,
    )
    assert killed.watch_returncode == 0, killed.watch_stderr

    report = CliRunner().invoke(cli, ["report", str(record), "--json"])
    assert report.exit_code == 0, report.output
    document = json.loads(report.stdout)
    assert missing_keys(document, "memforensics/report/1") == []
    (kill,) = document["oom_kills"]
    joined = kill["heap_sample"]
    assert joined is not None, kill
    assert 0 <= joined["before_kill_seconds"] < 30
    assert joined["in_use_bytes"] > 0 and joined["arenas"] >= 1
    assert joined["message"].startswith("killed at anon-rss ")
    print("report:", kill["time"], joined["message"])

    scan = CliRunner().invoke(
        cli,
        [
            "oom",
            "--kmsg",
            "--since",
            started.isoformat().replace("+00:00", "Z"),
            "--recording",
            str(record),
            "--json",
        ],
    )
    assert scan.exit_code == 0, scan.output
    oom = json.loads(scan.stdout)
    assert missing_keys(oom, "memforensics/oom/1") == []
    (event,) = [e for e in oom["events"] if e["pid"] == killed.pid]
    assert event["scope"] == "memcg"
    assert event["heap_sample"] is not None, event
    assert event["heap_sample"]["time"] == joined["time"]
    assert event["heap_sample"]["source"] == str(record)
    print("oom:", event["time"], event["anon_rss_bytes"], event["heap_sample"]["message"])
