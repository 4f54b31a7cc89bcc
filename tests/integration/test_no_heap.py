"""A process in which malloc never ran (tests/targets/no_heap.c; gzip reading a pipe is one)
is read from memory: main_arena as glibc's static initializer left it is what malloc_info
reports once it has initialized malloc (every bin empty, the initial top of size 0, no system
bytes). Before, main_arena was "not found" there: `--read-only` exited 3 and the default
called malloc_info into the process, whose first allocation then gave it a heap. So is one
whose heap is a few pages (tests/targets/small_heap.c), on each release.

Oracle: the target's own malloc_info, written after the read (it allocates nothing: stderr is
unbuffered), equal byte for byte to the document read, on glibc 2.31, 2.36 and 2.41.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.glibc_releases import GlibcRelease, build_target, command
from tests.support.targets import live_skip_reason, running

_SKIP = live_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]

INSPECT = [sys.executable, "-m", "memforensics", "inspect", "--json"]


@pytest.mark.parametrize("mode", [["--read-only"], []], ids=["read-only", "default"])
def test_a_process_malloc_never_ran_in_is_read_as_its_malloc_info_says(
    release: GlibcRelease, mode: list[str], tmp_path: Path
) -> None:
    own = _read_then_own(release, "no_heap", mode, tmp_path)
    assert b'<total type="rest" count="1" size="0"/>' in own


def test_a_heap_of_a_few_pages_is_read_as_its_malloc_info_says(
    release: GlibcRelease, tmp_path: Path
) -> None:
    """tests/targets/small_heap.c, a heap of a few pages: main_arena's bins then hold words
    a few KiB past the start of [heap]. In Debian's own sleep and cat one of those passed for
    a second mp_ (test_small_heaps.py, glibc 2.36); this heap does not lay out that decoy, it
    checks a small heap on each release against its own malloc_info, byte for byte."""
    own = _read_then_own(release, "small_heap", ["--read-only"], tmp_path)
    assert b"<sizes>\n</sizes>" not in own  # (its bins hold chunks)


@pytest.mark.parametrize(
    "tunables",
    [
        "glibc.malloc.tcache_max=0",  # one tcache bin
        "glibc.malloc.tcache_max=25:glibc.malloc.tcache_count=65535",
        "glibc.malloc.tcache_count=0",
        "glibc.malloc.hugetlb=1",  # 2.35+: mp_'s thp_pagesize set (ignored before)
    ],
)
def test_mp_is_found_under_the_tunables_that_move_its_fields(
    release: GlibcRelease, tunables: str, tmp_path: Path
) -> None:
    """mp_ is found by its shape, the tcache's fields included (malloc_par.py): the values
    the tunables set (one bin, a count at its maximum, no tcache, huge pages) are glibc's."""
    _read_then_own(release, "small_heap", ["--read-only"], tmp_path, {"GLIBC_TUNABLES": tunables})


def _read_then_own(
    release: GlibcRelease,
    name: str,
    mode: list[str],
    tmp_path: Path,
    env: dict[str, str] | None = None,
) -> bytes:
    """Target ``name`` read by `inspect --json` with ``mode``, with no call into it; then its
    own malloc_info, equal byte for byte to the document read, returned."""
    binary = build_target(release, name)
    saved = tmp_path / "read.xml"
    with running(command(release, binary, []), stdin=subprocess.PIPE, env=env) as target:
        run = subprocess.run(
            [*INSPECT, *mode, "--save-xml", str(saved), str(target.pid)],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        document = json.loads(run.stdout)
        assert document["fallback"] is None and document["read_only"] is not None, document
        if name == "no_heap":  # nothing was called into it: malloc still never ran
            assert "[heap]" not in Path(f"/proc/{target.pid}/maps").read_text()
        assert target.proc.stdin is not None and target.proc.stderr is not None
        target.proc.stdin.write(b"dump\n")
        target.proc.stdin.flush()
        assert target.proc.wait(timeout=30) == 0
        own = target.proc.stderr.read()
    assert saved.read_bytes() == own
    return own
