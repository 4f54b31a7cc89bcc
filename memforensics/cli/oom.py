"""`memforensics oom`: find every OOM kill in the journal, saved logs or /dev/kmsg."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from memforensics.analysis.oom_select import scan
from memforensics.cli import COMMAND_SUMMARIES
from memforensics.cli.options import exit_codes_epilog, json_option, verbose_journal_option
from memforensics.cli.output import emit_json, plain_stdout_width, stdout_console
from memforensics.entry.early import resume_collector
from memforensics.errors import (
    EXIT_GATE,
    InputDataError,
    MemforensicsError,
    TargetPermissionError,
    ToolingError,
)
from memforensics.model.logrecord import LogRecord
from memforensics.model.oom import OomScan
from memforensics.sources.logs.journal import (
    JOURNAL_DIRS,
    BootNotFoundError,
    JournalReader,
    boot_argument,
    has_journal_files,
)
from memforensics.sources.logs.kmsg import KmsgReader, boot_id
from memforensics.sources.logs.logfile import read_text_log
from memforensics.sources.logs.logtime import parse_user_time

EXAMPLES = """\b
Examples:
  memforensics oom                          every kill this host logged: the journal,
                                            else /dev/kmsg + /var/log/kern.log* etc.
  memforensics oom --boot -1 --summary      the previous boot, grouped by process
  memforensics oom --since yesterday --process 'java*'
  memforensics oom --directory ./journal    a journal directory copied from another host
  memforensics oom --file kern.log --file syslog.1.gz
  dmesg -T | memforensics oom --file -      saved or piped text (dmesg, syslog, journalctl)
  memforensics oom --file <(ssh node dmesg) --file messages.2.zst
  memforensics oom --wide                   full cgroup paths, boot, total-vm, uid
  memforensics oom --kmsg --json | jq '.events[] | {pid, process, cgroup}'
  memforensics oom --since -1h --fail-if-found    # CI/cron gate: exit 1 on any kill
  memforensics oom --recording app.jsonl    each kill of a recorded process beside
                                            its last heap sample (watch --record)
  memforensics oom --state-dir /var/lib/memforensics    ... or the last heap
                                            samples `collect` kept there
