"""`memforensics report`: trend and verdict from recordings, heap JSON and malloc_info dumps."""

from __future__ import annotations

import click

from memforensics.analysis.trend import VERDICTS
from memforensics.cli import COMMAND_SUMMARIES
from memforensics.cli.options import DURATION, exit_codes_epilog, json_option, verbose_files_option
from memforensics.cli.output import emit_json, stderr_console, stdout_console
from memforensics.entry.reporting import build_report
from memforensics.errors import EXIT_GATE, ToolingError
from memforensics.render.report_html import report_html
from memforensics.render.report_json import report_json
from memforensics.render.report_markdown import report_markdown
from memforensics.render.report_text import render_report

EXAMPLES = """\b
Examples:
  memforensics report app.jsonl                       verdict and figures in the terminal
  memforensics report app.jsonl --html app.html       one self-contained page (opens offline)
  memforensics report app.jsonl --markdown "$GITHUB_STEP_SUMMARY"
  memforensics report app.jsonl --json | jq '.trend.verdict, .trend.in_use_bytes_per_hour'
  memforensics report day1.jsonl day2.jsonl           recordings of one process, joined
  memforensics report dumps.xml --dump-interval 10s   a malloc_info series taken every 10 s
  memforensics report soak.jsonl --fail-on in-use-growing   CI gate: exit 1 on a leak
\b
INPUT is a recording (`watch --record`), a heap JSON document (`inspect --json`,
`parse --json`) or malloc_info XML (one dump or a series). The verdict per process:
in-use-growing (live memory, arena in use + mmapped chunks, grows: a leak or a cache),
mmap-growing (the same, in large mmapped blocks), outside-malloc-growing (memory malloc
does not know grows: a runtime's heap, the program's own mmaps), free-growing
(fragmentation: free resident chunks pile up while live memory stays flat), rss-growing
(RSS grows and no recorded line explains it), stable, or unknown (fewer than 3 heap
samples). "Growing" means: at least 1 MiB and 5% over the window, 3 standard errors
above zero, twice the noise, and not one single step (docs/watch.md).
"""


def _write(path: str, text: str, what: str) -> None:
    try:
        if path == "-":
            click.echo(text)
            return
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        raise ToolingError(
            f"cannot write the {what} {path}: {exc.strerror or exc}",
            hint="choose a writable output path",
        ) from exc


@click.command(
    name="report",
    short_help=COMMAND_SUMMARIES["report"],
    epilog=EXAMPLES + "\n" + exit_codes_epilog(),
)
@click.argument(
    "inputs", nargs=-1, required=True, type=click.Path(dir_okay=False), metavar="INPUT..."
)
@click.option("--html", "html_path", metavar="OUT", help="Write the HTML page to OUT.")
@click.option(
    "--markdown",
    "markdown_path",
    metavar="OUT",
    help="Write a Markdown summary to OUT (- for stdout), e.g. $GITHUB_STEP_SUMMARY.",
)
@click.option(
    "--dump-interval",
    "dump_interval_seconds",
    type=DURATION,
    default=None,
    help="Time between the dumps of a malloc_info series (they carry no times).",
)
@click.option(
    "--fail-on",
    "fail_on",
    multiple=True,
    type=click.Choice([*VERDICTS, "growing"]),
    help="Exit 1 when a process gets this verdict (repeatable; `growing`: any *-growing "
    "verdict): a CI gate.",
)
@json_option
@verbose_files_option
def command(
    *,
    inputs: tuple[str, ...],
    fail_on: tuple[str, ...],
    html_path: str | None,
    markdown_path: str | None,
    dump_interval_seconds: float | None,
    as_json: bool,
    verbose: bool,
) -> None:
    """Is it a leak or fragmentation? Trend per process (in use, free, RSS per hour), the
    verdict with its evidence, and pages people look at: HTML, Markdown, JSON."""
    report = build_report(inputs, dump_interval_seconds=dump_interval_seconds)
    status = stderr_console()
    if html_path is not None:
        _write(html_path, report_html(report), "HTML page")
        status.print(f"wrote {html_path}")
    if markdown_path is not None:
        _write(markdown_path, report_markdown(report), "Markdown summary")
        if markdown_path != "-":
            status.print(f"wrote {markdown_path}")
    if as_json:
        emit_json(report_json(report))
    elif html_path is None and markdown_path is None:
        stdout_console().print(render_report(report))
    gated = set(fail_on)
    if "growing" in gated:
        gated.update(v for v in VERDICTS if v.endswith("-growing"))
    failed = [p for p in report.processes if p.trend.verdict in gated]
    for process in failed:
        series = process.series
        who = f"PID {series.pid} {series.process}" if series.pid is not None else series.process
        status.print(f"gate: {who} is {process.trend.verdict}", highlight=False)
    if failed:
        click.get_current_context().exit(EXIT_GATE)
