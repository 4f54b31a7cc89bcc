"""Itanium C++ type names demangled by the C++ runtime's own ``__cxa_demangle``, loaded into
this process (never the target's), with the mangled name kept when no runtime is at hand.

The census names C++ types like ``c++filt -t``: the mangled string of a ``type_info`` is a
type, not a symbol, so it has no ``_Z`` prefix (``N4shop7SessionE`` is ``shop::Session``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

_LIBRARIES = ("libstdc++.so.6", "libc++abi.so.1", "libc++.so.1")


@functools.cache
def _runtime() -> tuple[object, object] | None:
    """(__cxa_demangle, free) from the first C++ runtime that loads, or None."""
    for name in _LIBRARIES:
        try:
            library = ctypes.CDLL(name)
            function = library.__cxa_demangle
        except (OSError, AttributeError):
            continue
        function.restype = ctypes.c_void_p
        function.argtypes = [
            ctypes.c_char_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_int),
        ]
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.free.argtypes = [ctypes.c_void_p]
        return function, libc.free
    return None


@functools.lru_cache(maxsize=65536)
def demangle_type(mangled: str) -> str:
    """The C++ type ``mangled`` names (``mangled`` itself when it cannot be demangled)."""
    runtime = _runtime()
    if runtime is None:
        return mangled
    function, free = runtime
    status = ctypes.c_int(0)
    result = function(mangled.encode("ascii"), None, None, ctypes.byref(status))  # type: ignore[operator]
    if not result:
        return mangled
    try:
        text = ctypes.string_at(result).decode("utf-8", errors="replace")
    finally:
        free(result)  # type: ignore[operator]
    return text if status.value == 0 else mangled
