"""Under CI a skipped test fails the run (tests/conftest.py): a skip there means a missing
install step. Checked by running pytest on a suite of one skip and one pass."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


def _run(tmp_path: Path, ci: bool) -> int:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_one.py").write_text(
        "import pytest\n\ndef test_skips():\n    pytest.skip('no tool')\n\n"
        "def test_passes():\n    pass\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(CONFTEST.parents[1])  # the conftest imports tests.support
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        env=env,
        capture_output=True,
        check=False,
        cwd=tmp_path,
    ).returncode


def test_a_skip_fails_the_run_under_ci(tmp_path: Path) -> None:
    assert _run(tmp_path, ci=True) == 1


def test_a_skip_is_a_skip_elsewhere(tmp_path: Path) -> None:
    assert _run(tmp_path, ci=False) == 0
