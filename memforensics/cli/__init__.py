"""The ``memforensics`` command group: registers commands and maps errors to exit codes."""

from __future__ import annotations

import sys
import traceback
from typing import Any

import click

from memforensics import __version__
from memforensics.cli.options import exit_codes_epilog
from memforensics.errors import EXIT_TOOLING, MemforensicsError


def _print_error(message: str, hint: str | None) -> None:
    click.echo(f"error: {message}", err=True)
    if hint:
        click.echo(f"hint: {hint}", err=True)


class MemforensicsGroup(click.Group):
    """A group that turns library errors into one-line messages and documented exit codes."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MemforensicsError as exc:
            if ctx.meta.get("memforensics.verbose"):
                traceback.print_exc()
            _print_error(exc.message, exc.hint)
            ctx.exit(exc.exit_code)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except KeyboardInterrupt:
            _print_error("interrupted", None)
            ctx.exit(130)
        except BrokenPipeError:
            # `memforensics … | head`: the reader went away; nothing left to report.
            sys.stderr.close()
            ctx.exit(0)
        except Exception as exc:
            if ctx.meta.get("memforensics.verbose"):
                traceback.print_exc()
            _print_error(
                f"internal error: {type(exc).__name__}: {exc}",
                "rerun with -v for the traceback and report it as a bug",
            )
            ctx.exit(EXIT_TOOLING)


@click.group(
    cls=MemforensicsGroup,
    epilog=exit_codes_epilog(),
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, prog_name="memforensics")
def cli() -> None:
    """Why is a process's memory so much bigger than what it uses, what can be
    given back, and who did the OOM killer take?

    \b
    inspect  live glibc heap report of a running process (via gdb)
    trim     forecast, run and measure malloc_trim on a running process
    parse    the same heap report from saved malloc_info XML (CI gates)
    diff     what changed between two saved dumps
    oom      find OOM kills in the kernel journal, saved logs or /dev/kmsg
    demo     reproduce the classic fragmentation case end to end
    """


def _register() -> None:
    from memforensics.cli import demo, diff, inspect, oom, parse, trim

    for module in (inspect, trim, parse, diff, oom, demo):
        cli.add_command(module.command)


_register()


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="memforensics")
