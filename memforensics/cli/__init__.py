"""The ``memforensics`` command group: registers commands and maps errors to exit codes."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from memforensics import __version__
from memforensics.cli.failures import (
    EXIT_INTERRUPTED,
    command_options,
    exit_code_for,
    print_error,
    report_failure,
)
from memforensics.cli.options import exit_codes_epilog
from memforensics.errors import MemforensicsError

# Command name -> module; imported only when the command runs (or --help lists it), so
# `parse` never pays for loading the gdb machinery.
COMMAND_MODULES = {
    "inspect": "memforensics.cli.inspect",
    "trim": "memforensics.cli.trim",
    "parse": "memforensics.cli.parse",
    "diff": "memforensics.cli.diff",
    "oom": "memforensics.cli.oom",
    "demo": "memforensics.cli.demo",
    "collect": "memforensics.cli.collect",
    "watch": "memforensics.cli.watch",
    "report": "memforensics.cli.report",
    "census": "memforensics.cli.census",
}

# Each command's line in `memforensics --help`: listed from here, so that the listing imports
# no command (importing all ten took 0.6 s); each command's own short_help is this line.
COMMAND_SUMMARIES = {
    "inspect": "Free vs in use per arena, and where the RSS went (live heap).",
    "trim": "Give free heap memory back with malloc_trim, and prove it.",
    "parse": "Report on saved malloc_info XML dumps (FILE, or - for stdin).",
    "diff": "Compare two saved dumps or censuses, OLD then NEW.",
    "oom": "Find every OOM kill in the kernel log: who, when, how big.",
    "demo": "Reproduce the classic glibc case end to end.",
    "collect": "Inspect processes and count OOM kills, for Prometheus.",
    "watch": "Watch heaps over time: a leak or fragmentation?",
    "report": "Leak or fragmentation, per process: HTML, Markdown, JSON.",
    "census": "Count a heap's live chunks by type (C++, Python, text...).",
}


def _print_traceback() -> None:
    import traceback  # only with -v: not worth loading on every start

    traceback.print_exc()


class MemforensicsGroup(click.Group):
    """A group that loads commands lazily and turns library errors into one-line
    messages and documented exit codes."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [
            *COMMAND_MODULES,
            *(n for n in super().list_commands(ctx) if n not in COMMAND_MODULES),
        ]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMAND_SUMMARIES[name]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module_name = COMMAND_MODULES.get(cmd_name)
        if module_name is None:
            return super().get_command(ctx, cmd_name)
        command: click.Command = importlib.import_module(module_name).command
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MemforensicsError as exc:
            if ctx.meta.get("memforensics.verbose"):
                _print_traceback()
            # The subcommand's context is gone by now; its options decide the flag hints.
            name = ctx.invoked_subcommand
            command = self.get_command(ctx, name) if name else None
            report_failure(exc, options=command_options(command))
            ctx.exit(exit_code_for(exc))
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except KeyboardInterrupt as exc:
            # Ctrl-C is 130; a SIGTERM/SIGHUP turned into an exception carries its own status.
            status = exit_code_for(exc)
            print_error("interrupted" if status == EXIT_INTERRUPTED else f"interrupted: {exc}")
            ctx.exit(status)
        except BrokenPipeError:
            # `memforensics … | head`: the reader went away; nothing left to report.
            sys.stderr.close()
            ctx.exit(0)
        except Exception as exc:
            if ctx.meta.get("memforensics.verbose"):
                _print_traceback()
            print_error(
                f"internal error: {type(exc).__name__}: {exc}",
                "rerun with -v for the traceback and report it as a bug",
            )
            ctx.exit(exit_code_for(exc))


@click.group(
    cls=MemforensicsGroup,
    epilog=exit_codes_epilog(),
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, prog_name="memforensics")
def cli() -> None:
    """Why is a process's memory so much bigger than what it uses, what can be
    given back, and who did the OOM killer take?

    Start with `memforensics demo` to see the classic glibc fragmentation case
    end to end, then `memforensics inspect PID` on your own process. Every
    command takes --help and --json.
    """


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="memforensics")
