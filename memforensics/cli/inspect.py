"""`memforensics inspect`: a live heap report of running processes (from their memory, or
by calling their malloc_info without gdb where that read is refused; through gdb/MI with
--gdb), or of a core file."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from memforensics.cli import COMMAND_SUMMARIES
from memforensics.cli.failures import exit_code_for, report_failure, worst_exit_code
from memforensics.cli.options import (
    accept_corrupt_risk_option,
    exit_codes_epilog,
    gdb_option,
    heap_view_options,
    json_option,
    read_only_option,
    timeout_option,
    verbose_option,
)
from memforensics.entry.early import collector_paused, resume_collector
from memforensics.errors import HeapCorruptionError, MemforensicsError, NoSuchProcessError

if TYPE_CHECKING:
    from memforensics.model.inspection import Inspection
    from memforensics.render.heap_sort import SortKey

EXAMPLES = """\b
Examples:
  memforensics inspect 4242                   heap report of PID 4242
  memforensics inspect --name postgres        every process whose name/cmdline matches
  memforensics inspect --json 4242 | jq '.totals.free_bytes, .pause_seconds'
  memforensics inspect --save-xml dump.xml 4242 && memforensics parse dump.xml
  memforensics inspect --read-only 4242       no call: fail rather than fall back
  memforensics inspect --gdb gdb 4242         malloc_info called through gdb instead
  memforensics inspect --core core.4242       the same report from a core file
\b
By default no gdb is used and no code runs in the target: malloc_info's document
is rebuilt from the target's memory, each arena read in stops of a few ms
(ptrace seize and interrupt; nothing is written), as the target's glibc prints
it, and the residency is that same read. Only where that read is impossible (a
glibc it does not know, more free chunks than it keeps, an arena locked at every
stop) is the target's own malloc_info called, without gdb, through a frame that
restores the thread by itself, at a moment no thread is in the allocator, and
only once the lists no read could follow are proved to close (a corrupt heap:
exit 8, nothing called); stderr and --json's "fallback" say so (--read-only:
never). The report says how long the target was stopped ("paused 14 ms").
"""

SAVE_XML_HINT = "choose a writable --save-xml path"


def save_xml_path(template: str, pid: int, *, several: bool) -> Path:
    """Where one target's XML goes: ``{pid}`` in PATH is replaced; several targets get .PID."""
    if "{pid}" in template:
        return Path(template.replace("{pid}", str(pid)))
    path = Path(template)
    if several:
        return path.with_name(f"{path.stem}.{pid}{path.suffix}")
    return path


def _document(result: Inspection) -> dict[str, Any]:
    from memforensics.render.inspect_json import inspection_document

    return inspection_document(result)


def _print_report(result: Inspection, *, top: int, sort: SortKey) -> None:
    from memforensics.cli.output import stdout_console
    from memforensics.render.inspect import render_inspection

    stdout_console().print(render_inspection(result, top=top, sort=sort))


def _corruption_document(error: HeapCorruptionError) -> dict[str, Any]:
    from memforensics.render.corruption import corruption_document

    return corruption_document(error)


def _print_corruption(error: HeapCorruptionError) -> None:
    from memforensics.cli.output import stdout_console
    from memforensics.render.corruption import render_corruption

    stdout_console().print(render_corruption(error))


def _save_xml(path: Path, xml: bytes, pid: int) -> None:
    from memforensics.cli.output import stderr_console
    from memforensics.sources.files.atomic_file import write_atomically

    write_atomically(path, xml, hint=SAVE_XML_HINT)
    stderr_console().print(f"saved malloc_info XML of PID {pid} to {path}")


def _save_html(path: Path, result: Inspection) -> None:
    from memforensics.cli.output import stderr_console
    from memforensics.render.heap_picture import picture_page
    from memforensics.sources.files.atomic_file import write_atomically

    pid = result.facts.pid
    if result.picture is None:
        why = result.pins_error or "read through gdb, which walks no chunks"
        _say(f"note: PID {pid}: no heap picture ({why})")
        return
    page = picture_page(
        f"The heaps of PID {pid} ({result.facts.name})",
        "live, free and released memory page by page, and the live chunks that pin it; "
        "read from memory, nothing run in the target",
        result.picture,
    )
    write_atomically(path, page.encode(), hint="choose a writable --html path")
    stderr_console().print(f"saved the heap picture of PID {pid} to {path}")


def _save_corruption_html(path: Path, error: HeapCorruptionError) -> None:
    from memforensics.cli.output import stderr_console
    from memforensics.render.corruption import corruption_html
    from memforensics.sources.files.atomic_file import write_atomically

    write_atomically(path, corruption_html(error).encode(), hint="choose a writable --html path")
    stderr_console().print(f"saved the corrupt heap's report of PID {error.pid} to {path}")


def _mi_logger(line: str) -> None:
    sys.stderr.write(f"gdb {line}\n")
    sys.stderr.flush()


