"""`memforensics parse` and `diff` through click's runner and a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from memforensics.cli import cli
from tests.support.schema import missing_keys
from tests.unit.test_malloc_xml import MODERN

MiB = 1 << 20


@pytest.fixture
def dump_file(tmp_path: Path) -> Path:
    path = tmp_path / "dump.xml"
    path.write_bytes(MODERN)
    return path


def run(*args: str, input: bytes | None = None):
    return CliRunner().invoke(cli, list(args), input=input)


def test_parse_human_report_has_totals_arenas_histogram_advice(dump_file: Path) -> None:
    result = run("parse", str(dump_file))
    assert result.exit_code == 0, result.output
    out = result.stdout
    for needle in ("arenas", "in use", "free ratio", "free chunks by size", "advice", "106.8 KiB"):
        assert needle in out
    assert result.stderr == ""


def test_parse_json_matches_documented_schema(dump_file: Path) -> None:
    result = run("parse", "--json", str(dump_file))
    assert result.exit_code == 0
    document = json.loads(result.stdout)
    assert document["schema"] == "memforensics/heap/1"
    assert missing_keys(document, "memforensics/heap/1") == []
    assert document["totals"]["free_bytes"] == 96 + 109269
    assert document["totals"]["mmap_chunks"] == 3
    assert document["arenas"][0]["sizes"][1] == {
        "kind": "bin",
        "from_bytes": 1041,
        "to_bytes": 1041,
        "total_bytes": 3123,
        "count": 3,
        "suspect": False,
    }


def test_parse_several_files_gives_array_and_stdin_works(dump_file: Path) -> None:
    result = run("parse", "--json", str(dump_file), "-", input=MODERN)
    documents = json.loads(result.stdout)
    assert [d["source"] for d in documents] == [str(dump_file), "<stdin>"]


def test_parse_series_reports_last_dump_and_every_line(tmp_path: Path) -> None:
    path = tmp_path / "series.xml"
    path.write_bytes(MODERN + b"\n" + MODERN + MODERN)
    document = json.loads(run("parse", "--json", str(path)).stdout)
    assert document["dumps"] == 3 and document["sequence"] == 2
    assert [row["sequence"] for row in document["series"]] == [0, 1, 2]
    human = run("parse", str(path)).stdout
    assert "3 dumps in" in human and "dump 3 of 3" in human


def test_gates_exit_1_with_one_line_per_violation(dump_file: Path) -> None:
    result = run("parse", "--max-free", "1KiB", "--max-arenas", "1", str(dump_file))
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"gate failed: {dump_file}: all arenas: free 106.8 KiB > 1.0 KiB; "
        "largest arena 0 holds 106.8 KiB",
        f"gate failed: {dump_file}: arenas: 2 > 1",
    ]
    assert (
        run("parse", "--max-free", "1GiB", "--max-free-ratio", "99%", str(dump_file)).exit_code == 0
    )


def test_gates_in_json_mode_still_exit_1_and_list_violations(dump_file: Path) -> None:
    result = run("parse", "--json", "--max-arenas", "1", str(dump_file))
    assert result.exit_code == 1
    assert json.loads(result.stdout)["gates"][0]["gate"] == "max-arenas"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--max-free", "lots"], "is not a size"),
        (["--max-free-ratio", "1.5"], "outside 0..1"),
        (["--sort", "colour"], "Invalid value for '--sort'"),
        (["--top", "-1"], "Invalid value for '--top'"),
    ],
)
def test_bad_options_are_usage_errors(dump_file: Path, args: list[str], fragment: str) -> None:
    result = run("parse", *args, str(dump_file))
    assert result.exit_code == 2 and fragment in result.stderr


def test_missing_file_is_usage_error() -> None:
    result = run("parse", "/nonexistent/dump.xml")
    assert result.exit_code == 2 and "does not exist" in result.stderr


def test_bad_dump_is_exit_7_one_line_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "cut.xml"
    path.write_bytes(MODERN[:300])
    result = run("parse", str(path))
    assert result.exit_code == 7
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"error: {path}:") and "truncated" in lines[0]
    assert lines[1].startswith("hint: ")
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_real_subprocess_entry_points(dump_file: Path) -> None:
    """`python -m memforensics` works, and stdout is pure JSON for pipes."""
    proc = subprocess.run(
        [sys.executable, "-m", "memforensics", "parse", "--json", str(dump_file)],
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["schema"] == "memforensics/heap/1"


def test_diff_json_and_human(tmp_path: Path, dump_file: Path) -> None:
    grown = tmp_path / "grown.xml"
    head, tail = MODERN.rsplit(b'<system type="current" size="135168"/>', 1)
    data = head.replace(
        b'<system type="current" size="135168"/>', b'<system type="current" size="1183744"/>', 1
    )
    grown.write_bytes(data + b'<system type="current" size="1183744"/>' + tail)
    result = run("diff", "--json", str(dump_file), str(grown))
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert missing_keys(document, "memforensics/heap-diff/1") == []
    assert document["totals"]["system_delta_bytes"] == 1183744 - 135168
    assert document["arenas"][0]["change"] == "changed"
    assert document["arenas"][1]["change"] == "unchanged"
    human = run("diff", str(dump_file), str(grown)).stdout
    assert "+1.0 MiB" in human and "1 unchanged arenas hidden" in human


def test_diff_refuses_two_stdins(dump_file: Path) -> None:
    result = run("diff", "-", "-", input=MODERN)
    assert result.exit_code == 2 and "only one of OLD and NEW" in result.stderr


FIXTURES = Path(__file__).resolve().parent.parent.parent / "fixtures"


def test_diff_shows_which_old_arena_is_which_new_one_after_a_new_arena() -> None:
    """A new arena becomes 1 and pushes the older ones up: the diff pairs old k with new k+1,
    shows both numbers, and reports only the new arena as a change."""
    old = str(FIXTURES / "derived/threads-fragmented-one-arena-earlier.xml")
    new = str(FIXTURES / "threads-fragmented.xml")
    document = json.loads(run("diff", "--json", old, new).stdout)
    assert missing_keys(document, "memforensics/heap-diff/1") == []
    arenas = document["arenas"]
    assert [(a["old_index"], a["new_index"], a["change"]) for a in arenas[:3]] == [
        (0, 0, "unchanged"),
        (None, 1, "appeared"),
        (1, 2, "unchanged"),
    ]
    assert [a["change"] for a in arenas].count("unchanged") == 15
    assert arenas[-1]["old_index"] == 14 and arenas[-1]["new_index"] == 15
    human = run("diff", old, new).stdout
    assert "15 unchanged arenas hidden" in human
    assert "— → 1" in human and "appeared" in human
    everything = run("diff", "--all", old, new).stdout
    assert "1 → 2" in everything and "14 → 15" in everything


def test_parse_old_glibc_garbage_unsorted_gives_no_absurd_totals() -> None:
    """glibc <= 2.17's uninitialised <unsorted> slot is kept out of free and in use (it would
    read "free 128 TiB, in use 0 B")."""
    path = str(FIXTURES / "dialects/glibc-2.12-nested.xml")
    human = run("parse", path).stdout
    assert "TiB" not in human.split("free chunks by size")[0]
    document = json.loads(run("parse", "--json", path).stdout)
    totals = document["totals"]
    assert totals["free_bytes"] == (992 + 24192) + (1280 + 1339)
    assert totals["in_use_bytes"] == totals["system_bytes"] - totals["free_bytes"]
    assert totals["suspect"] is True
    main = document["arenas"][0]
    assert main["suspect"] is True and main["rest_bytes"] == 24192
    assert [s["suspect"] for s in main["sizes"] if s["kind"] == "unsorted"] == [True]
    assert any("kept out of rest" in note for note in document["notes"])


def test_parse_page_size_option_reaches_the_trim_advice() -> None:
    path = str(FIXTURES / "threads-fragmented.xml")
    default = json.loads(run("parse", "--json", path).stdout)
    (message,) = [a["message"] for a in default["advice"] if a["code"] == "trim-would-release"]
    assert "this machine's page size" in message
    given = json.loads(run("parse", "--json", "--page-size", "4KiB", path).stdout)
    (message,) = [a["message"] for a in given["advice"] if a["code"] == "trim-would-release"]
    assert message.startswith("19.0 MiB") and "4 KiB pages" in message
    assert "this machine" not in message
    bad = run("parse", "--page-size", "5000", path)
    assert bad.exit_code == 2 and "power of two" in bad.stderr


def test_json_shape_follows_the_command_line_not_the_data(dump_file: Path) -> None:
    """One FILE gives an object; several FILEs an array, even when the files are the same
    dump: a script's `jq .totals` must not work one day and fail the next."""
    one = json.loads(run("parse", "--json", str(dump_file)).stdout)
    assert isinstance(one, dict) and one["schema"] == "memforensics/heap/1"
    two = json.loads(run("parse", "--json", str(dump_file), str(dump_file)).stdout)
    assert isinstance(two, list) and [d["schema"] for d in two] == ["memforensics/heap/1"] * 2
