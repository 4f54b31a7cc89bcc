"""Old glibc's garbage ``<unsorted>`` line: flagged suspect, kept out of rest, free and in use.

glibc <= 2.17 printed the unsorted bin's slot of malloc_info's size table without ever
filling it in, and added it into the arena's (and the process's) ``rest``
(malloc_info-format.md §3). Such a line cannot describe free chunks: its total is more than
the arena holds, or it does not fit ``count`` chunks between ``from`` and ``to``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from memforensics.analysis.heap import analyze
from memforensics.model.heap import HeapDump
from memforensics.sources.malloc_info.malloc_xml import iter_dumps, parse_dump
from tests.unit.test_analysis_heap import _big_dump_xml

FIXTURES = Path(__file__).resolve().parent.parent.parent / "fixtures"
GARBAGE_212 = 140737488343424  # the <unsorted> total in dialects/glibc-2.12-nested.xml
GARBAGE_212_COUNT = 140737354101600


def _old_dump(unsorted: str, *, in_rest: bool = True, shape: str = "text") -> bytes:
    """A two-arena glibc 2.17-shaped dump (no top in rest, column-0 lines) whose main arena
    ends with ``unsorted``; ``in_rest``: glibc added it into rest, as it did once the arena
    was initialised. ``shape``: "text" (glibc's exact shape), "tree" (an unknown attribute on
    the heap element), "lines" (an unknown attribute on a bucket line): the parser's three
    paths."""
    numbers = [int(v) for v in re.findall(r'"(\d+)"', unsorted)]
    _, _, total, count = numbers
    rest_count, rest_size = 5 + 1, 245 + 1129
    if in_rest:
        rest_count, rest_size = rest_count + count, rest_size + total
    heap_attr = ' numa="0"' if shape == "tree" else ""
    line_attr = ' note="x"' if shape == "lines" else ""
    return f"""<malloc version="1">
