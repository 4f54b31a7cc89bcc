"""Events of the userspace OOM killers: systemd-oomd (kills whole cgroups, logs no pid or
size) and earlyoom (one process, its VmRSS). Their own kill line confirms the kill."""

from __future__ import annotations

import re

from memforensics.analysis import oom_patterns as patterns
from memforensics.model.logrecord import LogRecord
from memforensics.model.oom import OomEvent
from memforensics.sources.proc.cgroup import identify
from memforensics.units import MiB


def oomd_event(
    record: LogRecord,
    line: str,
    cgroup: str,
    reason: str | None,
    incident: int,
    *,
    wrapped: bool = False,
) -> OomEvent:
    """systemd-oomd's "Killed/Marked <cgroup> … due to <reason>" (reason None if cut off)."""
    reason = reason.strip() if reason else None
    monitored = patterns.OOMD_MONITORED_RE.match(reason) if reason else None
    unit = cgroup.rstrip("/").rsplit("/", 1)[-1] or cgroup
    identity = identify(cgroup)
    return OomEvent(
        source=record.source,
        killer="systemd-oomd",
        incident=incident,
        time=record.time,
        boot_id=record.boot_id,
        process=unit,
        cgroup=cgroup,
        oom_memcg=monitored.group("monitored") if monitored else None,
        reason=reason,
        message=f"{line} due to {reason}" if wrapped and reason else line,
        pod_uid=identity.pod_uid,
        container_id=identity.container_id,
        qos_class=identity.qos_class,
    )


def earlyoom_event(match: re.Match[str], record: LogRecord, incident: int) -> OomEvent:
    """earlyoom's "sending SIGTERM to process N …" line as a victim."""
    uid, adj = match.group("uid"), match.group("adj")
    return OomEvent(
        source=record.source,
        killer="earlyoom",
        incident=incident,
        time=record.time,
        boot_id=record.boot_id,
        pid=int(match.group("pid")),
        process=match.group("name"),
        uid=int(uid) if uid is not None else None,
        rss_bytes=int(match.group("rss")) * MiB,
        oom_score=int(match.group("score")),
        oom_score_adj=int(adj) if adj is not None else None,
        reason=match.group("signal"),
        message=match.string,
    )
