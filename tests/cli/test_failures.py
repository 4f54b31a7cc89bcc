"""Errors at the CLI boundary: the library's hint plus the flag of *this* command that helps.

The library never names a flag (it cannot know which command runs it); the CLI adds one, and
only a flag the running command really has.
"""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from memforensics.cli import MemforensicsGroup, cli
from memforensics.errors import (
    EXIT_PERMISSION,
    EXIT_TARGET,
    EXIT_TIMEOUT,
    EXIT_TOOLING,
    DeadlineError,
    GdbUnavailableError,
    MemforensicsError,
    NoSuchProcessError,
    TargetExitedError,
    TargetPermissionError,
    TargetStoppedError,
)

NO_SUCH_PID = "4194000"


def _group(exc: MemforensicsError, *options: str) -> click.Group:
    """A command with the given options that raises ``exc``."""
    group = MemforensicsGroup(name="memforensics")

    def boom(**_: object) -> None:
        raise exc

    for option in options:
        boom = click.option(option, is_flag=True)(boom)
    group.command(name="boom")(boom)
    return group


def _hint(result: click.testing.Result) -> str:
    lines = result.stderr.splitlines()
    return next((line for line in lines if line.startswith("hint: ")), "")


@pytest.mark.parametrize(
    ("exc", "option", "code"),
    [
        (DeadlineError("no safe point in 1 s", pid=1), "--timeout", EXIT_TIMEOUT),
        (GdbUnavailableError("gdb not found"), "--gdb", EXIT_TOOLING),
        (TargetStoppedError("PID 1 is stopped", pid=1), "--allow-stopped", EXIT_TARGET),
        (NoSuchProcessError("no PID 1", pid=1), "--name", EXIT_TARGET),
    ],
)
def test_flag_hint_is_added_where_the_command_has_the_flag(
    exc: MemforensicsError, option: str, code: int
) -> None:
    with_flag = CliRunner().invoke(_group(exc, option), ["boom"])
    assert with_flag.exit_code == code
    hint = _hint(with_flag)
    assert exc.hint is not None and hint.startswith(f"hint: {exc.hint}")
    assert option in hint
    without = CliRunner().invoke(_group(exc), ["boom"])
    assert _hint(without) == f"hint: {exc.hint}"  # the library's words, no flag it lacks


def test_library_hints_name_no_flags() -> None:
    for cls in (DeadlineError, GdbUnavailableError, TargetStoppedError, NoSuchProcessError):
        assert "--" not in (cls.default_hint or ""), cls


def test_an_exited_target_gets_no_name_hint() -> None:
    """TargetExitedError is a NoSuchProcessError, but --name cannot bring a process back."""
    exc = TargetExitedError("PID 1 exited during the session", pid=1)
    assert "--name" not in _hint(CliRunner().invoke(_group(exc, "--name"), ["boom"]))


def test_permission_error_keeps_its_exit_code_and_hint() -> None:
    exc = TargetPermissionError("not allowed to trace PID 1", pid=1)
    result = CliRunner().invoke(_group(exc, "--name"), ["boom"])
    assert result.exit_code == EXIT_PERMISSION and _hint(result) == f"hint: {exc.hint}"


def test_real_missing_pid_hint_offers_name() -> None:
    result = CliRunner().invoke(cli, ["inspect", NO_SUCH_PID])
    assert result.exit_code == EXIT_TARGET
    assert "--name" in _hint(result)


def test_several_targets_print_each_error_once_through_the_same_printer() -> None:
    """inspect with several PIDs reports each failure as `error: PID N: …` + hint, goes on."""
    result = CliRunner().invoke(cli, ["inspect", NO_SUCH_PID, "4194001"])
    assert result.exit_code == EXIT_TARGET
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert [line.split(":")[1].strip() for line in errors] == ["PID 4194000", "PID 4194001"]
    assert result.stderr.count("hint: ") == 2
