"""gdbmi.parse_register_list: the register lists read without pygdbmi, exactly as it reads them."""

from __future__ import annotations

import pytest
from pygdbmi import gdbmiparser

from memforensics.sources.gdb.gdbmi import parse_register_list

# The shapes gdb 13 answers on x86-64 (values in raw format: a union of every view for the
# vector registers, {lo, hi} pairs, plain hex), and names with the empty ones gdb lists.
_UNION = (
    "{v8_bfloat16 = {0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0}, v4_float = {0x0, 0x1, 0x0, 0x0}, "
    "v2_double = {0x0, 0x0}, v16_int8 = {0x0 <repeats 16 times>}, uint128 = 0xff00}"
)
VALUES = (
    '23^done,register-values=[{number="0",value="0xfffffffffffffe00"},'
    '{number="16",value="0x00007f00cdd642ec"},'
    f'{{number="40",value="{_UNION}"}},'
    '{number="119",value="{0x00000000000000000000000000000000, 0x1}"}]'
)
NAMES = '22^done,register-names=["rax","rbx","","","xmm0","ymm0h","k7"]'


@pytest.mark.parametrize("line", [VALUES, NAMES, "7^done,register-values=[]"])
def test_a_register_list_reads_as_pygdbmi_reads_it(line: str) -> None:
    assert parse_register_list(line) == gdbmiparser.parse_response(line)


@pytest.mark.parametrize(
    "line",
    [
        '5^done,register-values=[{number="0",value="a \\"quoted\\" value"}]',  # an escape
        '5^done,register-values=[{number="0",value="0x1",extra="y"}]',  # another field
        '5^done,register-names=["rax",x]',  # not a string
        '5^error,msg="No registers."',
        '*stopped,reason="signal-received"',
        '5^done,value="93869138287552"',
    ],
)
def test_anything_else_is_left_to_pygdbmi(line: str) -> None:
    assert parse_register_list(line) is None
