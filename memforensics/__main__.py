"""The `memforensics` program (``python -m memforensics`` and the console script).

Before the command line is parsed, ``early.begin`` may start the slow parts of a command
(the read of an `inspect PID`'s smaps, the search of an `oom --file`'s log), so that they run
while Python imports click and the command; then the CLI runs as usual.
"""

import sys

from memforensics.entry import early


def main() -> None:
    """Console-script entry point."""
    early.begin(sys.argv[1:])
    from memforensics.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