<heap nr="0"{heap_attr}>
<sizes>
<size from="17" to="32" total="224" count="7"{line_attr}/>
<size from="49" to="49" total="245" count="5"/>
<size from="1129" to="1129" total="1129" count="1"/>
{unsorted}
</sizes>
<total type="fast" count="7" size="224"/>
<total type="rest" count="{rest_count}" size="{rest_size}"/>
<system type="current" size="1351680"/>
<system type="max" size="1351680"/>
</heap>
<heap nr="1">
<sizes>
<size from="65" to="65" total="650" count="10"/>
</sizes>
<total type="fast" count="0" size="0"/>
<total type="rest" count="10" size="650"/>
<system type="current" size="135168"/>
<system type="max" size="135168"/>
</heap>
<total type="fast" count="7" size="224"/>
<total type="rest" count="{rest_count + 10}" size="{rest_size + 650}"/>
<system type="current" size="1486848"/>
<system type="max" size="1486848"/>
</malloc>
""".encode()


def _one(path: str) -> HeapDump:
    return parse_dump((FIXTURES / path).read_bytes(), name=path)


def test_glibc_212_garbage_is_kept_out_of_the_totals() -> None:
    """Free and in use are the real bins' (not "free 128 TiB, in use 0 B"); the garbage
    stays visible as a suspect line."""
    dump = _one("dialects/glibc-2.12-nested.xml")
    main = dump.arenas[0]
    (garbage,) = [b for b in main.sizes if b.kind == "unsorted"]
    assert garbage.suspect and garbage.total_bytes == GARBAGE_212
    bins = [b for b in main.sizes if b.kind == "bin"]
    assert main.rest_chunks == sum(b.count for b in bins) == 34
    assert main.rest_bytes == sum(b.total_bytes for b in bins) == 24192
    assert main.free_bytes == 992 + 24192
    assert main.in_use_bytes == 2703360 - (992 + 24192)
    assert main.suspect and main.implausible == (garbage,) and main.implausible_in_rest
    # Process totals: glibc summed the garbage in too; they stay the sums of the arenas.
    assert dump.rest_chunks == sum(a.rest_chunks for a in dump.arenas)
    assert dump.rest_bytes == sum(a.rest_bytes for a in dump.arenas)
    assert dump.free_bytes < dump.system_bytes
    assert any("kept out of rest" in note and "arena 0" in note for note in dump.notes)
    analysis = analyze(dump)
    assert analysis.totals.free_bytes == dump.free_bytes and analysis.totals.suspect
    assert analysis.advice[0].code == "suspect-counters"


@pytest.mark.parametrize("shape", ["text", "tree", "lines"])
@pytest.mark.parametrize(
    ("line", "why"),
    [
        # plausible magnitudes (no count near 10**9), but 1 TiB in a 1.3 MiB arena
        ('<unsorted from="33" to="1099511627777" total="1099511627810" count="2"/>', "system"),
        # 5 chunks of at least 140,737 bytes cannot total 96 bytes
        ('<unsorted from="140737" to="140737" total="96" count="5"/>', "range"),
        # from above to
        ('<unsorted from="4097" to="33" total="4130" count="2"/>', "range"),
        # a raw chunk size below 16 bytes does not exist
        ('<unsorted from="0" to="0" total="0" count="3"/>', "range"),
    ],
)
def test_an_implausible_unsorted_line_is_suspect_and_out_of_rest(
    line: str, why: str, shape: str
) -> None:
    dump = parse_dump(_old_dump(line, shape=shape))
    main = dump.arenas[0]
    (unsorted,) = [b for b in main.sizes if b.kind == "unsorted"]
    assert unsorted.suspect, why
    assert main.suspect and main.implausible_in_rest
    assert (main.rest_chunks, main.rest_bytes) == (5 + 1, 245 + 1129)
    assert (dump.rest_chunks, dump.rest_bytes) == (5 + 1 + 10, 245 + 1129 + 650)
    analysis = analyze(dump)
    assert sum(r.chunks for r in analysis.histogram) == 7 + 5 + 1 + 10  # not the garbage
    assert not dump.arenas[1].suspect


def test_a_garbage_line_glibc_did_not_add_into_rest_leaves_rest_alone() -> None:
    """An arena malloc never initialised: glibc printed the slot but rest does not hold it."""
    line = '<unsorted from="33" to="1099511627777" total="1099511627810" count="2"/>'
    main = parse_dump(_old_dump(line, in_rest=False)).arenas[0]
    assert main.suspect and main.implausible and not main.implausible_in_rest
    assert (main.rest_chunks, main.rest_bytes) == (5 + 1, 245 + 1129)
    assert main.top_bytes is None


def test_a_plausible_unsorted_line_is_left_as_printed() -> None:
    line = '<unsorted from="97" to="8193" total="8290" count="2"/>'
    dump = parse_dump(_old_dump(line))
    main = dump.arenas[0]
    assert not main.suspect and main.implausible == () and not main.implausible_in_rest
    assert main.rest_bytes == 245 + 1129 + 8290
    assert not any("kept out of rest" in note for note in dump.notes)


def test_real_dumps_have_no_implausible_line() -> None:
    for path in sorted(FIXTURES.glob("*.xml")) + sorted((FIXTURES / "published").glob("*.xml")):
        if "fragment" in path.name:
            continue
        for dump in iter_dumps(path):
            assert not any(a.implausible for a in dump.arenas), path.name


def test_big_dump_with_small_valued_garbage_is_the_same_with_and_without_numpy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A garbage line under the magnitude thresholds: the vectorised sums would not see it
    as suspect, so the report must not take them for that dump."""
    from memforensics.analysis.bucket_arrays import MIN_TEXT_BYTES
    from tests.unit.test_analysis_heap import _without_numpy

    pytest.importorskip("numpy", reason="the vectorised path needs numpy")
    xml = _big_dump_xml(MIN_TEXT_BYTES // (126 * 45) + 5)
    heap_3 = xml.index(b'<heap nr="3">')
    at = xml.index(b'<unsorted from="49"', heap_3)
    xml = xml[:at] + b'<unsorted from="4294967297"' + xml[at + len(b'<unsorted from="49"') :]
    with_numpy = analyze(parse_dump(xml))
    assert with_numpy.arenas[3].suspect and not with_numpy.arenas[2].suspect
    with monkeypatch.context() as patch:
        _without_numpy(patch)
        without = analyze(parse_dump(xml))
    assert (with_numpy.arenas, with_numpy.histogram) == (without.arenas, without.histogram)
    assert with_numpy.trim_release_bytes == without.trim_release_bytes
