"""A 32-bit (i386) program is refused before anything touches it: memforensics reads glibc's
64-bit heap layout only (8-byte words, 64 MiB sub-heaps), and would read a 32-bit heap wrong.

The target is tests/targets/proc_idle.c built with ``cc -m32`` (Debian's gcc-multilib, which
these tests install like the nox session does when root; they skip saying why where they
cannot). The oracle for "32-bit" is ``file``-like: the ELF header of the binary built here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memforensics.errors import TargetError
from memforensics.sources.proc import process_facts, target_check
from tests.support.targets import compile_target, have_cc, running

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not have_cc(), reason="no C compiler (cc) to build the target programs"),
]


def _build_32bit() -> Path:
    """proc_idle built for i386, installing gcc-multilib if needed (root only)."""
    try:
        return compile_target("proc_idle", "-m32")
    except subprocess.CalledProcessError:
        pass
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("cc -m32 does not link here (gcc-multilib missing) and apt-get is not usable")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    installed = subprocess.run(
        ["apt-get", "install", "-y", "-qq", "gcc-multilib"],
        env=env,
        capture_output=True,
        check=False,
        timeout=600,
    )
    if installed.returncode != 0:
        pytest.skip("apt-get install gcc-multilib failed here")
    try:
        return compile_target("proc_idle", "-m32")
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cc -m32 still fails: {exc.stderr.decode(errors='replace')[-200:]}")


def test_a_32bit_program_is_refused_with_exit_3_and_a_hint() -> None:
    binary = _build_32bit()
    assert binary.read_bytes()[:5] == b"\x7fELF\x01", "not an ELFCLASS32 binary"
    try:
        started = running([str(binary)])
        target = started.__enter__()
    except (OSError, RuntimeError) as exc:  # a kernel without IA32 emulation
        pytest.skip(f"this kernel does not run 32-bit programs: {exc}")
    try:
        with pytest.raises(TargetError, match="32-bit") as refused:
            target_check.check_target(target.pid)
        assert refused.value.exit_code == 3
        assert refused.value.hint and "64-bit" in refused.value.hint

        command = subprocess.run(
            [sys.executable, "-m", "memforensics", "inspect", str(target.pid)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert command.returncode == 3, command.stderr
        assert "32-bit" in command.stderr
        # Refused before any attach: the target runs on, untraced.
        assert target.alive()
        assert process_facts.read_process(target.pid).tracer_pid == 0
    finally:
        started.__exit__(None, None, None)
