"""sources/files/code_cache.py: dataclasses' methods from this user's cache of compiled code,
the same classes as compiled, and no file of anyone else's ever run."""

from __future__ import annotations

import dataclasses
import marshal
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memforensics.sources.files import code_cache
from tests.unit.test_malloc_xml import MODERN

# A class statement run in a fresh namespace, so that its dataclass is made again at each run
# (frozen, defaults, a factory, a field out of the comparison, a post-init, slots).
CLASSES = """
import dataclasses

@dataclasses.dataclass(frozen=True)
class Frozen:
    name: str
    size_bytes: int = 0
    tags: tuple[str, ...] = ()
    notes: list[str] = dataclasses.field(default_factory=list, compare=False)

@dataclasses.dataclass
class Plain:
    count: int
    total: int = 0

    def __post_init__(self) -> None:
        self.total = max(self.total, self.count)

@dataclasses.dataclass(frozen=True, slots=True, order=True)
class Ordered:
    low: int
    high: int
"""


def made() -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "cached_classes"}
    exec(compile(CLASSES, "<classes>", "exec", dont_inherit=True), namespace)
    return namespace


def behaviour(namespace: dict[str, Any]) -> list[Any]:
    """What the three classes do, as plain values to compare."""
    frozen, plain, ordered = namespace["Frozen"], namespace["Plain"], namespace["Ordered"]
    a = frozen("a", 3, ("x",), ["n"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.size_bytes = 4
    return [
        repr(a),
        a == frozen("a", 3, ("x",), ["other"]),
        hash(a) == hash(frozen("a", 3, ("x",))),
        frozen("b").notes is not frozen("b").notes,
        repr(plain(5)),
        plain(2, 9) == plain(2, 9),
        repr(sorted([ordered(2, 1), ordered(1, 5), ordered(1, 2)])),
        [f.name for f in dataclasses.fields(ordered)],
    ]


@pytest.fixture
def restored() -> Iterator[None]:
    yield
    code_cache.uninstall()


def test_classes_made_through_the_cache_are_the_classes_compiled(
    tmp_path: Path, restored: None
) -> None:
    """The first run compiles every method and keeps it; a second run, from the file, compiles
    none; both make classes with the same methods (the same bytecode) and behaviour as
    dataclasses makes without the cache."""
    plain = made()
    path = tmp_path / "cache" / "table.marshal"
    first = code_cache.install(path)
    cached_first = made()
    assert first.compiled > 0
    first.save()
    assert path.is_file()

    second = code_cache.install(path)
    cached_second = made()
    assert second.compiled == 0
    assert len(second.used) == first.compiled

    expected = behaviour(plain)
    assert behaviour(cached_first) == expected
    assert behaviour(cached_second) == expected
    for name in ("Frozen", "Plain", "Ordered"):
        for method in ("__init__", "__repr__", "__eq__"):
            compiled = getattr(plain[name], method).__code__
            assert getattr(cached_second[name], method).__code__.co_code == compiled.co_code
        # (Compiled as dataclasses' own exec compiles: no __future__ flags of the cache's.)
        init = cached_second[name].__init__
        assert init.__annotations__ == plain[name].__init__.__annotations__


def test_without_install_dataclasses_use_the_builtin_exec(tmp_path: Path, restored: None) -> None:
    cache = code_cache.install(tmp_path / "table.marshal")
    code_cache.uninstall()
    made()
    assert cache.compiled == 0
    assert not hasattr(dataclasses, "exec")


CALLER_MARK = "the caller's globals"


def test_without_globals_the_code_runs_in_the_callers_namespace(tmp_path: Path) -> None:
    """As the built-in exec called there: the functions it defines see the caller's module."""
    cache = code_cache.CodeCache(tmp_path / "table.marshal")
    defined: dict[str, Any] = {}
    cache.exec("def f():\n return CALLER_MARK\n", None, defined)
    assert defined["f"]() == CALLER_MARK
    assert defined["f"].__globals__ is globals()


def test_a_run_that_compiled_nothing_does_not_write(tmp_path: Path) -> None:
    path = tmp_path / "table.marshal"
    cache = code_cache.CodeCache(path)
    cache.save()
    assert not path.exists()


def _table_file(tmp_path: Path, table: object) -> Path:
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    path = folder / "table.marshal"
    path.write_bytes(marshal.dumps(table))
    path.chmod(0o600)
    return path


def _a_real_table() -> dict[str, Any]:
    text = "def f():\n return 1\n"
    return {text: compile(text, "<string>", "exec", dont_inherit=True)}


def test_a_private_table_is_read(tmp_path: Path) -> None:
    path = _table_file(tmp_path, _a_real_table())
    assert list(code_cache.load_table(path)) == list(_a_real_table())


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda p: p.chmod(0o666), id="file writable by others"),
        pytest.param(lambda p: p.chmod(0o620), id="file writable by its group"),
        pytest.param(lambda p: p.parent.chmod(0o777), id="folder writable by others"),
        pytest.param(lambda p: p.write_bytes(p.read_bytes()[:-7]), id="truncated"),
        pytest.param(lambda p: p.write_bytes(os.urandom(512)), id="not marshal"),
        pytest.param(lambda p: p.write_bytes(marshal.dumps([1, 2])), id="not a table"),
        pytest.param(lambda p: p.write_bytes(marshal.dumps({"x": b"code"})), id="not code"),
        pytest.param(lambda p: (p.unlink(), p.mkdir()), id="a folder"),
        pytest.param(lambda p: p.unlink(), id="missing"),
    ],
)
def test_a_table_that_is_not_ours_alone_or_not_a_table_is_no_table(
    tmp_path: Path, spoil: Any
) -> None:
    path = _table_file(tmp_path, _a_real_table())
    spoil(path)
    assert code_cache.load_table(path) == {}


