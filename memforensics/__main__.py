"""The `memforensics` program (``python -m memforensics`` and the console script).

Before the command line is parsed, ``early.begin`` may start the slow parts of a command
(the read of an `inspect PID`'s smaps, the search of an `oom --file`'s log), so that they run
while Python imports click and the command; then the CLI runs as usual, its dataclasses'
methods' code taken from this user's cache (sources/files/code_cache.py), and what is worked
out from a file's bytes (a libc's symbols) kept there too (sources/files/digest_cache.py).
"""

import os
import sys

# numpy (imported by the reads of long lists, the proof and the pins) loads OpenBLAS, whose
# worker threads spin for ~0.1 s of CPU after loading; memforensics makes no BLAS call, and
# on a small machine that spin takes a CPU from the read's copies and the target's threads.
# Set before anything imports numpy; a value the user set is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from memforensics.entry import early


def main() -> None:
    """Console-script entry point."""
    early.begin(sys.argv[1:])
    # (Imported and installed after what early began, before any model module: their
    # dataclasses' methods come from this user's cache of compiled code.)
    from memforensics.sources.files import code_cache, digest_cache

    code_cache.install()
    digest_cache.enable_disk()
    from memforensics.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
