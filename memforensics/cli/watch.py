"""`memforensics watch`: sample live processes over time; record JSON Lines; a live view."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import click
from rich.console import Console
from rich.live import Live

from memforensics.cli import COMMAND_SUMMARIES
from memforensics.cli.options import (
    DURATION,
    RATIO,
    exit_codes_epilog,
    json_option,
    sample_gdb_option,
    sample_read_only_option,
    timeout_option,
    verbose_option,
)
from memforensics.cli.output import emit_json, stderr_console, stdout_console
from memforensics.entry.reporting import process_report
from memforensics.entry.trim import resolve_pids
from memforensics.entry.watching import Watch, WatchSettings, overhead_words
from memforensics.errors import EXIT_TIMEOUT
from memforensics.model.census import CensusSample
from memforensics.model.report import Report
from memforensics.model.series import Sample, Series, SeriesEvent
from memforensics.model.watch import WatchedProcess
from memforensics.render.report_json import report_json
from memforensics.render.sample_json import event_line, sample_line
from memforensics.render.watch_view import progress_line, render_watch
from memforensics.sources.files.census_doc import census_line
from memforensics.sources.files.recording import RecordingWriter

EXAMPLES = """\b
Examples:
  memforensics watch 4242                            heap every 60 s, RSS every 1 s, until Ctrl-C
  memforensics watch 4242 --record app.jsonl         ... and record every sample (JSON Lines)
  memforensics watch --name myservice --interval 5m --duration 24h --record day.jsonl
  memforensics watch 4242 --interval 1s --count 6 --record f.jsonl && memforensics report f.jsonl
  memforensics watch 4242 --read-only --census 10m --record day.jsonl   # leak verdict names types
  memforensics watch 4242 --count 10 --json | jq .trend.verdict
\b
A heap sample is read as `inspect` reads it (its pause is shown);
an RSS sample only reads /proc. A recording is appended to and flushed sample by
sample: run the same command again to resume it, and read it with `memforensics
report` while it is being written. A heap sample is skipped (and the gap recorded)
when the target is busy beyond --timeout; a process that exits ends its series,
and an OOM kill found in the kernel log is shown beside its last sample.
Ctrl-C stops after the sample being taken (targets are always detached).
"""


@contextlib.contextmanager
def _signals_stop(stop: threading.Event) -> Iterator[None]:
    """Ctrl-C or SIGTERM sets ``stop``; a second Ctrl-C aborts (the attach still detaches)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _mi_logger(line: str) -> None:
    sys.stderr.write(f"gdb {line}\n")
    sys.stderr.flush()


def _final_report(processes: list[WatchedProcess]) -> Report:
    reports = []
    for proc in processes:
        events: list[SeriesEvent] = [*proc.gaps]
        events += [e for e in (proc.ended, proc.oom_kill) if e is not None]
        samples: list[Sample] = [*proc.heap, *proc.rss]
        series = Series(
            pid=proc.pid, process=proc.process, samples=tuple(samples), events=tuple(events)
        )
        reports.append(process_report(series))
    return Report(processes=tuple(reports), inputs=(), notes=())


def _census_taken(
    record: CensusSample, writer: RecordingWriter | None, console: Console | None
) -> None:
    """A census taken while watching: recorded, and a line printed on ``console`` (None: the
    live view is shown instead)."""
    if writer is not None:
        writer.write(census_line(record))
    if console is not None:
        top = record.types[0] if record.types else None
        console.print(
            f"census PID {record.pid}: {record.live_chunks:,} live chunks"
            + (f", biggest {top.name} x {top.count:,}" if top else ""),
            highlight=False,
            soft_wrap=True,
        )


def _print_overheads(
    status: Console, processes: list[WatchedProcess], elapsed: float, record_path: str | None
) -> None:
    """What watching cost each process, and where the recording is."""
    for proc in processes:
        status.print(
            f"PID {proc.pid} {proc.process}: {overhead_words(proc, elapsed)}", highlight=False
        )
    if record_path:
        status.print(f"recorded to {record_path}: `memforensics report {record_path} --html OUT`")


def _json_document(processes: list[WatchedProcess], watched: dict[str, Any]) -> dict[str, Any]:
    """--json's document: the final report of every process, and the watch's own figures."""
    document: dict[str, Any] = report_json(_final_report(processes))
    document["watch"] = watched
    return document


