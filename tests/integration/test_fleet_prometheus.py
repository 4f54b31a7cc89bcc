"""The whole chain on loopback: collect writes the file for a bloated and an idle target,
a real node_exporter serves it, a real Prometheus scrapes it every second and evaluates the
shipped alert rules (threshold and `for:` shortened in a test copy); only the bloated
process's free-heap alert fires."""

from __future__ import annotations

import json
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.fleet import (
    NODE_EXPORTER,
    PROMETHEUS,
    collect_cli,
    free_port,
    http_get,
    missing_tool,
    node_exporter,
    serving,
)
from tests.support.targets import c_target, live_skip_reason

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RULES = (
    Path(__file__).resolve().parent.parent.parent
    / "deploy"
    / "prometheus"
    / ("memforensics-alerts.yml")
)
FRAGMENTED_ARGS = ("4", "2000", "4096", "8")  # ~27 MiB free and resident
THRESHOLD_BYTES = 8 * 1024 * 1024  # between the idle target (~0) and the bloated one
ALERT_DEADLINE_SECONDS = 60.0


def shortened_rules(tmp_path: Path) -> Path:
    """The shipped rules with the free-heap threshold and `for:` shortened for the test."""
    document = yaml.safe_load(RULES.read_text())
    for group in document["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            if rule["alert"] == "MemforensicsHeapTrimmable":
                shipped = "1 * 1024 * 1024 * 1024"
                assert shipped in rule["expr"]
                rule["expr"] = rule["expr"].replace(shipped, str(THRESHOLD_BYTES))
                rule["for"] = "2s"
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(document))
    return path


def query_alerts(base: str) -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = json.loads(http_get(f"{base}/api/v1/alerts"))["data"]["alerts"]
    return alerts


def test_prometheus_fires_the_trimmable_heap_alert_for_the_bloated_target(tmp_path: Path) -> None:
    reason = live_skip_reason() or missing_tool(PROMETHEUS, NODE_EXPORTER)
    if reason:
        pytest.skip(reason)
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    node_port, prom_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(shortened_rules(tmp_path))],
                "scrape_configs": [
                    {
                        "job_name": "node",
                        "static_configs": [{"targets": [f"127.0.0.1:{node_port}"]}],
                    }
                ],
            }
        )
    )
    base = f"http://127.0.0.1:{prom_port}"
    with (
        c_target("trim_fragmented", *FRAGMENTED_ARGS) as bloated,
        c_target("proc_idle") as idle,
    ):
        done = collect_cli(
            str(bloated.pid), str(idle.pid), "--textfile-dir", str(textfile), "--no-oom"
        )
        assert done.returncode == 0, done.stderr
        prometheus = [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ]
        with (
            node_exporter(textfile, node_port, tmp_path / "node_exporter.log"),
            serving(prometheus, f"{base}/-/ready", "prometheus", tmp_path / "prometheus.log"),
        ):
            deadline = time.monotonic() + ALERT_DEADLINE_SECONDS
            firing: list[dict[str, Any]] = []
            while time.monotonic() < deadline and not firing:
                firing = [
                    a
                    for a in query_alerts(base)
                    if a["labels"]["alertname"] == "MemforensicsHeapTrimmable"
                    and a["state"] == "firing"
                ]
                if not firing:
                    time.sleep(0.5)
            assert firing, f"no firing alert within {ALERT_DEADLINE_SECONDS:.0f} s"
            assert {a["labels"]["pid"] for a in firing} == {str(bloated.pid)}
            (alert,) = firing
            assert alert["labels"]["job"] == "node"
            assert "MALLOC_ARENA_MAX" in alert["annotations"]["description"]
            assert "MiB of free glibc heap" in alert["annotations"]["summary"]
            up = json.loads(
                http_get(
                    f"{base}/api/v1/query?"
                    + urllib.parse.urlencode({"query": "memforensics_target_up"})
                )
            )["data"]["result"]
            assert {r["metric"]["pid"]: r["value"][1] for r in up} == {
                str(bloated.pid): "1",
                str(idle.pid): "1",
            }
