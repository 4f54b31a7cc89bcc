"""Real journalctl on real journal files built by systemd-journal-remote from export format."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

import pytest

from memforensics.analysis.oom_select import scan
from memforensics.entry.oomscan import scan_default
from memforensics.model.logrecord import LogRecord
from memforensics.model.oom import OomEvent
from memforensics.sources.logs.journal import BootNotFoundError, JournalReader
from memforensics.sources.logs.logfile import read_text_log


def find_events(records: Iterable[LogRecord]) -> list[OomEvent]:
    """Every event of one stream, as a whole scan reports them."""
    return list(scan([("test", records)]).events)


pytestmark = pytest.mark.integration

JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"
BOOT_A = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1"
BOOT_B = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb2"
MACHINE = "0123456789abcdef0123456789abcdef"
# 2024-05-09T14:52:38Z in microseconds.
T0 = 1_715_266_358_000_000
FIXTURE_6_18 = (
    Path(__file__).resolve().parent.parent.parent / "fixtures" / "oom" / "kmsg-6.18-memcg-v1.kmsg"
)


def need_journal_tools() -> None:
    if shutil.which("journalctl") is None:
        pytest.skip("journalctl is not installed (systemd)")
    if not Path(JOURNAL_REMOTE).exists():
        pytest.skip(
            f"{JOURNAL_REMOTE} missing: apt-get install systemd-journal-remote "
            "(the nox tests session installs it)"
        )


def export_entry(fields: dict[str, str | bytes]) -> bytes:
    """One entry in journal export format; values with newlines use the binary form."""
    out = b""
    for key, value in fields.items():
        data = value.encode() if isinstance(value, str) else value
        if b"\n" in data:
            out += key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return out + b"\n"


def kernel(message: str | bytes, boot: str, usec: int, **extra: str) -> dict[str, str | bytes]:
    return {
        "__REALTIME_TIMESTAMP": str(usec),
        "__MONOTONIC_TIMESTAMP": str(usec - T0 + 1_000_000),
        "_BOOT_ID": boot,
        "_MACHINE_ID": MACHINE,
        "_HOSTNAME": "node-7",
        "_TRANSPORT": "kernel",
        "SYSLOG_IDENTIFIER": "kernel",
        "SYSLOG_FACILITY": "0",
        "PRIORITY": "3",
        "_SOURCE_MONOTONIC_TIMESTAMP": str(usec - T0 + 1_000_000),
        "MESSAGE": message,
        **extra,
    }


def userspace(message: str, ident: str, boot: str, usec: int) -> dict[str, str | bytes]:
    return {
        "__REALTIME_TIMESTAMP": str(usec),
        "__MONOTONIC_TIMESTAMP": str(usec - T0 + 1_000_000),
        "_BOOT_ID": boot,
        "_MACHINE_ID": MACHINE,
        "_HOSTNAME": "node-7",
        "_TRANSPORT": "syslog",
        "SYSLOG_IDENTIFIER": ident,
        "PRIORITY": "5",
        "MESSAGE": message,
    }


def build_journal(directory: Path, entries: Iterable[dict[str, str | bytes]]) -> Path:
    """Write a real journal file with systemd-journal-remote and return its directory."""
    need_journal_tools()
    directory.mkdir(parents=True, exist_ok=True)
    stream = b"".join(export_entry(e) for e in entries)
    subprocess.run(
        [JOURNAL_REMOTE, f"--output={directory / 'system.journal'}", "--split-mode=none", "-"],
        input=stream,
        check=True,
        capture_output=True,
        timeout=60,
    )
    return directory


def real_6_18_incident(boot: str, start_usec: int) -> list[dict[str, str | bytes]]:
    """The real 6.18 memcg OOM records (fixture), as the kernel transport logs them."""
    entries = []
    for index, line in enumerate(FIXTURE_6_18.read_text().splitlines()):
        if not line[:1].isdigit():
            continue
        text = line.split(";", 1)[1].replace("\\x0a", "\n")
        entries.append(kernel(text, boot, start_usec + index))
    return entries


def two_boot_entries() -> list[dict[str, str | bytes]]:
    memcg_block = "Memory cgroup stats for /kubepods/pod1:\nanon 1000000\nfile 0\nkernel 4096"
    return [
        kernel("Linux version 6.1.0", BOOT_A, T0),
        *real_6_18_incident(BOOT_A, T0 + 1_000),
        kernel("eth0: link up", BOOT_A, T0 + 2_000_000),
        userspace(
            "Killed /user.slice/user-1000.slice/app.slice/firefox.scope due to memory pressure "
            "for /user.slice/user-1000.slice being 63.12% > 50.00% for > 20s with reclaim activity",
            "systemd-oomd",
            BOOT_A,
            T0 + 3_000_000,
        ),
        # Quoted by another program: not a kill, and journald's filter never returns it.
        userspace(
            "Message:Memory cgroup out of memory: Killed process 1 (init) total-vm:1kB, "
            "anon-rss:1kB, file-rss:1kB",
            "node-problem-detector",
            BOOT_A,
            T0 + 3_500_000,
        ),
        kernel("Linux version 6.1.0", BOOT_B, T0 + 86_400_000_000),
        kernel(
            "java invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
            BOOT_B,
            T0 + 86_401_000_000,
            PRIORITY="4",
        ),
        kernel(
            "CPU: 1 UID: 0 PID: 4242 Comm: java Not tainted 6.1.0 #1", BOOT_B, T0 + 86_401_000_001
        ),
        kernel("memory: usage 1048576kB, limit 1048576kB, failcnt 9", BOOT_B, T0 + 86_401_000_002),
        kernel(memcg_block, BOOT_B, T0 + 86_401_000_003),
        kernel(
            "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
            "oom_memcg=/kubepods/pod1,task_memcg=/kubepods/pod1/c1,task=java,pid=4242,uid=1000",
            BOOT_B,
            T0 + 86_401_000_004,
        ),
        kernel(
            "Memory cgroup out of memory: Killed process 4242 (java) total-vm:2000000kB, "
            "anon-rss:1000000kB, file-rss:1000kB, shmem-rss:0kB, UID:1000 pgtables:2000kB "
            "oom_score_adj:900",
            BOOT_B,
            T0 + 86_401_000_005,
        ),
        # A non-UTF-8 comm: journald stores the MESSAGE as a byte array.
        kernel(
            b"Out of memory: Killed process 77 (caf\xe9) total-vm:8kB, anon-rss:4kB, "
            b"file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0",
            BOOT_B,
            T0 + 86_402_000_000,
        ),
        userspace(
            'sending SIGTERM to process 5151 uid 1000 "tail": oom_score 600, oom_score_adj 0, '
            'VmRSS 2022 MiB, cmdline "tail /dev/zero"',
            "earlyoom",
            BOOT_B,
            T0 + 86_403_000_000,
        ),
    ]


@pytest.fixture(scope="module")
def journal_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_journal(tmp_path_factory.mktemp("journal"), two_boot_entries())


def test_all_boots_in_one_journalctl_run(journal_dir: Path) -> None:
    reader = JournalReader(directory=str(journal_dir))
    found = find_events(reader.records())
    assert [(e.killer, e.pid, e.process) for e in found] == [
        ("kernel", 5256, "python3"),
        ("systemd-oomd", None, "firefox.scope"),
        ("kernel", 4242, "java"),
        ("kernel", 77, "caf\ufffd"),
        ("earlyoom", 5151, "tail"),
    ]
    real, oomd, java, _, early = found
    assert real.boot_id == BOOT_A and java.boot_id == BOOT_B
    assert real.time is not None and real.time.year == 2024
    assert real.oom_memcg == "/mf-probe-2808" and real.top_tasks[0].name == "python3"
    assert real.trigger is not None and real.trigger.pid == 5256
    assert java.time == datetime.fromtimestamp((T0 + 86_401_000_005) / 1e6, tz=timezone.utc)
    assert (java.cgroup, java.oom_memcg) == ("/kubepods/pod1/c1", "/kubepods/pod1")
    assert java.trigger is not None and java.trigger.pid == 4242
    assert java.memcg_limit_bytes == 1048576 * 1024
    assert oomd.oom_memcg == "/user.slice/user-1000.slice"
    assert early.boot_id == BOOT_B
    assert reader.notes == []


def test_journalctl_filters_on_its_side(journal_dir: Path) -> None:
    """The same command line, run bare, returns only incident lines: noise stays in journald."""
    argv = JournalReader(directory=str(journal_dir)).argv()
    out = subprocess.run(argv, capture_output=True, check=True, timeout=60).stdout
    messages = [json.loads(line)["MESSAGE"] for line in out.splitlines()]
    assert "eth0: link up" not in messages
    assert not any("node-problem-detector" in str(m) or "Message:" in str(m) for m in messages)
    assert any("Memory cgroup stats for /kubepods/pod1" in str(m) for m in messages)


@pytest.mark.parametrize(
    ("boot", "pids"),
    [
        ("current", [4242, 77, 5151]),
        ("-1", [5256, None]),
        (BOOT_A, [5256, None]),
        ("1", [5256, None]),
    ],
)
def test_boot_selection(journal_dir: Path, boot: str, pids: list[int | None]) -> None:
    found = find_events(JournalReader(directory=str(journal_dir), boot=boot).records())
    assert [e.pid for e in found] == pids


def test_since_until_go_to_journalctl(journal_dir: Path) -> None:
    since = datetime.fromtimestamp((T0 + 86_400_000_000) / 1e6, tz=timezone.utc)
    until = datetime.fromtimestamp((T0 + 86_402_500_000) / 1e6, tz=timezone.utc)
    reader = JournalReader(directory=str(journal_dir), since=since, until=until)
    assert [e.pid for e in find_events(reader.records())] == [4242, 77]


def test_unknown_boot_is_reported(journal_dir: Path) -> None:
    with pytest.raises(BootNotFoundError):
        list(JournalReader(directory=str(journal_dir), boot="-5").records())


def test_empty_directory_says_so(tmp_path: Path) -> None:
    need_journal_tools()
    reader = JournalReader(directory=str(tmp_path))
    assert list(reader.records()) == []
    assert reader.notes and "no journal files" in reader.notes[0]


@pytest.mark.parametrize(
    "output", ["short", "short-precise", "short-iso", "short-full", "verbose", "json", "export"]
)
def test_saved_journalctl_output_in_every_shape(
    journal_dir: Path, tmp_path: Path, output: str
) -> None:
    """The real journalctl prints the journal in each output mode; read back with --file,
    the kills and their figures are the same as from the journal itself."""
    saved = tmp_path / f"journal.{output}"
    with saved.open("wb") as out:
        subprocess.run(
            ["journalctl", "--no-pager", f"--directory={journal_dir}", "-o", output],
            stdout=out,
            check=True,
            timeout=60,
            env={"TZ": "UTC", "LANG": "C.UTF-8", "PATH": "/usr/bin:/bin"},
        )
    found = find_events(
        read_text_log(str(saved), reference=datetime(2024, 6, 1, tzinfo=timezone.utc))
    )
    by_pid = {e.pid: e for e in found if e.pid is not None}
    # The text modes print a non-UTF-8 message as "[blob data]" (journalctl without --all):
    # that kill is not in the saved text at all.
    expected = {5256, 4242, 5151} | ({77} if output in ("json", "export") else set())
    assert set(by_pid) == expected, [(e.pid, e.process) for e in found]
    java = by_pid[4242]
    assert java.anon_rss_bytes == 1000000 * 1024
    assert (java.cgroup, java.oom_memcg) == ("/kubepods/pod1/c1", "/kubepods/pod1")
    assert java.memcg_limit_bytes == 1048576 * 1024
    assert java.trigger is not None and java.trigger.pid == 4242
    assert java.time is not None and java.time.date().isoformat() == "2024-05-10"
    assert by_pid[5256].oom_memcg == "/mf-probe-2808"
    assert by_pid[5151].killer == "earlyoom"
    assert [e.process for e in found if e.killer == "systemd-oomd"] == ["firefox.scope"]
    if output in ("verbose", "json", "export"):
        # These shapes carry the boot ID and the exact time.
        assert java.boot_id == BOOT_B
        assert java.time == datetime.fromtimestamp((T0 + 86_401_000_005) / 1e6, tz=timezone.utc)


def test_default_scan_reads_the_journal_when_it_has_files(
    journal_dir: Path, tmp_path: Path
) -> None:
    result = scan_default(journal_dirs=(str(journal_dir),), log_dir=str(tmp_path))
    assert result.sources == (f"journal:{journal_dir}",)
    assert [e.pid for e in result.events] == [5256, None, 4242, 77, 5151]