\b
One row per victim. anon-rss is the victim's private memory when it died
(what the kill freed); total-vm (--wide) its address space. by is "global"
(the machine ran out) or "memcg" (a cgroup hit its limit: see cgroup, and
oom_memcg in --json for the cgroup whose limit was hit); oomd or earlyoom for
userspace killers; a "*" marks a kill known only from the kernel's selection
or summary line (no "Killed process" line in the log). cgroup is shortened to
the pod and container or the unit (--wide and --json give the full path).
trigger is the task whose allocation invoked the OOM killer: often not the
victim. A value the log does not contain is shown as "-".
\b
TIME for --since/--until: 2024-05-09, '2024-05-09 14:52:38' (local time),
2024-05-09T14:52:38Z, @EPOCH, today, yesterday, -2h, '3d ago'.
"""


if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    # click >= 8.3 makes ParamType generic; older releases cannot be subscripted at runtime.
    _TimeParam = click.ParamType[datetime]
    _TextParam = click.ParamType[str]
else:
    _TimeParam = _TextParam = click.ParamType


class TimeType(_TimeParam):
    """A point in time as users type it (see parse_user_time)."""

    name = "TIME"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            return parse_user_time(str(value), datetime.now(timezone.utc))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class BootType(_TextParam):
    """all, current, a 32-hex boot ID, or an offset (0 current, -1 previous, 1 first)."""

    name = "all|current|ID|OFFSET"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            boot_argument(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return str(value)


def _status(message: str) -> None:
    click.echo(message, err=True)


def _kmsg_reader(boot: str) -> KmsgReader:
    if boot.lower() not in ("all", "current", "0"):
        this_boot = boot_id()
        if this_boot is None or boot.replace("-", "").lower() != this_boot:
            raise click.BadParameter(
                "/dev/kmsg only holds the current boot; use all, current, 0 or this boot's ID",
                param_hint="--boot",
            )
    return KmsgReader()


@click.command(
    name="oom", short_help=COMMAND_SUMMARIES["oom"], epilog=EXAMPLES + "\n" + exit_codes_epilog()
)
@click.option(
    "--boot",
    type=BootType(),
    metavar="all|current|ID|OFFSET",
    default="all",
    show_default=True,
    help="Which boots of the journal: all, current, a boot ID, or an offset (-1 = previous).",
)
@click.option("--since", type=TimeType(), default=None, help="Only kills at or after TIME.")
@click.option("--until", type=TimeType(), default=None, help="Only kills at or before TIME.")
@click.option(
    "--directory",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Read a journal directory (e.g. copied from another machine) instead of the system's.",
)
@click.option(
    "--file",
    "files",
    multiple=True,
    metavar="PATH",
    help="Read saved text: dmesg (-T, -x, iso), kern.log/syslog/messages, journalctl output "
    "(short, iso, precise, verbose, json, export), raw /dev/kmsg records; plain, .gz, .xz, .bz2 "
    "or .zst; pipes and <(command) too; '-' is stdin. Repeat for several files.",
)
@click.option(
    "--kmsg",
    "use_kmsg",
    is_flag=True,
    help="Read the live kernel ring buffer (/dev/kmsg): hosts and containers without journald.",
)
@click.option(
    "--process", "process", metavar="NAME", default=None, help="Only victims named NAME (a glob)."
)
@click.option(
    "--recording",
    "recordings",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    metavar="FILE",
    help="A `watch --record` recording: show each kill of a recorded process beside its last "
    "heap sample (same pid and name, at most 1 h before the kill). Repeatable.",
)
@click.option(
    "--state-dir",
    "state_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    metavar="DIR",
    help="`collect`'s state directory: join kills with the last heap samples it keeps there.",
)
@click.option(
    "--summary", is_flag=True, help="Group kills by process name instead of one row each."
)
@click.option(
    "--wide", is_flag=True, help="Every column and full cgroup paths (wider than 80 columns)."
)
@json_option
@click.option(
    "--fail-if-found", is_flag=True, help="Exit 1 if any kill is found (a CI or cron gate)."
)
@verbose_journal_option
@click.pass_context
def command(
    ctx: click.Context,
    *,
    boot: str,
    since: datetime | None,
    until: datetime | None,
    directory: str | None,
    files: tuple[str, ...],
    use_kmsg: bool,
    process: str | None,
    recordings: tuple[str, ...],
    state_dir: Path | None,
    summary: bool,
    wide: bool,
    as_json: bool,
    fail_if_found: bool,
    verbose: bool,
) -> None:
    """Find every OOM kill in the kernel log, across boots, kernels and killers.

    Reads the system journal by default (through journalctl, all boots); on a
    host without journal files, /dev/kmsg and the syslog files instead. Or a
    journal directory, saved text logs, or /dev/kmsg. Reports who was killed,
    when, in which boot, how big it was, by whom (global OOM, a memory cgroup,
    systemd-oomd, earlyoom), which cgroup, which task triggered it and the
    biggest tasks at that moment (--json).
    """
    resume_collector()  # early.begin paused it for the imports of an `oom --file`
    chosen = sum((directory is not None, bool(files), use_kmsg))
    if chosen > 1:
        raise click.UsageError("choose one source: --directory, --file or --kmsg")
    if since is not None and until is not None and since > until:
        raise click.BadParameter("--since is after --until", param_hint="--since")
    try:
        result = _scan(
            boot=boot,
            since=since,
            until=until,
            directory=directory,
            files=files,
            use_kmsg=use_kmsg,
            process=process,
            verbose=verbose,
        )
    except BootNotFoundError as exc:
        raise click.BadParameter(f"{exc.message} ({exc.hint})", param_hint="--boot") from exc
    except MemforensicsError as exc:
        exc.hint = _with_flag_hint(exc)
        raise
    result = _joined(result, recordings, state_dir)
    _output(result, as_json=as_json, summary=summary, wide=wide)
    if fail_if_found and result.events:
        ctx.exit(EXIT_GATE)


def _joined(result: OomScan, recordings: tuple[str, ...], state_dir: Path | None) -> OomScan:
    """``result`` with each kill's last heap sample from ``recordings`` and the state
    directory (given, else `collect`'s default where it exists); the joining machinery is
    imported only when there is something to join with."""
    from memforensics.entry.state_dir import existing_default_state_dir

    state_dir = state_dir or existing_default_state_dir()
    if not recordings and state_dir is None:
        return result
    from memforensics.entry.oomjoin import join_scan, load_histories

    histories, notes = load_histories(recordings, state_dir)
    return join_scan(result, histories, notes)


def _with_flag_hint(exc: MemforensicsError) -> str | None:
    """The library's hint plus the options of this command that act on it."""
    text = f"{exc.message} {exc.hint or ''}"
    extra = None
    if isinstance(exc, ToolingError) and "journalctl" in text:
        extra = "--file reads saved logs, --kmsg the ring buffer"
    elif isinstance(exc, ToolingError | TargetPermissionError) and "kmsg" in text:
        extra = "--file reads saved dmesg output; without --kmsg the journal is read"
    elif isinstance(exc, InputDataError) and "journal file" in text:
        extra = "--directory reads a journal directory"
    elif isinstance(exc, InputDataError) and "ring buffer" in text:
        extra = "--kmsg reads it"
    if extra is None:
        return exc.hint
    return f"{exc.hint} ({extra})" if exc.hint else extra


def _scan(
    *,
    boot: str,
    since: datetime | None,
    until: datetime | None,
    directory: str | None,
    files: tuple[str, ...],
    use_kmsg: bool,
    process: str | None,
    verbose: bool,
) -> OomScan:
    streams: list[tuple[str, Iterable[LogRecord]]] = []
    if files:
        if boot.lower() != "all":
            raise click.BadParameter(
                "text logs carry no boot IDs; --boot works with the journal and --kmsg",
                param_hint="--boot",
            )
        # Open (and check) every file first, so a bad one fails before any output.
        for path in files:
            streams.append((path, read_text_log(path, stdin=sys.stdin.buffer)))
        return scan(streams, since=since, until=until, process=process)
    if use_kmsg:
        kmsg_reader = _kmsg_reader(boot)
        streams.append((kmsg_reader.source, kmsg_reader.records()))
        result = scan(streams, since=since, until=until, process=process)
        if kmsg_reader.lost_records:
            lost = (
                f"/dev/kmsg overwrote records before they were read ({kmsg_reader.lost_records}x)"
            )
            result = replace(result, notes=(*result.notes, lost))
        return result
    if directory is not None or boot.lower() != "all" or has_journal_files(None):
        reader = JournalReader(directory=directory, boot=boot, since=since, until=until)
        if verbose:
            _status("running: " + " ".join(reader.argv()))
        streams.append((reader.source, reader.records()))
        result = scan(streams, since=since, until=until, process=process)
        return replace(result, notes=(*reader.notes, *result.notes))
    if verbose:
        _status(f"no journal files in {' or '.join(JOURNAL_DIRS)}: reading /dev/kmsg and /var/log")
    from memforensics.entry.oomscan import scan_default

    return scan_default(since=since, until=until, process=process)


def _output(result: OomScan, *, as_json: bool, summary: bool, wide: bool) -> None:
    if as_json:
        from memforensics.render.oom import scan_json

        emit_json(scan_json(result))
        return
    if not summary and not wide and _print_plain(result):
        for note in result.notes:
            _status(f"note: {note}")
        return
    from memforensics.render.oom import events_table, summary_table

    console = stdout_console()
    table = (
        summary_table(result) if summary else events_table(result, wide=wide, width=console.width)
    )
    _print_table(console, table)
    for note in result.notes:
        _status(f"note: {note}")


def _print_plain(result: OomScan) -> bool:
    """Print the default table without rich where rich would print its plain characters
    (stdout is not a terminal) and every line fits; False, having printed nothing, where
    rich is needed. Byte for byte what _print_table prints there."""
    from memforensics.render.oom import events_text

    width = plain_stdout_width()
    if width is None:
        return False
    text = events_text(result, width=width)
    if text is None or any(len(line) > width for line in text.split("\n")):
        return False  # "nothing found" is prose rich wraps; overlong lines rich crops
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    return True


def _print_table(console: Console, table: RenderableType) -> None:
    """Print ``table``; the default table (a Text laid out by oom_table, one line per row
    line) fast when every line fits: rich's wrapping of thousands of lines, which then
    changes nothing, costs more than the rest of the rendering (~60 ms for 1,150 kills)."""
    from rich.cells import cell_len
    from rich.text import Text

    if not isinstance(table, Text) or table.no_wrap is not True:
        console.print(table)
        return
    plain = table.plain
    width = console.width
    if any(len(line) > width and cell_len(line) > width for line in plain.split("\n")):
        console.print(table)  # rich crops what does not fit
    elif console.color_system is None:
        console.file.write(plain + "\n")  # no styles to print: rich would write the same
    else:
        console.print(table, soft_wrap=True)
