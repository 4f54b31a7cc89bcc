"""`memforensics census` on a stripped C++ service against the population it built.

The oracle is tests/targets/census_service.cpp itself: it prints how many objects of each
type it made (multiple inheritance, templates, make_shared, arrays behind a cookie, texts,
zero-filled blocks). The census must count each C++ type within 1% (idle) or 2% (while a
thread churns unrelated allocations), texts and zeros within 95-130%; a diff of two censuses
must name the type that grew first, its growth within 2%; the census of a gcore of the target
must count the same. The census runs with no gdb on PATH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.census_targets import command, compile_cxx, ready_fields
from tests.support.gcore import gcore
from tests.support.targets import live_skip_reason, ptrace_skip_reason, running

_SKIP = ptrace_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]
BOX_STRING = (
    "shop::Box<std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > >"
)


def _census(*args: str) -> dict[str, Any]:
    """The CLI's JSON, run with no gdb reachable (PATH holds no directory with gdb)."""
    env = dict(os.environ, PATH="/nonexistent")
    result = subprocess.run(
        [sys.executable, "-m", "memforensics", "census", "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def _counts(document: dict[str, Any]) -> dict[str, int]:
    return {t["name"]: t["count"] for t in document["types"]}


def _check(document: dict[str, Any], built: dict[str, int], tolerance: float) -> None:
    counts = _counts(document)
    expected = {
        "shop::Session": built["shop::Session"],
        "shop::Order": built["shop::Order"],
        "shop::Box<int>": built["shop::Box<int>"],
        BOX_STRING: built["box_string"],
        "std::make_shared<shop::Cart>": built["make_shared"],
        "shop::Widget[]": built["widget_arrays"],
    }
    for name, count in expected.items():
        assert abs(counts.get(name, 0) - count) <= tolerance * count, (name, counts.get(name))
    assert 0.95 * built["text"] <= counts["text"] <= 1.30 * built["text"]
    assert 0.95 * built["zeros"] <= counts["zeros"] <= 1.30 * built["zeros"]
    assert document["schema"] == "memforensics/census/1"
    totals = document["totals"]
    assert totals["live_bytes"] == sum(t["bytes"] for t in document["types"])
    assert totals["live_chunks"] == sum(t["count"] for t in document["types"])


def test_stripped_cxx_types_counted_as_built() -> None:
    binary = compile_cxx("census_service")
    assert b".symtab" not in binary.read_bytes()  # stripped: no symbol names to lean on
    with running([str(binary)], stdin=subprocess.PIPE) as target:
        document = _census(str(target.pid))
        assert target.alive() and target.settled_state() == "S"
    _check(document, ready_fields(target), 0.01)
    assert document["read"]["longest_stop_seconds"] < 0.1
    assert document["read"]["heaps_incomplete"] == 0


def test_counts_hold_while_a_thread_churns() -> None:
    binary = compile_cxx("census_service")
    with running([str(binary), "churn"], stdin=subprocess.PIPE) as target:
        documents = [_census(str(target.pid)) for _ in range(2)]
    for document in documents:
        _check(document, ready_fields(target), 0.02)


def test_diff_names_the_type_that_grew(tmp_path: Path) -> None:
    binary = compile_cxx("census_service")
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    with running([str(binary), "churn"], stdin=subprocess.PIPE) as target:
        before.write_text(json.dumps(_census(str(target.pid))))
        command(target, "grow 5000", "grown")
        after.write_text(json.dumps(_census(str(target.pid))))
    result = subprocess.run(
        [sys.executable, "-m", "memforensics", "diff", "--json", str(before), str(after)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    diff = json.loads(result.stdout)
    assert diff["schema"] == "memforensics/census-diff/1"
    first = diff["types"][0]
    assert first["name"] == "shop::Leak"
    assert abs(first["count_delta"] - 5000) <= 100
    table = subprocess.run(
        [sys.executable, "-m", "memforensics", "diff", str(before), str(after)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "shop::Leak" in table


@pytest.mark.skipif(live_skip_reason() is not None, reason=str(live_skip_reason()))
def test_core_census_counts_the_same(tmp_path: Path) -> None:
    binary = compile_cxx("census_service")
    core = tmp_path / "core"
    with running([str(binary)], stdin=subprocess.PIPE) as target:
        live = _census(str(target.pid))
        gcore(target.pid, core)
    dead = _census("--core", str(core))
    _check(dead, ready_fields(target), 0.01)
    named = {k: v for k, v in _counts(live).items() if k.startswith(("shop::", "std::make"))}
    assert {k: _counts(dead).get(k) for k in named} == named


def test_collect_exports_the_top_types_and_other(tmp_path: Path) -> None:
    binary = compile_cxx("census_service")
    with running([str(binary)], stdin=subprocess.PIPE) as target:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "memforensics",
                "collect",
                "--no-oom",
                "--read-only",
                "--census-top",
                "3",
                "--textfile-dir",
                str(tmp_path),
                str(target.pid),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        built = ready_fields(target)
    text = (tmp_path / "memforensics.prom").read_text()
    series = [line for line in text.splitlines() if line.startswith("memforensics_census_chunks{")]
    assert len(series) == 4  # bounded: the top 3 and "other"
    sessions = next(line for line in series if 'type="shop::Session"' in line)
    assert abs(float(sessions.rsplit(" ", 1)[1]) - built["shop::Session"]) <= 200
    assert any('type="other"' in line for line in series)
