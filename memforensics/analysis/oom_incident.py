"""One OOM incident as the kernel printed it (header, memcg block, task table, summary,
selection) and how it turns into an event for each victim: the kill line's figures joined
with the victim's task-table row, the cgroup from the summary or the memory.oom.group notice,
the pod and container from that cgroup."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from memforensics.analysis import oom_tasks as tasks
from memforensics.model.logrecord import LogRecord
from memforensics.model.oom import OomEvent, OomTrigger, Scope
from memforensics.sources.proc.cgroup import identify as _identify

KIB = 1024


def _kib(value: str | None) -> int | None:
    return int(value) * KIB if value is not None else None


def _int(value: str | None) -> int | None:
    return int(value) if value is not None else None


@dataclass
class Incident:
    """What one OOM incident's lines said so far (header, memcg block, table, summary).

    ``number`` is given at its first victim, so that incidents without a kill (a panic, a
    log cut short) leave no gaps and every reader numbers the same incidents alike.
    """

    order: int
    number: int | None = None
    time: datetime | None = None
    record: LogRecord | None = None
    trigger: OomTrigger | None = None
    scope: Scope | None = None
    constraint: str | None = None
    oom_memcg: str | None = None
    task_memcg: str | None = None
    group_memcg: str | None = None
    summary_pid: int | None = None
    summary_uid: int | None = None
    summary_task: str | None = None
    summary_line: str | None = None
    selected: tuple[int, str, str] | None = None
    stats_memcg: str | None = None
    memcg_limit_bytes: int | None = None
    group: bool = False
    columns: list[str] | None = None
    rows: dict[int, tasks.Row] = field(default_factory=dict)
    scores: dict[int, int] = field(default_factory=dict)
    victims: set[int] = field(default_factory=set)


# The same few cgroup paths come back in kill after kill: read each once per scan's process.
identify = functools.lru_cache(maxsize=4096)(_identify)


def victim_event(
    incident: Incident,
    *,
    pid: int,
    name: str,
    match: re.Match[str] | None,
    record: LogRecord,
    line: str,
    group: bool,
    confirmed: bool,
) -> OomEvent:
    """The event of one victim of ``incident``; ``match`` is its Killed line (None when the
    log has only the selection or summary line, or a "sharing same memory" line)."""
    assert incident.number is not None
    total_vm = anon = file_rss = shmem = pgtables = uid = adj = None
    if match is not None:
        total_vm = _kib(match.group("vm"))
        anon = _kib(match.group("anon"))
        file_rss = _kib(match.group("file"))
        shmem = _kib(match.group("shmem"))
        pgtables = _kib(match.group("pgtables"))
        uid = _int(match.group("uid") or match.group("rhel_uid"))
        adj = _int(match.group("adj"))
    is_summary_victim = incident.summary_pid == pid
    if uid is None and is_summary_victim:
        uid = incident.summary_uid
    row = tasks.victim_row(incident.rows, pid, name)
    page_bytes = tasks.page_size(row, total_vm)
    rss = None
    if anon is not None and file_rss is not None:
        rss = anon + file_rss + (shmem or 0)
    if row is not None:
        if uid is None and isinstance(row.get("uid"), int):
            uid = int(row["uid"])
        if adj is None and isinstance(row.get("oom_score_adj"), int):
            adj = int(row["oom_score_adj"])
        if match is None or match.group("vm") is None:
            # No sizes on the kill line (missing, or the oldest forms): the table row's.
            total_vm, anon, file_rss, shmem, rss = tasks.row_sizes(row, page_bytes[0])
    scope = incident.scope
    constraint = incident.constraint
    if constraint == "CONSTRAINT_NONE" and scope == "memcg":
        # 5.0-5.1 printed CONSTRAINT_NONE for memcg OOMs (fixed by 432b1de0de02).
        constraint = "CONSTRAINT_MEMCG"
    oom_memcg = incident.oom_memcg or (incident.stats_memcg if scope == "memcg" else None)
    cgroup = incident.task_memcg if (is_summary_victim or incident.summary_pid is None) else None
    if cgroup is None and incident.group_memcg is not None and not is_summary_victim:
        # Every task of a memory.oom.group kill is in the group's cgroup (or below it).
        cgroup = incident.group_memcg
    if cgroup is None and not group and scope == "memcg" and incident.summary_pid is None:
        cgroup = oom_memcg
    identity = identify(cgroup)
    if identity.pod_uid is None and identity.container_id is None:
        # The victim is inside oom_memcg's subtree: a pod or container there is its own.
        identity = identify(oom_memcg if scope == "memcg" else None)
    return OomEvent(
        source=record.source,
        killer="kernel",
        incident=incident.number,
        time=record.time or incident.time,
        boot_id=record.boot_id,
        uptime_seconds=record.uptime_seconds,
        pid=pid,
        process=name,
        uid=uid,
        total_vm_bytes=total_vm,
        anon_rss_bytes=anon,
        file_rss_bytes=file_rss,
        shmem_rss_bytes=shmem,
        rss_bytes=rss,
        pgtables_bytes=pgtables,
        oom_score_adj=adj,
        oom_score=incident.scores.get(pid),
        constraint=constraint,
        scope=scope,
        oom_memcg=oom_memcg,
        cgroup=cgroup,
        memcg_limit_bytes=incident.memcg_limit_bytes,
        trigger=incident.trigger,
        top_tasks=tasks.top_tasks(incident.rows, page_bytes[0]),
        group_kill=group,
        page_size_bytes=page_bytes[1],
        message=line,
        confirmed=confirmed,
        pod_uid=identity.pod_uid,
        container_id=identity.container_id,
        qos_class=identity.qos_class,
    )


_EVENT_FIELDS = tuple(f.name for f in fields(OomEvent))
_set = object.__setattr__


def evolve(event: OomEvent, **changes: Any) -> OomEvent:
    """``dataclasses.replace(event, **changes)`` in half the time (it is called for most
    events: renumbering, oom_reaper's confirmation); OomEvent has no __post_init__."""
    new = object.__new__(OomEvent)
    for name in _EVENT_FIELDS:
        _set(new, name, getattr(event, name))
    for name, value in changes.items():
        _set(new, name, value)
    return new
