"""A gdb that cannot put a thread back after a call on this machine is refused before any
target is touched (sources/gdb/gdb_probe.py).

Debian 12's gdb 13 on a CPU with AMX writes back a 2,696-byte XSAVE area where the kernel
takes the whole ~11 KiB one: the call's thread is left in the called function and the process
dies when it resumes (seen: a plain ``gdb -p PID -ex 'call (int)malloc_trim(0)'`` killed its
target here). The oracle is the kernel: the target is alive and asleep afterwards.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from memforensics.cli import cli
from memforensics.errors import EXIT_TOOLING, GdbUnavailableError
from memforensics.sources.gdb import gdb_probe
from memforensics.sources.gdb.gdb_probe import check_call_restores, cpu_has_amx
from tests.support.targets import c_target

SYSTEM_GDB = "/usr/bin/gdb"


def _major(gdb: str) -> int:
    first = subprocess.run([gdb, "--version"], capture_output=True, text=True, check=True)
    return int(first.stdout.split("\n", 1)[0].rsplit(" ", 1)[-1].split(".", 1)[0])


def test_the_system_gdb_is_refused_exactly_where_it_would_break_a_target() -> None:
    """On an AMX CPU gdb 13 is refused, with the why and a way out; elsewhere it is used."""
    with c_target("idle_arenas", "2", "100") as target:
        result = CliRunner().invoke(cli, ["inspect", "--gdb", SYSTEM_GDB, str(target.pid)])
        assert target.alive() and target.state() in ("S", "R")
        if cpu_has_amx() and _major(SYSTEM_GDB) < 14:
            assert result.exit_code == EXIT_TOOLING, result.stderr
            assert "extended register state (AMX)" in result.stderr
            assert "hint:" in result.stderr
        else:
            assert result.exit_code == 0, result.stderr


def test_a_gdb_that_restores_the_thread_passes_the_probe() -> None:
    """The gdb the tests drive (first on PATH) makes a real call and gives the thread back."""
    gdb = shutil.which("gdb")
    assert gdb is not None
    check_call_restores(gdb)  # raises GdbUnavailableError if it would break a target
    with c_target("idle_arenas", "2", "100") as target:
        result = CliRunner().invoke(cli, ["trim", "--gdb", gdb, str(target.pid)])
        assert result.exit_code == 0, result.stderr
        assert target.alive() and target.state() in ("S", "R")


def test_the_probe_names_the_failure_on_this_machine() -> None:
    if not (cpu_has_amx() and _major(SYSTEM_GDB) < 14):
        check_call_restores(SYSTEM_GDB)
        return
    try:
        check_call_restores(SYSTEM_GDB)
    except GdbUnavailableError as exc:
        assert "cannot make a call safely" in exc.message
    else:
        raise AssertionError("gdb 13 on an AMX CPU passed the probe")


def test_a_verdict_is_kept_per_binary_and_probed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe costs a gdb start and a call: it runs once per gdb binary (and kernel), its
    verdict kept in the user's cache and found again by the next run."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    starts = tmp_path / "starts"
    fake = tmp_path / "gdb"
    fake.write_text(f"#!/bin/sh\necho started >> {starts}\n")
    fake.chmod(0o755)
    info = fake.stat()
    key = (str(fake), info.st_mtime_ns, info.st_size)
    assert gdb_probe._remembered(key) is None  # not a gdb: no call made, not the probe's to judge
    assert gdb_probe._remembered(key) is None
    assert starts.read_text().count("started") == 1
    kept = Path(gdb_probe._verdict_file(key))
    kept.write_text("it cannot write back this CPU's extended register state")
    assert gdb_probe._remembered(key) == "it cannot write back this CPU's extended register state"
