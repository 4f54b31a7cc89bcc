"""OOM scans as a ``memforensics/oom/1`` JSON document or as rich tables (pure functions)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from memforensics.analysis.oom_select import summarize
from memforensics.model.oom import OomEvent, OomScan, OomTrigger, ProcessSummary, TopTask
from memforensics.units import format_bytes

if TYPE_CHECKING:
    from rich.console import RenderableType

SCHEMA = "memforensics/oom/1"


def iso_utc(stamp: datetime | None) -> str | None:
    """ISO-8601 UTC with a ``Z`` (``None`` stays ``None``)."""
    if stamp is None:
        return None
    return stamp.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _trigger_json(trigger: OomTrigger | None) -> dict[str, Any] | None:
    if trigger is None:
        return None
    return {
        "process": trigger.process,
        "pid": trigger.pid,
        "gfp_mask": trigger.gfp_mask,
        "order": trigger.order,
        "oom_score_adj": trigger.oom_score_adj,
    }


def _task_json(task: TopTask) -> dict[str, Any]:
    return {
        "pid": task.pid,
        "name": task.name,
        "uid": task.uid,
        "tgid": task.tgid,
        "total_vm_bytes": task.total_vm_bytes,
        "rss_bytes": task.rss_bytes,
        "rss_anon_bytes": task.rss_anon_bytes,
        "rss_file_bytes": task.rss_file_bytes,
        "rss_shmem_bytes": task.rss_shmem_bytes,
        "pgtables_bytes": task.pgtables_bytes,
        "swap_bytes": task.swap_bytes,
        "oom_score_adj": task.oom_score_adj,
    }


def event_json(event: OomEvent) -> dict[str, Any]:
    """One event with the keys documented in docs/json.md."""
    return {
        "time": iso_utc(event.time),
        "boot_id": event.boot_id,
        "source": event.source,
        "killer": event.killer,
        "incident": event.incident,
        "pid": event.pid,
        "process": event.process,
        "uid": event.uid,
        "total_vm_bytes": event.total_vm_bytes,
        "anon_rss_bytes": event.anon_rss_bytes,
        "file_rss_bytes": event.file_rss_bytes,
        "shmem_rss_bytes": event.shmem_rss_bytes,
        "rss_bytes": event.rss_bytes,
        "pgtables_bytes": event.pgtables_bytes,
        "oom_score_adj": event.oom_score_adj,
        "oom_score": event.oom_score,
        "constraint": event.constraint,
        "scope": event.scope,
        "oom_memcg": event.oom_memcg,
        "cgroup": event.cgroup,
        "memcg_limit_bytes": event.memcg_limit_bytes,
        "trigger": _trigger_json(event.trigger),
        "top_tasks": [_task_json(task) for task in event.top_tasks],
        "group_kill": event.group_kill,
        "reaped": event.reaped,
        "uptime_seconds": event.uptime_seconds,
        "page_size_bytes": event.page_size_bytes,
        "reason": event.reason,
        "message": event.message,
    }


def _summary_json(summary: ProcessSummary) -> dict[str, Any]:
    return {
        "process": summary.process,
        "kills": summary.kills,
        "largest_anon_rss_bytes": summary.largest_anon_rss_bytes,
        "last_time": iso_utc(summary.last_time),
    }


def scan_json(scan: OomScan) -> dict[str, Any]:
    """The whole ``memforensics/oom/1`` document."""
    return {
        "schema": SCHEMA,
        "sources": list(scan.sources),
        "kills": len(scan.events),
        "events": [event_json(event) for event in scan.events],
        "summary": [_summary_json(s) for s in summarize(scan.events)],
        "notes": list(scan.notes),
    }


def _who(process: str | None, pid: int | None) -> str:
    if process is None and pid is None:
        return "-"
    if pid is None:
        return process or "-"
    return f"{process or '?'} ({pid})"


def _when(event: OomEvent) -> str:
    if event.time is not None:
        return event.time.strftime("%Y-%m-%d %H:%M:%S")
    if event.uptime_seconds is not None:
        return f"boot+{event.uptime_seconds:.3f}s"
    return "-"


def _scope(event: OomEvent) -> str:
    if event.killer != "kernel":
        return event.killer
    return event.scope or "?"


def events_table(scan: OomScan) -> RenderableType:
    """One row per victim: time, boot, victim, anon-rss, total-vm, uid, scope, cgroup, trigger."""
    from rich.table import Table
    from rich.text import Text

    if not scan.events:
        return Text(f"No OOM kills found in {', '.join(scan.sources) or 'the given sources'}.")
    from rich import box

    # A light box: nine columns have to fit an 80-column terminal.
    table = Table(
        title=f"OOM kills: {len(scan.events)}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1, 0, 0),
    )
    # Short cells never wrap; long paths (cgroup) and names fold instead of truncating.
    table.add_column("time (UTC)", min_width=8, overflow="fold")
    table.add_column("boot", no_wrap=True)
    table.add_column("victim", overflow="fold", min_width=6)
    table.add_column("anon-rss", justify="right", no_wrap=True)
    table.add_column("total-vm", justify="right", no_wrap=True)
    table.add_column("uid", justify="right", no_wrap=True)
    table.add_column("scope", no_wrap=True)
    table.add_column("cgroup", overflow="fold", min_width=6)
    table.add_column("trigger", overflow="fold", min_width=6)
    for event in scan.events:
        anon = event.anon_rss_bytes if event.killer != "earlyoom" else event.rss_bytes
        trigger = event.trigger
        table.add_row(
            _when(event),
            (event.boot_id or "-")[:8],
            _who(event.process, event.pid),
            format_bytes(anon) if anon is not None else "-",
            format_bytes(event.total_vm_bytes) if event.total_vm_bytes is not None else "-",
            str(event.uid) if event.uid is not None else "-",
            _scope(event),
            event.cgroup or event.oom_memcg or "-",
            _who(trigger.process, trigger.pid) if trigger else "-",
        )
    return table


def summary_table(scan: OomScan) -> RenderableType:
    """Kills grouped by process name: kills, largest anon-rss, last time."""
    from rich.table import Table
    from rich.text import Text

    if not scan.events:
        return Text(f"No OOM kills found in {', '.join(scan.sources) or 'the given sources'}.")
    table = Table(title=f"OOM kills by process: {len(scan.events)}", title_justify="left")
    table.add_column("process")
    table.add_column("kills", justify="right")
    table.add_column("largest anon-rss", justify="right")
    table.add_column("last (UTC)")
    for summary in summarize(scan.events):
        table.add_row(
            summary.process,
            str(summary.kills),
            format_bytes(summary.largest_anon_rss_bytes)
            if summary.largest_anon_rss_bytes is not None
            else "-",
            summary.last_time.strftime("%Y-%m-%d %H:%M:%S") if summary.last_time else "-",
        )
    return table
