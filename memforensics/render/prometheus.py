"""A collect run as Prometheus metrics: a CollectorRegistry for node_exporter's textfile
collector, built with prometheus_client (never hand-written exposition).

Names follow the Prometheus conventions: base units, ``_bytes``/``_seconds``/``_total``,
and every HELP says the value is cached from the last run, because node_exporter serves
the file as it was written, however old (see docs/fleet.md).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from memforensics.model.collect import CollectRun, OomKillKey, TargetFigures, TargetResult

PREFIX = "memforensics"
# ``allocator``: glibc, jemalloc, tcmalloc or mimalloc (what serves malloc); "" when down.
TARGET_LABELS = ("process", "pid", "pod_uid", "container_id", "allocator")
OOM_LABELS = ("process", "scope", "pod_uid", "container_id")
_CACHED = "Cached: from the last memforensics collect run, not measured at scrape time."

# name suffix, HELP, and the figure it shows (heap metrics of targets that are up).
_TARGET_GAUGES: tuple[tuple[str, str, str], ...] = (
    (
        "heap_free_bytes",
        "Bytes in free chunks held in glibc malloc's bins (fast + rest), all arenas.",
        "heap_free_bytes",
    ),
    (
        "heap_in_use_bytes",
        "Bytes of glibc malloc arenas in use (system minus free; an upper bound).",
        "heap_in_use_bytes",
    ),
    (
        "heap_system_bytes",
        "Bytes glibc malloc's arenas currently hold from the OS (malloc_info system current).",
        "heap_system_bytes",
    ),
    (
        "heap_free_resident_bytes",
        "Bytes of free heap chunks still resident in RAM: what fragmentation costs now (not "
        "all of it can be trimmed: see heap_trimmable_bytes).",
        "heap_free_resident_bytes",
    ),
    (
        "heap_trimmable_bytes",
        "Bytes malloc_trim(0) would give back now: resident whole pages inside free chunks, "
        "plus the main arena's top at the program break; measured, never estimated.",
        "heap_trimmable_bytes",
    ),
    (
        "heap_free_measured_ratio",
        "Share (0..1) of malloc_info's free bytes that the residency walk measured; the "
        "other figures lean on estimates below about 0.9.",
        "heap_measured_ratio",
    ),
    ("heap_arenas", "Number of glibc malloc arenas.", "heap_arenas"),
    (
        "process_resident_bytes",
        "Resident set size of the process (smaps_rollup Rss).",
        "process_resident_bytes",
    ),
    (
        "inspect_pause_seconds",
        "How long the process was stopped while its heap was read.",
        "pause_seconds",
    ),
)


def _target_labels(target: TargetResult) -> list[str]:
    return [
        target.process,
        str(target.pid),
        target.container.pod_uid or "",
        target.container.container_id or "",
        target.allocator,
    ]


def _figure(figures: TargetFigures, attribute: str) -> float | None:
    value = getattr(figures, attribute)
    return float(value) if value is not None else None


class CollectRunCollector(Collector):
    """Yields one collect run's metric families (registered once, collected at write)."""

    def __init__(self, run: CollectRun) -> None:
        self.run = run

    def collect(self) -> Iterator[Metric]:
        run = self.run
        for suffix, help_text, attribute in _TARGET_GAUGES:
            family = GaugeMetricFamily(
                f"{PREFIX}_{suffix}", f"{help_text} {_CACHED}", labels=TARGET_LABELS
            )
            for target in run.targets:
                if target.figures is None:
                    continue
                value = _figure(target.figures, attribute)
                if value is not None:
                    family.add_metric(_target_labels(target), value)
            yield family
        census_labels = (*TARGET_LABELS, "type", "kind")
        for suffix, help_text, index in (
            (
                "census_bytes",
                "Bytes of live chunks of each type (collect --census-top: the "
                'top N types by bytes and one type="other"; docs/census.md).',
                0,
            ),
            (
                "census_chunks",
                "Live chunks (or CPython pymalloc blocks) of each type "
                '(collect --census-top: the top N types and one type="other").',
                1,
            ),
        ):
            family = GaugeMetricFamily(
                f"{PREFIX}_{suffix}", f"{help_text} {_CACHED}", labels=census_labels
            )
            for target in run.targets:
                for line in target.census_types:
                    value = line.total_bytes if index == 0 else line.count
                    family.add_metric([*_target_labels(target), line.name, line.kind], value)
            yield family
        unread = GaugeMetricFamily(
            f"{PREFIX}_census_unread_bytes",
            "Heap bytes the census did not read, --max-pause spent before it reached them "
            f"(counted in no census_bytes type; 0: the whole heap was read). {_CACHED}",
            labels=TARGET_LABELS,
        )
        for target in run.targets:
            if target.census_unread_bytes is not None:
                unread.add_metric(_target_labels(target), target.census_unread_bytes)
        yield unread
        up = GaugeMetricFamily(
            f"{PREFIX}_target_up",
            "1 when the target was inspected, 0 when not; reason says why not "
            f"(pause_budget, gone, permission, timeout, not_glibc, ...). {_CACHED}",
            labels=(*TARGET_LABELS, "reason"),
        )
        for target in run.targets:
            up.add_metric([*_target_labels(target), target.reason or ""], 1.0 if target.up else 0)
        yield up
        if run.oom is not None:
            kills = CounterMetricFamily(
                f"{PREFIX}_oom_kills_total",
                "OOM kills counted from the kernel log since the collect state was created, "
                "by victim name, scope (global, memcg or the userspace killer) and container. "
                + _CACHED,
                labels=OOM_LABELS,
            )
            for entry in sorted(run.oom.counts, key=lambda e: _oom_labels(e.key)):
                kills.add_metric(_oom_labels(entry.key), float(entry.count))
            yield kills
            scan_up = GaugeMetricFamily(
                f"{PREFIX}_oom_scan_up",
                "1 when the last run read the kernel log for OOM kills, 0 when it could not "
                f"(the kill counters then keep their previous values). {_CACHED}",
            )
            scan_up.add_metric([], 1.0 if run.oom.ok else 0.0)
            yield scan_up
        last = GaugeMetricFamily(
            f"{PREFIX}_collect_last_success_timestamp_seconds",
            "Unix time when the last collect run finished and wrote this file. " + _CACHED,
        )
        last.add_metric([], run.finished.timestamp())
        yield last
        duration = GaugeMetricFamily(
            f"{PREFIX}_collect_duration_seconds",
            "Wall-clock duration of the last collect run. " + _CACHED,
        )
        duration.add_metric([], run.duration_seconds)
        yield duration


