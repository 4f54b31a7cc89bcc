"""`memforensics oom`: find every OOM kill in the journal, saved logs or /dev/kmsg."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import click

from memforensics.analysis.oom_select import scan
from memforensics.cli.options import exit_codes_epilog, json_option, verbose_option
from memforensics.cli.output import emit_json, stdout_console
from memforensics.errors import EXIT_GATE
from memforensics.model.logrecord import LogRecord
from memforensics.model.oom import OomScan
from memforensics.sources.journal import BootNotFoundError, JournalReader, boot_argument
from memforensics.sources.kmsg import KmsgReader, boot_id
from memforensics.sources.logfile import read_text_log
from memforensics.sources.logtime import parse_user_time

EXAMPLES = """\b
Examples:
  memforensics oom                          every kill in the system journal, all boots
  memforensics oom --boot -1 --summary      the previous boot, grouped by process
  memforensics oom --since yesterday --process 'java*'
  memforensics oom --directory ./journal    a journal directory copied from another host
  memforensics oom --file kern.log --file syslog.1.gz
  dmesg -T | memforensics oom --file -      saved or piped text (dmesg, syslog, journalctl)
  memforensics oom --kmsg --json | jq '.events[] | {pid, process, cgroup}'
  memforensics oom --since -1h --fail-if-found    # CI/cron gate: exit 1 on any kill
\b
One row per victim. anon-rss is the victim's private memory when it died
(what the kill freed); total-vm its address space. scope is "global" (the
machine ran out) or "memcg" (a cgroup hit its limit: see cgroup, and oom_memcg
in --json for the cgroup whose limit was hit); systemd-oomd or earlyoom for
userspace killers. trigger is the task whose allocation invoked the OOM killer:
often not the victim. A value the log does not contain is shown as "-".
\b
TIME for --since/--until: 2024-05-09, '2024-05-09 14:52:38' (local time),
2024-05-09T14:52:38Z, @EPOCH, today, yesterday, -2h, '3d ago'.
"""


if TYPE_CHECKING:
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


@click.command(name="oom", epilog=EXAMPLES + "\n" + exit_codes_epilog())
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
    help="Read saved text: dmesg (-T, -x, iso), kern.log/syslog/messages, journalctl output, "
    "raw /dev/kmsg records; .gz too; '-' is stdin. Repeat for several files.",
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
    "--summary", is_flag=True, help="Group kills by process name instead of one row each."
)
@json_option
@click.option(
    "--fail-if-found", is_flag=True, help="Exit 1 if any kill is found (a CI or cron gate)."
)
@verbose_option
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
    summary: bool,
    as_json: bool,
    fail_if_found: bool,
    verbose: bool,
) -> None:
    """Find every OOM kill in the kernel log, across boots, kernels and killers.

    Reads the system journal by default (through journalctl, all boots), or a
    journal directory, saved text logs, or /dev/kmsg. Reports who was killed,
    when, in which boot, how big it was, by whom (global OOM, a memory cgroup,
    systemd-oomd, earlyoom), which cgroup, which task triggered it and the
    biggest tasks at that moment (--json).
    """
    chosen = sum((directory is not None, bool(files), use_kmsg))
    if chosen > 1:
        raise click.UsageError("choose one source: --directory, --file or --kmsg")
    if since is not None and until is not None and since > until:
        raise click.BadParameter("--since is after --until", param_hint="--since")
    streams: list[tuple[str, Iterable[LogRecord]]] = []
    notes: list[str] = []
    reader: JournalReader | None = None
    kmsg_reader: KmsgReader | None = None
    if files:
        if boot.lower() != "all":
            raise click.BadParameter(
                "text logs carry no boot IDs; --boot works with the journal and --kmsg",
                param_hint="--boot",
            )
        # Open (and check) every file first, so a bad one fails before any output.
        for path in files:
            streams.append((path, read_text_log(path, stdin=sys.stdin.buffer)))
    elif use_kmsg:
        kmsg_reader = _kmsg_reader(boot)
        streams.append(("kmsg", kmsg_reader.records()))
    else:
        reader = JournalReader(directory=directory, boot=boot, since=since, until=until)
        if verbose:
            _status("running: " + " ".join(reader.argv()))
        streams.append((reader.source, reader.records()))
    try:
        result = scan(streams, since=since, until=until, process=process, notes=notes)
    except BootNotFoundError as exc:
        raise click.BadParameter(f"{exc.message} ({exc.hint})", param_hint="--boot") from exc
    if reader is not None and reader.notes:
        result = OomScan(result.events, result.sources, (*reader.notes, *result.notes))
    if kmsg_reader is not None and kmsg_reader.lost_records:
        lost = f"/dev/kmsg overwrote records before they were read ({kmsg_reader.lost_records}x)"
        result = OomScan(result.events, result.sources, (*result.notes, lost))
    _output(result, as_json=as_json, summary=summary)
    if fail_if_found and result.events:
        ctx.exit(EXIT_GATE)


def _output(result: OomScan, *, as_json: bool, summary: bool) -> None:
    if as_json:
        from memforensics.render.oom import scan_json

        emit_json(scan_json(result))
        return
    from memforensics.render.oom import events_table, summary_table

    console = stdout_console()
    console.print(summary_table(result) if summary else events_table(result))
    for note in result.notes:
        _status(f"note: {note}")
