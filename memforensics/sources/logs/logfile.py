"""Saved text logs opened and read in one pass: regular files (memory mapped, searched window
by window in flat memory), pipes, FIFOs, process substitution, /dev/stdin, /proc files, and
.gz/.xz/.bz2/.zst streams, never seeking and never loading a whole file.

Which lines are worth parsing is decided by sources/logs/logprefilter.py; what a line means by
sources/logs/logline.py. This module only moves bytes.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import re
import stat
import zlib
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from typing import IO, Any, BinaryIO, Protocol

from memforensics.errors import InputDataError, ToolingError
from memforensics.model.logrecord import LogRecord
from memforensics.sources.logs import logprefilter, logsearch
from memforensics.sources.logs.logline import LineParser
from memforensics.sources.logs.logprefilter import Buffer, candidate_spans

# A mapped file is searched this many bytes at a time, and what lies behind the search is
# dropped from our resident memory as it goes: memory stays flat in the file's size.
WINDOW_BYTES = 16 << 20
_CHUNK_BYTES = 8 << 20
_SNIFF_BYTES = 1 << 16
_JOURNAL_MAGIC = b"LPKSHHRH"
_GZIP_MAGIC = b"\x1f\x8b"
_XZ_MAGIC = b"\xfd7zXZ\x00"
_BZIP2_MAGIC = b"BZh"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# journalctl -o export: text fields, but a field holding a newline is length-prefixed binary.
_EXPORT_MARKERS = (b"__CURSOR=", b"__REALTIME_TIMESTAMP=")
# Lines of a report that never carry anything we use (dump_stack frames and registers),
# skipped before decoding: a third of a big report's lines.
_NOISE_RE = re.compile(
    rb"\+0x[0-9a-f]+/0x|Call Trace:|Hardware name: |\] ?R(?:IP|SP|AX|DX|BP|10|13): |Code: "
)


def _check_text(head: bytes, source: str) -> None:
    if head.startswith(_JOURNAL_MAGIC):
        raise InputDataError(
            "this is a binary journal file, not a text log",
            source=source,
            hint="read its directory as a journal, or convert it with "
            "`journalctl --file FILE -k > out.txt`",
        )
    if b"\x00" in head and not head.startswith(_EXPORT_MARKERS):
        raise InputDataError(
            "binary data, not a text log",
            source=source,
            hint="pass dmesg, kern.log/syslog/messages or journalctl output (plain or compressed)",
        )


class _Scan:
    """Turns candidate spans of one buffer into records; remembers how far it yielded."""

    def __init__(self, source: str, reference: datetime) -> None:
        self.parser = LineParser(source, reference)
        self.last_end = -1

    def records(
        self, buf: Buffer, start: int, end: int, floor: int, emitted: int | None = None
    ) -> Iterator[LogRecord]:
        return self.parse_spans(buf, candidate_spans(buf, start, end, floor, emitted))

    def parse_spans(self, buf: Buffer, spans: Iterable[tuple[int, int]]) -> Iterator[LogRecord]:
        """Decode and parse the given lines of ``buf``."""
        parse = self.parser.parse
        previous_end = -2
        for line_start, line_end in spans:
            self.last_end = max(self.last_end, line_end)
            if line_start != previous_end + 1:
                # Lines not adjacent to the last ones: no multi-line state carries over.
                pending = self.parser.gap()
                if pending is not None:
                    yield pending
            previous_end = line_end
            raw = buf[line_start:line_end]
            if _NOISE_RE.search(raw) and not self.parser.collecting:
                continue  # a stack frame or register dump inside a report: never used
            line = raw.decode("utf-8", errors="replace").rstrip("\r")
            record = parse(line)
            if record is not None:
                yield record


class _Readable(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...


class _Prefixed(io.RawIOBase):
    """A stream that first returns ``head`` (already read to sniff the format), then the rest."""

    def __init__(self, head: bytes, rest: _Readable) -> None:
        super().__init__()
        self._head = head
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._head:
            count = min(len(view), len(self._head))
            view[:count] = self._head[:count]
            self._head = self._head[count:]
            return count
        data = self._rest.read(len(view))
        view[: len(data)] = data
        return len(data)


def _stream_records(stream: _Readable, source: str, reference: datetime) -> Iterator[LogRecord]:
    """Chunked scan for streams (pipes, compressed files): keeps a look-behind tail."""
    tail = b""
    pending = b""
    scan = _Scan(source, reference)
    emitted = 0
    checked = False
    try:
        while True:
            chunk = stream.read(_CHUNK_BYTES)
            if not chunk:
                break
            if not checked:
                # Compressed input is checked once decompressed.
                _check_text(chunk[:_SNIFF_BYTES], source)
                checked = True
            data = pending + chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0 and len(data) < 4 * _CHUNK_BYTES:
                pending = data
                continue
            cut = cut or len(data)
            buf = tail + data[:cut]
            pending = data[cut:]
            scan.last_end = -1
            yield from scan.records(buf, len(tail), len(buf), 0, emitted)
            lookback = logprefilter.LOOKBACK_BYTES
            keep = buf[-lookback:]
            tail = keep[keep.find(b"\n") + 1 :] if len(buf) > lookback else buf
            # Offsets in the next buffer start where ``tail`` starts in this one.
            emitted = max(0, max(scan.last_end + 1, emitted) - (len(buf) - len(tail)))
    except (OSError, EOFError, zlib.error) as exc:
        raise InputDataError(
            f"cannot read compressed or streamed input: {exc}",
            source=source,
            hint="check that the file is complete (gzip -t, xz -t or zstd -t)",
        ) from exc
    if pending:
        buf = tail + pending + b"\n"
        yield from scan.records(buf, len(tail), len(buf), 0, emitted)
    last = scan.parser.finish()
    if last is not None:
        yield last


def _zstd_stream(raw: BinaryIO, head: bytes, source: str) -> Iterator[bytes]:
    """Decompress through ``zstd -dc``: no Python dependency, and it runs on another core."""
    import shutil
    import subprocess
    import threading

    executable = shutil.which("zstd")
    if executable is None:
        raise ToolingError(
            f"{source} is zstd-compressed and the zstd program is not installed",
            hint="install zstd, or decompress it first (zstd -dc FILE > FILE.txt)",
        )
    proc = subprocess.Popen(
        [executable, "-dcq"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    feeder_stdin: IO[bytes] = proc.stdin

    def feed() -> None:
        # A thread, so that zstd never blocks on a full stdout pipe while we write.
        try:
            feeder_stdin.write(head)
            while block := raw.read(1 << 20):
                feeder_stdin.write(block)
        except (BrokenPipeError, ValueError, OSError):
            pass  # zstd stopped (bad data, or we stopped reading): its exit status says why
        finally:
            with contextlib.suppress(OSError):
                feeder_stdin.close()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    finished = False
    try:
        while block := proc.stdout.read(_CHUNK_BYTES):
            yield block
        finished = True
    finally:
        proc.stdout.close()
        if not finished:
            proc.kill()
        returncode = proc.wait()
        feeder.join(timeout=5)
        message = proc.stderr.read().decode("utf-8", errors="replace").strip()
        proc.stderr.close()
    if returncode != 0:
        raise InputDataError(
            f"cannot decompress zstd input: {message or f'zstd exit {returncode}'}",
            source=source,
            hint="check that the file is complete (zstd -t FILE)",
        )


class _XzReader:
    """An LZMAFile whose corruption errors are OSErrors, like gzip's and bz2's."""

    def __init__(self, stream: _Readable) -> None:
        self._stream = stream

    def read(self, size: int = -1, /) -> bytes:
        try:
            return self._stream.read(size)
        except Exception as exc:
            if type(exc).__name__ == "LZMAError":
                raise OSError(str(exc)) from exc
            raise


class _Chunks:
    """A ``read(n)``-able view of an iterator of byte blocks."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        self._blocks = blocks
        self._buffer = b""

    def read(self, size: int = -1, /) -> bytes:
        while size < 0 or len(self._buffer) < size:
            block = next(self._blocks, b"")
            if not block:
                break
            self._buffer += block
        if size < 0:
            data, self._buffer = self._buffer, b""
        else:
            data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data


