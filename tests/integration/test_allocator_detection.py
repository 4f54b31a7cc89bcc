"""Which allocator serves malloc, found from the process itself: an allocator linked into the
executable (named by its functions in the symbol tables) and a renamed copy beside glibc's
malloc (Redis's bundled ``je_``, Rust's ``_rjem_``), as docs/allocators.md says.

The oracle is the build: each target is compiled here either with jemalloc's static library
linked in (Debian's libjemalloc-dev) or with a renamed ``mallctl`` of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memforensics.sources.proc import allocator_detect
from tests.support.targets import compile_target, live_skip_reason, proc_status, running

_SKIP = live_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]

MEMFORENSICS = [sys.executable, "-m", "memforensics"]
STATIC_JEMALLOC = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.a")


def _inspect(pid: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MEMFORENSICS, "inspect", "--json", str(pid)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_jemalloc_linked_into_the_executable_is_named_and_not_called() -> None:
    if not STATIC_JEMALLOC.exists():
        pytest.skip(f"{STATIC_JEMALLOC} is missing: install the Debian package libjemalloc-dev")
    binary = compile_target("linked_allocator", str(STATIC_JEMALLOC), "-ldl", "-lm")
    with running([str(binary)], stdin=subprocess.PIPE) as target:
        info = allocator_detect.detect_allocator(target.pid)
        assert info.kind == "jemalloc", info
        assert info.foreign is not None and info.foreign.serves_malloc
        assert info.foreign.path == str(binary) and info.foreign.prefix == ""
        assert f"linked into {binary}" in info.detail
        done = _inspect(target.pid)
        assert done.returncode == 3, done.stderr
        assert "cannot be told from the program's" in done.stderr
        assert "LD_PRELOAD" in done.stderr  # the hint: run it on the shared library
        status = proc_status(target.pid)
        assert status["TracerPid"] == "0" and status["State"][0] in "RS"


@pytest.mark.parametrize("prefix", ["je_", "_rjem_"])
def test_a_renamed_copy_is_reported_beside_glibc(prefix: str) -> None:
    binary = compile_target("linked_allocator", f"-DPREFIXED_MALLCTL={prefix}mallctl")
    with running([str(binary)], stdin=subprocess.PIPE) as target:
        info = allocator_detect.detect_allocator(target.pid)
        assert info.kind == "glibc", info  # glibc serves malloc
        assert info.foreign is not None and not info.foreign.serves_malloc
        assert info.foreign.kind == "jemalloc" and info.foreign.prefix == prefix
        assert f"beside it {prefix}-prefixed jemalloc in {binary}" in info.detail
        done = _inspect(target.pid)
        assert done.returncode == 0, done.stderr
        document = json.loads(done.stdout)
        allocator = document["allocator"]
        assert allocator["name"] == "glibc"
        assert allocator["beside"] == {"name": "jemalloc", "library": str(binary), "prefix": prefix}
        assert document["read_only"] is not None  # glibc's heap, read from memory


def test_a_plain_program_has_no_allocator_beside_glibc() -> None:
    binary = compile_target("linked_allocator")
    with running([str(binary)], stdin=subprocess.PIPE) as target:
        info = allocator_detect.detect_allocator(target.pid)
        assert info.kind == "glibc" and info.foreign is None
