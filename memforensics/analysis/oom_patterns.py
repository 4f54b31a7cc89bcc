"""The log lines an OOM incident consists of, as regular expressions, one per kernel or
killer format; docs/oom.md has the table of generations and the traps each one handles."""

from __future__ import annotations

import re

# --- kernel formats ----------------------------------------------------------------------
# dump_header: "<comm> invoked oom-killer: gfp_mask=0x..(..), [nodemask=..,] order=N, ..."
INVOKED_RE = re.compile(
    r"^(?P<comm>.*?) invoked oom-killer: gfp_mask=(?P<gfp>0x[0-9a-fA-F]+(?:\([^)]*\))?)"
    r"(?:, nodemask=.*?)?, order=(?P<order>-?\d+)"
    r"(?:, oomkilladj=(?P<oomkilladj>-?\d+))?(?:, oom_adj=-?\d+)?"
    r"(?:, oom_score_adj=(?P<adj>-?\d+))?"
)
# dump_stack: "CPU: 0 [UID: 0 ]PID: 5256 Comm: python3 Not tainted ..." / 2.6.32 "Pid: 42, comm: x"
CPU_RE = re.compile(
    r"^(?:CPU: \d+ (?:UID: \d+ )?PID: (?P<pid>\d+) Comm: |Pid: (?P<old_pid>\d+), comm: )"
    r"(?P<comm>.*?)(?: (?:Not tainted|Tainted:|Kdump:).*)?$"
)
SUMMARY_RE = re.compile(
    r"^oom-kill:constraint=(?P<constraint>[A-Z_]+),nodemask=.*?"
    r"(?:,oom_memcg=(?P<oom_memcg>.*?)|,(?P<global>global_oom))?"
    r"(?:,task_memcg=(?P<task_memcg>.*?))?"
    r",task=(?P<task>.*),pid=(?P<pid>\d+),uid=(?P<uid>\d+)\s*$"
)
TASK_IN_RE = re.compile(r"^Task in (?P<task>.*) killed as a result of limit of (?P<limit>.*?)\s*$")
GROUP_RE = re.compile(r"^Tasks in (?P<memcg>.*) are going to be killed due to memory\.oom\.group")
MEMCG_USAGE_RE = re.compile(r"^memory: usage (?P<usage>\d+)kB, limit (?P<limit>\d+)kB")
MEMCG_STATS_RE = re.compile(r"^Memory cgroup stats for (?P<path>.*?):(?: |$)")
TABLE_ROW_RE = re.compile(r"^\[\s*(?P<pid>\d+)\]\s+(?P<rest>\S.*)$")
PREFIXES = (
    r"Out of memory(?: \(oom_kill_allocating_task\))?|Memory cgroup out of memory|Out of Memory"
)
# select_bad_process/oom_kill_process (< 5.1): "<prefix>: Kill process N (x) score S or sacrifice
# child" (2.6.36+) / "... and children." (<= 2.6.35); "Kill process N (x) sharing same memory".
SELECT_RE = re.compile(
    rf"^(?:(?P<prefix>{PREFIXES}): )?Kill process (?P<pid>\d+) \((?P<name>.*)\) "
    r"(?:score (?P<score>-?\d+) (?:or sacrifice child|and children)"
    r"|(?P<sharing>sharing same memory))"
)
# __oom_kill_process, every generation: see docs/oom.md for the table.
KILLED_RE = re.compile(
    rf"^(?:(?P<prefix>{PREFIXES}): )?Killed process (?P<pid>\d+)(?:, UID (?P<rhel_uid>\d+),)? "
    r"\((?P<name>.*)\)(?:\.?\s*$| total-vm:(?P<vm>\d+)kB, anon-rss:(?P<anon>\d+)kB, "
    r"file-rss:(?P<file>\d+)kB(?:, shmem-rss:(?P<shmem>\d+)kB)?(?:, UID:(?P<uid>\d+))?"
    r"(?: pgtables:(?P<pgtables>\d+)kB)?(?: oom_score_adj:(?P<adj>-?\d+))?)"
)
REAPED_RE = re.compile(r"^oom_reaper: reaped process (?P<pid>\d+) \(")
UNREAPED_RE = re.compile(r"^oom_reaper: unable to reap pid:(?P<pid>\d+) ")

# --- userspace killers -------------------------------------------------------------------
# systemd-oomd (v247+): "Killed <cgroup> due to <reason>"; newest "Marked <cgroup> for killing
# due to <reason>". Pressure reasons name the monitored cgroup.
OOMD_RE = re.compile(
    r"^(?:Killed (?P<killed>/\S*)|Marked (?P<marked>/\S*) for killing) due to (?P<reason>.*?)\s*$"
)
OOMD_MONITORED_RE = re.compile(r"^memory pressure for (?P<monitored>/\S*) being")
# earlyoom: 'sending SIGTERM to process 42 uid 1000 "name": badness 870, VmRSS 3120 MiB'
# (1.4-1.7) / ': oom_score 870, oom_score_adj 0, VmRSS 3120 MiB, cmdline "..."' (1.8+).
EARLYOOM_RE = re.compile(
    r"^sending (?P<signal>SIG[A-Z]+) to process (?P<pid>\d+)(?: uid (?P<uid>\d+))? "
    r'"(?P<name>.*)": (?:badness|oom_score) (?P<score>-?\d+)'
    r"(?:, oom_score_adj (?P<adj>-?\d+))?, VmRSS (?P<rss>\d+) MiB"
)
# The same kill line cut before " due to …" (wrapped onto the next line by a terminal copy).
OOMD_WRAPPED_RE = re.compile(
    r"^(?:Killed (?P<killed>/\S*)|Marked (?P<marked>/\S*) for killing)\s*$"
)
