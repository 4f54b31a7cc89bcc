"""What `inspect` imports before it reads anything: not numpy (~45 ms of start-up on every
run, against a wall the issue measures in tenths of a second), nor concurrent.futures with
logging (~9 ms) or tempfile with shutil and the compression modules (~7 ms). The modules that
need them (the pins' picture, the list sweep; a file written, gdb's session) import them when
they run."""

from __future__ import annotations

import os
import subprocess
import sys

SKIPPED_AT_START = ("numpy", "concurrent", "logging", "tempfile")


def test_the_inspect_path_does_not_import_at_start_what_a_read_may_never_need() -> None:
    code = (
        "import sys\n"
        "import memforensics.__main__, memforensics.sources.files.code_cache\n"
        "import memforensics.cli, memforensics.entry.inspect\n"
        "import memforensics.entry.readers.memory, memforensics.sources.glibc.heapmaps\n"
        "import memforensics.sources.glibc.bin_relay\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {SKIPPED_AT_START!r}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout[:300]


def test_numpy_loaded_by_the_program_starts_no_blas_worker_thread() -> None:
    # OpenBLAS, which numpy loads, starts a worker per CPU that spins after loading (~0.1 s of
    # a CPU, taken from the read's copies); the program makes no BLAS call and keeps it to
    # one thread, the calling one. Counted from /proc, with the environment the tests have
    # (no OPENBLAS_NUM_THREADS of their own), against a bare numpy import as the control.
    count = "import os, numpy; print(len(os.listdir('/proc/self/task')))"
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}

    def threads(prelude: str) -> int:
        done = subprocess.run(
            [sys.executable, "-c", prelude + count],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            env=env,
        )
        return int(done.stdout.strip())

    assert threads("import memforensics.__main__; ") == 1
    if (os.cpu_count() or 1) > 1:  # the control: without the program, a worker per CPU
        assert threads("") > 1
