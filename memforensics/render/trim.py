"""Trim results as rich renderables, streaming round rows, and `memforensics/trim/1` JSON."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from memforensics.analysis.trim import RoundsSummary, forecast_ratio
from memforensics.model.process import Waterfall
from memforensics.model.trim import TrimFailure, TrimOutcome, TrimResult, TrimRound
from memforensics.render.process_json import waterfall_json
from memforensics.units import format_bytes, format_duration

SCHEMA = "memforensics/trim/1"


def iso_utc(moment: datetime) -> str:
    """ISO-8601 UTC with a Z, to the millisecond."""
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ---------------------------------------------------------------------------- JSON


def result_json(result: TrimResult) -> dict[str, Any]:
    """One target's trim as a JSON-able dict (the per-target part of trim/1)."""
    forecast = result.forecast
    return {
        "pid": result.pid,
        "name": result.name,
        "time": iso_utc(result.time),
        "rss_before_bytes": result.rss_before_bytes,
        "rss_after_bytes": result.rss_after_bytes,
        "anon_before_bytes": result.anon_before_bytes,
        "anon_after_bytes": result.anon_after_bytes,
        "released_bytes": result.released_bytes,
        "anon_released_bytes": result.anon_released_bytes,
        "forecast_bytes": result.forecast_bytes,
        "forecast_measured": forecast.measured,
        "forecast_estimated_bytes": forecast.estimated_bytes,
        "forecast_measured_share": round(forecast.measured_share, 6),
        "forecast_ratio": forecast_ratio(result),
        "free_bytes": result.free_bytes,
        "heap_bytes": result.heap_bytes,
        "free_not_resident_bytes": forecast.free_not_resident_bytes,
        "arenas": result.arenas,
        "forecast_arenas": [
            {
                "index": arena.index,
                "releasable_bytes": arena.releasable_bytes,
                "measured": arena.measured,
            }
            for arena in forecast.arenas
        ],
        "pad_bytes": result.pad_bytes,
        "dry_run": result.dry_run,
        "trimmed": result.trimmed,
        "trim_returned": result.trim_returned,
        "trim_called": result.trim_called,
        "purge": result.purge,
        "pause_seconds": round(result.pause_seconds, 6),
        "skipped": result.skipped,
        "skipped_detail": result.skipped_detail,
        "notes": list(result.notes),
        "error": None,
    }


def failure_json(failure: TrimFailure) -> dict[str, Any]:
    """A target that failed, with the same identifying keys as a result."""
    return {
        "pid": failure.pid,
        "time": iso_utc(failure.time),
        "error": {"message": failure.message, "hint": failure.hint, "exit_code": failure.exit_code},
    }


def outcome_json(outcome: TrimOutcome) -> dict[str, Any]:
    """A result or a failure as JSON."""
    if isinstance(outcome, TrimFailure):
        return failure_json(outcome)
    return result_json(outcome)


def trim_document(outcomes: Sequence[TrimOutcome], *, now: datetime) -> dict[str, Any]:
    """The one-shot `memforensics/trim/1` document.

    ``results[]`` holds one entry per target; with exactly one target its keys are also
    copied to the top level, so ``--json | jq .released_bytes`` works for the common case.
    """
    results = [outcome_json(o) for o in outcomes]
    document: dict[str, Any] = {"schema": SCHEMA, "time": iso_utc(now)}
    if len(results) == 1:
        document.update({k: v for k, v in results[0].items() if k != "time"})
    document["results"] = results
    return document


def summary_json(summary: RoundsSummary) -> dict[str, Any]:
    """Totals of a periodic run as JSON."""
    return {
        "rounds": summary.rounds,
        "trims": summary.trims,
        "skips": summary.skips,
        "failures": summary.failures,
        "released_bytes": summary.released_bytes,
        "pause_seconds": round(summary.pause_seconds, 6),
    }