@click.command(
    name="inspect",
    short_help=COMMAND_SUMMARIES["inspect"],
    epilog=EXAMPLES + "\n" + exit_codes_epilog(),
)
@click.argument("pids", nargs=-1, type=click.IntRange(min=1), metavar="PID...")
@click.option(
    "--name",
    "names",
    multiple=True,
    metavar="PATTERN",
    help="Also inspect every process whose name or command line matches (regex; repeatable).",
)
@json_option
@click.option(
    "--save-xml",
    "save_xml",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="PATH",
    help="Also write the raw malloc_info XML to PATH (atomically) for `memforensics parse`; "
    "with several targets, {pid} in PATH is replaced (else .PID is added).",
)
@timeout_option("10s")
@gdb_option
@accept_corrupt_risk_option
@click.option(
    "--allow-stopped",
    is_flag=True,
    help="Inspect a process someone else stopped (state T); it is left stopped.",
)
@read_only_option
@click.option(
    "--core",
    "core_path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    metavar="FILE",
    help="Read a core file (the kernel's, gdb's gcore) instead of a live process: the same "
    "report, residency unknown.",
)
@click.option(
    "--exe",
    "exe_path",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="PATH",
    help="With --core: the program that dumped it (names the process; default: the core's).",
)
@click.option(
    "--sysroot",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    metavar="DIR",
    help="With --core: where the dead machine's files are (its libc is found under DIR).",
)
@click.option(
    "--pins/--no-pins",
    "pins",
    default=False,
    help="Also walk every heap's chunks for the live ones that keep free memory from going "
    "back (the pins), after the figures' stops; --json lists them in pins[].",
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help="Also write a picture of each heap (its pages, the pins marked) to FILE, one offline "
    "HTML page; implies --pins. With several targets, {pid} in FILE is replaced (else .PID "
    "is added).",
)
@heap_view_options
@verbose_option
# The collector is off until the first report is out (early.pause_collector says why), and on
# again when the command returns, however it returns.
@collector_paused()
def command(
    *,
    pids: tuple[int, ...],
    names: tuple[str, ...],
    as_json: bool,
    save_xml: str | None,
    timeout_seconds: float,
    gdb_path: str | None,
    accept_corrupt_risk: bool,
    allow_stopped: bool,
    read_only: bool,
    core_path: str | None,
    exe_path: str | None,
    sysroot: str | None,
    pins: bool,
    html_path: str | None,
    top: int,
    sort: SortKey,
    verbose: bool,
) -> None:
    """Live glibc heap report of running processes: per-arena free vs in use, where the RSS
    went, and how long the target was paused. Read from the target's memory in stops of a
    few ms (where that is refused, its malloc_info called without gdb, at a moment no thread
    is in the allocator); the target is left running."""
    if core_path is not None:
        if pids or names:
            raise click.UsageError("--core reads a core file: give no PID or --name with it")
        _inspect_core(
            core_path,
            exe_path,
            sysroot,
            as_json=as_json,
            save_xml=save_xml,
            top=top,
            sort=sort,
            pins=pins or html_path is not None,
            html_path=html_path,
        )
        return
    if exe_path is not None or sysroot is not None:
        raise click.UsageError("--exe and --sysroot go with --core FILE")
    if not pids and not names:
        raise click.UsageError("give at least one PID or --name PATTERN")
    if read_only and gdb_path is not None:
        raise click.UsageError("--read-only runs no gdb: drop --gdb")
    if (pins or html_path is not None) and gdb_path is not None:
        raise click.UsageError("--pins and --html read the heap from memory: drop --gdb")
    _report_targets(
        *_targets_and_reader(
            pids,
            names,
            read_only,
            timeout_seconds,
            gdb_path,
            allow_stopped,
            verbose,
            pins=pins or html_path is not None,
            accept_corrupt_risk=accept_corrupt_risk,
        ),
        as_json=as_json,
        # The JSON's shape follows the command line, never what happened to be running:
        # one PID gives an object, several PIDs or --name an array (even of one).
        as_array=len(pids) > 1 or bool(names),
        save_xml=save_xml,
        html_path=html_path,
        top=top,
        sort=sort,
    )


def _targets_and_reader(
    pids: tuple[int, ...],
    names: tuple[str, ...],
    read_only: bool,
    timeout_seconds: float,
    gdb_path: str | None,
    allow_stopped: bool,
    verbose: bool,
    *,
    pins: bool = False,
    accept_corrupt_risk: bool = False,
) -> tuple[list[tuple[int, bool]], Callable[[int], Inspection]]:
    """The targets, and how each is inspected (entry.inspect decides the way); ``pins``:
    the memory way also walks every heap's chunks."""
    from memforensics.cli.progress import progress_line
    from memforensics.entry.inspect import inspect_live, inspect_method
    from memforensics.entry.targets import resolve_targets

    method = inspect_method(read_only=read_only, gdb_path=gdb_path)

    def read(pid: int) -> Inspection:
        # (A long read says how far it got on a terminal's stderr; -v's gdb/MI log is
        # printed there as it comes, so it goes without.)
        with progress_line() if not verbose else contextlib.nullcontext():
            inspection = inspect_live(
                pid,
                method=method,
                timeout_seconds=timeout_seconds,
                allow_stopped=allow_stopped,
                gdb_path=gdb_path,
                log=_mi_logger if verbose else None,
                pins=pins,
                accept_corrupt_risk=accept_corrupt_risk,
            )
        if inspection.fallback is not None:
            _say_fallback(pid, inspection.fallback.reason)
        return inspection

    return resolve_targets(pids, names), read


