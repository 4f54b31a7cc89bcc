"""Contracts every command keeps: teaching --help, the exit-code table, one-line errors."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from memforensics.cli import COMMAND_MODULES, COMMAND_SUMMARIES, MemforensicsGroup, cli
from memforensics.errors import EXIT_CODE_TABLE, InputDataError, MemforensicsError

COMMANDS = sorted(COMMAND_MODULES)


def test_top_level_help_lists_every_command_and_exit_codes() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in COMMANDS:
        assert f"  {name} " in result.stdout
    for code, _meaning in EXIT_CODE_TABLE:
        assert f"\n    {code}  " in result.stdout


def test_top_level_help_imports_no_command_and_lists_each_ones_own_line() -> None:
    """`memforensics --help` lists the commands from COMMAND_SUMMARIES without importing
    them (a fresh interpreter: the modules are absent after it); each line is the command's
    own short help, whole in 80 columns."""
    import importlib
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from memforensics.cli import cli\n"
        "try:\n"
        "    cli(['--help'], prog_name='memforensics')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print([m for m in sys.modules if m.startswith('memforensics.cli.')], file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = [name for name in COMMAND_MODULES.values() if name in done.stderr]
    assert loaded == [], done.stderr
    for name, module in COMMAND_MODULES.items():
        line = COMMAND_SUMMARIES[name]
        assert importlib.import_module(module).command.short_help == line
        assert f"  {name}  " in done.stdout and line in done.stdout, (name, done.stdout)
        assert len(f"  {name:8s} {line}") <= 80


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_help_teaches_and_documents_exit_codes(name: str) -> None:
    """Each --help has examples or usage text, --json, and the exit-code table (README.md)."""
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Exit codes:" in result.stdout
    assert all(f"  {code}  " in result.stdout for code, _ in EXIT_CODE_TABLE)
    assert "--json" in result.stdout
    assert "Example" in result.stdout or "memforensics " + name in result.stdout


def test_unknown_command_and_version() -> None:
    assert CliRunner().invoke(cli, ["frobnicate"]).exit_code == 2
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and "memforensics" in result.stdout


def _group_raising(exc: BaseException) -> click.Group:
    group = MemforensicsGroup(name="memforensics")

    @group.command(name="boom")
    @click.option("-v", "verbose", is_flag=True)
    def boom(verbose: bool) -> None:
        if verbose:
            click.get_current_context().find_root().meta["memforensics.verbose"] = True
        raise exc

    return group


def test_library_error_is_one_line_plus_hint_with_its_exit_code() -> None:
    """A MemforensicsError becomes `error:`/`hint:` lines and its class's exit code."""
    err = InputDataError("bad thing\nspread over lines", source="f.xml", line=3, hint="do X")
    result = CliRunner().invoke(_group_raising(err), ["boom"])
    assert result.exit_code == 7
    assert result.stderr.splitlines() == [
        "error: f.xml:3: bad thing spread over lines",
        "hint: do X",
    ]
    assert result.stdout == ""


def test_verbose_shows_the_traceback_too() -> None:
    result = CliRunner().invoke(_group_raising(MemforensicsError("x")), ["boom", "-v"])
    assert "Traceback" in result.stderr and result.stderr.rstrip().endswith("error: x")


def test_unexpected_exception_is_an_internal_error_line_not_a_traceback() -> None:
    result = CliRunner().invoke(_group_raising(ZeroDivisionError("oops")), ["boom"])
    assert result.exit_code == 5
    assert result.stderr.splitlines()[0] == "error: internal error: ZeroDivisionError: oops"
    assert "Traceback" not in result.stderr


def test_interrupt_exits_130() -> None:
    result = CliRunner().invoke(_group_raising(KeyboardInterrupt()), ["boom"])
    assert result.exit_code == 130 and "interrupted" in result.stderr
