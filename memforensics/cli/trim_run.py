"""The work of `memforensics trim` (cli/trim.py is its command line): once or in rounds."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

import click
from rich.console import Console

from memforensics.analysis.trim import summarize
from memforensics.cli.failures import report_recorded, worst_exit_code
from memforensics.cli.output import emit_json, stderr_console, stdout_console
from memforensics.entry.common import Log, now_utc
from memforensics.entry.targets import resolve_targets
from memforensics.entry.trim import TrimSettings, trim_outcome, trim_process
from memforensics.errors import EXIT_TARGET, MemforensicsError, NoSuchProcessError
from memforensics.model.trim import TrimFailure, TrimOutcome, TrimResult, TrimRound
from memforensics.render import trim as render


# After detaching, RSS is read until two readings agree: smaps_rollup walks the page tables,
# so it is exact at once, but a target that was just resumed may still be faulting pages in.
class StopFlag:
    """Set by the first Ctrl-C: finish the round under way, then stop. A second Ctrl-C aborts."""

    def __init__(self) -> None:
        self.event = threading.Event()

    @property
    def requested(self) -> bool:
        """True once a stop was asked for."""
        return self.event.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True when woken early by a stop request."""
        return self.event.wait(seconds)


@contextmanager
def first_sigint_stops(flag: StopFlag, status: Log) -> Iterator[None]:
    """While inside, the first SIGINT sets ``flag``; the next raises KeyboardInterrupt.

    gdb runs in its own process group, so the terminal's Ctrl-C reaches only us; an attach in
    progress finishes (and detaches) before the loop looks at the flag.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def handler(_signum: int, _frame: FrameType | None) -> None:
        if flag.requested:
            raise KeyboardInterrupt
        flag.event.set()
        status("stopping after this round (Ctrl-C again to abort it; targets are detached)")

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_rounds(
    pids: Sequence[int],
    settings: TrimSettings,
    *,
    interval_seconds: float,
    count: int | None,
    stop: StopFlag,
    on_round: Callable[[TrimRound], None],
) -> list[TrimRound]:
    """Trim every PID once per round, every ``interval_seconds``, ``count`` times or until stopped.

    Rounds are spaced from start to start; a round that overruns the interval starts the next
    one at once rather than bunching up later.
    """
    rounds: list[TrimRound] = []
    index = 0
    next_start = time.monotonic()
    while count is None or index < count:
        index += 1
        began = now_utc()
        outcomes = tuple(trim_outcome(pid, settings) for pid in pids)
        trim_round = TrimRound(index=index, time=began, outcomes=outcomes)
        rounds.append(trim_round)
        on_round(trim_round)
        if stop.requested or (count is not None and index >= count):
            break
        if all(isinstance(o, TrimFailure) and o.exit_code == EXIT_TARGET for o in outcomes):
            break  # every target is gone: nothing left to trim
        next_start += interval_seconds
        if stop.wait(max(next_start - time.monotonic(), 0.0)):
            break
    return rounds


def run_trim(
    *,
    pids: tuple[int, ...],
    names: tuple[str, ...],
    pad_bytes: int,
    dry_run: bool,
    min_free_bytes: int,
    interval_seconds: float | None,
    count: int | None,
    as_json: bool,
    timeout_seconds: float,
    gdb_path: str | None,
    verbose: bool,
    accept_corrupt_risk: bool = False,
) -> None:
    """Trim the targets once, or every ``interval_seconds`` (the options of `trim`)."""
    err = stderr_console(soft_wrap=True, highlight=True)
    out = stdout_console(soft_wrap=True, highlight=True)

    def status(message: str) -> None:
        err.print(message, style="dim", highlight=False)

    log: Log | None = None
    if verbose:

        def log(line: str) -> None:
            click.echo(line, err=True)

    resolved = resolve_targets(pids, names)
    targets = [pid for pid, _explicit in resolved]
    settings = TrimSettings(
        pad_bytes=pad_bytes,
        dry_run=dry_run,
        min_free_bytes=min_free_bytes,
        timeout_seconds=timeout_seconds,
        gdb_path=gdb_path,
        log=log,
        accept_corrupt_risk=accept_corrupt_risk,
    )
    if interval_seconds is None:
        outcomes = [
            outcome
            for pid, explicit in resolved
            if (outcome := _trim_once(pid, settings, explicit=explicit)) is not None
        ]
        _report_once(outcomes, as_json=as_json, out=out)
        code = _worst(outcomes)
        if code:
            click.get_current_context().exit(code)
        return
    _periodic(targets, settings, interval_seconds, count, as_json=as_json, out=out, status=status)


def _trim_once(pid: int, settings: TrimSettings, *, explicit: bool) -> TrimOutcome | None:
    """One target's outcome; None for a --name match that exited (skipped with a note)."""
    if explicit:
        return trim_outcome(pid, settings)
    try:
        return trim_process(pid, settings)
    except NoSuchProcessError:
        click.echo(f"note: PID {pid} (matched by --name) exited; skipped", err=True)
        return None
    except MemforensicsError as exc:
        return TrimFailure(
            pid=pid, time=now_utc(), message=exc.message, hint=exc.hint, exit_code=exc.exit_code
        )


def _worst(outcomes: Iterable[TrimOutcome]) -> int:
    return worst_exit_code(o.exit_code for o in outcomes if isinstance(o, TrimFailure))


def _report_once(outcomes: Sequence[TrimOutcome], *, as_json: bool, out: Console) -> None:
    for outcome in outcomes:
        if isinstance(outcome, TrimFailure):
            # Library messages already name the PID ("PID 123 (app) is a zombie").
            report_recorded(outcome.message, outcome.hint, outcome.exit_code)
    if as_json:
        emit_json(render.trim_document(outcomes, now=now_utc()))
        return
    shown = [o for o in outcomes if isinstance(o, TrimResult)]
    if shown:
        out.print(render.render_outcomes(shown))


def _periodic(
    targets: Sequence[int],
    settings: TrimSettings,
    interval_seconds: float,
    count: int | None,
    *,
    as_json: bool,
    out: Console,
    status: Log,
) -> None:
    stop = StopFlag()
    rows_started = False

    def on_round(trim_round: TrimRound) -> None:
        nonlocal rows_started
        for outcome in trim_round.outcomes:
            if isinstance(outcome, TrimFailure):
                status(f"round {trim_round.index}: pid {outcome.pid}: {outcome.message}")
        if as_json:
            status(f"round {trim_round.index} done")
            return
        if not rows_started:
            click.echo(render.round_header())
            rows_started = True
        for row in render.round_rows(trim_round):
            click.echo(row)

    status(
        f"trimming {len(targets)} process(es) every {interval_seconds:g} s"
        + (f", {count} rounds" if count else ", until Ctrl-C")
    )
    with first_sigint_stops(stop, status):
        rounds = run_rounds(
            targets,
            settings,
            interval_seconds=interval_seconds,
            count=count,
            stop=stop,
            on_round=on_round,
        )
    summary = summarize(rounds)
    if as_json:
        emit_json(
            render.rounds_document(
                rounds,
                summary,
                now=now_utc(),
                interval_seconds=interval_seconds,
                count=count,
                interrupted=stop.requested,
            )
        )
    else:
        status(render.summary_line(summary, interrupted=stop.requested))
    # The worst over the whole run: a round that timed out is worth knowing about.
    code = _worst(o for r in rounds for o in r.outcomes)
    if code:
        click.get_current_context().exit(code)
