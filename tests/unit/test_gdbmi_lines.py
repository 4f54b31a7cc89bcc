"""gdbmi.parse_line: one line of gdb/MI output becomes a record, never an exception.

The broken line is the shape a clean-clone CI run met when SIGTERM interrupted `inspect
--gdb` while it ran a single-threaded target forward: gdb left a console record
unterminated and glued the ``*stopped`` record to it, pygdbmi raised ValueError, and the
session ended in an internal error (exit 5) instead of its interrupted detach.
"""

from __future__ import annotations

import pytest
from pygdbmi import gdbmiparser

from memforensics.sources.gdb.gdbmi import parse_line

_STOPPED = (
    '*stopped,reason="signal-received",signal-name="0",frame={addr="0x00007feaa99a7167",'
    'func="__write_nocancel",args=[],from="/lib/x86_64-linux-gnu/libc.so.6",'
    'arch="i386:x86-64"},thread-id="1",stopped-threads=["1"],core="1"'
)
_BROKEN_CONSOLE = '~"0x00007feaa99a7167 in __write_nocancel () from /lib/x86_64-linux-gnu/libc.so.6'


def test_pygdbmi_refuses_the_glued_line() -> None:
    with pytest.raises(ValueError):
        gdbmiparser.parse_response(_BROKEN_CONSOLE + _STOPPED)


def test_the_record_glued_after_a_broken_console_line_is_read() -> None:
    """The *stopped record is read as pygdbmi reads it alone, untokened: the "6" of
    "libc.so.6" before it is the broken text's, not a token."""
    record = parse_line(_BROKEN_CONSOLE + _STOPPED)
    assert record == gdbmiparser.parse_response(_STOPPED)
    assert record["token"] is None


def test_a_result_glued_after_a_broken_console_line_keeps_its_token() -> None:
    record = parse_line('~"half a line12^done,value="3"')
    assert record == gdbmiparser.parse_response('12^done,value="3"')


@pytest.mark.parametrize(
    "line",
    ['~"an "unterminated" quote', '&"warning: \\"x', '=thread-group-added,id="i1'],
)
def test_a_line_with_no_readable_record_is_output(line: str) -> None:
    try:
        expected = gdbmiparser.parse_response(line)
    except ValueError:
        expected = {"type": "output", "message": None, "payload": line, "stream": "stdout"}
    assert parse_line(line) == expected


@pytest.mark.parametrize(
    "line", ['12^done,value="3"', _STOPPED, '~"text\\n"', '=thread-exited,id="2",group-id="i1"']
)
def test_a_well_formed_line_reads_as_pygdbmi_reads_it(line: str) -> None:
    assert parse_line(line) == gdbmiparser.parse_response(line)
