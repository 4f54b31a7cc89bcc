"""`watch --census` records census samples beside the heap samples, and `report` names the
type that grows, with its rate, in the terminal, Markdown, HTML and JSON.

The oracle is the target: tests/targets/census_service.cpp makes 1,000 more shop::Leak each
time the test tells it to (twice a second), and answers with its running total; the census
samples' counts of shop::Leak must lie within that total's range, grow, and the report's
rate must be the rate the test drove (within a factor of two: samples fall at any phase).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.census_targets import command, compile_cxx
from tests.support.targets import ptrace_skip_reason, running

_SKIP = ptrace_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]
MEMFORENSICS = [sys.executable, "-m", "memforensics"]


def test_watch_census_then_report_names_the_growing_type(tmp_path: Path) -> None:
    recording = tmp_path / "watch.jsonl"
    binary = compile_cxx("census_service")
    grown: list[int] = []
    with running([str(binary)], stdin=subprocess.PIPE) as target:
        stop = threading.Event()

        def drive() -> None:
            while not stop.is_set():
                grown.append(int(command(target, "grow 1000", "grown").split()[1]))
                stop.wait(0.5)

        driver = threading.Thread(target=drive)
        driver.start()
        try:
            began = time.monotonic()
            subprocess.run(
                [
                    *MEMFORENSICS,
                    "watch",
                    str(target.pid),
                    "--read-only",
                    "--interval",
                    "2s",
                    "--census",
                    "1s",
                    "--duration",
                    "7s",
                    "--record",
                    str(recording),
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
            driven_seconds = time.monotonic() - began
        finally:
            stop.set()
            driver.join(timeout=60)
    lines = [json.loads(line) for line in recording.read_text().splitlines()]
    censuses = [line for line in lines if line.get("kind") == "census"]
    gaps = [line for line in lines if line.get("event") == "gap"]
    assert len(censuses) >= 3, gaps
    leaks = [
        next((t["count"] for t in c["types"] if t["name"] == "shop::Leak"), 0) for c in censuses
    ]
    assert leaks == sorted(leaks) and leaks[-1] > leaks[0]
    assert max(leaks) <= max(grown)
    driven_per_hour = max(grown) / driven_seconds * 3600
    report = subprocess.run(
        [*MEMFORENSICS, "report", "--json", str(recording)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    document = json.loads(report.stdout)
    growth = document["processes"][0]["growing_types"]
    assert growth[0]["name"] == "shop::Leak"
    assert driven_per_hour / 2 <= growth[0]["count_per_hour"] <= driven_per_hour * 2
    for args in ([], ["--markdown", str(tmp_path / "r.md")], ["--html", str(tmp_path / "r.html")]):
        result = subprocess.run(
            [*MEMFORENSICS, "report", str(recording), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        written = result.stdout if not args else Path(args[1]).read_text()
        assert "shop::Leak +" in written, args
