"""Run a test in a given time zone and put the previous one back afterwards.

``monkeypatch.setenv("TZ", …)`` alone restores the variable but not the C library's zone:
``time.tzset()`` must run again after the restore, or every later test runs in the pinned
zone and passes or fails by the order tests happen to run in.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator


@contextlib.contextmanager
def pinned_timezone(name: str) -> Iterator[None]:
    """Inside: TZ is ``name`` for Python and libc alike. After: exactly as before."""
    previous = os.environ.get("TZ")
    os.environ["TZ"] = name
    time.tzset()
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = previous
        time.tzset()
