"""What `inspect` imports before it reads anything: not numpy (~45 ms of start-up on every
run, against a wall the issue measures in tenths of a second). The modules that need it (the
pins' picture, the list sweep) import it when they run."""

from __future__ import annotations

import subprocess
import sys


def test_the_inspect_path_does_not_import_numpy_at_start() -> None:
    code = (
        "import sys\n"
        "import memforensics.cli, memforensics.entry.inspect\n"
        "import memforensics.entry.readers.memory, memforensics.sources.glibc.heapmaps\n"
        "import memforensics.sources.glibc.bin_relay\n"
        "print(sorted(m for m in sys.modules if m == 'numpy' or m.startswith('numpy.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout[:300]
