"""gdb's failures become the project's errors in one place (sources/gdb_setup.gdb_error).

The process used as the "target" is this test process: alive, so every rule below is the
one for a live target whose gdb said something went wrong.
"""

from __future__ import annotations

import os
import subprocess
import sys

from memforensics.errors import (
    EXIT_PERMISSION,
    EXIT_TARGET,
    EXIT_TIMEOUT,
    EXIT_TOOLING,
    DeadlineError,
    TargetExitedError,
    TargetPermissionError,
    ThreadVanishedError,
    ToolingError,
)
from memforensics.sources.gdb.gdb_setup import gdb_error
from memforensics.sources.gdb.gdbmi import MiError, MiGdbExited, MiTimeout


def test_a_thread_gone_under_gdb_is_the_targets_race_not_a_tooling_error() -> None:
    """A JVM's compiler thread exiting between gdb's thread list and its register read gave
    "gdb: Couldn't get registers: No such process." and exit 5 ("install gdb" territory)."""
    error = gdb_error(
        MiError("Couldn't get registers: No such process."),
        os.getpid(),
        doing="-stack-list-frames --thread 7",
    )
    assert isinstance(error, ThreadVanishedError)
    assert error.exit_code == EXIT_TARGET
    assert error.pid == os.getpid()
    assert "exited while gdb read it" in error.message


def test_the_same_words_during_our_call_are_not_taken_for_a_thread_race() -> None:
    error = gdb_error(
        MiError("Couldn't get registers: No such process."),
        os.getpid(),
        doing="-data-evaluate-expression malloc_info",
        call=True,
    )
    assert not isinstance(error, ThreadVanishedError)
    assert isinstance(error, ToolingError)
    assert error.exit_code == EXIT_TOOLING


def test_a_process_that_is_gone_is_an_exit_of_the_target() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)  # reaped: the pid names no process now
    error = gdb_error(MiError("ptrace: No such process."), child.pid, doing="-target-attach")
    assert isinstance(error, TargetExitedError)
    assert isinstance(error, ProcessLookupError)


def test_a_call_past_its_deadline_is_a_timeout() -> None:
    error = gdb_error(
        MiTimeout("no answer"),
        os.getpid(),
        doing="-data-evaluate-expression x",
        call=True,
        timeout_seconds=2.0,
    )
    assert isinstance(error, DeadlineError) and isinstance(error, TimeoutError)
    assert error.exit_code == EXIT_TIMEOUT
    assert "2 s" in error.message


def test_a_refused_attach_is_diagnosed_not_taken_for_a_thread_race() -> None:
    """gdb says "ptrace: No such process." also when Yama or a missing capability refuses a
    live process: the attach failure gets its diagnosis (exit 4), never a retry as a thread
    that vanished, nor exit 5."""
    error = gdb_error(
        MiError("ptrace: No such process."), os.getpid(), doing=f"-target-attach {os.getpid()} &"
    )
    assert not isinstance(error, ThreadVanishedError)
    assert isinstance(error, TargetPermissionError) and isinstance(error, PermissionError)
    assert error.exit_code == EXIT_PERMISSION
    assert "gdb said: ptrace: No such process." in error.message


def test_a_deadline_during_the_attach_is_a_timeout_not_a_refusal() -> None:
    """With `--timeout 1ms` the deadline ended while gdb attached: /proc then shows our own gdb
    as the tracer, and the failure read "already traced by TracerPid N (gdb)" (exit 4)."""
    error = gdb_error(
        MiTimeout("gdb did not answer in time"),
        os.getpid(),
        doing=f"-target-attach {os.getpid()} &",
        timeout_seconds=0.001,
    )
    assert isinstance(error, DeadlineError)
    assert error.exit_code == EXIT_TIMEOUT
    assert "0.001 s" in error.message


def test_gdb_dying_during_the_attach_is_gdbs_failure_not_a_refusal() -> None:
    """gdb killed (OOM killer, say) as it attached read as "ptrace refused although you have
    CAP_SYS_PTRACE" (exit 4), and the session then skipped the target's protection."""
    error = gdb_error(MiGdbExited("gdb exited"), os.getpid(), doing=f"-target-attach {os.getpid()}")
    assert isinstance(error, ToolingError)
    assert error.exit_code == EXIT_TOOLING
    assert "gdb exited unexpectedly during -target-attach" in error.message
