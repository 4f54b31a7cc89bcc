"""Calls whose results come back through memory (sources.proc.ptrace_probe), made on the
integrity target (tests/targets/integrity.c: registers with upper ymm lanes, an ordered pipe,
SIGALRM every 2 ms, heap buffers), which says at its end whether anything was disturbed.

The calls are libc's own clock_gettime, directly and through syscall() with seven arguments
(the seventh on the stack, through libc's pop-pop-pop-ret): the oracle is our own clock, the
same kernel's, read around the call.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest

from memforensics.sources.glibc.libc_elf import LibcImage, load_libc_image
from memforensics.sources.proc import process_facts
from memforensics.sources.proc.elf_dynsym import function_symbols, read_mapped_file
from memforensics.sources.proc.ptrace_call import ScratchRef, caller_thread
from memforensics.sources.proc.ptrace_hold import ThreadHold
from memforensics.sources.proc.ptrace_probe import ProbeCall, call_reading
from tests.support.targets import (
    assert_integrity_intact,
    compile_target,
    live_skip_reason,
    proc_status,
    running,
)

_SKIP = live_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]

CLOCK_REALTIME, CLOCK_MONOTONIC = 0, 1
SYS_CLOCK_GETTIME = 228  # x86-64
SYS_PAUSE = 34  # x86-64
ROUNDS = 20


def _functions(pid: int, libc: LibcImage) -> dict[str, int]:
    mapped = read_mapped_file(pid, libc.path)
    wanted = frozenset({"clock_gettime", "syscall", "usleep"})
    return function_symbols(mapped.data, mapped.base, libc.path, wanted).defaults


def _seconds(scratch: bytes) -> float:
    tv_sec, tv_nsec = struct.unpack_from("<qq", scratch)
    return tv_sec + tv_nsec / 1e9


def test_calls_read_back_the_targets_clocks_and_leave_it_undisturbed() -> None:
    binary = compile_target("integrity", "-mavx2")
    with running([str(binary)]) as target:
        libc_path = process_facts.read_process(target.pid).libc_path
        assert libc_path is not None
        libc = load_libc_image(target.pid, libc_path)
        assert libc.restore_rt is not None and libc.pop3_ret is not None
        functions = _functions(target.pid, libc)
        sentinel = struct.pack("<qq", -1, -1)
        calls = [
            ProbeCall(functions["clock_gettime"], (CLOCK_MONOTONIC, ScratchRef(0)), sentinel),
            ProbeCall(functions["clock_gettime"], (CLOCK_REALTIME, ScratchRef(0)), sentinel),
            # syscall(number, a1 … a6): seven arguments, the last on the stack.
            ProbeCall(
                functions["syscall"],
                (SYS_CLOCK_GETTIME, CLOCK_MONOTONIC, ScratchRef(0), 0, 0, 0, 0x5EED),
                sentinel,
            ),
        ]
        for round_index in range(ROUNDS):
            before_monotonic, before_real = time.monotonic(), time.time()
            results = None
            # The target's SIGALRM every 2 ms may hold its thread in a signal stop, where no
            # call is made: the hold is let go and made again, as the direct trim does.
            for _attempt in range(50):
                with ThreadHold(target.pid, timeout_seconds=2.0, registers=True) as hold:
                    caller = caller_thread(hold, target.pid)
                    if caller is None:
                        continue
                    results = call_reading(
                        hold,
                        caller,
                        calls,
                        restore_rt=libc.restore_rt,
                        deadline=time.monotonic() + 5,
                        pop3_ret=libc.pop3_ret,
                    )
                    break
            after_monotonic, after_real = time.monotonic(), time.time()
            assert results is not None, (
                f"round {round_index}: no caller in 50 holds, or the calls did not end"
            )
            monotonic, real, through_syscall = (_seconds(r) for r in results)
            assert before_monotonic - 0.01 <= monotonic <= after_monotonic + 0.01
            assert before_real - 0.01 <= real <= after_real + 0.01
            assert monotonic <= through_syscall <= after_monotonic + 0.01
            status = proc_status(target.pid)
            assert status["TracerPid"] == "0" and status["State"][0] in "RS"
            time.sleep(0.01 * (round_index % 5))  # other moments of its loop
        assert_integrity_intact(target)


def test_a_call_past_its_deadline_in_a_system_call_is_left_to_restore_itself() -> None:
    """A call still sleeping at its deadline (usleep, 300 ms, against a 50 ms deadline, in
    tests/targets/proc_idle.c, which no signal wakes): the interrupt that ends the wait
    wakes the sleep, and the first stop the thread then reaches is that system call's exit
    (SIGTRAP | 0x80 under PTRACE_SYSCALL), no signal's. It is resumed as no signal: the call
    is given up (None), the thread sleeps on after the release, restores itself and is back
    in its pause(). (It once took that stop for a signal numbered 133: PTRACE_CONT failed
    with EIO, seen with Redis under redis-benchmark.)"""
    binary = compile_target("proc_idle")
    with running([str(binary)]) as target:
        libc_path = process_facts.read_process(target.pid).libc_path
        assert libc_path is not None
        libc = load_libc_image(target.pid, libc_path)
        assert libc.restore_rt is not None
        functions = _functions(target.pid, libc)
        for _round in range(3):
            with ThreadHold(target.pid, timeout_seconds=2.0, registers=True) as hold:
                caller = caller_thread(hold, target.pid)
                assert caller == target.pid
                results = call_reading(
                    hold,
                    caller,
                    [ProbeCall(functions["usleep"], (300_000,), b"")],
                    restore_rt=libc.restore_rt,
                    deadline=time.monotonic() + 0.05,
                )
            assert results is None
            status = proc_status(target.pid)
            assert status["TracerPid"] == "0"
            time.sleep(0.5)  # its sleep ends, and it restores itself
            status = proc_status(target.pid)
            assert status["TracerPid"] == "0" and status["State"][0] == "S"
            syscall = Path(f"/proc/{target.pid}/syscall").read_text().split()
            assert syscall[0] == str(SYS_PAUSE), syscall  # back where the hold found it


def test_more_arguments_than_the_frame_can_pass_are_refused() -> None:
    """Nine arguments at most (six in registers, three on the stack); a tenth is refused
    before anything is written, never dropped."""
    from memforensics.sources.proc.ptrace_call import build_frame
    from memforensics.sources.proc.ptrace_regs import UserRegs

    regs = UserRegs()
    regs.rsp = 0x7FFF_0000_0000
    with pytest.raises(ValueError):
        build_frame(regs, bytes(1024), 0, 0x1000, stack_args=(1, 2, 3, 4), pop3_ret=0x2000)
    with pytest.raises(ValueError):
        build_frame(regs, bytes(1024), 0, 0x1000, stack_args=(1,), pop3_ret=None)
    frame = build_frame(regs, bytes(1024), 0, 0x1000, stack_args=(7, 8), pop3_ret=0x2000)
    assert frame.entry == frame.address - 32 and frame.entry % 16 == 8
    assert struct.unpack_from("<4Q", frame.image) == (0x2000, 7, 8, 0)
    assert struct.unpack_from("<Q", frame.image, 32)[0] == 0x1000  # then __restore_rt
