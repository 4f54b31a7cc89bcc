"""coremaps.heap_range_hint: which anonymous mapping of a core was most likely [heap], for a
program the kernel ran itself and for one run by the dynamic loader (``ld.so PROGRAM``, as the
live tests run their targets on glibc 2.31 and 2.41), whose brk the kernel puts at
ELF_ET_DYN_BASE instead of after the program.

The addresses are those of real processes of this machine's kernel (/proc/PID/maps of a
program run directly, and of the same program run through Debian 13's loader)."""

from __future__ import annotations

import pytest

from memforensics.sources.core.coremaps import heap_range_hint
from memforensics.sources.proc.procmaps import Mapping

LOADER = "/srv/trixie/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
PROGRAM = "/srv/build/seeds_heap"
LIBC = "/srv/trixie/usr/lib/x86_64-linux-gnu/libc.so.6"


def _file(start: int, end: int, path: str, perms: str = "r--p") -> Mapping:
    return Mapping(start, end, perms, 0, -1, path)


def _anonymous(start: int, end: int) -> Mapping:
    return Mapping(start, end, "rw-p", 0, 0, "")


def test_a_program_run_by_the_kernel_has_its_heap_above_its_bss() -> None:
    maps = [
        _file(0x55648E191000, 0x55648E196000, PROGRAM),
        _file(0x55648E196000, 0x55648E197000, PROGRAM, "rw-p"),
        _anonymous(0x55648E197000, 0x55648E397000),  # the bss
        _anonymous(0x5564A4E1B000, 0x5564A4E3C000),  # [heap]
        _anonymous(0x7F19A8000000, 0x7F19A8426000),  # a thread arena
        _file(0x7F19AC0AD000, 0x7F19AC0E2000, "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
    ]
    assert heap_range_hint(maps, PROGRAM) == (0x5564A4E1B000, 0x5564A4E3C000)


@pytest.mark.parametrize("loader", [LOADER, "/srv/bullseye/lib/x86_64-linux-gnu/ld-2.31.so"])
def test_a_program_run_by_the_loader_has_its_heap_at_the_loaders_brk_base(loader: str) -> None:
    maps = [
        _anonymous(0x555564386000, 0x5555643A7000),  # [heap]: ~238 MiB above ELF_ET_DYN_BASE
        _anonymous(0x7F4E3C000000, 0x7F4E3C426000),  # a thread arena
        _file(0x7F4E43800000, 0x7F4E43806000, PROGRAM),
        _file(0x7F4E43900000, 0x7F4E43A00000, LIBC),
        _file(0x7F4E43B25000, 0x7F4E43B5B000, loader),
        _file(0x7F4E43B5B000, 0x7F4E43B5C000, loader, "rw-p"),
        _anonymous(0x7F4E43B5C000, 0x7F4E43B5D000),  # the loader's bss
    ]
    assert heap_range_hint(maps, loader) == (0x555564386000, 0x5555643A7000)


def test_a_program_run_by_the_loader_that_never_grew_brk_has_no_heap_named() -> None:
    maps = [
        _anonymous(0x7F4E3C000000, 0x7F4E3C426000),  # anonymous memory, far above the base
        _file(0x7F4E43800000, 0x7F4E43806000, PROGRAM),
        _file(0x7F4E43B25000, 0x7F4E43B5C000, LOADER, "rw-p"),
    ]
    assert heap_range_hint(maps, LOADER) is None