@click.command(
    name="watch",
    short_help=COMMAND_SUMMARIES["watch"],
    epilog=EXAMPLES + "\n" + exit_codes_epilog(),
)
@click.argument("pids", nargs=-1, type=click.IntRange(min=1), metavar="PID...")
@click.option(
    "--name",
    "names",
    multiple=True,
    metavar="REGEX",
    help="Also watch every process whose name or command line matches (repeatable).",
)
@click.option(
    "--interval",
    "interval_seconds",
    type=DURATION,
    default="60s",
    show_default=True,
    help="Time between heap samples (each holds the target a few ms, as inspect does).",
)
@click.option(
    "--rss-interval",
    "rss_interval_seconds",
    type=DURATION,
    default="1s",
    show_default=True,
    help="Time between RSS samples (read from /proc, no attach).",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after N heap samples per process.",
)
@click.option(
    "--duration", "duration_seconds", type=DURATION, default=None, help="Stop after this long."
)
@click.option(
    "--record",
    "record_path",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help="Append every sample to FILE as JSON Lines (resumable; `memforensics report FILE`).",
)
@click.option(
    "--census",
    "census_interval_seconds",
    type=DURATION,
    default=None,
    metavar="INTERVAL",
    help="Also take a census (live chunks by type, no gdb) every INTERVAL, within its own "
    "pause budget (--census-budget); recorded for `report`, whose "
    "leak verdict then names the types that grow.",
)
@click.option(
    "--census-budget",
    "census_pause_share",
    type=RATIO,
    default="1%",
    show_default=True,
    help="With --census: skip a census (recorded as a gap) while the censuses' stops exceed "
    "this share of the time watched.",
)
@json_option
@timeout_option(
    "10s",
    help_text="Skip a heap sample (recorded as a gap, target left running) if reaching a safe "
    "point or a call takes longer, or a read from memory longer than this and its share for "
    "big heaps.",
)
@sample_gdb_option
@sample_read_only_option
@verbose_option
def command(
    *,
    pids: tuple[int, ...],
    names: tuple[str, ...],
    interval_seconds: float,
    rss_interval_seconds: float,
    count: int | None,
    duration_seconds: float | None,
    record_path: str | None,
    census_interval_seconds: float | None,
    census_pause_share: float,
    as_json: bool,
    timeout_seconds: float,
    gdb_path: str | None,
    read_only: bool,
    verbose: bool,
) -> None:
    """Watch processes' heaps over time: is it a leak (in use grows) or fragmentation (free
    grows while in use stays flat)? A live view of RSS, in use and free-resident with the
    pause the target paid and the trend so far; --record keeps every sample for `report`."""
    if not pids and not names:
        raise click.UsageError("give at least one PID or --name REGEX")
    if count is not None and duration_seconds is not None:
        raise click.UsageError("give --count or --duration, not both")
    targets = resolve_pids(pids, names)
    settings = WatchSettings(
        interval_seconds=interval_seconds,
        rss_interval_seconds=rss_interval_seconds,
        count=count,
        duration_seconds=duration_seconds,
        timeout_seconds=timeout_seconds,
        gdb_path=gdb_path,
        log=_mi_logger if verbose else None,
        read_only=read_only,
        census_interval_seconds=census_interval_seconds,
        census_pause_share=census_pause_share,
    )
    out = stdout_console()
    status = stderr_console()
    live_view = out.is_terminal and not as_json
    stop = threading.Event()
    writer: RecordingWriter | None = None
    live: Live | None = None
    watch: Watch | None = None

    def on_record(record: Sample | SeriesEvent | CensusSample, proc: WatchedProcess) -> None:
        if isinstance(record, CensusSample):
            _census_taken(record, writer, None if live_view else status if as_json else out)
            return
        if writer is not None:
            writer.write(sample_line(record) if isinstance(record, Sample) else event_line(record))
        if live is not None and watch is not None:
            live.update(render_watch(watch.processes, watch.elapsed_seconds(), footer=footer))
        elif not live_view:
            line = progress_line(record, proc)
            if line is not None:
                (status if as_json else out).print(line, highlight=False, soft_wrap=True)

    footer = "Ctrl-C stops" + (f"; recording to {record_path}" if record_path else "")
    watch = Watch(targets, settings, on_record=on_record, stop=stop)  # exit 3 if one is gone
    writer = RecordingWriter(record_path) if record_path else None
    try:
        with _signals_stop(stop), contextlib.ExitStack() as stack:
            if live_view:
                live = stack.enter_context(Live(console=out, refresh_per_second=4, transient=False))
            processes = watch.run()
    finally:
        if writer is not None:
            writer.close()
    elapsed = watch.elapsed_seconds()
    _print_overheads(status, processes, elapsed, record_path)
    if as_json:
        watched = {
            "interval_seconds": interval_seconds,
            "rss_interval_seconds": rss_interval_seconds,
            "elapsed_seconds": round(elapsed, 3),
            "interrupted": stop.is_set(),
            "record": record_path,
        }
        emit_json(_json_document(processes, watched))
    if all(not p.heap and p.gaps for p in processes):
        click.get_current_context().exit(EXIT_TIMEOUT)  # busy all along: no heap sample at all