def test_a_foreign_owner_is_no_table(tmp_path: Path) -> None:
    """A file of another user's (root may chown; others see their own files only) is not read."""
    path = _table_file(tmp_path, _a_real_table())
    if os.geteuid() != 0:
        path = Path("/etc/hostname")  # (root's, never ours: refused for its owner)
    else:
        os.chown(path, 65534, 65534)
    assert code_cache.load_table(path) == {}


def test_a_table_past_its_bound_keeps_this_runs_texts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restored: None
) -> None:
    """Texts of classes no longer made (an older version's) are dropped once the table is past
    MAX_ENTRIES; those this run used stay."""
    texts = [f"def old_{i}():\n return {i}\n" for i in range(5)]
    stale = {t: compile(t, "<string>", "exec", dont_inherit=True) for t in texts}
    path = _table_file(tmp_path, stale)
    monkeypatch.setattr(code_cache, "MAX_ENTRIES", 3)
    cache = code_cache.install(path)
    made()
    cache.save()
    kept = code_cache.load_table(path)
    assert set(kept) == cache.used
    assert not set(kept) & set(stale)


def test_a_cache_that_cannot_be_written_is_no_error(tmp_path: Path, restored: None) -> None:
    blocker = tmp_path / "a file"
    blocker.write_text("not a folder")
    cache = code_cache.install(blocker / "table.marshal")
    made()
    cache.save()  # (no exception: the next run compiles again)
    assert cache.compiled > 0
    assert list(tmp_path.iterdir()) == [blocker]


def test_the_program_keeps_its_table_and_a_second_run_only_reads_it(tmp_path: Path) -> None:
    """`memforensics parse --json` twice with a fresh cache: the first writes the table (the
    user's alone), the second gives the same document and leaves the table as it was (it
    compiled nothing, so wrote nothing)."""
    dump = tmp_path / "dump.xml"
    dump.write_bytes(MODERN)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}

    def run() -> str:
        done = subprocess.run(
            [sys.executable, "-m", "memforensics", "parse", "--json", str(dump)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=True,
        )
        assert done.stderr == ""
        return done.stdout

    first = run()
    tables = list((tmp_path / "xdg" / "memforensics").glob("dataclass-code-*.marshal"))
    assert len(tables) == 1
    before = tables[0].stat()
    assert before.st_mode & 0o077 == 0
    assert len(code_cache.load_table(tables[0])) > 50
    assert run() == first
    after = tables[0].stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
