"""OOM grouping and parsing on real and hand-made log text (fixtures/oom/, see its README)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from memforensics.analysis.oom_select import scan, select_events, summarize
from memforensics.model.logrecord import KERNEL, LogRecord
from memforensics.model.oom import OomEvent
from memforensics.sources.logs.logfile import read_text_log
from tests.support.timezone import pinned_timezone


def find_events(records: Iterable[LogRecord]) -> list[OomEvent]:
    """Every event of one stream, as a whole scan reports them."""
    return list(scan([("test", records)]).events)


OOM = Path(__file__).resolve().parent.parent.parent / "fixtures" / "oom"
KiB = 1024


@pytest.fixture(autouse=True)
def utc() -> Iterator[None]:
    """Local-time stamps (syslog, dmesg -T) are read in TZ; pin it, then put it back."""
    with pinned_timezone("UTC"):
        yield


def events(name: str) -> list[OomEvent]:
    return find_events(read_text_log(str(OOM / name)))


def test_real_6_18_memcg_v1_from_kmsg_records() -> None:
    """Real /dev/kmsg records of a memcg OOM on this project's 6.18 test machine."""
    (event,) = events("kmsg-6.18-memcg-v1.kmsg")
    assert (event.pid, event.process, event.uid) == (5256, "python3", 0)
    assert event.scope == "memcg"
    assert event.constraint == "CONSTRAINT_MEMCG"
    assert event.oom_memcg == event.cgroup == "/mf-probe-2808"
    assert event.anon_rss_bytes == 72172 * KiB
    assert event.total_vm_bytes == 82360 * KiB
    assert event.shmem_rss_bytes == 0
    assert event.pgtables_bytes == 204 * KiB
    assert event.memcg_limit_bytes == 65536 * KiB
    assert event.trigger is not None
    assert (event.trigger.process, event.trigger.pid) == ("python3", 5256)
    assert event.trigger.gfp_mask == "0xcc0(GFP_KERNEL)"
    # 6.8+ table: rss split into anon/file/shmem columns, in pages.
    (top,) = event.top_tasks
    assert top.rss_anon_bytes == 18043 * 4096
    assert top.rss_file_bytes == 1656 * 4096
    assert event.page_size_bytes == 4096
    assert event.uptime_seconds == pytest.approx(300.947624)
    assert event.time is None  # a saved kmsg file has no wall clock


def test_real_3_13_memcg_cadvisor() -> None:
    (event,) = events("cadvisor-3.13-memcg.log")
    assert (event.pid, event.process) == (13536, "memorymonster")
    assert event.scope == "memcg"
    assert (event.cgroup, event.oom_memcg) == ("/mem2", "/mem2")
    assert event.oom_score == 996
    assert event.uid == 275858  # six-digit uids are real: from the table row
    assert event.shmem_rss_bytes is None  # not printed before 4.5: unknown, not 0
    assert event.constraint is None
    assert event.memcg_limit_bytes == 980 * KiB


def test_real_3_13_global_keeps_top_consumers() -> None:
    (event,) = events("cadvisor-3.13-global.log")
    assert event.scope == "global"
    assert event.pid == 1532
    assert event.cgroup is None and event.oom_memcg is None
    assert [task.name for task in event.top_tasks] == [
        "badsysprogram",
        "manage_accounts",
        "manage_addresse",
        "bash",
        "sshd",
    ]
    assert event.top_tasks[0].rss_bytes == 398810 * 4096
    assert event.top_tasks[4].oom_score_adj == -1000


def test_real_4_8_two_docker_incidents_with_reaper() -> None:
    first, second = events("cadvisor-4.8-docker.log")
    assert (first.pid, second.pid) == (1381, 1667)
    assert first.incident != second.incident
    assert first.cgroup is not None and first.cgroup.startswith("/docker/2e088fe4")
    assert second.oom_memcg is not None and second.oom_memcg.startswith("/docker/6c6fcab8")
    assert first.reaped is True and second.reaped is True
    assert second.anon_rss_bytes == 248180 * KiB


def test_real_npd_4_19_and_5_4_forms() -> None:
    old, new = events("npd-480-4.19-5.4.log")
    assert (old.pid, old.oom_score, old.uid, old.oom_score_adj) == (4015, 1923, None, None)
    assert (new.pid, new.uid, new.oom_score_adj) == (4249, 0, 994)
    assert new.pgtables_bytes == 112 * KiB
    assert old.scope == new.scope == "memcg"


