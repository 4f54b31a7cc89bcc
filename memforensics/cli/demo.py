"""`memforensics demo`: fragment a child's heap, trim it, and show RSS fall beside the forecast."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from memforensics.cli import COMMAND_SUMMARIES
from memforensics.cli.options import (
    SIZE,
    exit_codes_epilog,
    gdb_option,
    json_option,
    timeout_option,
    verbose_option,
)
from memforensics.errors import DeadlineError, TargetError
from memforensics.units import format_bytes

if TYPE_CHECKING:
    from memforensics.entry.common import Log

# Allocation speed is ~1 µs per block in CPython; give slow machines a wide margin.
_READY_BASE_SECONDS = 30.0
_READY_SECONDS_PER_BLOCK = 50e-6
_CHILD_LIFETIME_SECONDS = 600
_MAX_SHARE_OF_AVAILABLE = 0.5  # never let the demo take more than half the free RAM


@dataclass(frozen=True)
class DemoSpec:
    """What the child allocates."""

    buffers: int
    size_bytes: int
    threads: int

    @property
    def allocated_bytes(self) -> int:
        """Bytes the child allocates (and frees all but one block per thread of)."""
        return self.buffers * self.size_bytes


def _available_bytes() -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in open("/proc/meminfo", encoding="ascii"):  # noqa: SIM115
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def _child_argv(spec: DemoSpec) -> list[str]:
    return [
        sys.executable,
        "-m",
        "memforensics.entry.demo_target",
        "--buffers",
        str(spec.buffers),
        "--size",
        str(spec.size_bytes),
        "--threads",
        str(spec.threads),
        "--max-seconds",
        str(_CHILD_LIFETIME_SECONDS),
    ]


@contextlib.contextmanager
def demo_child(spec: DemoSpec) -> Iterator[subprocess.Popen[bytes]]:
    """Start the child (its own session, so Ctrl-C reaches only us) and always stop it."""
    proc = subprocess.Popen(
        _child_argv(spec),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def wait_ready(
    proc: subprocess.Popen[bytes], spec: DemoSpec, on_progress: Log | None = None
) -> str:
    """Read the child's progress lines until "ready"; raise if it dies or takes too long."""
    assert proc.stdout is not None
    deadline = time.monotonic() + _READY_BASE_SECONDS + spec.buffers * _READY_SECONDS_PER_BLOCK
    fd = proc.stdout.fileno()
    pending = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise DeadlineError(
                f"the demo child (PID {proc.pid}) did not finish allocating in time",
                hint="try fewer --buffers; the child was stopped",
            )
        readable, _, _ = select.select([fd], [], [], min(left, 0.5))
        if not readable:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            proc.wait(timeout=5)
            why = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
            last = why.splitlines()[-1] if why else f"exit status {proc.returncode}"
            raise TargetError(
                f"the demo child exited before it was ready: {last}",
                hint="try a smaller --buffers/--size; run "
                "`python -m memforensics.entry.demo_target` to see its error",
            )
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace").strip()
            if line.startswith("ready"):
                return line
            if line.startswith("progress") and on_progress is not None:
                on_progress(line)


@click.command(name="demo", short_help=COMMAND_SUMMARIES["demo"], epilog=exit_codes_epilog())
@click.option(
    "--buffers",
    type=click.IntRange(min=1),
    default=200_000,
    show_default=True,
    help="Blocks the child allocates.",
)
@click.option(
    "--size", "size_bytes", type=SIZE, default="1KiB", show_default=True, help="Bytes per block."
)
@click.option(
    "--threads",
    type=click.IntRange(min=1, max=64),
    default=1,
    show_default=True,
    help="Threads sharing the work: one malloc arena each.",
)
@json_option
@timeout_option("10s")
@gdb_option
@verbose_option
def command(
    *,
    buffers: int,
    size_bytes: int,
    threads: int,
    as_json: bool,
    timeout_seconds: float,
    gdb_path: str | None,
    verbose: bool,
) -> None:
    """Reproduce the classic glibc case end to end: a heap full of free memory that RSS keeps.

    A child Python process allocates BUFFERS blocks of SIZE bytes with libc's malloc (through
    ctypes), writes them, and frees all but the last one, so the heap cannot shrink from the
    top. memforensics then inspects it, forecasts what malloc_trim can release, trims it, and
    shows RSS before and after beside the forecast. The child is stopped at the end.

    \b
    Examples:
      memforensics demo                      200,000 x 1 KiB: about 200 MB down to a few MB
      memforensics demo --threads 4          the same spread over 4 arenas
      memforensics demo --json | jq .released_bytes
    """
    if size_bytes < 1:
        raise click.BadParameter("must be at least 1 byte", param_hint="--size")
    spec = DemoSpec(buffers=buffers, size_bytes=size_bytes, threads=threads)
    available = _available_bytes()
    if available is not None and spec.allocated_bytes > available * _MAX_SHARE_OF_AVAILABLE:
        raise click.UsageError(
            f"--buffers x --size = {format_bytes(spec.allocated_bytes)} is more than half of the "
            f"{format_bytes(available)} of RAM available; choose smaller numbers"
        )
    # The live machinery and rich are imported here, not at the top: `demo --help` needs
    # neither.
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from memforensics.cli.output import emit_json, stderr_console, stdout_console
    from memforensics.entry.inspect import inspect_live, inspect_method
    from memforensics.entry.trim import TrimSettings, trim_process
    from memforensics.render import trim as render
    from memforensics.render.process import render_waterfall

    err = stderr_console(soft_wrap=True, highlight=True)
    log: Log | None = None
    if verbose:

        def log(line: str) -> None:
            click.echo(line, err=True)

    err.print(
        f"demo: a child allocates {spec.buffers:,} x {format_bytes(spec.size_bytes)} "
        f"in {spec.threads} thread(s), writes them, frees all but the last",
        style="dim",
        highlight=False,
    )
    with demo_child(spec) as proc:
        with Progress(
            TextColumn("[dim]allocating"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=True,
            disable=not err.is_terminal,  # no bar (nor blank line) in logs and pipes
        ) as progress:
            task = progress.add_task("allocating", total=spec.buffers)

            def on_progress(line: str) -> None:
                parts = line.split()
                if len(parts) == 3 and parts[1].isdigit():
                    progress.update(task, completed=int(parts[1]))

            wait_ready(proc, spec, on_progress)
        err.print(
            f"demo: child PID {proc.pid} is ready; inspecting it, then trimming it",
            style="dim",
            highlight=False,
        )
        inspection = inspect_live(
            proc.pid,
            method=inspect_method(read_only=False, gdb_path=gdb_path),
            timeout_seconds=timeout_seconds,
            gdb_path=gdb_path,
            log=log,
        )
        result = trim_process(
            proc.pid, TrimSettings(timeout_seconds=timeout_seconds, gdb_path=gdb_path, log=log)
        )
    if as_json:
        document = render.demo_document(
            result,
            buffers=spec.buffers,
            size_bytes=spec.size_bytes,
            threads=spec.threads,
            waterfall_before=inspection.waterfall,
        )
        emit_json(document)
        return
    out = stdout_console(soft_wrap=True, highlight=True)
    if inspection.waterfall is not None:
        out.print(render_waterfall(inspection.waterfall))
    out.print(render.render_demo(result, spec.allocated_bytes, spec.threads))
