"""Group kernel and userspace-killer log lines into OOM events, one per victim.

Pure: LogRecords in, OomEvents out. The formats and their traps are in docs/oom.md and
analysis/oom_patterns.py; the kernel sources they come from are mm/oom_kill.c,
mm/memcontrol.c (``dump_header``, ``dump_tasks``, ``dump_oom_summary``,
``__oom_kill_process``, ``mem_cgroup_print_oom_*``), systemd src/oom/ and earlyoom kill.c.

Any defining line makes an event: ``Killed process``, the selection line (< 5.1), the
``oom-kill:`` summary (5.0+), a systemd-oomd or earlyoom kill line. The lines of one
incident merge into one event per victim; what the log lacks stays None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime

from memforensics.analysis import oom_patterns as patterns
from memforensics.analysis import oom_tasks as tasks
from memforensics.analysis import oom_userspace as userspace
from memforensics.analysis.oom_incident import Incident, evolve, victim_event
from memforensics.model.logrecord import KERNEL, LogRecord
from memforensics.model.oom import OomEvent, OomTrigger

KIB = 1024

_OOMD_IDENTS = frozenset({"systemd-oomd", None})
_EARLYOOM_IDENTS = frozenset({"earlyoom", None})
_KERNEL_IDENTS = frozenset({KERNEL, None})
# Lines printed only inside an OOM report (memcg block, task table title).
_BLOCK_STARTS = ("Task in ", "memory: usage ", "Memory cgroup stats for ", "Tasks state ")
# A kill line this long after its incident's first line belongs to another incident (the
# lines of one report are printed within milliseconds; a cut log can join two reports).
_INCIDENT_SECONDS = 60.0


def _apart(first: datetime | None, second: datetime | None) -> bool:
    if first is None or second is None:
        return False
    return abs((second - first).total_seconds()) > _INCIDENT_SECONDS


def _kib(value: str | None) -> int | None:
    return int(value) * KIB if value is not None else None


def _int(value: str | None) -> int | None:
    return int(value) if value is not None else None


@dataclass
class _PendingOomd:
    """A systemd-oomd kill line whose "due to …" was wrapped onto the next line."""

    record: LogRecord
    line: str
    cgroup: str
    order: int


class OomLogParser:
    """Feed LogRecords of one stream in order, then ``finish()``; ``events`` holds one
    OomEvent per victim, in log order.

    State resets when the boot changes: pids and incidents never span boots.
    """

    def __init__(self, first_incident: int = 1) -> None:
        self.events: list[OomEvent] = []
        self._order: list[int] = []
        self._first_incident = first_incident
        self._next_incident = first_incident
        self._incident: Incident | None = None
        self._unkilled: list[Incident] = []
        self._summaries: dict[int, Incident] = {}
        self._boot: tuple[str, str | None] | None = None
        self._last_event_for_pid: dict[int, int] = {}
        self._pending_oomd: _PendingOomd | None = None
        self._records = 0

    @property
    def next_incident(self) -> int:
        """The number the next new incident will get (to continue across sources)."""
        return self._next_incident

    def feed(self, record: LogRecord) -> None:
        """Consume one record (possibly several lines)."""
        self._records += 1
        boot = (record.source, record.boot_id)
        previous = self._boot
        if boot != previous:
            # A record without a boot ID (a window of a saved journal export that starts
            # mid-entry) belongs to the boot around it.
            unknown = (
                previous is not None
                and previous[0] == record.source
                and (record.boot_id is None or previous[1] is None)
            )
            if not unknown:
                self._close_boot()
            if not unknown or record.boot_id is not None:
                self._boot = boot
        if "\n" in record.text:
            for line in record.text.split("\n"):
                self._line(line.strip(), record)
        else:
            self._line(record.text.strip(), record)

    def finish(self) -> list[OomEvent]:
        """Emit what only a selection or summary line showed, order and number the events."""
        self._close_boot()
        ordered = sorted(range(len(self.events)), key=lambda index: self._order[index])
        events = [self.events[index] for index in ordered]
        numbers: dict[int, int] = {}
        renumbered = []
        for event in events:
            number = numbers.setdefault(event.incident, self._first_incident + len(numbers))
            renumbered.append(event if number == event.incident else evolve(event, incident=number))
        self.events = renumbered
        self._order = sorted(self._order)
        self._next_incident = self._first_incident + len(numbers)
        self._last_event_for_pid.clear()
        return self.events

    def _close_boot(self) -> None:
        self._flush_oomd()
        for incident in self._unkilled:
            if not incident.victims:
                self._emit_unconfirmed(incident)
        self._unkilled.clear()
        self._incident = None
        self._summaries.clear()
        self._last_event_for_pid.clear()

    # -- dispatch -----------------------------------------------------------------------

    def _line(self, line: str, record: LogRecord) -> None:
        ident = record.ident
        if self._pending_oomd is not None:
            if line.startswith("due to ") and ident in _OOMD_IDENTS:
                pending, self._pending_oomd = self._pending_oomd, None
                self._emit_oomd(pending.record, pending.line, pending.cgroup, line[7:], pending)
                return
            self._flush_oomd()
        if ident in _KERNEL_IDENTS and self._kernel_line(line, record):
            return
        if (
            ident in _OOMD_IDENTS
            and line[:7] in ("Killed ", "Marked ")
            and self._oomd_line(line, record)
        ):
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
            return self._table_line(line, record)
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
        if line.startswith("Tasks in "):
            return self._group(line, incident)
        if (incident is None or incident.victims) and line.startswith(_BLOCK_STARTS):
            # The log starts inside a report (cut, or grep -A/-B): these lines exist only in
            # OOM reports, so they open an incident of their own.
            incident = self._new_incident(record)
        if incident is None or incident.victims:
            return False
        return self._report_line(line, incident)

    # -- kernel pieces ------------------------------------------------------------------

    @staticmethod
    def _group(line: str, incident: Incident | None) -> bool:
        """memory.oom.group's line, printed after the first victim's Killed line."""
        group = patterns.GROUP_RE.match(line)
        if group and incident is not None:
            incident.group = True
            incident.group_memcg = group.group("memcg")
            incident.oom_memcg = incident.oom_memcg or group.group("memcg")
            incident.scope = "memcg"
        return group is not None

    @staticmethod
    def _report_line(line: str, incident: Incident) -> bool:
        """A line of an OOM report's header block (before its victims): the trigger's PID,
        the memcg that hit its limit, and the report's scope."""
        if line[0] in "CP" and (line.startswith(("CPU: ", "Pid: "))):
            cpu = patterns.CPU_RE.match(line)
            if cpu and incident.trigger is not None and incident.trigger.pid is None:
                incident.trigger = replace(
                    incident.trigger, pid=int(cpu.group("pid") or cpu.group("old_pid"))
                )
            return cpu is not None
        if line.startswith("Task in "):
            task_in = patterns.TASK_IN_RE.match(line)
            if task_in:
                incident.task_memcg = task_in.group("task")
                incident.oom_memcg = task_in.group("limit")
                incident.scope = "memcg"
            return task_in is not None
        if line.startswith("memory: usage "):
            usage = patterns.MEMCG_USAGE_RE.match(line)
            if usage:
                incident.memcg_limit_bytes = int(usage.group("limit")) * KIB
                incident.scope = "memcg"
            return usage is not None
        if line.startswith("Memory cgroup stats for "):
            stats = patterns.MEMCG_STATS_RE.match(line)
            if stats and incident.stats_memcg is None:
                incident.stats_memcg = stats.group("path")
                incident.scope = "memcg"
            return stats is not None
        if line.startswith("Mem-Info:") and incident.scope is None:
            incident.scope = "global"
            return True
        return False

    def _new_incident(self, record: LogRecord) -> Incident:
        incident = Incident(order=self._records, time=record.time, record=record)
        self._incident = incident
        self._unkilled.append(incident)
        return incident

    def _invoked(self, line: str, record: LogRecord) -> bool:
        match = patterns.INVOKED_RE.match(line)
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

    def _table_line(self, line: str, record: LogRecord) -> bool:
        incident = self._incident
        header = "uid" in line and "tgid" in line and line.rstrip().endswith("name")
        if header and (incident is None or incident.victims):
            incident = self._new_incident(record)  # a log that starts at the task table
        if incident is None or incident.victims:
            return False
        if header:
            incident.columns = line.split("]", 1)[1].split()
            return True
        row = patterns.TABLE_ROW_RE.match(line)
        if row is None or incident.columns is None:
            return False
        parsed = tasks.parse_row(incident.columns, row.group("rest"))
        if parsed is None:
            return False
        incident.rows[int(row.group("pid"))] = parsed
        return True

    def _summary(self, line: str, record: LogRecord) -> bool:
        match = patterns.SUMMARY_RE.match(line)
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
        incident.summary_task = match.group("task")
        incident.summary_line = line
        incident.time = incident.time or record.time
        incident.record = incident.record or record
        self._summaries[incident.summary_pid] = incident
        return True

    def _selected(self, line: str, record: LogRecord) -> bool:
        match = patterns.SELECT_RE.match(line)
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
        if incident is None or incident.victims or incident.selected is not None:
            incident = self._new_incident(record)
        incident.scores[pid] = int(match.group("score"))
        incident.selected = (pid, match.group("name"), line)
        self._scope_from_prefix(incident, match.group("prefix"))
        return True

    def _killed(self, line: str, record: LogRecord) -> bool:
        match = patterns.KILLED_RE.match(line)
        if not match:
            return False
        pid = int(match.group("pid"))
        incident = self._summaries.pop(pid, None)
        if incident is None:
            incident = self._incident
            if (
                incident is None
                or (incident.victims and not incident.group)
                or _apart(incident.time, record.time)
            ):
                incident = self._new_incident(record)
        if pid in incident.victims:
            return True  # the same victim printed twice (memory.oom.group): count once
        self._scope_from_prefix(incident, match.group("prefix"))
        self._emit_kernel(
            incident, pid=pid, name=match.group("name"), match=match, record=record, line=line
        )
        return True

    @staticmethod
    def _scope_from_prefix(incident: Incident, prefix: str | None) -> None:
        if prefix is None or incident.scope is not None:
            return
        incident.scope = "memcg" if prefix.startswith("Memory cgroup") else "global"

    def _emit_kernel(
        self,
        incident: Incident,
        *,
        pid: int,
        name: str,
        match: re.Match[str] | None,
        record: LogRecord,
        line: str,
        confirmed: bool = True,
    ) -> None:
        if incident.number is None:
            incident.number = self._take_incident_number()
        incident.victims.add(pid)
        group = incident.group or len(incident.victims) > 1
        event = victim_event(
            incident,
            pid=pid,
            name=name,
            match=match,
            record=record,
            line=line,
            group=group,
            confirmed=confirmed,
        )
        if group and len(incident.victims) == 2:
            # The first victim turned out to be part of a group kill too.
            for index, previous in enumerate(self.events):
                if previous.incident == incident.number and not previous.group_kill:
                    self.events[index] = evolve(previous, group_kill=True)
        self._append(event, self._records if confirmed else incident.order)
        self._last_event_for_pid[pid] = len(self.events) - 1

    def _emit_unconfirmed(self, incident: Incident) -> None:
        """An incident with a selection or summary line but no Killed line (cut or filtered
        log, or the victim exited first): one event, ``confirmed`` false."""
        record = incident.record
        if record is None:
            return
        if incident.summary_pid is not None and incident.summary_line is not None:
            pid, name, line = incident.summary_pid, incident.summary_task, incident.summary_line
        elif incident.selected is not None:
            pid, name, line = incident.selected
        else:
            return
        if name is None:
            return
        self._emit_kernel(
            incident,
            pid=pid,
            name=name,
            match=None,
            record=replace(record, time=record.time or incident.time),
            line=line,
            confirmed=False,
        )

    def _reaper(self, line: str) -> bool:
        reaped = patterns.REAPED_RE.match(line)
        unreaped = None if reaped else patterns.UNREAPED_RE.match(line)
        found = reaped or unreaped
        if found is None:
            return False
        index = self._last_event_for_pid.get(int(found.group("pid")))
        if index is not None:
            self.events[index] = evolve(self.events[index], reaped=reaped is not None)
        return True

    # -- userspace killers --------------------------------------------------------------

    def _oomd_line(self, line: str, record: LogRecord) -> bool:
        match = patterns.OOMD_RE.match(line)
        if match:
            cgroup = match.group("killed") or match.group("marked")
            self._emit_oomd(record, line, cgroup, match.group("reason"), None)
            return True
        wrapped = patterns.OOMD_WRAPPED_RE.match(line)
        if wrapped is None:
            return False
        # "due to …" may follow on the next line (a terminal copy, a wrapped journal field).
        self._pending_oomd = _PendingOomd(
            record, line, wrapped.group("killed") or wrapped.group("marked"), self._records
        )
        return True

    def _flush_oomd(self) -> None:
        pending, self._pending_oomd = self._pending_oomd, None
        if pending is not None:
            self._emit_oomd(pending.record, pending.line, pending.cgroup, None, pending)

    def _emit_oomd(
        self,
        record: LogRecord,
        line: str,
        cgroup: str,
        reason: str | None,
        pending: _PendingOomd | None,
    ) -> None:
        event = userspace.oomd_event(
            record, line, cgroup, reason, self._take_incident_number(), wrapped=pending is not None
        )
        self._append(event, pending.order if pending is not None else self._records)

    def _earlyoom_line(self, line: str, record: LogRecord) -> bool:
        match = patterns.EARLYOOM_RE.match(line)
        if not match:
            return False
        pid = int(match.group("pid"))
        last = self._last_event_for_pid.get(pid)
        if last is not None and self.events[last].killer == "earlyoom":
            # SIGTERM then SIGKILL to the same process: one victim.
            self.events[last] = evolve(self.events[last], reason=match.group("signal"))
            return True
        self._append(
            userspace.earlyoom_event(match, record, self._take_incident_number()),
            self._records,
        )
        self._last_event_for_pid[pid] = len(self.events) - 1
        return True

    def _append(self, event: OomEvent, order: int) -> None:
        self.events.append(event)
        self._order.append(order)

    def _take_incident_number(self) -> int:
        number = self._next_incident
        self._next_incident += 1
        return number
