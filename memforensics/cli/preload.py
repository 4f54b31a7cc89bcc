"""Modules a command will need later, imported in a background thread while it waits on gdb.

A live command spends most of its first session waiting for gdb and the target (the main
thread sleeps in select(), without Python's lock); importing the analysis and the renderers
meanwhile takes that import time off the command's wall time. The main thread's own import
of the same module later waits for this one, as Python's per-module import locks make it.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Sequence

from memforensics.background import QuietGate, lower_thread_priority


def preload(module_names: Sequence[str], *, gate: QuietGate | None = None) -> threading.Thread:
    """Start importing ``module_names`` in a daemon thread; failures are left to the main
    thread's own import, which reports them where they matter. Between two modules the
    thread parks while ``gate`` is closed (while gdb attaches)."""

    def load() -> None:
        lower_thread_priority()  # the main thread and gdb come first
        with gate.worker() if gate is not None else contextlib.nullcontext():
            for name in module_names:
                if gate is not None:
                    gate.checkpoint()
                with contextlib.suppress(Exception):
                    importlib.import_module(name)

    thread = threading.Thread(target=load, name="memforensics-preload", daemon=True)
    thread.start()
    return thread