def test_summary_line_pairs_with_its_kill() -> None:
    (event,) = events("cadvisor-2417-summary.log")
    assert event.oom_memcg == "/kubepods/burstable/podfbdfe8e3-1c87-4ff2-907c-b2ec8e25d012"
    assert event.cgroup is not None and event.cgroup.endswith(
        "/ef807430361e6e82b45db92e2e9b6fbec98f419b12c591e655c1a725565e73a8"
    )


def test_rhel6_uid_before_name_and_gpud_short_form() -> None:
    full, short = events("handmade-rhel6-2.6.32.log")
    assert (full.pid, full.uid, full.process, full.oom_score) == (4242, 48, "httpd", 912)
    assert full.trigger is not None and full.trigger.pid == 4242
    assert full.scope == "global"
    assert full.time is not None
    assert (full.time.month, full.time.day, full.time.hour) == (1, 9, 3)
    assert (short.pid, short.uid, short.anon_rss_bytes) == (123, 48, None)


def test_oldest_kernel_form() -> None:
    (event,) = events("handmade-2.6.2x.log")
    assert (event.pid, event.process, event.oom_score) == (2211, "java", 845123)
    assert event.total_vm_bytes is None


def test_trigger_is_not_the_victim_and_names_with_parentheses() -> None:
    (event,) = events("handmade-5.10-global-caller-ids.log")
    assert event.process == "worker (x y)"
    assert event.pid == 5150
    assert event.trigger is not None
    assert (event.trigger.process, event.trigger.pid) == ("node server", 4242)
    assert event.cgroup == "/system.slice/batch.service"
    assert event.scope == "global"
    assert (event.uid, event.oom_score_adj) == (1001, 300)
    assert event.reaped is True
    assert event.top_tasks[0].name == "worker (x y)"
    assert event.top_tasks[0].pgtables_bytes == 9900000


def test_constraint_none_bug_of_5_0_is_corrected() -> None:
    (event,) = events("handmade-5.0-constraint-none-memcg.log")
    assert event.scope == "memcg"
    assert event.constraint == "CONSTRAINT_MEMCG"
    assert event.memcg_limit_bytes == 102400 * KiB


def test_oom_group_kill_is_one_incident_and_repeated_victim_counted_once() -> None:
    found = events("handmade-oom-group-v2-6.12.log")
    assert [e.pid for e in found] == [7001, 7002]
    assert {e.incident for e in found} == {found[0].incident}
    assert all(e.group_kill for e in found)
    assert found[0].cgroup is not None and found[0].cgroup.endswith("cri-containerd-aaaa.scope")
    assert found[1].oom_memcg == found[0].oom_memcg
    pause = next(t for t in found[0].top_tasks if t.name == "pause")
    assert (pause.uid, pause.oom_score_adj) == (65535, -998)


def test_interleaved_summaries_pair_by_pid_and_headerless_kills_stand_alone() -> None:
    found = events("handmade-storm-interleaved.log")
    by_pid = {e.pid: e for e in found}
    assert by_pid[501].cgroup == "/jobs/a"
    assert by_pid[502].cgroup == "/jobs/b"
    assert by_pid[503].cgroup is None and by_pid[503].scope == "memcg"
    assert len({e.incident for e in found}) == 4


def test_quoted_oom_messages_are_not_kills() -> None:
    (event,) = events("handmade-quoted-not-kills.log")
    assert event.pid == 3100
    assert event.uptime_seconds == pytest.approx(52341.234567)


def test_dmesg_T_in_any_locale() -> None:
    found = events("handmade-dmesg-T-locales.log")
    assert [e.time for e in found] == [
        datetime(2024, 5, 9, 14, 52, 38, tzinfo=timezone.utc),
        datetime(2025, 3, 3, 9, 15, 2, tzinfo=timezone.utc),
        datetime(2023, 10, 5, 10, 0, 0, tzinfo=timezone.utc),
    ]
    assert found[0].shmem_rss_bytes == 100000 * KiB
    assert found[2].scope == "memcg"


def test_journalctl_short_iso_and_localised_month() -> None:
    found = events("handmade-journalctl-short.log")
    assert [e.pid for e in found] == [1001, 1002, 1003, 1004]
    assert found[1].time == datetime(2024, 3, 5, 10, 22, 33, tzinfo=timezone.utc)
    assert found[2].time is not None and (found[2].time.month, found[2].time.day) == (3, 5)
    assert found[3].uptime_seconds == pytest.approx(9999.000001)


def test_dmesg_x_and_iso() -> None:
    first, second = events("handmade-dmesg-x-iso.log")
    assert first.trigger is not None and first.trigger.process == "gcc"
    assert second.time == datetime(2024, 5, 9, 14, 52, 38, 123456, tzinfo=timezone.utc)


