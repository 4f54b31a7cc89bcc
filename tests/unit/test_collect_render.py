"""The Prometheus renderer: names, units, HELP, labels and types of a collect run."""

from __future__ import annotations

from datetime import datetime, timezone

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from memforensics.model.collect import (
    CollectRun,
    ContainerIdentity,
    OomKillCount,
    OomKillKey,
    OomReading,
    TargetFigures,
    TargetResult,
)
from memforensics.render.prometheus import collect_json, collect_registry

POD = "fbdfe8e3-1c87-4ff2-907c-b2ec8e25d012"
CID = "ef807430361e6e82b45db92e2e9b6fbec98f419b12c591e655c1a725565e73a8"
ISSUE_NAMES = {
    "memforensics_heap_free_bytes",
    "memforensics_heap_in_use_bytes",
    "memforensics_heap_system_bytes",
    "memforensics_heap_free_resident_bytes",
    "memforensics_heap_arenas",
    "memforensics_process_resident_bytes",
    "memforensics_inspect_pause_seconds",
    "memforensics_oom_kills_total",
    "memforensics_target_up",
    "memforensics_collect_last_success_timestamp_seconds",
    "memforensics_collect_duration_seconds",
}


def sample_run() -> CollectRun:
    figures = TargetFigures(
        heap_free_bytes=3 << 30,
        heap_in_use_bytes=1 << 30,
        heap_system_bytes=4 << 30,
        heap_free_resident_bytes=None,  # residency unknown: the sample is left out, not 0
        heap_arenas=17,
        process_resident_bytes=5 << 30,
        pause_seconds=0.012,
    )
    up = TargetResult(4242, "java", ContainerIdentity(POD, CID), figures, allocator="jemalloc")
    budget = TargetResult(
        4343, "postgres", ContainerIdentity(), None, "pause_budget", "budget used up"
    )
    kills = (
        OomKillCount(OomKillKey("manager", "memcg", POD, CID), 2),
        OomKillCount(OomKillKey("java", "global"), 1),
    )
    started = datetime(2026, 11, 23, 10, 0, tzinfo=timezone.utc)
    return CollectRun(
        started=started,
        finished=datetime(2026, 11, 23, 10, 0, 1, tzinfo=timezone.utc),
        duration_seconds=1.0,
        max_pause_seconds=0.5,
        pause_used_seconds=0.012,
        targets=(up, budget),
        oom=OomReading(kills, new_kills=1, sources=("journal",), ok=True),
    )


def test_every_metric_of_the_issue_with_cached_help_and_base_units() -> None:
    text = generate_latest(collect_registry(sample_run())).decode()
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP")}
    assert names >= ISSUE_NAMES
    for line in text.splitlines():
        if line.startswith("# HELP"):
            assert "Cached: from the last memforensics collect run" in line, line
    assert "# TYPE memforensics_oom_kills_total counter" in text
    assert "# TYPE memforensics_heap_free_bytes gauge" in text


def test_labels_identify_process_pid_container_and_allocator() -> None:
    text = generate_latest(collect_registry(sample_run())).decode()
    found = {f.name: f for f in text_string_to_metric_families(text)}
    (free,) = found["memforensics_heap_free_bytes"].samples
    assert free.labels == {
        "process": "java",
        "pid": "4242",
        "pod_uid": POD,
        "container_id": CID,
        "allocator": "jemalloc",
    }
    assert free.value == 3 << 30
    assert found["memforensics_heap_free_resident_bytes"].samples == []
    up = {
        s.labels["pid"]: (s.value, s.labels["reason"])
        for s in found["memforensics_target_up"].samples
    }
    assert up == {"4242": (1.0, ""), "4343": (0.0, "pause_budget")}
    kills = {
        (s.labels["process"], s.labels["scope"], s.labels["pod_uid"]): s.value
        for s in found["memforensics_oom_kills"].samples
    }
    assert kills == {("manager", "memcg", POD): 2.0, ("java", "global", ""): 1.0}


def test_json_summary_reports_the_pause_budget() -> None:
    document = collect_json(sample_run())
    assert document["schema"] == "memforensics/collect/1"
    assert document["max_pause_seconds"] == 0.5
    assert document["pause_used_seconds"] == 0.012
    targets = document["targets"]
    assert isinstance(targets, list)
    assert [t["reason"] for t in targets] == [None, "pause_budget"]