def _oom_labels(key: OomKillKey) -> list[str]:
    """Label values of a kill counter, in OOM_LABELS order."""
    return [key.process, key.scope, key.pod_uid, key.container_id]


def collect_registry(run: CollectRun) -> CollectorRegistry:
    """A registry holding only this run's metrics (no process/platform collectors)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CollectRunCollector(run))
    return registry


def collect_json(run: CollectRun) -> dict[str, object]:
    """The ``memforensics/collect/1`` summary of a run (what --json prints)."""
    return {
        "schema": "memforensics/collect/1",
        "started": run.started.isoformat(),
        "finished": run.finished.isoformat(),
        "duration_seconds": round(run.duration_seconds, 6),
        "max_pause_seconds": run.max_pause_seconds,
        "pause_used_seconds": round(run.pause_used_seconds, 6),
        "targets": [_target_json(target) for target in run.targets],
        "oom": None
        if run.oom is None
        else {
            "ok": run.oom.ok,
            "error": run.oom.error,
            "baseline": run.oom.baseline,
            "new_kills": run.oom.new_kills,
            "sources": list(run.oom.sources),
            "kills": [
                {**dict(zip(OOM_LABELS, _oom_labels(entry.key), strict=True)), "count": entry.count}
                for entry in run.oom.counts
            ],
        },
        "notes": list(run.notes),
    }


def _target_json(target: TargetResult) -> dict[str, object]:
    figures = target.figures
    return {
        "pid": target.pid,
        "process": target.process,
        "pod_uid": target.container.pod_uid,
        "container_id": target.container.container_id,
        "up": target.up,
        "allocator": target.allocator or None,
        "reason": target.reason,
        "detail": target.detail,
        "pause_seconds": round(figures.pause_seconds, 6) if figures else None,
        "elapsed_seconds": round(target.elapsed_seconds, 6),
        "heap_free_bytes": figures.heap_free_bytes if figures else None,
        "heap_in_use_bytes": figures.heap_in_use_bytes if figures else None,
        "heap_system_bytes": figures.heap_system_bytes if figures else None,
        "heap_free_resident_bytes": figures.heap_free_resident_bytes if figures else None,
        "heap_trimmable_bytes": figures.heap_trimmable_bytes if figures else None,
        "heap_measured_ratio": figures.heap_measured_ratio if figures else None,
        "heap_arenas": figures.heap_arenas if figures else None,
        "process_resident_bytes": figures.process_resident_bytes if figures else None,
        "census": [
            {"name": t.name, "kind": t.kind, "count": t.count, "bytes": t.total_bytes}
            for t in target.census_types
        ],
        "census_unread_bytes": target.census_unread_bytes,
    }
