"""The code Python compiles for dataclasses' generated methods, kept in this user's cache
between runs of the program.

A dataclass's ``__init__``, ``__repr__``, ``__eq__`` (and a frozen one's ``__setattr__``,
``__delattr__`` and ``__hash__``) are written as source text and compiled when its class
statement runs: in Python 3.11 and 3.12 one compile a method, ~0.2 ms each. The model is made
of frozen dataclasses, so `memforensics inspect` compiles some 300 of them at every start, as
long as the read of a small heap itself. ``install`` makes dataclasses' ``exec`` look the text
up first in a table of code objects loaded from the cache (a code object is what compiling
the same text gives, so the classes are the same); what it had to compile is added to the
file when the program exits.

The file is marshal's (version-specific: its name carries the interpreter's cache tag and
bytecode magic), read only when it is a regular file of this user's that no one else may
write, in a folder no one else may write either: its code runs in this process. Anything
wrong with it (missing, foreign, truncated, not a table of code) is the same as no file:
every method compiled, nothing lost. Only the program installs it (``memforensics.__main__``);
the library imported by another program leaves dataclasses alone.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import dataclasses
import importlib.util
import marshal
import sys
from pathlib import Path
from types import CodeType
from typing import Any

from memforensics.sources.files.user_cache import cache_folder, read_private, write_private

# Past this many entries the table is written back with only the texts this run used: the
# texts of classes that have changed since (a new version of the program) would pile up.
MAX_ENTRIES = 4096
# A file bigger than this is not read (a table of MAX_ENTRIES small methods is ~6 MiB).
MAX_FILE_BYTES = 8 << 20


def cache_file() -> Path:
    """Where this user's cache keeps the table for this interpreter (XDG_CACHE_HOME, else
    ~/.cache)."""
    tag = f"{sys.implementation.cache_tag}-{importlib.util.MAGIC_NUMBER.hex()}"
    return cache_folder() / f"dataclass-code-{tag}.marshal"


def load_table(path: Path) -> dict[str, CodeType]:
    """The table kept at ``path``: text -> code; empty where there is none, or where it is not
    this user's alone (the file, or its folder), or not a table of code objects."""
    data = read_private(path, MAX_FILE_BYTES)
    if data is None:
        return {}
    try:
        table = marshal.loads(data)
    except (ValueError, EOFError, TypeError):
        return {}
    if not isinstance(table, dict) or not all(
        type(text) is str and type(code) is CodeType for text, code in table.items()
    ):
        return {}
    return table


class CodeCache:
    """A table of compiled texts, standing in for ``exec`` where dataclasses calls it.

    ``compiled`` counts the texts compiled since the table was loaded (0: every method came
    from the table); ``used`` holds the texts looked up, compiled or not."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.table = load_table(path)
        self.compiled = 0
        self.used: set[str] = set()

    def exec(
        self, source: Any, globals: dict[str, Any] | None = None, locals: Any = None, /
    ) -> None:
        """``exec(source, globals, locals)``, a text's code taken from the table where it is
        there. (Compiled as exec compiles a text dataclasses passes: no __future__ flags of
        this module's, file name ``<string>``; without ``globals``, run in the caller's
        namespaces, as the built-in called there would.)"""
        if globals is None:
            caller = sys._getframe(1)
            globals = caller.f_globals
            if locals is None:
                locals = caller.f_locals
        if type(source) is str:
            code = self.table.get(source)
            if code is None:
                code = compile(source, "<string>", "exec", dont_inherit=True)
                self.table[source] = code
                self.compiled += 1
            self.used.add(source)
            source = code
        builtins.exec(source, globals, locals)

    def save(self) -> None:
        """Write the table back where anything was compiled (whole or not at all: a temporary
        file renamed into place), keeping only this run's texts past MAX_ENTRIES. A cache that
        cannot be written is no error: the next run compiles again."""
        if not self.compiled:
            return
        table = self.table
        if len(table) > MAX_ENTRIES:
            table = {text: code for text, code in table.items() if text in self.used}
        write_private(self.path, marshal.dumps(table))


_installed: CodeCache | None = None  # the one install() made, until uninstall()


def install(path: Path | None = None) -> CodeCache:
    """Make dataclasses compile through a CodeCache of ``path`` (cache_file()), saved at exit.
    A module-level name ``exec`` in dataclasses shadows the built-in for its own calls only;
    installing again replaces the one before (unsaved)."""
    global _installed
    uninstall()
    cache = CodeCache(cache_file() if path is None else path)
    setattr(dataclasses, "exec", cache.exec)  # noqa: B010 (a name mypy does not know there)
    atexit.register(cache.save)
    _installed = cache
    return cache


def uninstall() -> None:
    """dataclasses back to the built-in ``exec``; the table installed is not saved."""
    global _installed
    if _installed is not None:
        atexit.unregister(_installed.save)
        _installed = None
    with contextlib.suppress(AttributeError):
        delattr(dataclasses, "exec")
