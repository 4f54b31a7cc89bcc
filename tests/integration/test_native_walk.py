"""The residency walk's optional C loop against its pure-Python twin, and a build without a
compiler: both ways measure the same heap to the byte, and ``pip`` builds a working package
when no C compiler is there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from memforensics.entry.readers.gdb import read_heap_residency
from memforensics.sources.glibc import heapcopy
from tests.integration.test_residency_live import arenas_target
from tests.support.residency_figures import walk_figures
from tests.support.targets import have_cc

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not have_cc(), reason="no C compiler (cc) to build the target programs"),
]


@pytest.mark.skipif(
    not heapcopy.native_walk_available(),
    reason="the C loop is not in use (not built here, or MEMFORENSICS_PURE_PYTHON is set)",
)
def test_c_and_python_loops_measure_the_same_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wholly resident arenas, then after a trim (partly resident pages): same figures."""
    with arenas_target("3", "3000", "1024", "runs", "0") as arenas:
        for trimmed in (False, True):
            if trimmed:
                arenas.trim()
            dump = arenas.dump()
            native = read_heap_residency(arenas.pid, dump)
            with monkeypatch.context() as patch:
                patch.setattr(heapcopy, "_native", None)
                python = read_heap_residency(arenas.pid, dump)
            assert walk_figures(native) == walk_figures(python)
            assert all(row.free_method == "walked" for row in native.arenas)
            # Worker arenas: every free page written, so resident until the trim released it.
            resident = [row.free_resident_bytes for row in native.arenas[1:]]
            measured = [row.measured_free_bytes for row in native.arenas[1:]]
            assert (resident == measured) is not trimmed


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a compiler to show it is unused")
def test_without_a_compiler_pip_builds_a_pure_python_package(tmp_path: Path) -> None:
    """CC points at a compiler that always fails: the wheel still builds, holds no C loop,
    and the package from it walks a real heap with the Python loop."""
    source = tmp_path / "source"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(".venv", ".git", ".nox", "build", "*.so", "__pycache__"),
    )
    env = dict(os.environ, CC="false", CXX="false", LDSHARED="false")
    wheels = tmp_path / "wheels"
    # As `pip install .` does: an isolated build environment, the configured package index.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)],
        check=True,
        env=env,
        capture_output=True,
        timeout=240,
    )
    (wheel,) = wheels.glob("memforensics-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(tmp_path / "installed")
    assert "memforensics/sources/glibc/glibc_walk.py" in names
    assert not [n for n in names if n.endswith(".so")]
    probe = (
        "import sys\n"
        "from memforensics.sources.glibc import heapcopy\n"
        "from memforensics.entry.readers.gdb import read_heap_residency\n"
        "from memforensics.model.heap import Arena, HeapDump\n"
        "assert not heapcopy.native_walk_available(), heapcopy.__file__\n"
        "main = Arena(0, (), 0, 0, 1, 0, 0, 0)\n"
        "dump = HeapDump('1', (main,), 0, 0, 1, 0, 0, 0, 0, 0)\n"
        "row = read_heap_residency(int(sys.argv[1]), dump).arena(0)\n"
        "assert row is not None and row.walked_chunks > 0, row\n"
        "print(heapcopy.__file__)\n"
    )
    code = "junk = [bytearray(3000) for _ in range(3000)]\ndel junk[::2]\nimport time\n"
    target = subprocess.Popen([sys.executable, "-c", code + "time.sleep(120)"])
    try:
        # -S: no site hooks, so this checkout's editable install cannot shadow the wheel;
        # the dependencies come from this environment's site-packages, after the wheel.
        path = os.pathsep.join([str(tmp_path / "installed"), sysconfig.get_paths()["purelib"]])
        result = subprocess.run(
            [sys.executable, "-S", "-c", probe, str(target.pid)],
            check=False,
            cwd=tmp_path,  # not the checkout: "-c" puts the working directory on sys.path
            env=dict(os.environ, PYTHONPATH=path),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        target.kill()
        target.wait()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(str(tmp_path / "installed"))
