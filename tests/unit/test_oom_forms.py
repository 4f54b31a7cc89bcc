"""Issue 12 on real published text: every record form counts, lines of one incident merge,
the task table and the group notice are joined, containers are named, locales are read."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from memforensics.analysis.oom_select import scan
from memforensics.model.oom import OomEvent
from memforensics.render.cgroup_name import short_cgroup
from memforensics.sources.logs.logfile import read_text_log
from memforensics.sources.proc.cgroup import identify

OOM = Path(__file__).resolve().parent.parent.parent / "fixtures" / "oom"
KIB = 1024
MIB = 1024 * 1024


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()


def events(name: str) -> list[OomEvent]:
    path = str(OOM / name)
    return list(scan([(path, read_text_log(path))]).events)


def test_summary_and_table_without_killed_line_is_an_unconfirmed_kill() -> None:
    """KubeVirt/Harvester KB: the report ends at the oom-kill: line. The victim's figures come
    from its task-table row (rss 4201766 pages, adj 986); nothing else is invented."""
    (event,) = events("harvester-kb-5.14-kubevirt-summary-no-kill.log")
    assert event.confirmed is False
    assert (event.pid, event.process, event.uid) == (39079, "qemu-system-x86", 107)
    assert event.oom_score_adj == 986
    assert event.rss_bytes == 4201766 * 4096
    assert event.total_vm_bytes == 4457263 * 4096
    assert event.anon_rss_bytes is None  # the 5.14 table has no rss_anon column
    assert event.page_size_bytes is None  # assumed 4 KiB, not inferred
    assert event.memcg_limit_bytes == 17024340 * KIB
    assert event.pod_uid == "968a06fb-9ab9-4819-8caf-0392ddff3d9b"
    assert event.container_id == "0f32894de86edf3d3832702af794874ef8d400b4969acdea4976b12040756e0d"
    assert event.qos_class == "burstable"
    assert event.trigger is not None and event.trigger.pid == 40785


def test_victims_oom_score_adj_comes_from_its_table_row() -> None:
    """5.3 SLE prints no oom_score_adj on the Killed line; the table row says 830."""
    (event,) = events("harvester-kb-5.3-dmesg-T-kubevirt.log")
    assert event.confirmed is True
    assert event.oom_score_adj == 830
    assert event.uid == 107  # from the oom-kill: summary
    assert event.anon_rss_bytes == 66852088 * KIB
    assert event.reaped is True
    # The published path has a typo ("kubepods-urstable.slice"); the pod's own slice still
    # names its QoS class.
    assert event.pod_uid == "ef91e487-dec5-4613-800b-eb23e1a1617d"
    assert event.qos_class == "burstable"
    assert event.time is not None and event.time.isoformat() == "2024-05-09T14:52:38+00:00"


def test_log_starting_inside_a_report_keeps_its_cgroup_and_table() -> None:
    """kubernetes#56891: the excerpt starts at "Memory cgroup stats for"; RHEL 7 3.10 picks
    pid 24572 and kills 28438; the row gives adj -998 and uid 0; Guaranteed pod, cgroupfs."""
    (event,) = events("k8s-56891-rhel7-3.10-dmesg-T.log")
    assert (event.pid, event.uid, event.oom_score_adj) == (28438, 0, -998)
    assert event.oom_score is None  # the score belongs to 24572, not to the victim
    assert event.file_rss_bytes == 13684 * KIB and event.shmem_rss_bytes is None
    assert event.pod_uid == "95387fa4-da9c-11e7-9d36-5254b24cbf5e"
    assert event.container_id == "6895a3e13439535852d3184ac2aadd26d7363cc035f171545ec7d4ce74073b0b"
    assert event.qos_class == "guaranteed"


def test_group_kill_gives_every_member_the_groups_cgroup() -> None:
    """Tetsuo Handa's 5.0-rc report: one memory.oom.group kill of /test1, 12 victims
    (PID 1 among them), CONSTRAINT_NONE printed for a memcg OOM (the 5.0 bug)."""
    found = events("lkml-5.0-rc-oom-group-kills-init.log")
    assert [e.pid for e in found] == [
        9188,
        1,
        9182,
        9183,
        9184,
        9185,
        9186,
        9187,
        9189,
        9190,
        9191,
        9192,
    ]
    assert {e.incident for e in found} == {1}
    assert all(e.cgroup == "/test1" and e.group_kill for e in found)
    assert all(e.constraint == "CONSTRAINT_MEMCG" for e in found)
    first, init = found[0], found[1]
    assert first.uid == 0 and init.uid is None  # only the first victim has a summary line
    assert init.process == "systemd" and init.anon_rss_bytes == 1228 * KIB
    assert [e.reaped for e in found][:4] == [True, True, None, True]


def test_summary_lines_alone_are_kills() -> None:
    """A log filtered to the oom-kill: lines (what Kubernetes OOM exporters key on)."""
    found = events("handmade-filtered-summary-only.log")
    assert [(e.pid, e.process, e.uid) for e in found] == [
        (50624, "java", 10000),
        (4101, "postgres", 999),
        (7311, "node", 1001),
    ]
    assert not any(e.confirmed for e in found)
    assert all(e.anon_rss_bytes is None and e.rss_bytes is None for e in found)
    assert [e.qos_class for e in found] == ["burstable", "guaranteed", "besteffort"]


def test_selection_line_alone_is_a_kill_and_a_late_killed_line_is_another() -> None:
    first, second = events("handmade-syslog-year-selection-only.log")
    assert (first.pid, first.oom_score, first.confirmed) == (4242, 912, False)
    assert first.time is not None and first.time.year == 2024  # year before the month
    assert first.uptime_seconds == 52341.234567
    assert (second.pid, second.confirmed, second.uid) == (5151, True, 27)
    assert second.time is not None and second.time.year == 2023  # year after the clock


def test_container_ids_from_every_runtime_and_driver() -> None:
    found = {e.pid: e for e in events("handmade-k8s-cgroup-paths.log")}
    expect = {
        50624: ("28fcb1a0-a45c-44e7-b9bf-e3b9360bedba", True, "burstable"),
        4101: ("95387fa4-da9c-11e7-9d36-5254b24cbf5e", True, "guaranteed"),
        7311: ("0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0", True, "besteffort"),
        8800: ("5e6f7a8b-9c0d-1e2f-3a4b-5c6d7e8f9a0b", True, "guaranteed"),
        9901: ("1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d", True, "burstable"),
        3100: (None, True, None),
        3200: (None, True, None),
        1200: (None, False, None),
    }
    for pid, (pod, has_container, qos) in expect.items():
        event = found[pid]
        assert event.pod_uid == pod, pid
        assert (event.container_id is not None) == has_container, pid
        if has_container:
            assert event.container_id is not None and len(event.container_id) == 64
            assert event.cgroup is not None and event.container_id in event.cgroup
        assert event.qos_class == qos, pid


@pytest.mark.parametrize(
    ("path", "short"),
    [
        (
            "/kubepods/burstable/pod28fcb1a0-a45c-44e7-b9bf-e3b9360bedba/" + "a" * 64,
            "pod 28fcb1a0\naaaaaaaaaaaa",
        ),
        ("/kubepods.slice/kubepods-pod5e6f7a8b_9c0d_1e2f_3a4b_5c6d7e8f9a0b.slice", "pod 5e6f7a8b"),
        ("/system.slice/docker-" + "b" * 64 + ".scope", "container\nbbbbbbbbbbbb"),
        ("/system.slice/crio-conmon-" + "c" * 64 + ".scope", "crio-conmon-" + "c" * 64 + ".scope"),
        ("/system.slice/postgresql@15-main.service", "postgresql@15-main.service"),
        (
            "/user.slice/user-1000.slice/app-gnome\\x2dterminal-42.scope",
            "app-gnome-terminal-42.scope",
        ),
        ("/", "/"),
    ],
)
def test_short_cgroup_names(path: str, short: str) -> None:
    assert short_cgroup(path) == short


def test_a_pod_named_directory_outside_kubernetes_is_not_a_pod() -> None:
    assert identify("/user.slice/podcast.service").pod_uid is None
    assert identify("/batch/pod28fcb1a0-a45c-44e7-b9bf-e3b9360bedba").pod_uid is not None


def test_russian_journal_and_cjk_locales_with_and_without_hostname() -> None:
    (bash,) = events("journal-ru-earlyoom-121.log")
    assert (bash.pid, bash.oom_score, bash.anon_rss_bytes) == (27541, 572, 8098448 * KIB)
    assert bash.time is not None and (bash.time.month, bash.time.day) == (4, 28)
    oomd, worker, java = events("handmade-cjk-locales.log")
    # ja_JP prints " 4月" with a leading space; no hostname column.
    assert oomd.killer == "systemd-oomd" and oomd.time is not None
    assert (oomd.time.month, oomd.time.day, oomd.time.hour) == (4, 16, 21)
    assert oomd.reason is not None and oomd.reason.startswith("memory pressure for /user.slice")
    assert worker.time is not None and (worker.time.month, worker.time.day) == (3, 5)  # ko_KR
    assert java.time is not None and java.time.isoformat() == "2024-09-03T05:57:48+00:00"  # zh_CN
    assert java.confirmed and java.pod_uid == "28fcb1a0-a45c-44e7-b9bf-e3b9360bedba"


def test_systemd_oomd_reason_wrapped_onto_the_next_line() -> None:
    """overdeck#2390 (reason on the next line) and omarchy#9799 ("Marked … for killing"
    with no reason at all), both from journals printed without a hostname."""
    tmux, terminal = events("systemd-oomd-wrapped-no-hostname.log")
    assert tmux.process == "overdeck-tmux-server.service"
    assert tmux.reason == (
        "memory pressure for /user.slice/user-1000.slice/user@1000.service being 56.11% > "
        "50.00% for > 20s with reclaim activity"
    )
    assert tmux.oom_memcg == "/user.slice/user-1000.slice/user@1000.service"
    assert tmux.confirmed
    assert (
        terminal.cgroup == "/user.slice/.../app-Hyprland-xdg\\x2dterminal\\x2dexec-0ae8dde6.scope"
    )
    assert terminal.reason is None and terminal.oom_memcg is None


def test_real_earlyoom_lines_in_journal_short_form() -> None:
    web, cluster, electron = events("earlyoom-issues-real.log")
    assert (web.process, web.oom_score, web.oom_score_adj, web.rss_bytes) == (
        "Web Content",
        823,
        None,
        79 * MIB,
    )
    assert (cluster.pid, cluster.uid, cluster.rss_bytes) == (29410, 1000, 23964 * MIB)
    assert electron.pid == 11567
    assert all(e.killer == "earlyoom" and e.confirmed for e in (web, cluster, electron))


def test_reaper_confirms_a_54_kill() -> None:
    (event,) = events("reportportal-203-5.4-uwsgi.log")
    assert (event.pid, event.uid, event.oom_score_adj, event.reaped) == (63214, 0, 986, True)
    assert event.pgtables_bytes == 1372 * KIB
