"""Pins of real processes through the real CLI, against what the targets know and what the
kernel says.

tests/targets/pin_shapes.c prints each pin's user address and the bytes it freed below it
(user bytes, and chunk bytes by glibc's own malloc_usable_size); `inspect --json --pins` must
name that very address, with the free memory it pins between 97% of the freed user bytes and
103% of their chunk bytes. The kernel's oracle: after `memforensics trim`, the pinned [heap]
keeps its size in /proc/PID/maps while VmRSS drops; once the target frees the pin, the [heap]
mapping shrinks."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from memforensics.cli import cli
from tests.support.schema import missing_keys
from tests.support.targets import Target, compile_target, ptrace_skip_reason, running

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(ptrace_skip_reason() is not None, reason=str(ptrace_skip_reason())),
]

MIB = 1024 * 1024


def printed_pins(target: Target) -> list[tuple[int, int, int]]:
    """(user address, freed user bytes, freed chunk bytes) of each pin the target printed."""
    return [
        (int(address, 16), int(user), int(chunk))
        for address, user, chunk in re.findall(r"pin=(0x[0-9a-f]+):(\d+):(\d+)", target.ready_line)
    ]


def inspect_pins(pid: int, *extra: str, some: bool = True) -> dict:
    """`inspect --json --pins PID`; ``some``: pins are expected, so every key is checked."""
    result = CliRunner().invoke(cli, ["inspect", "--json", "--pins", *extra, str(pid)])
    assert result.exit_code == 0, result.output + result.stderr
    document = json.loads(result.stdout)
    if some:
        assert missing_keys(document, "memforensics/heap/1#pins") == []
        assert missing_keys(document, "memforensics/heap/1#inspect") == []
    assert document["pins_error"] is None and isinstance(document["pins"], list)
    return document


def check_pins_found(document: dict, expected: list[tuple[int, int, int]]) -> None:
    by_address = {pin["address"]: pin for pin in document["pins"]}
    for address, user, chunk in expected:
        assert address in by_address, (
            f"no pin at {address:#x}; pins: {[hex(a) for a in by_address]}"
        )
        pinned = by_address[address]["pinned_free_bytes"]
        assert 0.97 * user <= pinned <= 1.03 * chunk, (address, pinned, user, chunk)


def shape(*args: str, stdin: int = subprocess.DEVNULL):  # type: ignore[no-untyped-def]
    return running([str(compile_target("pin_shapes")), *args], stdin=stdin)


def test_the_last_buffer_pins_all_the_others() -> None:
    with shape("last", "400") as target:
        expected = printed_pins(target)
        document = inspect_pins(target.pid)
        check_pins_found(document, expected)
        pin = next(p for p in document["pins"] if p["address"] == expected[0][0])
        assert pin["arena"] == 0 and pin["kind"] == "text"
        assert pin["preview"].startswith("GET /api/v1/orders")
        assert pin["resident_bytes"] >= 0.97 * expected[0][1]


def test_the_first_buffer_pins_nothing() -> None:
    with shape("first", "400") as target:
        freed = 399 * 64 * 1024
        document = inspect_pins(target.pid, some=False)
        assert all(pin["pinned_free_bytes"] < freed // 2 for pin in document["pins"])
        main = next(heap for heap in document["pin_heaps"] if heap["arena"] == 0)
        assert main["held_free_bytes"] < freed // 2


def test_a_thread_heap_pinned_by_its_middle_block() -> None:
    with shape("thread", "300") as target:
        expected = printed_pins(target)
        document = inspect_pins(target.pid)
        check_pins_found(document, expected)
        pin = next(p for p in document["pins"] if p["address"] == expected[0][0])
        assert pin["arena"] != 0


def test_several_arenas_each_pinned() -> None:
    with shape("arenas", "4", "120") as target:
        expected = printed_pins(target)
        assert len(expected) == 4
        document = inspect_pins(target.pid)
        check_pins_found(document, expected)
        arenas = {p["arena"] for p in document["pins"] if p["address"] in {e[0] for e in expected}}
        assert len(arenas) == 4 and 0 not in arenas


def test_terminal_report_names_the_pin_in_one_sentence() -> None:
    with shape("last", "200") as target:
        address = printed_pins(target)[0][0]
        result = CliRunner().invoke(
            cli, ["inspect", "--pins", str(target.pid)], env={"COLUMNS": "400"}
        )
        assert result.exit_code == 0, result.output
        sentence = next(line for line in result.stdout.splitlines() if f"{address:#x}" in line)
        assert re.search(
            r'one live 64\.0 KiB chunk at 0x[0-9a-f]+, text "GET /api/v1/orders.*", keeps '
            r"[\d.]+ MiB of free memory in the main heap below it: free\(\) cannot return it",
            sentence,
        ), sentence


def heap_mapping_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        if line.endswith("[heap]"):
            start, end = line.split()[0].split("-")
            return int(end, 16) - int(start, 16)
    raise AssertionError("no [heap] mapping")


def rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    assert match
    return int(match.group(1)) * 1024


def wait_line(target: Target, wanted: str, timeout_seconds: float = 10.0) -> None:
    assert target.proc.stdout is not None
    fd = target.proc.stdout.fileno()
    deadline = time.monotonic() + timeout_seconds
    seen = b""
    while wanted.encode() not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"target did not print {wanted!r}: {seen!r}"
        readable, _, _ = select.select([fd], [], [], left)
        if readable:
            chunk = os.read(fd, 4096)
            assert chunk, "target exited"
            seen += chunk


def test_kernel_trim_keeps_the_address_space_and_the_freed_pin_lets_it_shrink() -> None:
    with shape("last", "400", stdin=subprocess.PIPE) as target:
        (address, user, _chunk) = printed_pins(target)[0]
        document = inspect_pins(target.pid)
        check_pins_found(document, printed_pins(target))
        heap_before, rss_before = heap_mapping_bytes(target.pid), rss_bytes(target.pid)
        assert heap_before >= user
        trimmed = CliRunner().invoke(cli, ["trim", str(target.pid)])
        assert trimmed.exit_code == 0, trimmed.output + trimmed.stderr
        # The pin holds the heap's top in place: the address space stays, the pages go.
        assert heap_mapping_bytes(target.pid) == heap_before
        assert rss_before - rss_bytes(target.pid) >= 0.9 * user
        after = inspect_pins(target.pid)
        pin = next(p for p in after["pins"] if p["address"] == address)
        assert pin["resident_bytes"] < 0.05 * user  # the report sees the pages released
        assert target.proc.stdin is not None
        target.proc.stdin.write(b"release\n")
        target.proc.stdin.flush()
        wait_line(target, "released")
        assert heap_mapping_bytes(target.pid) <= heap_before - 0.9 * user


def test_a_cxx_pin_is_named_by_its_type() -> None:
    """A stripped C++ program's pin is a shop::Cart: the census's RTTI names it, and the
    sentence says so."""
    from tests.support.census_targets import compile_cxx

    with running([str(compile_cxx("pin_cxx"))]) as target:
        expected = printed_pins(target)
        document = inspect_pins(target.pid)
        check_pins_found(document, expected)
        pin = next(p for p in document["pins"] if p["address"] == expected[0][0])
        assert pin["type"] == "shop::Cart" and pin["kind"] == "c++"
        assert f"chunk at {expected[0][0]:#x}, a shop::Cart, keeps" in pin["sentence"]


def test_a_core_names_the_same_pin(tmp_path: Path) -> None:
    """gdb's gcore of a pinned target (the test's tool): `inspect --core --pins` names the
    pin at the target's address with the same bytes; residency is unknown (null)."""
    import shutil

    from tests.support.gcore import gcore

    if shutil.which("gdb") is None:
        pytest.skip("gdb is not installed (the test writes the core with gcore)")
    core = tmp_path / "core"
    with shape("thread", "200") as target:
        expected = printed_pins(target)
        gcore(target.pid, core)
    result = CliRunner().invoke(cli, ["inspect", "--core", str(core), "--json", "--pins"])
    assert result.exit_code == 0, result.output + result.stderr
    document = json.loads(result.stdout)
    check_pins_found(document, expected)
    assert all(pin["resident_bytes"] is None for pin in document["pins"])
    assert document["heap_maps"]["resident_known"] is False
