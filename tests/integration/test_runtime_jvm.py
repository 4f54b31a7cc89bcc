"""The runtime told from the process itself, on a live OpenJDK 17 JVM.

tests/targets/NativeChurn.java (2 worker threads, a 64 MiB Java heap) is watched with the
real CLI, `memforensics watch PID --interval 1s --count 3 --record F`; every heap sample in F
and `memforensics report F --json` must name the runtime "jvm". Nothing on the command line
says so: the JVM is started as `java`, and sources/proc/runtime.py tells it from libjvm.so
in the process's maps. The JVM is killed in ``finally`` (tests.support.services.java_service).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from memforensics.cli import cli
from tests.support.services import java_service, java_skip_reason
from tests.support.targets import live_skip_reason

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(180)
def test_watch_and_report_name_the_jvm_from_the_process(tmp_path: Path) -> None:
    skip = live_skip_reason() or java_skip_reason()
    if skip:
        pytest.skip(skip)
    record = tmp_path / "jvm.jsonl"
    with java_service("2", "4", "8") as service:
        watch = ["watch", str(service.pid), "--interval", "1s", "--count", "3"]
        watched = CliRunner().invoke(cli, [*watch, "--record", str(record)])
        assert watched.exit_code == 0, watched.output
        assert service.target.alive(), "the JVM must be left running"
        assert service.ask("ping").startswith("pong"), "the JVM must still answer"
    samples = [json.loads(line) for line in record.read_text().splitlines()]
    heap = [sample for sample in samples if sample["kind"] == "heap"]
    assert len(heap) == 3, samples
    assert {sample.get("runtime") for sample in heap} == {"jvm"}

    reported = CliRunner().invoke(cli, ["report", str(record), "--json"])
    assert reported.exit_code == 0, reported.output
    document = json.loads(reported.stdout)
    assert document["runtime"] == "jvm"
    assert "runtime: a JVM" in document["trend"]["evidence"]
    text = CliRunner().invoke(cli, ["report", str(record)], env={"COLUMNS": "100"})
    assert text.exit_code == 0, text.output
    assert "runtime: a JVM" in text.stdout
