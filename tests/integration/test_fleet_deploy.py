"""The deploy assets an SRE copies: alert rules (real promtool), systemd units (real
systemd-analyze), the DaemonSet and the dashboard (parsed, the fields that matter checked),
and every metric they query is one collect really writes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from memforensics.entry.collect_state import default_state_dir
from memforensics.model.collect import (
    CollectRun,
    ContainerIdentity,
    OomKillCount,
    OomKillKey,
    OomReading,
    TargetFigures,
    TargetResult,
)
from memforensics.render.prometheus import collect_registry
from tests.support.fleet import PROMTOOL, missing_tool

DEPLOY = Path(__file__).resolve().parent.parent.parent / "deploy"
RULES = DEPLOY / "prometheus" / "memforensics-alerts.yml"
METRIC_RE = re.compile(r"\bmemforensics_[a-z_]+")


def written_metric_names() -> set[str]:
    """Names in a file collect writes (a run with one target up and one kill counted)."""
    figures = TargetFigures(1, 1, 2, 1, 1, 3, 0.01)
    now = datetime.now(timezone.utc)
    run = CollectRun(
        started=now,
        finished=now,
        duration_seconds=0.1,
        max_pause_seconds=1,
        pause_used_seconds=0.01,
        targets=(TargetResult(1, "x", ContainerIdentity(), figures),),
        oom=OomReading((OomKillCount(OomKillKey("x", "global"), 1),), 1, (), ok=True),
    )
    text = generate_latest(collect_registry(run)).decode()
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    reason = missing_tool(PROMTOOL)
    if reason:
        pytest.skip(reason)
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_check_rules() -> None:
    done = promtool("check", "rules", RULES.name, cwd=RULES.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_test_rules() -> None:
    done = promtool("test", "rules", "memforensics-alerts.test.yml", cwd=RULES.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_rules_cover_the_issue_and_query_real_metrics() -> None:
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    by_name = {rule["alert"]: rule for rule in rules}
    free = by_name["MemforensicsHeapTrimmable"]
    assert "memforensics_heap_trimmable_bytes" in free["expr"]
    assert free["for"] == "30m" and "1024 * 1024 * 1024" in free["expr"]
    assert "MALLOC_ARENA_MAX" in free["annotations"]["description"]
    assert "trim" in free["annotations"]["description"]
    assert "memforensics_oom_kills_total" in by_name["MemforensicsOomKill"]["expr"]
    assert (
        "memforensics_collect_last_success_timestamp_seconds"
        in (by_name["MemforensicsCollectStale"]["expr"])
    )
    used = {m for rule in rules for m in METRIC_RE.findall(rule["expr"])}
    assert used <= written_metric_names()


def test_systemd_units_pass_systemd_analyze(tmp_path: Path) -> None:
    """systemd-analyze reads the units as systemd would; unknown keys only warn, so the
    test wants no output at all. ExecStart points at this checkout's console script."""
    analyze = shutil.which("systemd-analyze")
    beside_python = Path(sys.executable).parent / "memforensics"
    memforensics = str(beside_python) if beside_python.exists() else shutil.which("memforensics")
    if analyze is None or memforensics is None:
        pytest.skip("systemd-analyze or the memforensics console script is not on PATH")
    timer = (DEPLOY / "systemd" / "memforensics-collect.timer").read_text()
    assert "OnCalendar=*:0/5" in timer and "RandomizedDelaySec=" in timer
    service = (DEPLOY / "systemd" / "memforensics-collect.service").read_text()
    assert "collect $MEMFORENSICS_TARGETS --read-only" in service  # its final SIGKILL is safe
    for unit in (DEPLOY / "systemd").iterdir():
        text = unit.read_text().replace("/usr/local/bin/memforensics", memforensics)
        (tmp_path / unit.name).write_text(text)
    done = subprocess.run(
        [analyze, "verify", *(str(p) for p in sorted(tmp_path.iterdir()))],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


def load_manifests() -> dict[str, dict[str, Any]]:
    found = {}
    for path in (DEPLOY / "kubernetes").glob("*.yaml"):
        for document in yaml.safe_load_all(path.read_text()):
            found[document["kind"]] = document
    return found


def test_daemonset_has_what_collect_needs() -> None:
    manifests = load_manifests()
    daemonset = manifests["DaemonSet"]
    account = manifests["ServiceAccount"]
    pod = daemonset["spec"]["template"]["spec"]
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= (
        daemonset["spec"]["template"]["metadata"]["labels"].items()
    )
    assert pod["hostPID"] is True
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert account["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert "SYS_PTRACE" in security["capabilities"]["add"]
    assert security["capabilities"]["drop"] == ["ALL"]
    assert security.get("privileged") is False
    limits = container["resources"]["limits"]
    assert {"cpu", "memory"} <= limits.keys()
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    assert set(mounts) <= set(volumes)
    command = " ".join(container["args"])
    # The textfile and state directories the command writes are host directories; the state
    # one is mounted where collect looks by default for root, so it needs no flag.
    assert f"--textfile-dir {mounts['textfile']['mountPath']}" in command
    assert security["runAsUser"] == 0
    assert mounts["state"]["mountPath"] == str(default_state_dir({}, euid=0))
    assert "--state-dir" not in command
    for name in ("textfile", "state"):
        assert volumes[name]["hostPath"]["path"].startswith("/var/lib/")
        assert not mounts[name].get("readOnly", False)
    assert f"--oom-journal {mounts['journal']['mountPath']}" in command
    assert mounts["journal"]["readOnly"] is True
    # A pod deletion SIGKILLs the whole cgroup: no call may be in flight in a target.
    assert "--read-only" in command


def test_dashboard_parses_and_queries_real_metrics() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "memforensics-fleet.json").read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    titles = " | ".join(p["title"] for p in panels)
    assert "Top $topn" in titles and "in use vs free" in titles and "OOM kills" in titles
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    assert any("topk($topn, memforensics_heap_free_resident_bytes" in e for e in exprs)
    assert any("memforensics_oom_kills_total" in e for e in exprs)
    used = {m for e in exprs for m in METRIC_RE.findall(e)}
    assert used <= written_metric_names()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "instance", "process", "topn"} <= variables
