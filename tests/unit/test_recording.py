"""Recordings: written line by line, resumed, read while written; torn lines tolerated."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from memforensics.cli import cli
from memforensics.entry.reporting import build_report
from memforensics.errors import InputDataError
from memforensics.model.advice import Advice
from memforensics.model.process import Waterfall, WaterfallLine
from memforensics.model.series import ArenaPoint, Sample, SeriesEvent, SizeClassPoint
from memforensics.render.sample_json import event_line, sample_line
from memforensics.sources.files.recording import RecordingWriter, read_recording
from memforensics.sources.files.report_inputs import sniff
from tests.support.schema import missing_keys

FIXTURES = Path(__file__).resolve().parent.parent.parent / "fixtures"
T0 = datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)
MiB = 1 << 20


def heap_sample(i: int) -> Sample:
    return Sample(
        kind="heap",
        time=T0 + timedelta(seconds=i),
        pid=7,
        process="svc",
        rss_bytes=(20 + i) * MiB,
        anon_bytes=(18 + i) * MiB,
        totals={
            "arenas": 1,
            "in_use_bytes": (10 + i) * MiB,
            "free_bytes": 2 * MiB,
            "system_bytes": (12 + i) * MiB,
            "mmap_bytes": 0,
        },
        pause_seconds=0.012,
        free_resident_bytes=MiB,
        arenas=(ArenaPoint(0, (12 + i) * MiB, (10 + i) * MiB, 2 * MiB, 0.16, 4096),),
        histogram=(SizeClassPoint(4096, 16383, 3, 30000),),
        waterfall=Waterfall((WaterfallLine("rss", "RSS", (20 + i) * MiB, 0),)),
        advice=(Advice("heap-mostly-used", "mostly used", "info"),),
    )


def rss_sample(i: int) -> Sample:
    return Sample(
        kind="rss", time=T0 + timedelta(seconds=i), pid=7, process="svc", rss_bytes=(20 + i) * MiB
    )


def test_lines_round_trip_and_match_the_documented_schema(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    gap = SeriesEvent("gap", T0, 7, "svc", "heap sample skipped: busy", rss_bytes=MiB)
    with RecordingWriter(path) as writer:
        writer.write(sample_line(heap_sample(0)))
        writer.write(sample_line(rss_sample(1)))
        writer.write(event_line(gap))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert missing_keys(lines[0], "memforensics/sample/1") == []
    assert missing_keys(lines[0], "memforensics/sample/1#heap") == []
    assert missing_keys(lines[1], "memforensics/sample/1") == []
    assert lines[0]["time"] == "2026-11-23T12:00:00.000Z"
    recording = read_recording(path)
    assert [s.kind for s in recording.samples] == ["heap", "rss"]
    back = recording.samples[0]
    original = heap_sample(0)
    assert back.in_use_bytes == original.in_use_bytes
    assert back.arenas == original.arenas and back.histogram == original.histogram
    assert back.waterfall is not None and back.waterfall.get("rss") == 20 * MiB
    assert back.advice[0].code == "heap-mostly-used"
    assert back.time == original.time
    assert recording.events == [gap]
    assert sniff(path) == "recording"


def test_each_line_is_on_disk_as_soon_as_it_is_written(tmp_path: Path) -> None:
    """A reader sees every sample while the writer is still open (flushed line by line)."""
    path = tmp_path / "live.jsonl"
    writer = RecordingWriter(path)
    try:
        for i in range(3):
            writer.write(sample_line(rss_sample(i)))
            assert len(read_recording(path).samples) == i + 1
    finally:
        writer.close()


def test_torn_last_line_is_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "torn.jsonl"
    with RecordingWriter(path) as writer:
        writer.write(sample_line(rss_sample(0)))
        writer.write(sample_line(rss_sample(1)))
    whole = json.dumps(sample_line(heap_sample(2)))
    with path.open("a") as handle:
        handle.write(whole[: len(whole) // 2])  # a crash in the middle of a write
    recording = read_recording(path)
    assert len(recording.samples) == 2
    assert recording.torn_lines == 1
    assert "incomplete" in recording.notes[0]


def test_resume_after_a_torn_line_keeps_both_halves_apart(tmp_path: Path) -> None:
    path = tmp_path / "resume.jsonl"
    with RecordingWriter(path) as writer:
        writer.write(sample_line(rss_sample(0)))
    whole = json.dumps(sample_line(heap_sample(1)))
    with path.open("a") as handle:
        handle.write(whole[:40])
    with RecordingWriter(path) as writer:  # the next `watch --record` on the same file
        writer.write(sample_line(rss_sample(2)))
        writer.write(sample_line(heap_sample(3)))
    recording = read_recording(path)
    assert [s.time for s in recording.samples] == [T0 + timedelta(seconds=i) for i in (0, 2, 3)]
    assert recording.torn_lines == 1


def test_reader_and_writer_at_the_same_time(tmp_path: Path) -> None:
    """Reading while another thread appends never fails: at worst the last line is torn."""
    path = tmp_path / "concurrent.jsonl"
    done = threading.Event()

    def write() -> None:
        with RecordingWriter(path) as writer:
            for i in range(400):
                writer.write(sample_line(heap_sample(i)))
        done.set()

    thread = threading.Thread(target=write)
    path.touch()
    thread.start()
    seen = 0
    while not done.is_set():
        recording = read_recording(path)
        assert len(recording.samples) >= seen
        seen = len(recording.samples)
    thread.join(timeout=30)
    assert len(read_recording(path).samples) == 400


def test_garbage_in_the_middle_is_invalid_input(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    line = json.dumps(sample_line(rss_sample(0)))
    path.write_text(f"{line}\nthis is not json\n{line}\n")
    with pytest.raises(InputDataError) as caught:
        read_recording(path)
    assert caught.value.line == 2


def test_a_line_of_another_schema_is_invalid_input(tmp_path: Path) -> None:
    path = tmp_path / "other.jsonl"
    path.write_text(json.dumps({"schema": "memforensics/sample/1", "kind": "rss"}) + "\n" + "{}\n")
    with pytest.raises(InputDataError, match="not a memforensics/sample/1 line"):
        read_recording(path)


def test_unknown_kinds_from_newer_releases_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "newer.jsonl"
    lines = [
        sample_line(rss_sample(0)),
        {"schema": "memforensics/sample/1", "kind": "gpu", "time": None, "pid": 7},
        {"schema": "memforensics/sample/1", "kind": "event", "event": "future", "pid": 7},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    recording = read_recording(path)
    assert len(recording.samples) == 1 and recording.events == []


def test_a_malloc_info_series_reads_as_untimed_heap_samples() -> None:
    report = build_report([FIXTURES / "series-5.xml"])
    samples = report.processes[0].series.samples
    assert len(samples) > 1 and all(s.kind == "heap" and s.time is None for s in samples)
    assert (
        report.processes[0].trend.in_use is None
        or report.processes[0].trend.in_use.per_hour is None
    )
    assert any("without times" in note for note in report.notes)


def test_a_heap_json_document_reads_as_one_heap_sample(tmp_path: Path) -> None:
    xml = FIXTURES / "threads-fragmented.xml"
    result = CliRunner().invoke(cli, ["parse", "--json", str(xml)])
    document_path = tmp_path / "heap.json"
    document_path.write_text(result.stdout)
    assert sniff(document_path) == "heap-json"
    report = build_report([document_path])
    (process,) = report.processes
    assert process.series.samples[0].kind == "heap"
    assert process.trend.verdict == "unknown"