def _decompressed(raw: BinaryIO, head: bytes, source: str, *, consumed: bool) -> _Readable | None:
    """A decompressing reader when ``head`` shows a compressed format, else None.

    ``consumed``: ``head`` was read from ``raw`` (a stream) and is replayed before the rest.
    """
    prefix = head if consumed else b""
    # Imported on use: most inputs are plain text, and start-up time counts.
    if head.startswith(_GZIP_MAGIC):
        import gzip

        return gzip.GzipFile(fileobj=io.BufferedReader(_Prefixed(prefix, raw)), mode="rb")
    if head.startswith(_XZ_MAGIC):
        import lzma

        return _XzReader(lzma.LZMAFile(io.BufferedReader(_Prefixed(prefix, raw)), mode="rb"))
    if head.startswith(_BZIP2_MAGIC) and head[3:4].isdigit():
        import bz2

        return bz2.BZ2File(io.BufferedReader(_Prefixed(prefix, raw)), mode="rb")
    if head.startswith(_ZSTD_MAGIC):
        return _Chunks(_zstd_stream(raw, prefix, source))
    return None


def _read_head(raw: BinaryIO) -> bytes:
    """Up to _SNIFF_BYTES from a stream (a pipe may return less per read)."""
    parts: list[bytes] = []
    size = 0
    while size < _SNIFF_BYTES:
        block = raw.read(_SNIFF_BYTES - size)
        if not block:
            break
        parts.append(block)
        size += len(block)
    return b"".join(parts)