def rounds_document(
    rounds: Sequence[TrimRound],
    summary: RoundsSummary,
    *,
    now: datetime,
    interval_seconds: float,
    count: int | None,
    interrupted: bool,
) -> dict[str, Any]:
    """The periodic-mode `memforensics/trim/1` document: ``rounds[]`` plus totals."""
    return {
        "schema": SCHEMA,
        "time": iso_utc(now),
        "interval_seconds": interval_seconds,
        "count": count,
        "interrupted": interrupted,
        "rounds": [
            {
                "round": r.index,
                "time": iso_utc(r.time),
                "released_bytes": r.released_bytes,
                "results": [outcome_json(o) for o in r.outcomes],
            }
            for r in rounds
        ],
        "summary": summary_json(summary),
    }


# ---------------------------------------------------------------------------- human


def _action_line(result: TrimResult) -> Text:
    head = Text(f"pid {result.pid}", style="bold")
    if result.name:
        head.append(f" {result.name}")
    head.append("  ")
    if result.trimmed and result.purge is not None:
        head.append(f"{result.purge} called (no gdb)")
    elif result.trimmed and result.trim_returned is None:
        head.append(f"malloc_trim({result.pad_bytes}) called (no gdb)")
    elif result.trimmed:
        head.append(f"malloc_trim({result.pad_bytes}) returned {result.trim_returned}")
    else:
        head.append(f"not trimmed: {result.skipped_detail or result.skipped}", style="yellow")
    head.append(f", target paused {format_duration(result.pause_seconds)}")
    return head


def _ratio_words(result: TrimResult) -> str:
    ratio = forecast_ratio(result)
    if ratio is None:
        return ""
    return f"{ratio:.0%} of forecast"


def render_result(result: TrimResult, *, notes: bool = True) -> RenderableType:
    """One target's trim: RSS and anonymous before/after/released, forecast beside it."""
    table = Table(box=None, show_header=True, pad_edge=False, padding=(0, 2))
    table.add_column("")
    table.add_column("RSS", justify="right")
    table.add_column("anon", justify="right")
    table.add_column("")
    table.add_row(
        "before", format_bytes(result.rss_before_bytes), format_bytes(result.anon_before_bytes), ""
    )
    if result.trimmed:
        table.add_row(
            "after", format_bytes(result.rss_after_bytes), format_bytes(result.anon_after_bytes), ""
        )
        table.add_row(
            Text("released", style="bold green"),
            Text(format_bytes(result.released_bytes), style="bold green"),
            format_bytes(result.anon_released_bytes),
            _ratio_words(result),
        )
    method = "measured" if result.forecast.measured else "estimated"
    forecast_words = f"resident whole pages ({method})"
    if result.purge is not None:
        forecast_words = "free pages, the allocator's own count" if method == "measured" else ""
    table.add_row(
        Text("forecast", style="bold"),
        Text(format_bytes(result.forecast_bytes), style="bold"),
        "",
        forecast_words,
    )
    gone = result.forecast.free_not_resident_bytes
    gone_words = "" if gone is None else f"{format_bytes(gone)} of it no longer resident"
    free_label = "free in bins" if result.purge is None else "free, kept"
    table.add_row(free_label, format_bytes(result.free_bytes), "", gone_words)
    lines: list[RenderableType] = [_action_line(result), table]
    if notes:
        lines.extend(Text(f"note: {note}", style="dim") for note in result.notes)
    return Group(*lines)


def render_failure(failure: TrimFailure) -> RenderableType:
    """A target that could not be trimmed, in one line."""
    return Text(f"pid {failure.pid}  error: {failure.message}", style="red")


def render_outcomes(outcomes: Sequence[TrimOutcome]) -> RenderableType:
    """Every target's report, a blank line between them."""
    parts: list[RenderableType] = []
    for i, outcome in enumerate(outcomes):
        if i:
            parts.append(Text(""))
        if isinstance(outcome, TrimFailure):
            parts.append(render_failure(outcome))
        else:
            parts.append(render_result(outcome))
    return Group(*parts)