def _say(line: str) -> None:
    from memforensics.cli.output import stderr_console

    stderr_console().print(line, markup=False, highlight=False)


def _say_fallback(pid: int, why: str) -> None:
    _say(
        f"note: PID {pid} was inspected by calling its malloc_info (without gdb): its memory "
        f"could not be read ({why})"
    )


def _inspect_core(
    core_path: str,
    exe_path: str | None,
    sysroot: str | None,
    *,
    as_json: bool,
    save_xml: str | None,
    top: int,
    sort: SortKey,
    pins: bool = False,
    html_path: str | None = None,
) -> None:
    from memforensics.cli.output import emit_json, stderr_console
    from memforensics.entry.inspect import inspect_core
    from memforensics.sources.files.atomic_file import write_atomically

    try:
        result, warnings = inspect_core(core_path, exe=exe_path, sysroot=sysroot, pins=pins)
    except HeapCorruptionError as exc:  # a finding: its report on stdout, then exit 8
        if as_json:
            emit_json(_corruption_document(exc))
        else:
            _print_corruption(exc)
        raise
    for warning in warnings:
        stderr_console().print(f"warning: {warning}", markup=False, highlight=False)
    if save_xml is not None:
        write_atomically(Path(save_xml), result.capture.xml, hint=SAVE_XML_HINT)
    if html_path is not None:
        _save_html(Path(html_path), result)
    if as_json:
        emit_json(_document(result))
    else:
        _print_report(result, top=top, sort=sort)


def _keep_xml(result: Inspection, template: str, pid: int, *, several: bool) -> None:
    """--save-xml for one target: its malloc_info document, or a note where it has none."""
    if result.foreign is not None:
        _say(f"note: PID {pid} runs on {result.foreign.kind}: no malloc_info to save")
    else:
        _save_xml(save_xml_path(template, pid, several=several), result.capture.xml, pid)


def _failed(
    exc: MemforensicsError,
    pid: int,
    *,
    explicit: bool,
    several: bool,
    documents: list[dict[str, Any]] | None,
    html: str | None = None,
) -> int:
    """One target's error handled: its exit code (0 for a --name match that exited by
    itself); a corrupt heap is a finding, its report printed (or its JSON document added
    to ``documents``, when they are collected) like any other; an error that ends the only
    target is raised."""
    if isinstance(exc, HeapCorruptionError):
        if html is not None:
            _save_corruption_html(save_xml_path(html, pid, several=several), exc)
        if documents is not None:
            documents.append(_corruption_document(exc))
        else:
            _print_corruption(exc)
        report_failure(exc, prefix=f"PID {pid}: " if several else "")
        return exit_code_for(exc)
    gone_by_itself = isinstance(exc, NoSuchProcessError) and not explicit
    if not several and not gone_by_itself:
        raise exc
    if gone_by_itself:  # a --name match that came and went: the others are the report
        click.echo(f"note: PID {pid} (matched by --name) exited; skipped", err=True)
        return 0
    report_failure(exc, prefix=f"PID {pid}: ")
    return exit_code_for(exc)


def _report_targets(
    targets: list[tuple[int, bool]],
    inspect_one: Callable[[int], Inspection],
    *,
    as_json: bool,
    as_array: bool,
    save_xml: str | None,
    html_path: str | None = None,
    top: int,
    sort: SortKey,
) -> None:
    """Inspect each target, print its report (or collect its JSON: an array when
    ``as_array``, else the one object), and exit with the worst code of those that failed;
    one failure does not stop the others."""
    several = len(targets) > 1
    documents: list[dict[str, Any]] = []
    docs = documents if as_json else None  # where a corrupt heap's document goes
    worst = 0
    for index, (pid, explicit) in enumerate(targets):
        if index:
            resume_collector()  # the first report is done: a long list of targets is not
        try:
            result = inspect_one(pid)
            if save_xml is not None:
                _keep_xml(result, save_xml, pid, several=several)
            if html_path is not None:
                _save_html(save_xml_path(html_path, pid, several=several), result)
        except MemforensicsError as exc:
            worst = worst_exit_code(
                (
                    worst,
                    _failed(
                        exc, pid, explicit=explicit, several=several, documents=docs, html=html_path
                    ),
                )
            )
            continue
        if as_json:
            documents.append(_document(result))
        else:
            _print_report(result, top=top, sort=sort)
    if as_json and (as_array or documents):
        from memforensics.cli.output import emit_json

        emit_json(documents if as_array else documents[0])
    if worst:
        click.get_current_context().exit(worst)
