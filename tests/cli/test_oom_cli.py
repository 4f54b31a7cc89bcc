"""`memforensics oom` through click's runner (and a real subprocess for the permission case)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from memforensics.cli import cli
from tests.support.schema import missing_keys
from tests.support.timezone import pinned_timezone

OOM = Path(__file__).resolve().parent.parent.parent / "fixtures" / "oom"


@pytest.fixture(autouse=True)
def utc() -> Iterator[None]:
    """Local-time stamps (syslog, dmesg -T) are read in TZ; pin it, then put it back."""
    with pinned_timezone("UTC"):
        yield


def run(*args: str, input: bytes | None = None, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, ["oom", *args], input=input, env=env)


def test_help_teaches_with_examples_and_exit_codes() -> None:
    result = run("--help")
    assert result.exit_code == 0
    for text in (
        "--boot",
        "--since",
        "--until",
        "--directory",
        "--file",
        "--kmsg",
        "--process",
        "--summary",
        "--json",
        "--fail-if-found",
        "Examples:",
        "memforensics oom --kmsg",
        "Exit codes:",
        "anon-rss",
        "trigger",
    ):
        assert text in result.output, text


def test_wide_table_for_humans() -> None:
    result = run(
        "--file", str(OOM / "handmade-5.10-global-caller-ids.log"), "--wide", env={"COLUMNS": "160"}
    )
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in (
        "OOM kills: 1",
        "worker (x y)",
        "(5150)",
        "4.6 GiB",
        "1001",
        "global",
        "/system.slice/batch.service",
        "node server",
        "(4242)",
    ):
        assert text in out, text


def test_default_table_fits_80_columns_with_a_kill_in_at_most_three_lines() -> None:
    """Issue 12: at 80 columns a kill took 11 lines (the cgroup column wrapped into five)."""
    fixtures = [
        "handmade-oom-group-v2-6.12.log",
        "cadvisor-4.8-docker.log",
        "handmade-5.10-global-caller-ids.log",
        "systemd-oomd.log",
        "handmade-k8s-cgroup-paths.log",
    ]
    args = [a for name in fixtures for a in ("--file", str(OOM / name))]
    result = run(*args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines), max(lines, key=len)
    body = lines[lines.index(next(line for line in lines if "───" in line)) + 1 :]
    rows = body[: next(i for i, line in enumerate(body) if not line.strip())]
    kills = int(lines[0].split(":")[1])
    # Every kill starts with its date (or "boot+", or "-" when unknown) in the first column.
    starts = [i for i, line in enumerate(rows) if re.match(r"^ (\d{4}-\d\d-\d\d|boot\+|-) ", line)]
    assert len(starts) == kills
    heights = [b - a for a, b in zip(starts, [*starts[1:], len(rows)], strict=True)]
    assert max(heights) <= 3, rows
    out = result.stdout
    # Short readable cgroups: pod and container, Docker container, systemd unit.
    assert "pod 1a2b3c4d" in out
    assert "container" in out and "2e088fe462e2" in out
    assert "batch.service" in out
    assert "/kubepods.slice/" not in out  # the full path is for --wide and --json


def test_json_document_has_the_documented_keys() -> None:
    files = [str(p) for p in sorted(OOM.glob("*.log"))]
    args = [a for f in files for a in ("--file", f)]
    result = run(*args, "--json")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "memforensics/oom/1"
    assert missing_keys(document, "memforensics/oom/1") == []
    assert document["kills"] == len(document["events"]) > 30
    assert document["sources"] == files
    incidents = [e["incident"] for e in document["events"]]
    assert incidents == sorted(incidents)  # numbered across files, in order
    for event in document["events"]:
        for key, value in event.items():
            if key.endswith("_bytes"):
                assert value is None or (isinstance(value, int) and value >= 0), key
        if event["time"] is not None:
            assert event["time"].endswith("Z")


def test_summary_groups_by_process() -> None:
    result = run("--file", str(OOM / "handmade-storm-interleaved.log"), "--summary")
    assert result.exit_code == 0
    assert "OOM kills by process: 4" in result.stdout
    assert "job-c" in result.stdout and " 2 " in result.stdout


def test_process_filter_and_fail_if_found() -> None:
    path = str(OOM / "cadvisor-4.8-docker.log")
    assert run("--file", path, "--fail-if-found").exit_code == 1
    quiet = run("--file", path, "--process", "nginx*", "--fail-if-found")
    assert quiet.exit_code == 0
    assert "No OOM kills found" in quiet.stdout


def test_since_until_on_text_logs() -> None:
    path = str(OOM / "handmade-dmesg-T-locales.log")
    result = run("--file", path, "--since", "2024-01-01", "--until", "2024-12-31", "--json")
    assert [e["pid"] for e in json.loads(result.stdout)["events"]] == [777]
    untimed = run("--file", str(OOM / "npd-480-4.19-5.4.log"), "--since", "-1h")
    assert untimed.exit_code == 0
    assert "without a wall-clock time" in untimed.stderr


def test_stdin_and_gzip(tmp_path: Path) -> None:
    text = (OOM / "cadvisor-3.13-memcg.log").read_bytes()
    piped = run("--file", "-", "--json", input=text)
    assert json.loads(piped.stdout)["events"][0]["pid"] == 13536
    gz = tmp_path / "kern.log.gz"
    gz.write_bytes(gzip.compress(text))
    packed = run("--file", str(gz), "--json")
    assert json.loads(packed.stdout)["events"][0]["cgroup"] == "/mem2"


@pytest.mark.parametrize(
    "content", [b"LPKSHHRH\x00\x01binary", b"\x00\x01\x02\x03", gzip.compress(b"x" * 5000)[:30]]
)
def test_binary_or_corrupt_file_is_exit_7(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.log"
    path.write_bytes(content)
    result = run("--file", str(path))
    assert result.exit_code == 7
    assert result.stderr.startswith("error: ")
    assert "hint: " in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_unreadable_file_is_exit_7(tmp_path: Path) -> None:
    result = run("--file", str(tmp_path / "missing.log"))
    assert result.exit_code == 7
    assert "cannot read" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("--kmsg", "--file", "x.log"),
        ("--file", "x.log", "--boot", "current"),
        ("--boot", "yesterday"),
        ("--since", "last tuesday"),
        ("--since", "2024-05-02", "--until", "2024-05-01"),
        ("--kmsg", "--boot", "-1"),
    ],
)
def test_usage_errors_are_exit_2(args: tuple[str, ...]) -> None:
    result = run(*args)
    assert result.exit_code == 2, result.output


def test_journalctl_missing_is_exit_5(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A journal directory was asked for and journalctl is missing. (Without a source option
    on a host without journal files, kmsg and /var/log are read instead: no journalctl.)"""
    monkeypatch.setenv("PATH", str(tmp_path))
    result = run("--directory", str(tmp_path))
    assert result.exit_code == 5
    assert "journalctl not found" in result.stderr
    assert "--file" in result.stderr  # the hint offers the other sources