def read_text_log(
    path: str, *, stdin: BinaryIO | None = None, reference: datetime | None = None
) -> Iterator[LogRecord]:
    """Open ``path`` (``-`` = ``stdin``), check it is text, and return its records lazily.

    Errors opening or recognising the input are raised here, before iteration starts:
    InputDataError (exit 7) for unreadable, binary or corrupt input. ``reference`` dates
    year-less syslog stamps (default: the file's mtime, or now for a stream).
    """
    if path == "-":
        if stdin is None:
            raise InputDataError("no standard input to read", source="-")
        return _open_stream(stdin, "-", reference or datetime.now(timezone.utc), close=False)
    try:
        handle = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by the generator
        info = os.fstat(handle.fileno())
    except IsADirectoryError as exc:
        raise InputDataError(
            "is a directory",
            source=path,
            hint="a journal directory is read as a journal, not as a text file",
        ) from exc
    except OSError as exc:
        raise InputDataError(
            f"cannot read: {exc.strerror}",
            source=path,
            hint="check the path and permissions (kern.log is often root:adm 0640; try sudo)",
        ) from exc
    if stat.S_ISDIR(info.st_mode):
        handle.close()
        raise InputDataError("is a directory", source=path)
    if stat.S_ISCHR(info.st_mode) and os.path.basename(os.path.realpath(path)) == "kmsg":
        handle.close()
        # /dev/kmsg never ends: read as a stream it would block after the last record.
        raise InputDataError(
            "the live kernel ring buffer is not a saved log",
            source=path,
            hint="read the ring buffer as such, or save it first (dmesg > dmesg.txt)",
        )
    if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
        # A pipe, FIFO, terminal or /proc file (size 0): read it as a stream, once.
        when = reference or datetime.now(timezone.utc)
        return _open_stream(handle, path, when, close=True)
    when = reference or datetime.fromtimestamp(info.st_mtime, tz=timezone.utc)
    # pread: look at the start without moving the file position.
    head = os.pread(handle.fileno(), _SNIFF_BYTES, 0)
    decompressed = _decompressed(handle, head, path, consumed=False)
    if decompressed is not None:
        return _closing(handle, _stream_records(decompressed, path, when))
    _check_text(head, path)
    return _closing(handle, _mapped_records(handle, path, when, info))


def _open_stream(
    raw: BinaryIO, source: str, reference: datetime, *, close: bool
) -> Iterator[LogRecord]:
    head = _read_head(raw)
    decompressed = _decompressed(raw, head, source, consumed=True)
    stream: _Readable
    if decompressed is not None:
        stream = decompressed
    else:
        _check_text(head, source)
        stream = io.BufferedReader(_Prefixed(head, raw), buffer_size=_CHUNK_BYTES)
    records = _stream_records(stream, source, reference)
    return _closing(raw, records) if close else records


def _mapped_records(
    handle: BinaryIO, source: str, reference: datetime, info: os.stat_result
) -> Iterator[LogRecord]:
    try:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        # Not mappable: stream it instead (the position is still 0: we only pread).
        yield from _stream_records(handle, source, reference)
        return
    with mapped:
        scan = _Scan(source, reference)
        # A child process started before the command was imported may be searching it already.
        release = _Releaser(mapped)

        def search_here() -> Iterator[tuple[int, int]]:
            return candidate_spans(
                mapped, 0, len(mapped), 0, window=WINDOW_BYTES, on_window=release.before
            )

        spans = _releasing(logsearch.take(source, info, search_here), release)
        yield from scan.parse_spans(mapped, spans)
        last = scan.parser.finish()
        if last is not None:
            yield last


def _releasing(spans: Iterable[tuple[int, int]], release: _Releaser) -> Iterator[tuple[int, int]]:
    """``spans`` as they are, the pages behind them released every WINDOW_BYTES or so."""
    next_release = WINDOW_BYTES
    for span in spans:
        if span[0] >= next_release:
            release.before(span[0])
            next_release = span[0] + WINDOW_BYTES
        yield span


class _Releaser:
    """Keeps a mapped file's resident pages flat: once the search has moved on, the pages
    behind it (but its look-behind) are dropped from our page tables. They stay in the page
    cache, so a later look at them costs a minor fault, not a read."""

    def __init__(self, mapped: mmap.mmap) -> None:
        self._mapped = mapped
        self._released = 0
        if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
            with contextlib.suppress(OSError):
                mapped.madvise(mmap.MADV_SEQUENTIAL)  # read ahead further on a cold file

    def before(self, offset: int) -> None:
        """The search is about to start at ``offset``: drop what it cannot need again."""
        page = mmap.PAGESIZE
        upto = (offset - logprefilter.LOOKBACK_BYTES - _SNIFF_BYTES) // page * page
        if upto <= self._released or not hasattr(mmap, "MADV_DONTNEED"):
            return
        with contextlib.suppress(OSError, ValueError):
            self._mapped.madvise(mmap.MADV_DONTNEED, self._released, upto - self._released)
        self._released = upto


def _closing(handle: IO[bytes], records: Iterator[LogRecord]) -> Iterator[LogRecord]:
    try:
        yield from records
    finally:
        handle.close()
