"""Real `--json` output against docs/json.md, and the checker itself on broken documents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from memforensics.cli import cli
from tests.support.schema import missing_keys

FIXTURES = Path(__file__).resolve().parent.parent.parent / "fixtures"
DUMPS = sorted(p.name for p in FIXTURES.glob("*.xml"))


def _json(*args: str) -> object:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code in (0, 1), result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("name", DUMPS)
def test_parse_json_of_every_fixture_meets_the_schema(name: str) -> None:
    document = _json("parse", "--json", str(FIXTURES / name))
    assert missing_keys(document, "memforensics/heap/1") == []


def test_diff_json_meets_the_schema() -> None:
    old, new = (
        FIXTURES / n for n in ("free-all-but-last-before-trim.xml", "threads-fragmented.xml")
    )
    document = _json("diff", "--json", str(old), str(new))
    assert missing_keys(document, "memforensics/heap-diff/1") == []


def _good() -> dict[str, object]:
    document = _json("parse", "--json", str(FIXTURES / "threads-fragmented.xml"))
    assert isinstance(document, dict)
    return document


def test_checker_refuses_an_empty_list_where_elements_are_promised() -> None:
    document = _good()
    document["arenas"] = []
    assert "arenas[].index" in missing_keys(document, "memforensics/heap/1")
    assert "arenas[].index" not in missing_keys(
        document, "memforensics/heap/1", may_be_empty=["arenas"]
    )


@pytest.mark.parametrize(
    ("where", "value", "why"),
    [
        ("free_bytes", 1.5, "integers"),
        ("free_bytes", -4096, "below zero"),
        ("free_bytes", True, "integers"),
        ("free_ratio", 1.25, "0 to 1"),
        ("free_ratio", None, "0 to 1"),
    ],
)
def test_checker_looks_at_values(where: str, value: object, why: str) -> None:
    document = _good()
    totals = document["totals"]
    assert isinstance(totals, dict)
    totals[where] = value
    problems = missing_keys(document, "memforensics/heap/1")
    assert any(p.startswith(f"totals.{where}: ") and why in p for p in problems), problems


def test_checker_knows_the_schema_name_and_times() -> None:
    document = _good()
    document["schema"] = "memforensics/heap/2"
    document["time"] = "23/11/2026 16:00"
    problems = " | ".join(missing_keys(document, "memforensics/heap/1"))
    assert "schema must be memforensics/heap/1" in problems and "ISO-8601" in problems


@pytest.mark.parametrize("name", ["threads-fragmented.xml", "series-5.xml", "python3-idle.xml"])
def test_written_text_is_what_json_dumps_would_write(name: str) -> None:
    """The piecewise writer and the per-arena bucket template keep json.dumps's layout."""
    result = CliRunner().invoke(cli, ["parse", "--json", str(FIXTURES / name)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == json.dumps(json.loads(result.stdout), indent=2) + "\n"


def test_writer_handles_every_kind_of_value() -> None:
    from memforensics.render.jsondoc import write_json

    document = {
        "empty_list": [],
        "empty_dict": {},
        "lazy": (i * 2 for i in range(300)),
        "lazy_empty": iter(()),
        "nested": {"a": [1, {"b": None}], "t": True, "f": False},
        "text": 'naïve "quoted" \\ line\nbreak',
        "ratio": 0.1 + 0.2,
        "big": 2**64 - 1,
    }
    pieces: list[str] = []
    write_json(document, pieces.append, buffer_chars=8)
    expected = dict(document, lazy=[i * 2 for i in range(300)], lazy_empty=[])
    assert "".join(pieces) == json.dumps(expected, indent=2) + "\n"
    assert len(pieces) > 1  # written in pieces, not held whole
