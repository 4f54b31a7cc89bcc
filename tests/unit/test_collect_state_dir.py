"""Where `collect` keeps its OOM state by default, and which directories it refuses."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from memforensics.entry import collect_state
from memforensics.entry.collect_state import (
    SYSTEM_STATE_DIR,
    default_state_dir,
    prepare_state_dir,
    state_lock,
)
from memforensics.errors import EXIT_PERMISSION, UnsafeDirectoryError


def test_root_gets_the_system_state_directory() -> None:
    env = {"HOME": "/root", "XDG_STATE_HOME": "/root/.local/state"}
    assert default_state_dir(env, euid=0) == SYSTEM_STATE_DIR == Path("/var/lib/memforensics")


def test_other_users_get_their_xdg_state_directory() -> None:
    env = {"HOME": "/home/ann", "XDG_STATE_HOME": "/srv/ann-state"}
    assert default_state_dir(env, euid=1000) == Path("/srv/ann-state/memforensics")
    # The XDG base directory spec: a relative XDG_STATE_HOME is invalid and ignored.
    relative = {"HOME": "/home/ann", "XDG_STATE_HOME": "state"}
    assert default_state_dir(relative, euid=1000) == Path("/home/ann/.local/state/memforensics")
    assert default_state_dir({"HOME": "/home/ann"}, euid=1000) == Path(
        "/home/ann/.local/state/memforensics"
    )


def test_the_process_identity_decides_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MEMFORENSICS_STATE_DIR", "STATE_DIRECTORY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/home/bob")
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setattr(collect_state.os, "geteuid", lambda: 0)
    assert default_state_dir() == SYSTEM_STATE_DIR
    monkeypatch.setattr(collect_state.os, "geteuid", lambda: 1001)
    assert default_state_dir() == Path("/home/bob/.local/state/memforensics")


def test_environment_overrides_come_first() -> None:
    both = {"MEMFORENSICS_STATE_DIR": "/x/mine", "STATE_DIRECTORY": "/var/lib/unit:/var/lib/b"}
    assert default_state_dir(both, euid=0) == Path("/x/mine")
    # systemd's StateDirectory= (several are colon-separated: the first is ours).
    assert default_state_dir({"STATE_DIRECTORY": "/var/lib/unit:/var/lib/b"}, euid=1000) == Path(
        "/var/lib/unit"
    )
    assert default_state_dir({"MEMFORENSICS_STATE_DIR": ""}, euid=0) == SYSTEM_STATE_DIR


def test_a_new_directory_is_created_private(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "state"
    old = os.umask(0)
    try:
        assert prepare_state_dir(target) == target
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    assert prepare_state_dir(target) == target  # an existing safe directory is fine


def test_a_world_writable_directory_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "state"
    target.mkdir()
    target.chmod(0o777)
    with pytest.raises(UnsafeDirectoryError, match="world-writable") as caught:
        prepare_state_dir(target)
    assert caught.value.exit_code == EXIT_PERMISSION
    assert isinstance(caught.value, PermissionError)
    assert caught.value.hint and "chmod 700" in caught.value.hint
    # The lock (every read of the state goes through it) refuses it too.
    with pytest.raises(UnsafeDirectoryError), state_lock(target):
        pass


def test_another_users_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "state"
    target.mkdir(mode=0o700)
    owner = target.stat().st_uid
    monkeypatch.setattr(collect_state.os, "geteuid", lambda: owner + 1)
    with pytest.raises(UnsafeDirectoryError, match=f"owned by uid {owner}") as caught:
        prepare_state_dir(target)
    assert caught.value.hint and "chown" in caught.value.hint
