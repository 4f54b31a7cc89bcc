"""The watchdog's program starts as watchdog_link starts it: from the package root alone,
without site-packages (-S -s), so a move of the package's files cannot silently leave every
session without its watchdog."""

from __future__ import annotations

import os
import subprocess
import sys

from memforensics.sources.gdb import watchdog_link


def test_the_watchdog_program_imports_from_the_package_root_alone() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = watchdog_link.package_root()
    program = watchdog_link._WATCHDOG_PROGRAM.replace("sys.exit(main(sys.argv[1:]))", "print(main)")
    assert program != watchdog_link._WATCHDOG_PROGRAM
    done = subprocess.run(
        [sys.executable, "-S", "-s", "-c", program],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "function main" in done.stdout
