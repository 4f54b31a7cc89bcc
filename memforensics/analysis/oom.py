"""Group kernel and userspace-killer log lines into OOM events, one per victim.

Pure: LogRecords in, OomEvents out. The formats and their traps are in
docs/oom.md; the kernel sources they come from are mm/oom_kill.c, mm/memcontrol.c
(``dump_header``, ``dump_tasks``, ``dump_oom_summary``, ``__oom_kill_process``,
``mem_cgroup_print_oom_*``), systemd src/oom/ and earlyoom kill.c.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from fnmatch import fnmatchcase

from memforensics.model.oom import (
    OomEvent,
    OomScan,
    OomTrigger,
    ProcessSummary,
    Scope,
    TopTask,
)
from memforensics.sources.logrecord import KERNEL, LogRecord

KIB = 1024
DEFAULT_PAGE_BYTES = 4096
TOP_TASKS = 5

# --- kernel formats ----------------------------------------------------------------------
# dump_header: "<comm> invoked oom-killer: gfp_mask=0x..(..), [nodemask=..,] order=N, ..."
_INVOKED_RE = re.compile(
    r"^(?P<comm>.*?) invoked oom-killer: gfp_mask=(?P<gfp>0x[0-9a-fA-F]+(?:\([^)]*\))?)"
    r"(?:, nodemask=.*?)?, order=(?P<order>-?\d+)"
    r"(?:, oomkilladj=(?P<oomkilladj>-?\d+))?(?:, oom_adj=-?\d+)?"
    r"(?:, oom_score_adj=(?P<adj>-?\d+))?"
)
# dump_stack: "CPU: 0 [UID: 0 ]PID: 5256 Comm: python3 Not tainted ..." / 2.6.32 "Pid: 42, comm: x"
_CPU_RE = re.compile(
    r"^(?:CPU: \d+ (?:UID: \d+ )?PID: (?P<pid>\d+) Comm: |Pid: (?P<old_pid>\d+), comm: )"
    r"(?P<comm>.*?)(?: (?:Not tainted|Tainted:|Kdump:).*)?$"
)
_SUMMARY_RE = re.compile(
    r"^oom-kill:constraint=(?P<constraint>[A-Z_]+),nodemask=.*?"
    r"(?:,oom_memcg=(?P<oom_memcg>.*?)|,(?P<global>global_oom))?"
    r"(?:,task_memcg=(?P<task_memcg>.*?))?"
    r",task=(?P<task>.*),pid=(?P<pid>\d+),uid=(?P<uid>\d+)\s*$"
)
_TASK_IN_RE = re.compile(r"^Task in (?P<task>.*) killed as a result of limit of (?P<limit>.*?)\s*$")
_GROUP_RE = re.compile(r"^Tasks in (?P<memcg>.*) are going to be killed due to memory\.oom\.group")
_MEMCG_USAGE_RE = re.compile(r"^memory: usage (?P<usage>\d+)kB, limit (?P<limit>\d+)kB")
_MEMCG_STATS_RE = re.compile(r"^Memory cgroup stats for (?P<path>.*?):(?: |$)")
_TABLE_ROW_RE = re.compile(r"^\[\s*(?P<pid>\d+)\]\s+(?P<rest>\S.*)$")
_PREFIXES = (
    r"Out of memory(?: \(oom_kill_allocating_task\))?|Memory cgroup out of memory|Out of Memory"
)
# select_bad_process/oom_kill_process (< 5.1): "<prefix>: Kill process N (x) score S or sacrifice
# child" (2.6.36+) / "... and children." (<= 2.6.35); "Kill process N (x) sharing same memory".
_SELECT_RE = re.compile(
    rf"^(?:(?P<prefix>{_PREFIXES}): )?Kill process (?P<pid>\d+) \((?P<name>.*)\) "
    r"(?:score (?P<score>-?\d+) (?:or sacrifice child|and children)"
    r"|(?P<sharing>sharing same memory))"
)
# __oom_kill_process, every generation: see docs/oom.md for the table.
_KILLED_RE = re.compile(
    rf"^(?:(?P<prefix>{_PREFIXES}): )?Killed process (?P<pid>\d+)(?:, UID (?P<rhel_uid>\d+),)? "
    r"\((?P<name>.*)\)(?:\.?\s*$| total-vm:(?P<vm>\d+)kB, anon-rss:(?P<anon>\d+)kB, "
    r"file-rss:(?P<file>\d+)kB(?:, shmem-rss:(?P<shmem>\d+)kB)?(?:, UID:(?P<uid>\d+))?"
    r"(?: pgtables:(?P<pgtables>\d+)kB)?(?: oom_score_adj:(?P<adj>-?\d+))?)"
)
_REAPED_RE = re.compile(r"^oom_reaper: reaped process (?P<pid>\d+) \(")
_UNREAPED_RE = re.compile(r"^oom_reaper: unable to reap pid:(?P<pid>\d+) ")

# --- userspace killers -------------------------------------------------------------------
# systemd-oomd (v247+): "Killed <cgroup> due to <reason>"; newest "Marked <cgroup> for killing
# due to <reason>". Pressure reasons name the monitored cgroup.
_OOMD_RE = re.compile(
    r"^(?:Killed (?P<killed>/\S*)|Marked (?P<marked>/\S*) for killing) due to (?P<reason>.*?)\s*$"
)
_OOMD_MONITORED_RE = re.compile(r"^memory pressure for (?P<monitored>/\S*) being")
# earlyoom: 'sending SIGTERM to process 42 uid 1000 "name": badness 870, VmRSS 3120 MiB'
# (1.4-1.7) / ': oom_score 870, oom_score_adj 0, VmRSS 3120 MiB, cmdline "..."' (1.8+).
_EARLYOOM_RE = re.compile(
    r"^sending (?P<signal>SIG[A-Z]+) to process (?P<pid>\d+)(?: uid (?P<uid>\d+))? "
    r'"(?P<name>.*)": (?:badness|oom_score) (?P<score>-?\d+)'
    r"(?:, oom_score_adj (?P<adj>-?\d+))?, VmRSS (?P<rss>\d+) MiB"
)

_OOMD_IDENTS = frozenset({"systemd-oomd", None})
_EARLYOOM_IDENTS = frozenset({"earlyoom", None})
_KERNEL_IDENTS = frozenset({KERNEL, None})
_PAGE_SIZES = (4096, 16384, 65536)
# Column names of the task table and the TopTask field (and unit) each feeds.
_PAGE_COLUMNS = {
    "total_vm": "total_vm_bytes",
    "rss": "rss_bytes",
    "rss_anon": "rss_anon_bytes",
    "rss_file": "rss_file_bytes",
    "rss_shmem": "rss_shmem_bytes",
    "swapents": "swap_bytes",
}


def _kib(value: str | None) -> int | None:
    return int(value) * KIB if value is not None else None


def _int(value: str | None) -> int | None:
    return int(value) if value is not None else None


@dataclass
class _Incident:
    """What one OOM incident's lines said so far (header, memcg block, table, summary).

    ``number`` is given at its first victim, so that incidents without a kill (a panic, a
    log cut short) leave no gaps and every reader numbers the same incidents alike.
    """

    number: int | None = None
    time: datetime | None = None
    trigger: OomTrigger | None = None
    scope: Scope | None = None
    constraint: str | None = None
    oom_memcg: str | None = None
    task_memcg: str | None = None
    summary_pid: int | None = None
    summary_uid: int | None = None
    stats_memcg: str | None = None
    memcg_limit_bytes: int | None = None
    group: bool = False
    columns: list[str] | None = None
    rows: dict[int, dict[str, int | str]] = field(default_factory=dict)
    scores: dict[int, int] = field(default_factory=dict)
    victims: set[int] = field(default_factory=set)


class OomLogParser:
    """Feed LogRecords of one stream in order; collect OomEvents (one per victim).

    State resets when the boot changes: pids and incidents never span boots.
    """

    def __init__(self, first_incident: int = 1) -> None:
        self.events: list[OomEvent] = []
        self.notes: list[str] = []
        self._next_incident = first_incident
        self._incident: _Incident | None = None
        self._summaries: dict[int, _Incident] = {}
        self._boot: tuple[str, str | None] | None = None
        self._last_event_for_pid: dict[int, int] = {}

    @property
    def next_incident(self) -> int:
        """The number the next new incident will get (to continue across sources)."""
        return self._next_incident

    def feed(self, record: LogRecord) -> None:
        """Consume one record (possibly several lines)."""
        boot = (record.source, record.boot_id)
        if boot != self._boot:
            self._boot = boot
            self._incident = None
            self._summaries.clear()
            self._last_event_for_pid.clear()
        if "\n" in record.text:
            for line in record.text.split("\n"):
                self._line(line.strip(), record)
        else:
            self._line(record.text.strip(), record)

    # -- dispatch -----------------------------------------------------------------------

    def _line(self, line: str, record: LogRecord) -> None:
        ident = record.ident
        if ident in _KERNEL_IDENTS and self._kernel_line(line, record):
            return
        if ident in _OOMD_IDENTS and ("due to" in line) and self._oomd_line(line, record):
            return
        if ident in _EARLYOOM_IDENTS and line.startswith("sending SIG"):
            self._earlyoom_line(line, record)

    def _kernel_line(self, line: str, record: LogRecord) -> bool:
        if not line:
            return False
        first = line[0]
        if " invoked oom-killer: " in line:
            return self._invoked(line, record)
        if first == "[":
            return self._table_line(line)
        if first == "o":
            if line.startswith("oom-kill:"):
                return self._summary(line, record)
            if line.startswith("oom_reaper: "):
                return self._reaper(line)
        if "Killed process " in line:
            return self._killed(line, record)
        if "Kill process " in line:
            return self._selected(line, record)
        incident = self._incident
        if incident is not None and line.startswith("Tasks in "):
            # memory.oom.group: printed after the first victim's Killed line.
            group = _GROUP_RE.match(line)
            if group:
                incident.group = True
                incident.oom_memcg = incident.oom_memcg or group.group("memcg")
                incident.scope = "memcg"
            return group is not None
        if incident is None or incident.victims:
            return False
        if first in "CP" and (line.startswith(("CPU: ", "Pid: "))):
            cpu = _CPU_RE.match(line)
            if cpu and incident.trigger is not None and incident.trigger.pid is None:
                incident.trigger = replace(
                    incident.trigger, pid=int(cpu.group("pid") or cpu.group("old_pid"))
                )
            return cpu is not None
        if line.startswith("Task in "):
            task_in = _TASK_IN_RE.match(line)
            if task_in:
                incident.task_memcg = task_in.group("task")
                incident.oom_memcg = task_in.group("limit")
                incident.scope = "memcg"
            return task_in is not None
        if line.startswith("memory: usage "):
            usage = _MEMCG_USAGE_RE.match(line)
            if usage:
                incident.memcg_limit_bytes = int(usage.group("limit")) * KIB
                incident.scope = "memcg"
            return usage is not None
        if line.startswith("Memory cgroup stats for "):
            stats = _MEMCG_STATS_RE.match(line)
            if stats and incident.stats_memcg is None:
                incident.stats_memcg = stats.group("path")
                incident.scope = "memcg"
            return stats is not None
        if line.startswith("Mem-Info:") and incident.scope is None:
            incident.scope = "global"
            return True
        return False

    # -- kernel pieces ------------------------------------------------------------------

    def _new_incident(self, record: LogRecord) -> _Incident:
        incident = _Incident(time=record.time)
        self._incident = incident
        return incident

    def _invoked(self, line: str, record: LogRecord) -> bool:
        match = _INVOKED_RE.match(line)
        if not match:
            return False
        incident = self._new_incident(record)
        adj = match.group("adj") or match.group("oomkilladj")
        incident.trigger = OomTrigger(
            process=match.group("comm"),
            gfp_mask=match.group("gfp"),
            order=int(match.group("order")),
            oom_score_adj=_int(adj),
        )
        return True

    def _table_line(self, line: str) -> bool:
        incident = self._incident
        if incident is None or incident.victims:
            return False
        if "uid" in line and "tgid" in line and line.rstrip().endswith("name"):
            incident.columns = line.split("]", 1)[1].split()
            return True
        row = _TABLE_ROW_RE.match(line)
        if row is None or incident.columns is None:
            return False
        columns = incident.columns
        values = row.group("rest").split(None, len(columns) - 1)
        if len(values) != len(columns):
            return False
        parsed: dict[str, int | str] = {"name": values[-1]}
        try:
            for column, value in zip(columns[:-1], values[:-1], strict=False):
                parsed[column] = int(value)
        except ValueError:
            return False
        incident.rows[int(row.group("pid"))] = parsed
        return True

    def _summary(self, line: str, record: LogRecord) -> bool:
        match = _SUMMARY_RE.match(line)
        if not match:
            return False
        incident = self._incident
        if incident is None or incident.victims or incident.summary_pid is not None:
            # Its header was rate-limited away (or filtered out): a new incident.
            incident = self._new_incident(record)
        incident.constraint = match.group("constraint")
        if match.group("oom_memcg") is not None:
            incident.oom_memcg = match.group("oom_memcg")
            incident.scope = "memcg"
        elif match.group("global"):
            incident.scope = "global"
        elif incident.constraint == "CONSTRAINT_MEMCG":
            incident.scope = "memcg"
        if match.group("task_memcg") is not None:
            incident.task_memcg = match.group("task_memcg")
        incident.summary_pid = int(match.group("pid"))
        incident.summary_uid = int(match.group("uid"))
        self._summaries[incident.summary_pid] = incident
        return True

    def _selected(self, line: str, record: LogRecord) -> bool:
        match = _SELECT_RE.match(line)
        if not match:
            return False
        pid = int(match.group("pid"))
        incident = self._incident
        if match.group("sharing"):
            # Killed for sharing the victim's mm: a victim of the same incident, sizes unknown.
            if incident is None:
                incident = self._new_incident(record)
            self._emit_kernel(
                incident, pid=pid, name=match.group("name"), match=None, record=record, line=line
            )
            return True
        if incident is None or incident.victims:
            incident = self._new_incident(record)
        incident.scores[pid] = int(match.group("score"))
        self._scope_from_prefix(incident, match.group("prefix"))
        return True

    def _killed(self, line: str, record: LogRecord) -> bool:
        match = _KILLED_RE.match(line)
        if not match:
            return False
        pid = int(match.group("pid"))
        incident = self._summaries.pop(pid, None)
        if incident is None:
            incident = self._incident
            if incident is None or (incident.victims and not incident.group):
                incident = self._new_incident(record)
        if pid in incident.victims:
            return True  # the same victim printed twice (memory.oom.group): count once
        self._scope_from_prefix(incident, match.group("prefix"))
        self._emit_kernel(
            incident, pid=pid, name=match.group("name"), match=match, record=record, line=line
        )
        return True

    @staticmethod
    def _scope_from_prefix(incident: _Incident, prefix: str | None) -> None:
        if prefix is None or incident.scope is not None:
            return
        incident.scope = "memcg" if prefix.startswith("Memory cgroup") else "global"

    def _emit_kernel(
        self,
        incident: _Incident,
        *,
        pid: int,
        name: str,
        match: re.Match[str] | None,
        record: LogRecord,
        line: str,
    ) -> None:
        if incident.number is None:
            incident.number = self._take_incident_number()
        incident.victims.add(pid)
        group = incident.group or len(incident.victims) > 1
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
        row = incident.rows.get(pid)
        page_bytes = _page_size(row, total_vm)
        if row is not None:
            if uid is None and isinstance(row.get("uid"), int):
                uid = int(row["uid"])
            if adj is None and isinstance(row.get("oom_score_adj"), int):
                adj = int(row["oom_score_adj"])
        rss = None
        if anon is not None and file_rss is not None:
            rss = anon + file_rss + (shmem or 0)
        scope = incident.scope
        constraint = incident.constraint
        if constraint == "CONSTRAINT_NONE" and scope == "memcg":
            # 5.0-5.1 printed CONSTRAINT_NONE for memcg OOMs (fixed by 432b1de0de02).
            constraint = "CONSTRAINT_MEMCG"
        oom_memcg = incident.oom_memcg or (incident.stats_memcg if scope == "memcg" else None)
        cgroup = (
            incident.task_memcg if (is_summary_victim or incident.summary_pid is None) else None
        )
        if cgroup is None and not group and scope == "memcg" and incident.summary_pid is None:
            cgroup = oom_memcg
        event = OomEvent(
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
            top_tasks=_top_tasks(incident.rows, page_bytes[0]),
            group_kill=group,
            page_size_bytes=page_bytes[1],
            message=line,
        )
        if group and len(incident.victims) == 2:
            # The first victim turned out to be part of a group kill too.
            for index, previous in enumerate(self.events):
                if previous.incident == incident.number and not previous.group_kill:
                    self.events[index] = replace(previous, group_kill=True)
        self._last_event_for_pid[pid] = len(self.events)
        self.events.append(event)

    def _reaper(self, line: str) -> bool:
        reaped = _REAPED_RE.match(line)
        unreaped = None if reaped else _UNREAPED_RE.match(line)
        found = reaped or unreaped
        if found is None:
            return False
        index = self._last_event_for_pid.get(int(found.group("pid")))
        if index is not None:
            self.events[index] = replace(self.events[index], reaped=reaped is not None)
        return True

    # -- userspace killers --------------------------------------------------------------

    def _oomd_line(self, line: str, record: LogRecord) -> bool:
        match = _OOMD_RE.match(line)
        if not match:
            return False
        cgroup = match.group("killed") or match.group("marked")
        reason = match.group("reason")
        monitored = _OOMD_MONITORED_RE.match(reason)
        unit = cgroup.rstrip("/").rsplit("/", 1)[-1] or cgroup
        self.events.append(
            OomEvent(
                source=record.source,
                killer="systemd-oomd",
                incident=self._take_incident_number(),
                time=record.time,
                boot_id=record.boot_id,
                process=unit,
                cgroup=cgroup,
                oom_memcg=monitored.group("monitored") if monitored else None,
                reason=reason,
                message=line,
            )
        )
        return True

    def _earlyoom_line(self, line: str, record: LogRecord) -> bool:
        match = _EARLYOOM_RE.match(line)
        if not match:
            return False
        pid = int(match.group("pid"))
        last = self._last_event_for_pid.get(pid)
        if last is not None and self.events[last].killer == "earlyoom":
            # SIGTERM then SIGKILL to the same process: one victim.
            self.events[last] = replace(self.events[last], reason=match.group("signal"))
            return True
        self._last_event_for_pid[pid] = len(self.events)
        self.events.append(
            OomEvent(
                source=record.source,
                killer="earlyoom",
                incident=self._take_incident_number(),
                time=record.time,
                boot_id=record.boot_id,
                pid=pid,
                process=match.group("name"),
                uid=_int(match.group("uid")),
                rss_bytes=int(match.group("rss")) * 1024 * 1024,
                oom_score=int(match.group("score")),
                oom_score_adj=_int(match.group("adj")),
                reason=match.group("signal"),
                message=line,
            )
        )
        return True

    def _take_incident_number(self) -> int:
        number = self._next_incident
        self._next_incident += 1
        return number


def _page_size(
    row: dict[str, int | str] | None, total_vm_bytes: int | None
) -> tuple[int, int | None]:
    """(page size to use, page size inferred or None): the victim's table row in pages against
    its Killed line in kB gives the machine's page size (4 KiB x86-64, 16/64 KiB arm64/ppc64)."""
    if row is None or total_vm_bytes is None:
        return DEFAULT_PAGE_BYTES, None
    pages = row.get("total_vm")
    if not isinstance(pages, int) or pages <= 0:
        return DEFAULT_PAGE_BYTES, None
    ratio = total_vm_bytes / pages
    best = min(_PAGE_SIZES, key=lambda size: abs(size - ratio))
    if abs(best - ratio) > best * 0.05:
        return DEFAULT_PAGE_BYTES, None
    return best, best


