"""libc_elf.parse_libc through files/digest_cache.py: a libc's parse kept under its bytes'
SHA-256 gives the very image a fresh parse gives, wherever the libc is mapped; any other
bytes, or a kept document that does not hold up, are parsed afresh; nothing of anyone else's
is read. The oracle is _parse_libc itself, run on this test's own libc."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memforensics.errors import NotGlibcMallocError
from memforensics.sources.files import digest_cache
from memforensics.sources.glibc import libc_elf
from memforensics.sources.proc.elf_dynsym import read_mapped_file
from memforensics.sources.proc.procmaps import read_smaps

SHIFT = 1 << 32  # another place the same libc may be mapped at


@pytest.fixture
def libc() -> tuple[bytes, int, str]:
    """This process's libc: its bytes, where it is mapped, its path."""
    pid = os.getpid()
    path = next(m.path for m in read_smaps(pid) if m.path and "/libc.so" in m.path)
    mapped = read_mapped_file(pid, path)
    return mapped.data, mapped.base, path


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    libc_elf._PARSED.forget()
    digest_cache.disable_disk()
    yield
    libc_elf._PARSED.forget()
    digest_cache.disable_disk()


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bases _parse_libc is called with from now on (it still parses)."""
    calls: list[int] = []
    real = libc_elf._parse_libc

    def counted(data: bytes, base: int, path: str) -> libc_elf.LibcImage:
        calls.append(base)
        return real(data, base, path)

    monkeypatch.setattr(libc_elf, "_parse_libc", counted)
    return calls


def test_a_kept_parse_is_the_fresh_parse_wherever_the_libc_is_mapped(
    libc: tuple[bytes, int, str], parses: list[int]
) -> None:
    data, base, path = libc
    first = libc_elf.parse_libc(data, base, path)
    assert first == libc_elf._parse_libc(data, base, path)
    parses.clear()
    for at in (base, base + SHIFT, base - SHIFT):
        assert libc_elf.parse_libc(data, at, path) == libc_elf._parse_libc(data, at, path)
    assert parses == [base, base + SHIFT, base - SHIFT]  # (the oracle's calls alone)
    assert libc_elf.parse_libc(data, base, "/elsewhere/libc.so.6").path == "/elsewhere/libc.so.6"


def test_other_bytes_are_parsed_afresh(libc: tuple[bytes, int, str], parses: list[int]) -> None:
    data, base, path = libc
    libc_elf.parse_libc(data, base, path)
    # One byte in the middle of its code changed: the same symbols, other bytes.
    changed = bytearray(data)
    changed[len(data) // 2] ^= 0xFF
    libc_elf.parse_libc(bytes(changed), base, path)
    assert parses == [base, base]


def test_the_program_keeps_the_parse_on_disk_for_its_users_alone(
    libc: tuple[bytes, int, str], parses: list[int], tmp_path: Path
) -> None:
    data, base, path = libc
    digest_cache.enable_disk(tmp_path / "cache")
    expected = libc_elf.parse_libc(data, base, path)
    files = list((tmp_path / "cache").glob("libc-image-*.json"))
    assert [f.name for f in files] == [f"libc-image-{digest_cache.digest_of(data)}.json"]
    assert files[0].stat().st_mode & 0o077 == 0
    libc_elf._PARSED.forget()  # (a later run: nothing in memory)
    assert libc_elf.parse_libc(data, base + SHIFT, path) == libc_elf._parse_libc(
        data, base + SHIFT, path
    )
    assert parses == [base, base + SHIFT]  # (the second: the oracle's)
    assert libc_elf.parse_libc(data, base, path) == expected


def _spoil(kept: Path, how: str) -> None:
    """The kept file ``kept`` made one that must not be trusted, ``how``."""
    if how == "group-writable":
        kept.chmod(0o620)
        return
    if how == "folder world-writable":
        kept.parent.chmod(0o777)
        return
    wrapper = json.loads(kept.read_text())
    document = wrapper["document"]
    if how == "other digest":
        wrapper["digest"] = "0" * 64
    elif how == "unsorted":
        starts = document["function_starts"]
        starts[0], starts[1] = starts[1], starts[0]
    elif how == "no malloc":
        del document["functions"]["malloc"]
    elif how == "a name not text":
        document["function_names"][3] = 7
    elif how == "a bool for an address":
        document["restore_rt"] = True
    elif how == "an extra key":
        document["more"] = 1
    elif how == "names short":
        document["function_names"].pop()
    elif how == "a range of three":
        document["allocator_range"].append(0)
    elif how == "an address too far":
        document["functions"]["free"] = 1 << 64
    kept.write_text(json.dumps(wrapper))
    kept.chmod(0o600)


@pytest.mark.parametrize(
    "how",
    [
        "group-writable",
        "folder world-writable",
        "other digest",
        "unsorted",
        "no malloc",
        "a name not text",
        "a bool for an address",
        "an extra key",
        "names short",
        "a range of three",
        "an address too far",
    ],
)
def test_a_kept_file_not_ours_alone_or_not_holding_up_is_parsed_again(
    libc: tuple[bytes, int, str], parses: list[int], tmp_path: Path, how: str
) -> None:
    data, base, path = libc
    digest_cache.enable_disk(tmp_path / "cache")
    expected = libc_elf.parse_libc(data, base, path)
    _spoil(tmp_path / "cache" / f"libc-image-{digest_cache.digest_of(data)}.json", how)
    libc_elf._PARSED.forget()
    assert libc_elf.parse_libc(data, base, path) == expected
    assert parses == [base, base]


def test_a_file_that_is_not_glibc_is_refused_every_time_and_nothing_kept(
    tmp_path: Path, parses: list[int]
) -> None:
    digest_cache.enable_disk(tmp_path / "cache")
    data = Path(sys.executable).read_bytes()  # (an ELF file exporting no malloc)
    for _ in range(2):
        with pytest.raises(NotGlibcMallocError):
            libc_elf.parse_libc(data, 0x7F0000000000, sys.executable)
    assert len(parses) == 2
    assert not list((tmp_path / "cache").glob("libc-image-*"))


def test_past_its_bound_the_oldest_documents_go(tmp_path: Path) -> None:
    digest_cache.enable_disk(tmp_path)
    cache = digest_cache.DigestCache("kind", max_files=2)
    for number in range(3):
        cache.put(f"{number:064x}", {"n": number})
        os.utime(tmp_path / f"kind-{number:064x}.json", ns=(number, number))
    cache.put(f"{3:064x}", {"n": 3})
    left = sorted(p.name for p in tmp_path.glob("kind-*.json"))
    assert left == [f"kind-{2:064x}.json", f"kind-{3:064x}.json"]
    cache.forget()
    assert cache.get(f"{3:064x}") == {"n": 3}
    assert cache.get(f"{0:064x}") is None


def test_without_the_program_nothing_is_written(
    libc: tuple[bytes, int, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library alone (a test, another program) keeps parses in memory only."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    data, base, path = libc
    libc_elf.parse_libc(data, base, path)
    assert not list(tmp_path.rglob("*"))


def test_the_program_keeps_a_targets_libc_and_a_second_run_only_reads_it(tmp_path: Path) -> None:
    """`memforensics inspect --json` of a sleeping process twice with a fresh cache: the first
    keeps its libc's parse (the user's alone), the second gives the same arenas and leaves
    the file as it was."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    target = subprocess.Popen(["sleep", "120"])
    try:

        def run() -> list[dict[str, Any]]:
            done = subprocess.run(
                [sys.executable, "-m", "memforensics", "inspect", "--json", str(target.pid)],
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
                check=True,
            )
            arenas: list[dict[str, Any]] = json.loads(done.stdout)["arenas"]
            return arenas

        first = run()
        kept = list((tmp_path / "xdg" / "memforensics").glob("libc-image-*.json"))
        assert len(kept) == 1
        before = kept[0].stat()
        assert before.st_mode & 0o077 == 0
        assert run() == first
        after = kept[0].stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    finally:
        target.kill()
        target.wait()
