"""`memforensics census` on CPython 3.11 (and 3.12, 3.13 where this machine has them)
against the program's own account: the instances of classes with and without __slots__ it
built (within 2%), gc.get_objects()'s count of the GC-tracked types, and the blocks in use
sys._debugmallocstats() reports for pymalloc's pools.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.census_targets import PYTHONS, command, ready_json
from tests.support.gcore import gcore
from tests.support.targets import TARGETS_DIR, live_skip_reason, ptrace_skip_reason, running

_SKIP = ptrace_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]
_CLASS_LINE = re.compile(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*$")


def _census(pid: int) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "memforensics", "census", "--json", str(pid)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def _blocks_in_use(stats: str) -> int:
    """The sum of 'blocks in use' over sys._debugmallocstats()'s size-class table."""
    total = 0
    for line in stats.splitlines():
        found = _CLASS_LINE.match(line)
        if found:
            total += int(found.group(4))
    return total


@pytest.mark.parametrize("python", PYTHONS)
def test_python_instances_counted_as_built(python: str) -> None:
    script = str(TARGETS_DIR / "py_census.py")
    with running([python, script], stdin=subprocess.PIPE) as target:
        document = _census(target.pid)
        command(target, "stats", "stats")
        target.proc.terminate()
        _, stderr = target.proc.communicate(timeout=30)
    oracle = ready_json(target)
    counts = {t["name"]: t["count"] for t in document["types"] if t["kind"] == "python"}
    version = python.rsplit("python", 1)[1]
    assert document["python_layout"].startswith(f"cpython-{version}")
    for name in ("Plain", "Slotted"):
        assert abs(counts[name] - oracle["built"][name]) <= 0.02 * oracle["built"][name]
        assert abs(counts[name] - oracle["gc"][name]) <= 0.02 * oracle["gc"][name]
    # lists are all GC-tracked: gc.get_objects() sees each one the census may.
    assert abs(counts["list"] - oracle["gc"]["list"]) <= 0.02 * oracle["gc"]["list"]
    assert counts["bytes"] >= oracle["built"]["bytes"]
    assert counts["dict"] >= oracle["built"]["dict"]
    blocks = _blocks_in_use(stderr.decode())
    assert blocks > 100_000
    assert abs(document["read"]["pymalloc_blocks"] - blocks) <= 0.02 * blocks


def test_python_instances_hold_while_a_thread_churns() -> None:
    script = str(TARGETS_DIR / "py_census.py")
    with running([PYTHONS[0], script, "churn"], stdin=subprocess.PIPE) as target:
        documents = [_census(target.pid) for _ in range(2)]
    oracle = ready_json(target)
    for document in documents:
        counts = {t["name"]: t["count"] for t in document["types"] if t["kind"] == "python"}
        for name in ("Plain", "Slotted"):
            assert abs(counts[name] - oracle["built"][name]) <= 0.02 * oracle["built"][name]


@pytest.mark.skipif(live_skip_reason() is not None, reason=str(live_skip_reason()))
def test_core_census_of_python_counts_the_same(tmp_path: Path) -> None:
    script = str(TARGETS_DIR / "py_census.py")
    core = tmp_path / "core"
    with running([PYTHONS[0], script], stdin=subprocess.PIPE) as target:
        live = _census(target.pid)
        gcore(target.pid, core)
    result = subprocess.run(
        [sys.executable, "-m", "memforensics", "census", "--json", "--core", str(core)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr, result.stderr
    dead = json.loads(result.stdout)
    assert dead["python_layout"] == live["python_layout"]
    named = {t["name"]: t["count"] for t in live["types"] if t["kind"] == "python"}
    assert {t["name"]: t["count"] for t in dead["types"] if t["kind"] == "python"} == named
