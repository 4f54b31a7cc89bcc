"""`census` and `diff` of census documents through click: help, usage errors, hostile input
(exit 7, one line), and the documents against docs/json.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from memforensics.cli import cli
from tests.support.schema import missing_keys

CENSUS = Path(__file__).resolve().parent.parent.parent / "fixtures" / "census"
BEFORE, AFTER = CENSUS / "service-before.json", CENSUS / "service-after.json"


def test_census_help_has_examples_and_exit_codes() -> None:
    result = CliRunner().invoke(cli, ["census", "--help"])
    assert result.exit_code == 0
    assert "memforensics census --core" in result.stdout
    assert "Exit codes" in result.stdout or "exit codes" in result.stdout.lower()


def test_census_needs_pids_or_a_core() -> None:
    result = CliRunner().invoke(cli, ["census"])
    assert result.exit_code == 2
    assert "PID... or --core" in result.stderr


def test_fixture_censuses_meet_the_schema() -> None:
    for path in (BEFORE, AFTER):
        assert missing_keys(json.loads(path.read_text()), "memforensics/census/1") == []


def test_diff_of_censuses_names_the_leak_first() -> None:
    result = CliRunner().invoke(cli, ["diff", "--json", str(BEFORE), str(AFTER)])
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert missing_keys(document, "memforensics/census-diff/1") == []
    first = document["types"][0]
    assert (first["name"], first["count_delta"]) == ("shop::Leak", 5000)
    # The oracle is the two documents' own lines, not the diff's code.
    before = {t["name"]: t for t in json.loads(BEFORE.read_text())["types"]}
    after = {t["name"]: t for t in json.loads(AFTER.read_text())["types"]}
    for row in document["types"]:
        old, new = before.get(row["name"]), after.get(row["name"])
        assert row["bytes_delta"] == (new["bytes"] if new else 0) - (old["bytes"] if old else 0)
    table = CliRunner().invoke(cli, ["diff", str(BEFORE), str(AFTER)])
    assert table.exit_code == 0 and "shop::Leak" in table.stdout


_HEAD = '{"schema": "memforensics/census/1", "types": '


@pytest.mark.parametrize(
    "text",
    [
        _HEAD + '[{"name": 1, "kind": "c++", "count": 1, "bytes": 1}]}',
        _HEAD + '[{"name": "x", "kind": "c++", "count": -1, "bytes": 1}]}',
        _HEAD + '"no"}',
        _HEAD + "[" * 100000 + "]}",
        _HEAD + '[{"name": "x", "kind": "evil", "count": 1, "bytes": 1}]}',
        _HEAD + '[{"name": "x", "kind": "c++", "count": 1.5, "bytes": 1}]}',
    ],
)
def test_hostile_census_documents_exit_7(tmp_path: Path, text: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    result = CliRunner().invoke(cli, ["diff", str(BEFORE), str(bad)])
    assert result.exit_code == 7, result.stderr
    assert result.stderr.startswith("error:") and "Traceback" not in result.stderr


def test_census_against_a_dump_is_refused(tmp_path: Path) -> None:
    dump = Path(__file__).resolve().parent.parent.parent / "fixtures" / "threads-fragmented.xml"
    result = CliRunner().invoke(cli, ["diff", str(BEFORE), str(dump)])
    assert result.exit_code == 7


def test_census_of_no_such_process_exits_3() -> None:
    result = CliRunner().invoke(cli, ["census", "4194303"])
    assert result.exit_code == 3, result.stderr
    assert result.stderr.startswith("error:") and "Traceback" not in result.stderr


def test_census_of_a_file_that_is_no_core_exits_7(tmp_path: Path) -> None:
    junk = tmp_path / "core"
    junk.write_bytes(b"\x7fELF" + bytes(200))
    result = CliRunner().invoke(cli, ["census", "--core", str(junk)])
    assert result.exit_code == 7, result.stderr
    assert result.stderr.startswith("error:") and "Traceback" not in result.stderr