# Fixed-width columns: periodic rows are printed one by one as rounds finish.
_ROW_FORMAT = "{:>5}  {:<8}  {:>8}  {:>11}  {:>11}  {:>11}  {:>11}  {:>8}  {}"


def round_header() -> str:
    """The column header printed once before the first periodic row."""
    return _ROW_FORMAT.format(
        "round", "time", "pid", "rss before", "rss after", "released", "forecast", "pause", "note"
    )


def round_rows(trim_round: TrimRound) -> list[str]:
    """One text row per target of a round, for streaming to stdout as it finishes."""
    clock = trim_round.time.strftime("%H:%M:%S")
    rows = []
    for outcome in trim_round.outcomes:
        if isinstance(outcome, TrimFailure):
            rows.append(
                _ROW_FORMAT.format(
                    trim_round.index,
                    clock,
                    outcome.pid,
                    "",
                    "",
                    "",
                    "",
                    "",
                    f"error: {outcome.message}",
                )
            )
            continue
        note = "" if outcome.trimmed else f"skipped: {outcome.skipped}"
        rows.append(
            _ROW_FORMAT.format(
                trim_round.index,
                clock,
                outcome.pid,
                format_bytes(outcome.rss_before_bytes),
                format_bytes(outcome.rss_after_bytes) if outcome.trimmed else "-",
                format_bytes(outcome.released_bytes) if outcome.trimmed else "-",
                format_bytes(outcome.forecast_bytes),
                format_duration(outcome.pause_seconds),
                note,
            )
        )
    return rows


def summary_line(summary: RoundsSummary, *, interrupted: bool) -> str:
    """The closing line of a periodic run."""
    why = " (stopped by Ctrl-C)" if interrupted else ""
    return (
        f"{summary.rounds} rounds{why}: {summary.trims} trims, {summary.skips} skipped, "
        f"{summary.failures} failed; released {format_bytes(summary.released_bytes)} in total, "
        f"targets paused {format_duration(summary.pause_seconds)} in total"
    )


def demo_document(
    result: TrimResult,
    *,
    buffers: int,
    size_bytes: int,
    threads: int,
    waterfall_before: Waterfall | None,
) -> dict[str, Any]:
    """`memforensics demo --json`: the trim/1 document plus what the child allocated."""
    document = trim_document([result], now=result.time)
    document["demo"] = {
        "buffers": buffers,
        "size_bytes": size_bytes,
        "threads": threads,
        "allocated_bytes": buffers * size_bytes,
    }
    if waterfall_before is not None:
        document["demo"]["waterfall_before"] = waterfall_json(waterfall_before)
    return document


def render_demo(result: TrimResult, allocated_bytes: int, threads: int) -> RenderableType:
    """The demo's story: what the child did, what the heap held, what the trim gave back."""
    share = result.free_bytes / result.heap_bytes if result.heap_bytes else 0.0
    story = Text()
    story.append(
        f"The child allocated {format_bytes(allocated_bytes)} in {threads} thread(s) and freed "
        "all but the last block, yet its RSS stayed high: glibc keeps freed chunks in its bins.\n"
    )
    story.append(
        f"malloc_info: {result.arenas} arena(s) hold {format_bytes(result.heap_bytes)} from the "
        f"OS, of which {format_bytes(result.free_bytes)} ({share:.0%}) is free.\n"
    )
    released = result.released_bytes
    if result.trimmed and released is not None:
        story.append("After malloc_trim(0): RSS ", style="bold")
        story.append(
            f"{format_bytes(result.rss_before_bytes)} -> {format_bytes(result.rss_after_bytes)}",
            style="bold green",
        )
        story.append(
            f" (released {format_bytes(released)}; forecast {format_bytes(result.forecast_bytes)})",
            style="bold",
        )
    return Group(story, Text(""), render_result(result, notes=False))
