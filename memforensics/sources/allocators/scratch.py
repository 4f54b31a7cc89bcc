"""The in-memory arguments of an allocator's statistics call, laid out in one buffer (the
call's scratch, sources.proc.ptrace_probe): names, out-buffers prefilled with a sentinel,
lengths, values to write. An out-buffer still holding its sentinel after the call was not
written: the allocator refused that name (the call's return value is not kept)."""

from __future__ import annotations

from memforensics.sources.proc.ptrace_call import ScratchRef

_ALIGN = 8


class Scratch:
    """A buffer being laid out; every piece 8-byte aligned."""

    def __init__(self) -> None:
        self._data = bytearray()

    def _add(self, data: bytes) -> ScratchRef:
        ref = ScratchRef(len(self._data))
        self._data += data + bytes(-len(data) % _ALIGN)
        return ref

    def string(self, text: str) -> ScratchRef:
        """A NUL-terminated string."""
        return self._add(text.encode() + b"\0")

    def out(self, size: int, sentinel: int) -> ScratchRef:
        """An out-buffer of ``size`` bytes holding ``sentinel`` until written."""
        return self._add(sentinel.to_bytes(size, "little", signed=sentinel < 0))

    def word(self, value: int) -> ScratchRef:
        """An 8-byte value (a length, a value to write)."""
        return self._add(value.to_bytes(8, "little", signed=value < 0))

    @property
    def data(self) -> bytes:
        return bytes(self._data)


def read_out(
    scratch: bytes, ref: ScratchRef, size: int, sentinel: int, *, signed: bool = False
) -> int | None:
    """The value an out-buffer holds after the call; None when it still holds the sentinel."""
    raw = scratch[ref.offset : ref.offset + size]
    value = int.from_bytes(raw, "little", signed=signed)
    return None if value == sentinel else value
