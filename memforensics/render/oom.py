"""OOM scans as a ``memforensics/oom/1`` JSON document, as rich tables, or as the default
table's plain text (pure functions)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import TYPE_CHECKING, Any

from memforensics.analysis.oom_select import summarize
from memforensics.model.oom import (
    HeapAtKill,
    OomEvent,
    OomScan,
    OomTrigger,
    ProcessSummary,
    TopTask,
)
from memforensics.render.cgroup_name import short_cgroup
from memforensics.render.oom_table import plain_rows, render_rows
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


def heap_at_kill_json(heap: HeapAtKill | None) -> dict[str, Any] | None:
    """``heap_sample``: the last heap sample of the victim before the kill (docs/json.md)."""
    if heap is None:
        return None
    sample = heap.sample
    return {
        "time": iso_utc(sample.time),
        "before_kill_seconds": round(heap.seconds_before, 3),
        "source": heap.source,
        "rss_bytes": sample.rss_bytes,
        "anon_bytes": sample.anon_bytes,
        "in_use_bytes": sample.in_use_bytes,
        "free_bytes": sample.free_bytes,
        "free_resident_bytes": sample.free_resident_bytes,
        "system_bytes": sample.total("system_bytes"),
        "arenas": sample.total("arenas"),
        "verdict": heap.verdict,
        "message": heap.sentence,
    }


def event_json(event: OomEvent, heap: HeapAtKill | None = None) -> dict[str, Any]:
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
        "confirmed": event.confirmed,
        "pod_uid": event.pod_uid,
        "container_id": event.container_id,
        "qos_class": event.qos_class,
        "heap_sample": heap_at_kill_json(heap),
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
        "events": [event_json(event, scan.heap.get(i)) for i, event in enumerate(scan.events)],
        "summary": [_summary_json(s) for s in summarize(scan.events)],
        "notes": list(scan.notes),
    }


def _who(process: str | None, pid: int | None) -> str:
    if process is None and pid is None:
        return "-"
    if pid is None:
        return process or "-"
    return f"{process or '?'} ({pid})"


def _who_narrow(process: str | None, pid: int | None) -> str:
    """Name over pid: two short lines instead of one folded one."""
    if pid is None:
        return process or "-"
    return f"{process or '?'}\n({pid})"


def _when(event: OomEvent, *, narrow: bool = False) -> str:
    if event.time is not None:
        return event.time.strftime("%Y-%m-%d\n%H:%M:%S" if narrow else "%Y-%m-%d %H:%M:%S")
    if event.uptime_seconds is not None:
        return (
            f"boot+\n{event.uptime_seconds:.3f}s" if narrow else f"boot+{event.uptime_seconds:.3f}s"
        )
    return "-"


def _scope(event: OomEvent, *, narrow: bool = False) -> str:
    name: str
    if event.killer != "kernel":
        name = "oomd" if narrow and event.killer == "systemd-oomd" else event.killer
    else:
        name = event.scope or "?"
    return name if event.confirmed else f"{name}*"


_ROTATED_RE = re.compile(r"^(?P<base>(?:.*/)?(?:kern\.log|syslog|messages))(?:[.-][^/]+)?$")


def describe_sources(sources: tuple[str, ...] | list[str]) -> str:
    """The sources of a scan in a few words: rotated syslog files are counted, not listed."""
    groups: dict[str, list[str]] = {}
    for source in sources:
        match = _ROTATED_RE.match(source)
        groups.setdefault(match.group("base") if match else source, []).append(source)
    words = []
    for base, members in groups.items():
        if len(members) == 1:
            words.append(members[0])
        elif base in members:
            words.append(f"{base} (+{len(members) - 1} rotated)")
        else:
            words.append(f"{members[0]} (+{len(members) - 1} more)")
    return ", ".join(words)


def _nothing_found(scan: OomScan) -> RenderableType:
    from rich.text import Text

    where = describe_sources(scan.sources) or "no readable source"
    return Text(f"No OOM kills found in {where}.")


def events_table(scan: OomScan, *, wide: bool = False, width: int = 80) -> RenderableType:
    """One row per victim. Narrow (default: fits ``width`` columns, a kill in at most three
    lines): time, victim, anon-rss, by, short cgroup, trigger. ``wide``: every column, full
    paths."""
    if not scan.events:
        return _nothing_found(scan)
    title, notes = _title_and_notes(scan)
    if wide:
        return _wide_table(scan, title, notes)
    return render_rows(title, _narrow_rows(scan), notes, width)


def events_text(scan: OomScan, *, width: int = 80) -> str | None:
    """The characters of the narrow ``events_table``, without rich and without styles (what
    it prints where it prints no styles); None when there are no events."""
    if not scan.events:
        return None
    title, notes = _title_and_notes(scan)
    return plain_rows(title, _narrow_rows(scan), notes, width)


def _title_and_notes(scan: OomScan) -> tuple[str, list[str]]:
    notes = [f"read: {describe_sources(scan.sources)}"]
    if any(not event.confirmed for event in scan.events):
        notes.append("* no kill line in the log: known from the selection or summary line only")
    for index, heap in sorted(scan.heap.items()):
        event = scan.events[index]
        notes.append(f"{_who(event.process, event.pid)} {heap.sentence}")
    return f"OOM kills: {len(scan.events)}", notes


def _narrow_rows(scan: OomScan) -> list[list[list[str]]]:
    boots = {event.boot_id for event in scan.events if event.boot_id}
    cgroups: dict[str | None, str] = {}  # kills of one container share their cgroup
    rows = []
    for event in scan.events:
        when = _when(event, narrow=True)
        if len(boots) > 1 and event.boot_id:
            when += f"\nboot {event.boot_id[:8]}"
        trigger = event.trigger
        cells = (
            when,
            _who_narrow(event.process, event.pid),
            _anon_text(event),
            _scope(event, narrow=True),
            _short_cgroup(event.cgroup or event.oom_memcg, cgroups),
            _who_narrow(trigger.process, trigger.pid) if trigger else "-",
        )
        rows.append([cell.split("\n") for cell in cells])
    return rows


def _short_cgroup(path: str | None, known: dict[str | None, str]) -> str:
    name = known.get(path)
    if name is None:
        name = known[path] = short_cgroup(path) or "-"
    return name


def _anon_text(event: OomEvent) -> str:
    anon = event.anon_rss_bytes if event.killer != "earlyoom" else event.rss_bytes
    if anon is None and event.killer == "kernel" and not event.confirmed:
        anon = event.rss_bytes  # from the table row: the only size such a kill has
    return format_bytes(anon) if anon is not None else "-"


def _wide_table(scan: OomScan, title: str, notes: list[str]) -> RenderableType:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(
        title=title,
        title_justify="left",
        caption="\n".join(notes),
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1, 0, 0),
    )
    table.add_column("time (UTC)", no_wrap=True)
    table.add_column("boot", no_wrap=True)
    table.add_column("victim")
    table.add_column("anon-rss", justify="right", no_wrap=True)
    table.add_column("total-vm", justify="right", no_wrap=True)
    table.add_column("uid", justify="right", no_wrap=True)
    table.add_column("adj", justify="right", no_wrap=True)
    table.add_column("by", no_wrap=True)
    table.add_column("cgroup", overflow="fold")
    table.add_column("trigger")
    for event in scan.events:
        trigger = event.trigger
        cells = (
            _when(event),
            (event.boot_id or "-")[:8],
            _who(event.process, event.pid),
            _anon_text(event),
            format_bytes(event.total_vm_bytes) if event.total_vm_bytes is not None else "-",
            str(event.uid) if event.uid is not None else "-",
            str(event.oom_score_adj) if event.oom_score_adj is not None else "-",
            _scope(event),
            event.cgroup or event.oom_memcg or "-",
            _who(trigger.process, trigger.pid) if trigger else "-",
        )
        # Text, not str: a process or cgroup name is never read as rich markup.
        table.add_row(*map(Text, cells))
    return table


def summary_table(scan: OomScan) -> RenderableType:
    """Kills grouped by process name: kills, largest anon-rss, last time."""
    from rich.table import Table
    from rich.text import Text

    if not scan.events:
        return _nothing_found(scan)
    table = Table(title=f"OOM kills by process: {len(scan.events)}", title_justify="left")
    table.add_column("process")
    table.add_column("kills", justify="right")
    table.add_column("largest anon-rss", justify="right")
    table.add_column("last (UTC)")
    for summary in summarize(scan.events):
        table.add_row(
            Text(summary.process),
            str(summary.kills),
            format_bytes(summary.largest_anon_rss_bytes)
            if summary.largest_anon_rss_bytes is not None
            else "-",
            summary.last_time.strftime("%Y-%m-%d %H:%M:%S") if summary.last_time else "-",
        )
    return table
