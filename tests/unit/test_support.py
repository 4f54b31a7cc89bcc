"""The test harness itself: a target that never says ready fails in time; time zones restore."""

from __future__ import annotations

import os
import sys
import time

import pytest

from tests.support.targets import running
from tests.support.timezone import pinned_timezone


def test_a_target_that_never_says_ready_fails_by_the_deadline() -> None:
    """Half a line and then silence used to block readline() for ever."""
    code = "import sys, time; sys.stdout.write('rea'); sys.stdout.flush(); time.sleep(60)"
    started = time.monotonic()
    with (
        pytest.raises(RuntimeError, match="did not say ready within"),
        running([sys.executable, "-c", code], ready_timeout_seconds=1.0),
    ):
        pass
    assert time.monotonic() - started < 10


def test_a_target_that_dies_first_is_reported_with_its_status() -> None:
    with (
        pytest.raises(RuntimeError, match="exited with 3 before saying ready"),
        running([sys.executable, "-c", "import sys; sys.exit(3)"]),
    ):
        pass


def test_ready_line_split_across_writes_is_read_whole() -> None:
    code = "\n".join(
        [
            "import sys, time",
            "sys.stdout.write(chr(10).join(['noise', 'rea'])); sys.stdout.flush()",
            "time.sleep(0.2)",
            "print('dy pid=1', flush=True); time.sleep(60)",
        ]
    )
    with running([sys.executable, "-c", code]) as target:
        assert target.ready_line == "ready pid=1"


def test_pinned_timezone_puts_the_old_zone_back() -> None:
    before_env = os.environ.get("TZ")
    before = time.strftime("%z", time.localtime(0))
    with pinned_timezone("Asia/Kolkata"):
        assert time.strftime("%z", time.localtime(0)) == "+0530"
    assert os.environ.get("TZ") == before_env
    assert time.strftime("%z", time.localtime(0)) == before