def _top_tasks(rows: dict[int, dict[str, int | str]], page_bytes: int) -> tuple[TopTask, ...]:
    """The biggest rows of the task table by rss, converted to bytes."""
    tasks = []
    for pid, row in rows.items():
        values: dict[str, int | None] = {}
        for column, attribute in _PAGE_COLUMNS.items():
            value = row.get(column)
            values[attribute] = value * page_bytes if isinstance(value, int) else None
        pgtables = row.get("pgtables_bytes")
        uid, tgid, adj = row.get("uid"), row.get("tgid"), row.get("oom_score_adj")
        tasks.append(
            TopTask(
                pid=pid,
                name=str(row["name"]),
                uid=uid if isinstance(uid, int) else None,
                tgid=tgid if isinstance(tgid, int) else None,
                pgtables_bytes=pgtables if isinstance(pgtables, int) else None,
                oom_score_adj=adj if isinstance(adj, int) else None,
                **values,
            )
        )
    tasks.sort(key=lambda task: task.rss_bytes or 0, reverse=True)
    return tuple(tasks[:TOP_TASKS])


# --- whole scans ---------------------------------------------------------------------------


def find_events(records: Iterable[LogRecord], *, first_incident: int = 1) -> list[OomEvent]:
    """All OOM events in ``records`` (one stream, in log order)."""
    parser = OomLogParser(first_incident)
    for record in records:
        parser.feed(record)
    return parser.events


