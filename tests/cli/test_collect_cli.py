"""`memforensics collect` through click's runner: help, usage errors, exit 0 with targets down."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner, Result

from memforensics.cli import cli
from tests.support.schema import missing_keys

GONE_PID = 2**22 + 4321  # above pid_max's default: no such process


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, ["collect", *args], env=env)


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
    assert f'memforensics_target_up{{container_id="",pid="{GONE_PID}"' in prom
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
        "--oom-file", str(log), "--textfile-dir", str(textfile), env={"STATE_DIRECTORY": str(state)}
    )
    assert result.exit_code == 0, result.output
    assert (state / "collect-state.json").is_file()
    assert "OOM cursor started" in result.stderr
    assert "memforensics_oom_scan_up 1.0" in (textfile / "memforensics.prom").read_text()
