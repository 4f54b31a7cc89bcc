"""`memforensics collect`: one run for a timer, written as node_exporter textfile metrics."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import click

from memforensics.cli import COMMAND_SUMMARIES
from memforensics.cli.options import (
    DURATION,
    exit_codes_epilog,
    json_option,
    sample_gdb_option,
    sample_read_only_option,
    verbose_option,
)
from memforensics.cli.output import emit_json
from memforensics.errors import ToolingError
from memforensics.model.collect import CollectRun

TEXTFILE_NAME = "memforensics.prom"

EXAMPLES = """\b
Examples:
  memforensics collect --name postgres --textfile-dir /var/lib/prometheus/node-exporter
  memforensics collect 4242 4343 --textfile-dir ./tf --max-pause 500ms --json
  memforensics collect --no-oom --name 'java.*Kafka' --textfile-dir /host/textfile
\b
One run, made for a systemd timer or a Kubernetes DaemonSet (see docs/fleet.md
and deploy/). Each target is inspected as `inspect` does (read from memory in
stops of a few ms, always released) until the measured pauses reach
--max-pause; the rest are reported with memforensics_target_up 0 and
reason="pause_budget". OOM kills since the previous run are added to
counters kept in --state-dir (by default /var/lib/memforensics for root,
~/.local/state/memforensics otherwise; see --state-dir). DIR/memforensics.prom
is written atomically (temporary file in DIR, then rename). Exit 0 once the
file is written, even when targets could not be inspected: that is in the
metrics (memforensics_target_up, reason label) and on stderr.
"""


def _status(message: str) -> None:
    click.echo(message, err=True)


def write_textfile(run: CollectRun, directory: Path) -> Path:
    """Write the run's metrics to DIR/memforensics.prom through prometheus_client's atomic
    write (a temporary file in DIR, then a rename); the file ends up world-readable because
    node_exporter usually runs as another user."""
    from prometheus_client import write_to_textfile

    from memforensics.render.prometheus import collect_registry

    path = directory / TEXTFILE_NAME
    try:
        write_to_textfile(str(path), collect_registry(run))
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o044 != 0o044:
            os.chmod(path, mode | 0o644)
    except OSError as exc:
        raise ToolingError(
            f"cannot write {path}: {exc.strerror or exc}",
            hint="check that the textfile directory exists and is writable by this user",
        ) from exc
    return path


def _mi_logger(line: str) -> None:
    sys.stderr.write(f"gdb {line}\n")
    sys.stderr.flush()


@click.command(
    name="collect",
    short_help=COMMAND_SUMMARIES["collect"],
    epilog=EXAMPLES + "\n" + exit_codes_epilog(),
)
@click.argument("pids", nargs=-1, type=click.IntRange(min=1), metavar="[PID...]")
@click.option(
    "--name",
    "names",
    multiple=True,
    metavar="REGEX",
    help="Also collect every process whose name or command line matches (repeatable).",
)
@click.option(
    "--textfile-dir",
    "textfile_dir",
    required=True,
    type=click.Path(exists=True, file_okay=False, writable=True, path_type=Path),
    metavar="DIR",
    help="node_exporter's --collector.textfile.directory: memforensics.prom is written here.",
)
@click.option(
    "--state-dir",
    "state_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    metavar="DIR",
    help="Where the OOM kill counters and cursor, and the last heap samples per process (for "
    "`oom --state-dir`), persist between runs, created 0700 "
    "(default: $MEMFORENSICS_STATE_DIR, else $STATE_DIRECTORY from systemd's StateDirectory=, "
    "else /var/lib/memforensics for root and $XDG_STATE_HOME/memforensics or "
    "~/.local/state/memforensics for other users). Refused if world-writable or another "
    "user's.",
)
@click.option(
    "--max-pause",
    "max_pause_seconds",
    type=DURATION,
    default="2s",
    show_default=True,
    metavar="DURATION",
    help="Total pause budget of one run: stop inspecting once the measured pauses reach it.",
)
@click.option(
    "--oom-journal",
    "oom_journal",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    metavar="DIR",
    help="Read OOM kills from this journal directory (e.g. the host's, mounted in a pod).",
)
@click.option(
    "--oom-file",
    "oom_files",
    multiple=True,
    type=click.Path(dir_okay=False),
    metavar="PATH",
    help="Read OOM kills from saved text logs (kern.log, dmesg) instead; repeatable.",
)
@click.option("--oom-kmsg", "oom_kmsg", is_flag=True, help="Read OOM kills from /dev/kmsg instead.")
@click.option("--no-oom", "no_oom", is_flag=True, help="Do not count OOM kills.")
@click.option(
    "--timeout",
    "timeout_seconds",
    type=DURATION,
    default="10s",
    show_default=True,
    help="Per target: give up on a safe point or a call after this long, or on a read from "
    "memory after this long and its share for big heaps (the target is left running and "
    "reported down with reason=timeout).",
)
@click.option(
    "--census-top",
    "census_top",
    type=click.IntRange(min=1, max=1000),
    default=None,
    metavar="N",
    help="Also take a census of each target (no gdb, within --max-pause) and export its N "
    'biggest types and one type="other" as memforensics_census_bytes/_chunks series.',
)
@sample_gdb_option
@sample_read_only_option
@json_option
@verbose_option
def command(
    *,
    pids: tuple[int, ...],
    names: tuple[str, ...],
    textfile_dir: Path,
    state_dir: Path | None,
    max_pause_seconds: float,
    oom_journal: str | None,
    oom_files: tuple[str, ...],
    oom_kmsg: bool,
    no_oom: bool,
    timeout_seconds: float,
    gdb_path: str | None,
    read_only: bool,
    census_top: int | None,
    as_json: bool,
    verbose: bool,
) -> None:
    """Inspect processes and count OOM kills, for Prometheus: one run writes
    DIR/memforensics.prom for node_exporter's textfile collector."""
    from memforensics.entry.collect import OomSources, collect

    if sum((oom_journal is not None, bool(oom_files), oom_kmsg)) > 1:
        raise click.UsageError("choose one OOM source: --oom-journal, --oom-file or --oom-kmsg")
    if no_oom and (oom_journal or oom_files or oom_kmsg):
        raise click.UsageError("--no-oom contradicts --oom-journal/--oom-file/--oom-kmsg")
    if not pids and not names and no_oom:
        raise click.UsageError("nothing to collect: give a PID, --name REGEX, or drop --no-oom")
    sources = None if no_oom else OomSources(oom_journal, oom_files, oom_kmsg)
    if sources is not None:
        from memforensics.entry.collect_state import default_state_dir, prepare_state_dir

        # Checked before any target is touched: an unsafe directory is refused (exit 4).
        state_dir = prepare_state_dir(state_dir or default_state_dir())
    run = collect(
        pids,
        names,
        max_pause_seconds=max_pause_seconds,
        timeout_seconds=timeout_seconds,
        state_dir=state_dir,
        oom_sources=sources,
        gdb_path=gdb_path,
        log=_mi_logger if verbose else None,
        read_only=read_only,
        census_top=census_top,
    )
    path = write_textfile(run, textfile_dir)
    _report(run, path)
    if as_json:
        from memforensics.render.prometheus import collect_json

        document = collect_json(run)
        document["textfile"] = str(path)
        emit_json(document)


def _report(run: CollectRun, path: Path) -> None:
    for target in run.targets:
        if not target.up:
            name = f" ({target.process})" if target.process else ""
            _status(
                f"warning: PID {target.pid}{name} not collected: {target.reason}: {target.detail}"
            )
    if run.oom is not None and not run.oom.ok:
        _status(f"warning: OOM kills not read: {run.oom.error}")
    for note in run.notes:
        _status(f"note: {note}")
    up = sum(1 for target in run.targets if target.up)
    kills = ""
    if run.oom is not None and run.oom.ok:
        kills = (
            ", OOM cursor started (kills counted from now on)"
            if run.oom.baseline
            else f", {run.oom.new_kills} new OOM kill(s)"
        )
    _status(
        f"wrote {path}: {up} of {len(run.targets)} target(s) inspected, pause "
        f"{run.pause_used_seconds * 1000:.0f} ms of {run.max_pause_seconds:g} s budget{kills}"
    )