def test_kmsg_reads_this_boot() -> None:
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg is not readable here (container without it, or dmesg_restrict)")
    result = run("--kmsg", "--json")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["sources"] == ["kmsg"]
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
    assert all(event["boot_id"] == boot for event in document["events"])


@pytest.mark.integration
def test_unreadable_journal_is_exit_4_with_the_group_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real journalctl, run as 'nobody' (through a setpriv wrapper first on PATH), on a
    root-only journal directory: its real error becomes exit 4 with the group hint."""
    from tests.integration.test_oom_journal import build_journal, two_boot_entries

    journalctl = shutil.which("journalctl")
    if os.geteuid() != 0 or shutil.which("setpriv") is None or journalctl is None:
        pytest.skip("needs root, setpriv and journalctl to run journalctl as an unprivileged user")
    journal = build_journal(tmp_path / "journal", two_boot_entries()[:3])
    tmp_path.chmod(0o755)
    journal.chmod(0o700)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "journalctl"
    wrapper.write_text(
        f'#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 --clear-groups {journalctl} "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    result = run("--directory", str(journal))
    assert result.exit_code == 4, result.output
    assert "error: cannot read the journal" in result.stderr
    assert "systemd-journal" in result.stderr and "adm" in result.stderr and "sudo" in result.stderr
    # Files readable by nobody but the directory fine: the other message journalctl has.
    journal.chmod(0o755)
    for file in journal.iterdir():
        file.chmod(0o600)
    assert run("--directory", str(journal)).exit_code == 4


@pytest.mark.integration
def test_directory_source_end_to_end(tmp_path: Path) -> None:
    from tests.integration.test_oom_journal import build_journal, two_boot_entries

    journal = build_journal(tmp_path / "journal", two_boot_entries())
    result = run("--directory", str(journal), "--boot", "-1", "--json", "--fail-if-found")
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    assert [e["pid"] for e in document["events"]] == [5256, None]
    assert document["sources"] == [f"journal:{journal}"]
    verbose = run("--directory", str(journal), "-v")
    assert "running: journalctl" in verbose.stderr
    bad_boot = run("--directory", str(journal), "--boot", "-7")
    assert bad_boot.exit_code == 2
    assert "not in the journal" in bad_boot.output


def test_dev_kmsg_as_file_points_to_kmsg_option() -> None:
    if not os.path.exists("/dev/kmsg"):
        pytest.skip("no /dev/kmsg in this container")
    result = run("--file", "/dev/kmsg")
    assert result.exit_code == 7
    assert "--kmsg" in result.stderr
