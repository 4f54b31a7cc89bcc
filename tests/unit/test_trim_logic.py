"""Pure trim logic and rendering: skip decisions, forecast ratio, exit codes, JSON, rows."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console

from memforensics.analysis.trim import forecast_ratio, skip_reason, summarize
from memforensics.model.process import ArenaTrimForecast, TrimForecast
from memforensics.model.trim import TrimFailure, TrimResult, TrimRound
from memforensics.render import trim as render

MIB = 1024 * 1024
T0 = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)
# Keys docs/json.md promises in every trim/1 result.
PROMISED_KEYS = {
    "pid",
    "rss_before_bytes",
    "rss_after_bytes",
    "released_bytes",
    "forecast_bytes",
    "trim_returned",
    "pause_seconds",
    "anon_before_bytes",
    "anon_after_bytes",
    "dry_run",
    "skipped",
}


def forecast(releasable_bytes: int) -> TrimForecast:
    return TrimForecast(
        releasable_bytes=releasable_bytes,
        arenas=(ArenaTrimForecast(index=0, releasable_bytes=releasable_bytes, measured=True),),
        measured=True,
        free_not_resident_bytes=0,
    )


def result(**changes: object) -> TrimResult:
    base = TrimResult(
        pid=42,
        name="app",
        time=T0,
        rss_before_bytes=210 * MIB,
        anon_before_bytes=200 * MIB,
        rss_after_bytes=10 * MIB,
        anon_after_bytes=1 * MIB,
        forecast=forecast(199 * MIB),
        free_bytes=205 * MIB,
        heap_bytes=206 * MIB,
        arenas=1,
        pad_bytes=0,
        dry_run=False,
        trim_returned=1,
        pause_seconds=0.0421,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_dry_run_always_skips_even_with_plenty_to_release() -> None:
    assert skip_reason(forecast(500 * MIB), min_free_bytes=0, dry_run=True)[0] == "dry-run"


def test_min_free_compares_with_the_forecast_not_with_malloc_info_free() -> None:
    code, words = skip_reason(forecast(10 * MIB), min_free_bytes=64 * MIB, dry_run=False)
    assert code == "below-min-free"
    assert words is not None and "64.0 MiB" in words and "10.0 MiB" in words
    # Exactly at the threshold is enough ("free >= --min-free").
    assert skip_reason(forecast(64 * MIB), min_free_bytes=64 * MIB, dry_run=False) == (None, None)


def test_released_is_measured_and_signed() -> None:
    assert result().released_bytes == 200 * MIB
    grew = result(rss_after_bytes=220 * MIB)
    assert grew.released_bytes == -10 * MIB  # the target grew meanwhile: say so, do not clamp
    assert result(rss_after_bytes=None, trim_returned=None).released_bytes is None


def test_forecast_ratio() -> None:
    ratio = forecast_ratio(result())
    assert ratio is not None and abs(ratio - 200 / 199) < 1e-9
    assert forecast_ratio(result(forecast=forecast(0))) is None
    assert forecast_ratio(result(trim_returned=None, rss_after_bytes=None)) is None


def test_summarize_counts_trims_skips_failures() -> None:
    skipped = result(trim_returned=None, rss_after_bytes=None, skipped="below-min-free")
    failure = TrimFailure(pid=9, time=T0, message="gone", hint=None, exit_code=3)
    rounds = [
        TrimRound(1, T0, (result(), failure)),
        TrimRound(2, T0, (skipped, result(rss_after_bytes=200 * MIB))),
    ]
    summary = summarize(rounds)
    assert (summary.rounds, summary.trims, summary.skips, summary.failures) == (2, 2, 1, 1)
    assert summary.released_bytes == 200 * MIB + 10 * MIB
    assert abs(summary.pause_seconds - 3 * 0.0421) < 1e-9


def test_single_target_document_has_flat_keys_and_results() -> None:
    document = render.trim_document([result()], now=T0)
    assert document["schema"] == "memforensics/trim/1"
    assert document["time"] == "2026-01-02T03:04:05.678Z"
    assert document.keys() >= PROMISED_KEYS
    assert document["released_bytes"] == 200 * MIB
    assert document["results"][0]["pid"] == 42
    json.dumps(document)  # plain JSON, nothing exotic


def test_dry_run_document_says_unknown_as_null() -> None:
    dry = result(
        dry_run=True, trim_returned=None, rss_after_bytes=None, anon_after_bytes=None,
        skipped="dry-run",
    )  # fmt: skip
    document = render.trim_document([dry], now=T0)
    assert document["rss_after_bytes"] is None
    assert document["released_bytes"] is None
    assert document["trim_returned"] is None
    assert document["skipped"] == "dry-run"
    assert document["forecast_bytes"] == 199 * MIB


def test_several_targets_document_keeps_failures() -> None:
    failure = TrimFailure(pid=7, time=T0, message="no process with PID 7", hint="h", exit_code=3)
    document = render.trim_document([result(), failure], now=T0)
    assert "pid" not in document  # no single target to flatten
    assert [r["pid"] for r in document["results"]] == [42, 7]
    assert document["results"][1]["error"]["exit_code"] == 3
    for entry in document["results"][:1]:
        assert entry.keys() >= PROMISED_KEYS


def test_rounds_document() -> None:
    rounds = [TrimRound(1, T0, (result(),)), TrimRound(2, T0, (result(rss_after_bytes=None),))]
    document = render.rounds_document(
        rounds, summarize(rounds), now=T0, interval_seconds=5.0, count=2, interrupted=False
    )
    assert document["schema"] == "memforensics/trim/1"
    assert [r["round"] for r in document["rounds"]] == [1, 2]
    assert document["rounds"][0]["results"][0]["released_bytes"] == 200 * MIB
    assert document["summary"]["rounds"] == 2


def test_round_rows_are_aligned_with_the_header() -> None:
    rows = render.round_rows(TrimRound(3, T0, (result(),)))
    header = render.round_header()
    assert len(rows) == 1
    assert rows[0].index("42") + 2 == header.index("pid") + 3  # right-aligned under "pid"
    assert "200.0 MiB" in rows[0] and "42 ms" in rows[0]


def test_human_report_shows_before_after_and_forecast() -> None:
    buffer = io.StringIO()
    shown = result(notes=("tcache chunks look in-use",))
    Console(file=buffer, width=100, color_system=None).print(render.render_result(shown))
    text = buffer.getvalue()
    assert "malloc_trim(0) returned 1" in text
    assert "210.0 MiB" in text and "10.0 MiB" in text and "199.0 MiB" in text
    assert "101% of forecast" in text
    assert "tcache" in text


def test_docs_json_md_describes_every_key_trim_emits() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "json.md").read_text()
    section = docs.split("## `memforensics/trim/1`")[1].split("\n## ")[0]
    rounds = [TrimRound(1, T0, (result(),))]
    emitted = set(render.trim_document([result()], now=T0))
    emitted |= set(render.result_json(result()))
    periodic = render.rounds_document(
        rounds, summarize(rounds), now=T0, interval_seconds=1.0, count=None, interrupted=True
    )
    emitted |= set(periodic) | set(periodic["rounds"][0]) | set(periodic["summary"])
    missing = sorted(key for key in emitted if f"`{key}" not in section)
    assert not missing, f"docs/json.md trim/1 section lacks {missing}"