def test_sysrq_sacrificed_child_and_shared_mm() -> None:
    child, sharing = events("handmade-sysrq-sharing-panic.log")
    assert child.pid == 3334  # "Kill process 3333" chose the parent; its child died
    assert child.oom_score is None
    assert child.trigger is not None and child.trigger.order == -1
    assert child.trigger.process == "kworker/4:1"
    assert sharing.pid == 3335 and sharing.incident == child.incident
    assert sharing.anon_rss_bytes is None
    assert child.group_kill and sharing.group_kill


def test_page_size_is_inferred_from_the_victim_row() -> None:
    (event,) = events("handmade-arm64-64k.log")
    assert event.page_size_bytes == 65536
    assert event.top_tasks[0].rss_bytes == 40000 * 65536


def test_earlyoom_generations_and_sigterm_then_sigkill_is_one_victim() -> None:
    found = events("handmade-earlyoom.log")
    assert [(e.pid, e.process) for e in found] == [
        (4242, "Web Content"),
        (5151, "tail"),
        (6000, 'old \\"quoted\\" name'),
    ]
    assert found[0].reason == "SIGKILL"
    assert found[0].rss_bytes == 3120 * 1024 * 1024
    assert (found[0].oom_score, found[0].oom_score_adj) == (870, 0)
    assert (found[1].oom_score, found[1].oom_score_adj) == (600, None)
    assert all(e.killer == "earlyoom" and e.scope is None for e in found)


def test_real_systemd_oomd_lines() -> None:
    found = events("systemd-oomd.log")
    assert [e.killer for e in found] == ["systemd-oomd"] * 3
    assert found[0].process == "vte-spawn-dbb4a75e-031f-480d-924b-5de5af7579d2.scope"
    assert found[0].oom_memcg == "/user.slice/user-1001.slice/user@1001.service"
    assert found[2].cgroup == "/system.slice/systemd-journald.service"  # "Marked … for killing"
    assert found[2].oom_memcg == "/system.slice"
    assert found[1].pid is None


def _record(text: str, **kwargs: object) -> LogRecord:
    return LogRecord(text=text, source="test", **kwargs)  # type: ignore[arg-type]


def test_multi_line_journal_record_and_boot_change_resets_state() -> None:
    stats = "Memory cgroup stats for /x:\nanon 1000\nfile 0"
    records = [
        _record(
            "a invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
            ident=KERNEL,
            boot_id="b1",
        ),
        _record(stats, ident=KERNEL, boot_id="b1"),
        # A new boot: the header above must not attach to this kill.
        _record(
            "Killed process 9 (z) total-vm:8kB, anon-rss:4kB, file-rss:0kB, shmem-rss:0kB",
            ident=KERNEL,
            boot_id="b2",
        ),
    ]
    (event,) = find_events(records)
    assert event.trigger is None and event.oom_memcg is None and event.boot_id == "b2"


def test_userspace_identifiers_never_count_as_kernel_kills() -> None:
    line = "Out of memory: Killed process 1 (x) total-vm:8kB, anon-rss:4kB, file-rss:0kB"
    assert find_events([_record(line, ident="node-problem-detector")]) == []
    assert len(find_events([_record(line, ident=None)])) == 1
    oomd = (
        "Killed /a.slice/b.service due to memory used (9) / total (10) and swap used (9) / "
        "total (10) being more than 90.00%"
    )
    assert find_events([_record(oomd, ident=KERNEL)]) == []
    (swap_kill,) = find_events([_record(oomd, ident="systemd-oomd")])
    assert swap_kill.cgroup == "/a.slice/b.service" and swap_kill.oom_memcg is None


def test_select_and_summarize() -> None:
    found = events("handmade-storm-interleaved.log") + events("handmade-dmesg-T-locales.log")
    assert [e.pid for e in select_events(found, process="job-*")] == [502, 501, 503, 504]
    since = datetime(2024, 1, 1, tzinfo=timezone.utc)
    assert [e.pid for e in select_events(found, since=since)] == [777, 778]
    summary = summarize(found)
    assert (summary[0].process, summary[0].kills) == ("job-c", 2)
    assert summary[0].largest_anon_rss_bytes == 9100 * KiB
    assert summary[0].last_time is None
    result = scan([("x", read_text_log(str(OOM / "handmade-storm-interleaved.log")))], since=since)
    assert result.events == ()
    assert any("without a wall-clock time" in note for note in result.notes)
