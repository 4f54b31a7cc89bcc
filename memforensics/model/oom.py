"""Frozen dataclasses for OOM kills found in a log: victims, triggers, top tasks, scans."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    # Only named in HeapAtKill's annotation: a scan of logs never loads the heap series.
    from memforensics.model.series import Sample

Killer = Literal["kernel", "systemd-oomd", "earlyoom"]
Scope = Literal["global", "memcg"]


@dataclass(frozen=True, slots=True)
class TopTask:
    """One row of the kernel's ``Tasks state`` table (``dump_tasks``) at the time of a kill.

    Sizes are converted from pages with the page size of that machine when the log lets us
    infer it (see ``OomEvent.page_size_bytes``), else 4 KiB; columns the kernel version did
    not print are ``None``.
    """

    pid: int
    name: str
    uid: int | None = None
    tgid: int | None = None
    total_vm_bytes: int | None = None
    rss_bytes: int | None = None
    rss_anon_bytes: int | None = None
    rss_file_bytes: int | None = None
    rss_shmem_bytes: int | None = None
    pgtables_bytes: int | None = None
    swap_bytes: int | None = None
    oom_score_adj: int | None = None


@dataclass(frozen=True, slots=True)
class OomTrigger:
    """The task whose allocation invoked the OOM killer (not always the victim)."""

    process: str | None = None
    pid: int | None = None
    gfp_mask: str | None = None
    order: int | None = None
    oom_score_adj: int | None = None


@dataclass(frozen=True, slots=True)
class OomEvent:
    """One victim of one OOM incident; a value the log does not contain is ``None``.

    ``incident`` numbers the incidents of one scan: the victims of a memory.oom.group kill
    (or the tasks killed for sharing the victim's mm) share it. ``killer`` says who killed:
    the kernel (``scope`` global or memcg) or a userspace killer (``scope`` None).
    ``confirmed`` is true only when the log holds the kill itself (a ``Killed process`` line,
    or the userspace killer's own kill line); an event known only from the kernel's selection
    line or ``oom-kill:`` summary (a filtered or cut log) is unconfirmed. ``pod_uid``,
    ``container_id`` and ``qos_class`` come from the victim's cgroup path.
    """

    source: str
    killer: Killer
    incident: int
    time: datetime | None = None
    boot_id: str | None = None
    uptime_seconds: float | None = None
    pid: int | None = None
    process: str | None = None
    uid: int | None = None
    total_vm_bytes: int | None = None
    anon_rss_bytes: int | None = None
    file_rss_bytes: int | None = None
    shmem_rss_bytes: int | None = None
    rss_bytes: int | None = None
    pgtables_bytes: int | None = None
    oom_score_adj: int | None = None
    oom_score: int | None = None
    constraint: str | None = None
    scope: Scope | None = None
    oom_memcg: str | None = None
    cgroup: str | None = None
    memcg_limit_bytes: int | None = None
    trigger: OomTrigger | None = None
    top_tasks: tuple[TopTask, ...] = ()
    group_kill: bool = False
    reaped: bool | None = None
    page_size_bytes: int | None = None
    reason: str | None = None
    message: str = ""
    confirmed: bool = True
    pod_uid: str | None = None
    container_id: str | None = None
    qos_class: str | None = None


@dataclass(frozen=True, slots=True)
class ProcessSummary:
    """Kills of one process name across a scan (the ``--summary`` view)."""

    process: str
    kills: int
    largest_anon_rss_bytes: int | None
    last_time: datetime | None


@dataclass(frozen=True, slots=True)
class HeapAtKill:
    """The last heap sample of a process before the OOM killer took it, and its trend.

    ``seconds_before`` is the kill's time minus the sample's; ``verdict`` the trend of the
    process's heap samples up to that one (analysis/trend.py); ``source`` the recording or
    state file the sample came from; ``sentence`` the kill and the heap in words.
    """

    sample: Sample
    seconds_before: float
    verdict: str
    source: str
    sentence: str


@dataclass(frozen=True, slots=True)
class OomScan:
    """Everything one scan found: events in log order, which sources, and notes to show.

    ``heap`` maps an event's index in ``events`` to the heap sample it was joined with (only
    when recordings or a collect state directory were given, and only where one fits).
    """

    events: tuple[OomEvent, ...]
    sources: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())
    heap: Mapping[int, HeapAtKill] = field(default_factory=dict)