def select_events(
    events: Iterable[OomEvent],
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    process: str | None = None,
) -> Iterator[OomEvent]:
    """Events within [since, until] whose victim name matches ``process`` (a glob).

    An event without a wall-clock time cannot be placed and is left out when a time bound
    is given (the scan notes how many).
    """
    for event in events:
        if since is not None or until is not None:
            if event.time is None:
                continue
            if since is not None and event.time < since:
                continue
            if until is not None and event.time > until:
                continue
        if process is not None and not fnmatchcase(event.process or "", process):
            continue
        yield event


def scan(
    streams: Iterable[tuple[str, Iterable[LogRecord]]],
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    process: str | None = None,
    notes: Iterable[str] = (),
) -> OomScan:
    """Parse every stream (name, records), filter, and return one OomScan."""
    events: list[OomEvent] = []
    names: list[str] = []
    next_incident = 1
    for name, records in streams:
        names.append(name)
        parser = OomLogParser(next_incident)
        for record in records:
            parser.feed(record)
        next_incident = parser.next_incident
        events.extend(parser.events)
    all_notes = list(notes)
    selected = list(select_events(events, since=since, until=until, process=process))
    if since is not None or until is not None:
        untimed = sum(1 for event in events if event.time is None)
        if untimed:
            all_notes.append(
                f"{untimed} kill(s) without a wall-clock time in the log were left out by "
                "--since/--until"
            )
    return OomScan(events=tuple(selected), sources=tuple(names), notes=tuple(all_notes))


def summarize(events: Iterable[OomEvent]) -> list[ProcessSummary]:
    """Kills per process name: count, largest anon-rss, last time; most kills first."""
    groups: dict[str, list[OomEvent]] = {}
    for event in events:
        groups.setdefault(event.process or "?", []).append(event)
    summaries = []
    for name, group in groups.items():
        sizes = [e.anon_rss_bytes for e in group if e.anon_rss_bytes is not None]
        times = [e.time for e in group if e.time is not None]
        summaries.append(
            ProcessSummary(
                process=name,
                kills=len(group),
                largest_anon_rss_bytes=max(sizes) if sizes else None,
                last_time=max(times) if times else None,
            )
        )
    summaries.sort(key=lambda s: (-s.kills, s.process))
    return summaries
