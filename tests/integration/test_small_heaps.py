"""Programs from Debian's own packages whose heap is a few pages (sleep, cat, a bash waiting on
read) are read from memory, mp_ and all, with no call into them.

In a heap that small, main_arena's bins hold many words less than 64 KiB past the start of
[heap], where mp_'s sbrk_base may lie; one of them once read as a second malloc_par, mp_ was
"not found", and the default called malloc_info in every such process. The oracle is glibc's
own malloc_info, called (without gdb) after the read: equal but for what the calls allocate
in the caller's arena (tests/support/called_compare.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memforensics.entry.readers.call import call_malloc_info
from memforensics.sources.proc import target_check
from tests.support.called_compare import assert_equal_but_the_callers_arena
from tests.support.targets import live_skip_reason

_SKIP = live_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]

INSPECT = [sys.executable, "-m", "memforensics", "inspect", "--read-only", "--json"]
PROGRAMS = {
    "sleep": ["/bin/sleep", "600"],
    "cat": ["/bin/cat"],
    "bash": ["/bin/bash", "-c", "read line"],
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_small_heap_is_read_from_memory_as_its_malloc_info_says(
    name: str, tmp_path: Path
) -> None:
    target = subprocess.Popen(PROGRAMS[name], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while "[heap]" not in Path(f"/proc/{target.pid}/maps").read_text():
            assert time.monotonic() < deadline, "no [heap] came"
            time.sleep(0.02)
        time.sleep(0.1)  # (its start-up done: it waits on its input or its timer)
        saved = tmp_path / "read.xml"
        run = subprocess.run(
            [*INSPECT, "--save-xml", str(saved), str(target.pid)],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        document = json.loads(run.stdout)
        assert document["totals"]["arenas"] == 1 and not document["fallback"], document
        facts = target_check.check_target(target.pid)
        called = call_malloc_info(target.pid, facts, 10.0)
        assert target.poll() is None
    finally:
        target.kill()
        target.wait()
    assert_equal_but_the_callers_arena(called.xml.decode(), saved.read_text())
