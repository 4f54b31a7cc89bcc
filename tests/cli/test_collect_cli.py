"""`memforensics collect` through click's runner: help, usage errors, exit 0 with targets down."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from memforensics.cli import cli
from tests.support.schema import missing_keys

GONE_PID = 2**22 + 4321  # above pid_max's default: no such process


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, ["collect", *args], env=env)


@pytest.fixture(autouse=True)
def _default_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Runs without --state-dir use the default: keep it away from this user's home."""
    state = tmp_path / "default-state"
    monkeypatch.setenv("MEMFORENSICS_STATE_DIR", str(state))
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    return state


def test_help_teaches_with_examples_and_exit_codes() -> None:
    result = run("--help")
    assert result.exit_code == 0
    for text in ("--textfile-dir", "--state-dir", "--max-pause", "--name", "Examples:"):
        assert text in result.output
    assert "Exit codes:" in result.output and "pause_budget" in result.output


def test_listed_among_commands() -> None:
    assert "collect" in CliRunner().invoke(cli, ["--help"]).output


def test_textfile_dir_is_required_and_must_exist(tmp_path: Path) -> None:
    assert run(str(GONE_PID)).exit_code == 2
    assert run(str(GONE_PID), "--textfile-dir", str(tmp_path / "nope")).exit_code == 2


def test_usage_errors(tmp_path: Path) -> None:
    textfile = str(tmp_path)
    assert run("--no-oom", "--textfile-dir", textfile).exit_code == 2
    both = run("--oom-kmsg", "--oom-file", "x", "--textfile-dir", textfile)
    assert both.exit_code == 2 and "choose one OOM source" in both.output
    assert run("1", "--max-pause", "0", "--textfile-dir", textfile).exit_code == 2


def test_gone_target_is_down_but_the_file_is_written(tmp_path: Path) -> None:
    """A timer run must always leave its file: a missing process is a metric, not a failure."""
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    result = run(str(GONE_PID), "--textfile-dir", str(textfile), "--no-oom", "--json")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in textfile.iterdir()) == ["memforensics.prom"]
    prom = (textfile / "memforensics.prom").read_text()
    assert f'memforensics_target_up{{allocator="",container_id="",pid="{GONE_PID}"' in prom
    assert 'reason="gone"} 0.0' in prom
    assert "memforensics_oom_kills_total" not in prom  # --no-oom: no counter at all
    document = json.loads(result.stdout)
    assert missing_keys(document, "memforensics/collect/1") == []
    assert document["targets"][0]["reason"] == "gone"
    assert f"PID {GONE_PID} not collected: gone" in result.stderr


def test_name_matching_nothing_is_a_note_not_an_error(tmp_path: Path) -> None:
    result = run(
        "--name", "no-such-process-name-xyz-123", "--textfile-dir", str(tmp_path), "--no-oom"
    )
    assert result.exit_code == 0
    assert "no process matches" in result.stderr
    assert (tmp_path / "memforensics.prom").is_file()


def test_state_dir_from_systemd_environment(tmp_path: Path) -> None:
    """StateDirectory= sets $STATE_DIRECTORY: the OOM cursor goes there without a flag."""
    log = tmp_path / "kern.log"
    log.write_text("")
    state = tmp_path / "state"
    textfile = tmp_path / "tf"
    textfile.mkdir()
    result = run(
        "--oom-file",
        str(log),
        "--textfile-dir",
        str(textfile),
        env={"STATE_DIRECTORY": str(state), "MEMFORENSICS_STATE_DIR": ""},
    )
    assert result.exit_code == 0, result.output
    assert (state / "collect-state.json").is_file()
    assert "OOM cursor started" in result.stderr
    assert "memforensics_oom_scan_up 1.0" in (textfile / "memforensics.prom").read_text()


def test_oom_kills_are_counted_without_state_dir(tmp_path: Path, _default_state_dir: Path) -> None:
    """No --state-dir: the default directory (here $MEMFORENSICS_STATE_DIR) keeps the cursor,
    and memforensics_oom_kills_total is written, so the dashboard and the alert see kills."""
    soon = datetime.now(timezone.utc) + timedelta(minutes=1)
    log = tmp_path / "kern.log"
    log.write_text(
        f"{soon.strftime('%Y-%m-%dT%H:%M:%S.%f+00:00')} node1 kernel: Out of memory: Killed "
        "process 4242 (java) total-vm:8000000kB, anon-rss:6000000kB, file-rss:1000kB, "
        "shmem-rss:0kB, UID:1000 pgtables:12000kB oom_score_adj:0\n"
    )
    textfile = tmp_path / "tf"
    textfile.mkdir()
    result = run("--oom-file", str(log), "--textfile-dir", str(textfile))
    assert result.exit_code == 0, result.output
    assert "no state directory" not in result.stderr
    assert (_default_state_dir / "collect-state.json").is_file()
    assert (_default_state_dir.stat().st_mode & 0o777) == 0o700
    prom = (textfile / "memforensics.prom").read_text()
    assert "memforensics_oom_kills_total{" in prom and 'process="java"' in prom


def test_an_unsafe_state_dir_is_refused_before_any_work(tmp_path: Path) -> None:
    state = tmp_path / "open"
    state.mkdir()
    os.chmod(state, 0o777)
    textfile = tmp_path / "tf"
    textfile.mkdir()
    log = tmp_path / "kern.log"
    log.write_text("")
    result = run("--oom-file", str(log), "--textfile-dir", str(textfile), "--state-dir", str(state))
    assert result.exit_code == 4, result.output
    assert "world-writable" in result.stderr and "chmod 700" in result.stderr
    assert "--state-dir" in result.stderr
    assert not (textfile / "memforensics.prom").exists()
    # The default directory is checked the same way.
    default = run(
        "--oom-file",
        str(log),
        "--textfile-dir",
        str(textfile),
        env={"MEMFORENSICS_STATE_DIR": str(state)},
    )
    assert default.exit_code == 4
