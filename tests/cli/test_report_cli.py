"""`memforensics report`: JSON, Markdown, HTML and terminal output from recordings and dumps."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from memforensics.cli import cli
from memforensics.model.series import Sample, SeriesEvent
from memforensics.render.sample_json import event_line, sample_line
from memforensics.sources.files.recording import RecordingWriter
from tests.support.schema import missing_keys

FIXTURES = Path(__file__).resolve().parent.parent.parent / "fixtures"
MiB = 1 << 20
T0 = datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)


def record(path: Path, pid: int, in_use_step: int, free_step: int, *, oom: bool = False) -> None:
    """A recording of 10 heap samples a minute apart with RSS readings between them."""
    with RecordingWriter(path) as writer:
        for i in range(10):
            when = T0 + timedelta(minutes=i)
            in_use, free = 50 * MiB + i * in_use_step, 10 * MiB + i * free_step
            totals = {
                "arenas": 1,
                "system_bytes": in_use + free,
                "free_bytes": free,
                "in_use_bytes": in_use,
                "mmap_bytes": 0,
            }
            rss = in_use + free // 2
            writer.write(
                sample_line(
                    Sample(
                        "heap",
                        when,
                        pid,
                        f"p{pid}",
                        rss,
                        totals=totals,
                        pause_seconds=0.02,
                        free_resident_bytes=free // 2,
                    )
                )
            )
            for second in (20, 40):
                writer.write(
                    sample_line(
                        Sample("rss", when + timedelta(seconds=second), pid, f"p{pid}", rss)
                    )
                )
        if oom:
            writer.write(
                event_line(
                    SeriesEvent("exit", T0 + timedelta(minutes=10), pid, f"p{pid}", "exited")
                )
            )
            writer.write(
                event_line(
                    SeriesEvent(
                        "oom-kill",
                        T0 + timedelta(minutes=10),
                        pid,
                        f"p{pid}",
                        "killed by the kernel OOM killer (memcg)",
                        rss_bytes=200 * MiB,
                    )
                )
            )


@pytest.fixture
def leak(tmp_path: Path) -> Path:
    path = tmp_path / "leak.jsonl"
    record(path, 100, 4 * MiB, 0, oom=True)
    return path


@pytest.fixture
def fragment(tmp_path: Path) -> Path:
    path = tmp_path / "fragment.jsonl"
    record(path, 200, 0, 8 * MiB)
    return path


def test_json_for_one_recording_has_the_documented_keys(leak: Path) -> None:
    result = CliRunner().invoke(cli, ["report", str(leak), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert missing_keys(document, "memforensics/report/1") == []
    assert missing_keys(document, "memforensics/report/1#one-process") == []
    assert document["trend"]["verdict"] == "in-use-growing"
    assert document["trend"]["in_use_bytes_per_hour"] == pytest.approx(240 * MiB, rel=0.01)
    assert [m["kind"] for m in document["marks"]] == ["exit", "oom-kill"]


def test_several_processes_each_get_their_verdict(leak: Path, fragment: Path) -> None:
    result = CliRunner().invoke(cli, ["report", str(leak), str(fragment), "--json"])
    document = json.loads(result.stdout)
    verdicts = {p["pid"]: p["trend"]["verdict"] for p in document["processes"]}
    assert verdicts == {100: "in-use-growing", 200: "free-growing"}
    assert "trend" not in document  # only one process is lifted to the top level


def test_markdown_summary(leak: Path, tmp_path: Path) -> None:
    out = tmp_path / "summary.md"
    result = CliRunner().invoke(cli, ["report", str(leak), "--markdown", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "### PID 100 p100: 🔴 `in-use-growing`" in text
    assert "| in use |" in text and "oom-kill" in text
    assert result.stdout == ""  # files only: nothing on stdout unless asked
    to_stdout = CliRunner().invoke(cli, ["report", str(leak), "--markdown", "-"])
    assert to_stdout.stdout.strip() == text.strip()


def test_html_is_one_self_contained_file(fragment: Path, tmp_path: Path) -> None:
    out = tmp_path / "page.html"
    result = CliRunner().invoke(cli, ["report", str(fragment), "--html", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page) is None
    assert "@import" not in page and "url(" not in page
    assert page.count('class="layer layer-') == 3  # in use, free resident, free released
    assert 'class="rss"' in page and "free-growing" in page


def test_terminal_report(fragment: Path) -> None:
    result = CliRunner().invoke(cli, ["report", str(fragment)])
    assert result.exit_code == 0
    assert "verdict: free-growing" in result.stdout
    assert "free chunks pile up" in result.stdout


def test_xml_series_and_heap_json_inputs() -> None:
    result = CliRunner().invoke(
        cli, ["report", str(FIXTURES / "series-5.xml"), "--dump-interval", "1m", "--json"]
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["span_seconds"] == 240
    assert document["trend"]["verdict"] in ("in-use-growing", "free-growing", "stable")
    assert document["trend"]["in_use_bytes_per_hour"] is not None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("just words\n", "neither a recording"),
        ('{"schema": "memforensics/sample/1", "kind": "rss"}\nnot json\n{}\n', "not a JSON line"),
        ('{"schema": "something/else"}', "not a memforensics/heap/1 document"),
    ],
)
def test_bad_input_is_exit_7(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad"
    path.write_text(content)
    result = CliRunner().invoke(cli, ["report", str(path)])
    assert result.exit_code == 7
    assert message in result.stderr


def test_missing_input_is_exit_7(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["report", str(tmp_path / "nope.jsonl")])
    assert result.exit_code == 7
    assert "cannot read" in result.stderr


def test_report_needs_an_input() -> None:
    assert CliRunner().invoke(cli, ["report"]).exit_code == 2


def test_a_long_recording_is_downsampled_to_a_small_page(tmp_path: Path) -> None:
    """50,000 RSS readings draw at most 2 points per pixel bucket, keeping the one spike."""
    path = tmp_path / "long.jsonl"
    with RecordingWriter(path) as writer:
        for second in range(50_000):
            rss = (100 + (second % 7)) * MiB + (400 * MiB if second == 31_337 else 0)
            writer.write(sample_line(Sample("rss", T0 + timedelta(seconds=second), 9, "long", rss)))
    out = tmp_path / "long.html"
    result = CliRunner().invoke(cli, ["report", str(path), "--html", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    points = re.search(r'<polyline class="rss" points="([^"]*)"', page)
    assert points is not None
    coordinates = [tuple(map(float, p.split(","))) for p in points.group(1).split()]
    assert len(coordinates) <= 2002
    # The axis tops at 600 MiB: the spike (506 MiB) is drawn high, the rest (~106 MiB) low.
    assert min(y for _, y in coordinates) < 100, "the 500 MiB spike is gone"
    assert sorted(y for _, y in coordinates)[1] > 200
    assert len(page) < 300_000


def test_fail_on_is_a_gate(leak: Path, fragment: Path) -> None:
    gate = CliRunner().invoke(
        cli, ["report", str(leak), str(fragment), "--fail-on", "in-use-growing"]
    )
    assert gate.exit_code == 1
    assert "gate: PID 100 p100 is in-use-growing" in gate.stderr
    assert "PID 200" not in gate.stderr
    passing = CliRunner().invoke(cli, ["report", str(fragment), "--fail-on", "in-use-growing"])
    assert passing.exit_code == 0


def test_fail_on_accepts_every_verdict_and_growing(leak: Path, fragment: Path) -> None:
    """Gates take every verdict; `growing` means any *-growing verdict."""
    for verdict in ("mmap-growing", "outside-malloc-growing", "rss-growing", "stable"):
        result = CliRunner().invoke(cli, ["report", str(fragment), "--fail-on", verdict])
        assert result.exit_code == 0, result.output
    free_gate = CliRunner().invoke(cli, ["report", str(fragment), "--fail-on", "free-growing"])
    assert free_gate.exit_code == 1
    both = CliRunner().invoke(cli, ["report", str(leak), str(fragment), "--fail-on", "growing"])
    assert both.exit_code == 1
    assert "PID 100 p100 is in-use-growing" in both.stderr
    assert "PID 200 p200 is free-growing" in both.stderr
