"""`memforensics inspect` through click: --help, usage errors and every refusal's exit code."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from memforensics.cli import cli
from memforensics.cli.inspect import save_xml_path
from memforensics.errors import ToolingError
from memforensics.sources.files.atomic_file import write_atomically
from tests.support.targets import c_target, needs_live

NO_SUCH_PID = 4194000  # above the default pid_max of 4194304 minus a margin: never in use


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_help_lists_options_examples_and_exit_codes() -> None:
    code, out, _ = run("inspect", "--help")
    assert code == 0
    for text in ("--name", "--json", "--save-xml", "--timeout", "--gdb", "-v", "Exit codes:"):
        assert text in out
    assert "memforensics inspect 4242" in out
    assert "6  timeout" in out


def test_no_target_is_a_usage_error() -> None:
    code, _, err = run("inspect")
    assert code == 2
    assert "at least one PID" in err


@pytest.mark.parametrize("value", ["0", "soon", "-1s"])
def test_bad_timeout_is_a_usage_error(value: str) -> None:
    code, _, _ = run("inspect", "--timeout", value, "1")
    assert code == 2


def test_no_such_pid_exits_3_with_a_hint() -> None:
    code, out, err = run("inspect", str(NO_SUCH_PID))
    assert code == 3
    assert out == ""
    assert err.startswith(f"error: no process with PID {NO_SUCH_PID}")
    hint = err.split("hint: ", 1)[1].strip()
    assert hint == "check the PID with `ps -p PID`; or select processes by name with --name PATTERN"
    assert "Traceback" not in err


def test_missing_gdb_exits_5_saying_how_to_install_it() -> None:
    code, _, err = run("inspect", "--gdb", "/nonexistent/gdb", str(os.getppid()))
    assert code == 5
    assert "gdb not found" in err
    assert "apt-get install gdb" in err


def test_name_matching_nothing_exits_3() -> None:
    code, _, err = run("inspect", "--name", "no-such-process-name-xyzzy-42")
    assert code == 3
    assert "no process matches --name" in err


def test_kernel_thread_is_refused() -> None:
    code, _, err = run("inspect", "2")  # kthreadd
    assert code == 3
    assert "kernel thread" in err


def test_save_xml_path_per_target() -> None:
    assert save_xml_path("dump.xml", 42, several=False) == Path("dump.xml")
    assert save_xml_path("dump.xml", 42, several=True) == Path("dump.42.xml")
    assert save_xml_path("out/{pid}.xml", 42, several=True) == Path("out/42.xml")


def test_write_atomically_replaces_whole_file_or_fails_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "dump.xml"
    path.write_bytes(b"old")
    write_atomically(path, b"<malloc/>")
    assert path.read_bytes() == b"<malloc/>"
    assert [p.name for p in tmp_path.iterdir()] == ["dump.xml"]
    with pytest.raises(ToolingError) as info:
        write_atomically(tmp_path / "missing-dir" / "dump.xml", b"x")
    assert info.value.exit_code == 5


@needs_live
@pytest.mark.parametrize(
    ("path", "safe_point", "read_only"),
    [
        ((), "no gdb, nothing run in the target", True),  # the default: read from memory
        (("--gdb", "gdb"), "outside the allocator", False),
    ],
)
def test_json_document_of_a_live_target(
    path: tuple[str, ...], safe_point: str, read_only: bool
) -> None:
    with c_target("idle_arenas", "3", "500") as target:
        code, out, err = run("inspect", *path, "--json", str(target.pid))
        assert code == 0, err
        document = json.loads(out)
        assert document["schema"] == "memforensics/heap/1"
        assert document["source"] == f"pid:{target.pid}"  # the form docs/json.md documents
        for key in ("arenas", "system_bytes", "free_bytes", "in_use_bytes", "free_ratio"):
            assert key in document["totals"]
        process = document["process"]
        assert process["pid"] == target.pid
        assert isinstance(process["rss_bytes"], int) and isinstance(process["anon_bytes"], int)
        assert isinstance(document["pause_seconds"], float)
        assert safe_point in document["safe_point"]
        assert (document["read_only"] is not None) is read_only
        assert document["fallback"] is None
        assert document["gdb_fallback"] is None  # kept for old scripts: gdb never stands in
        assert err == ""  # no fallback note


@needs_live
def test_unwritable_save_xml_exits_5(tmp_path: Path) -> None:
    with c_target("idle_arenas", "1", "50") as target:
        target_path = tmp_path / "missing-dir" / "dump.xml"
        code, _, err = run("inspect", "--save-xml", str(target_path), str(target.pid))
        assert code == 5
        assert "cannot write" in err


@needs_live
def test_a_program_that_is_not_gdb_exits_5() -> None:
    with c_target("idle_arenas", "1", "50") as target:
        code, _, err = run("inspect", "--gdb", "/bin/false", str(target.pid))
        assert code == 5
        assert "not a working gdb" in err
        assert target.state() in ("S", "R")


def test_zombie_is_refused() -> None:
    child = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # exited but not reaped: a zombie
            stat = Path(f"/proc/{child.pid}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.01)
        code, _, err = run("inspect", str(child.pid))
        assert code == 3
        assert "zombie" in err
    finally:
        child.wait()


def test_json_shape_follows_the_command_line_not_what_was_running() -> None:
    """One PID: an object. --name: an array, even when one process matches; several PIDs:
    an array, even when one of them is gone (its error on stderr)."""
    with c_target("idle_arenas", "2", "100") as target:
        code, out, err = run("inspect", "--json", str(target.pid))
        assert code == 0, err
        assert isinstance(json.loads(out), dict)
        binary = Path(f"/proc/{target.pid}/exe").resolve().name
        code, out, err = run("inspect", "--json", "--name", f"^{binary}$")
        assert code == 0, err
        documents = json.loads(out)
        assert isinstance(documents, list)
        assert [d["process"]["pid"] for d in documents] == [target.pid]
        code, out, err = run("inspect", "--json", str(target.pid), str(NO_SUCH_PID))
        assert code == 3
        documents = json.loads(out)
        assert isinstance(documents, list)
        assert [d["process"]["pid"] for d in documents] == [target.pid]
