"""JSON documents worked out from a file's bytes, kept under the SHA-256 of those bytes: in
this process always, and in this user's cache folder once the program enabled it.

Contract: a document comes back only under the digest it was put under (the same bytes: what
it says of them holds whatever the file's name, inode or time); the caller validates its
shape, as for any input, and works it out afresh where it does not hold. On disk a document
is one file, ``<kind>-<digest>.json``, read only where it is this user's alone
(user_cache.read_private); past ``max_files`` of a kind the oldest are removed. Only the
program enables the disk (``memforensics.__main__``): the library imported by another program,
and the tests, keep documents in memory only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

from memforensics.sources.files.user_cache import cache_folder, read_private, write_private

_MEMORY_ENTRIES = 16  # documents kept in memory per kind (a node's few libcs)
_folder: Path | None = None  # where documents are kept on disk; None: in memory only


def enable_disk(folder: Path | None = None) -> None:
    """Keep documents in ``folder`` (default: this user's cache folder) as well."""
    global _folder
    _folder = cache_folder() if folder is None else folder


def disable_disk() -> None:
    """Documents in memory only, as before ``enable_disk``."""
    global _folder
    _folder = None


def digest_of(data: bytes) -> str:
    """The key of ``data``: its SHA-256, in hex."""
    return hashlib.sha256(data).hexdigest()


class DigestCache:
    """Documents of one ``kind`` by digest (digest_of)."""

    def __init__(self, kind: str, *, max_files: int = 32, max_file_bytes: int = 4 << 20) -> None:
        self.kind = kind
        self.max_files = max_files
        self.max_file_bytes = max_file_bytes
        self._memory: dict[str, object] = {}

    def _path(self, folder: Path, digest: str) -> Path:
        return folder / f"{self.kind}-{digest}.json"

    def get(self, digest: str) -> object | None:
        """The document put under ``digest`` (in this process, else on disk); None where
        there is none, or the file is not this user's alone, or not a document of it."""
        if digest in self._memory:
            return self._memory[digest]
        folder = _folder
        if folder is None:
            return None
        data = read_private(self._path(folder, digest), self.max_file_bytes)
        if data is None:
            return None
        try:
            wrapper = json.loads(data)
        except (ValueError, RecursionError):
            return None
        if not isinstance(wrapper, dict) or wrapper.get("digest") != digest:
            return None  # (a file renamed: not what these bytes gave)
        document = wrapper.get("document")
        self._remember(digest, document)
        return document

    def put(self, digest: str, document: object) -> None:
        """Keep ``document`` (JSON-serialisable) under ``digest``; on disk too where enabled
        (a cache that cannot be written is no error)."""
        self._remember(digest, document)
        folder = _folder
        if folder is None:
            return
        text = json.dumps({"digest": digest, "document": document}, separators=(",", ":"))
        if write_private(self._path(folder, digest), text.encode()):
            self._prune(folder)

    def forget(self) -> None:
        """Forget what this process keeps in memory (the disk's files stay)."""
        self._memory.clear()

    def _remember(self, digest: str, document: object) -> None:
        if len(self._memory) >= _MEMORY_ENTRIES:
            self._memory.pop(next(iter(self._memory)))
        self._memory[digest] = document

    def _prune(self, folder: Path) -> None:
        """Past ``max_files`` documents of this kind, the least recently written removed."""
        with contextlib.suppress(OSError):
            files = list(folder.glob(f"{self.kind}-*.json"))
            if len(files) <= self.max_files:
                return
            aged = sorted(files, key=lambda path: path.stat().st_mtime_ns)
            for path in aged[: len(files) - self.max_files]:
                with contextlib.suppress(OSError):
                    path.unlink()
