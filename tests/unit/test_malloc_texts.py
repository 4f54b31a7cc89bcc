"""The reader hands libxml2 each glibc-shaped arena without its bucket lines: same results.

Every test compares against the tree path (a leading comment makes the reader distrust the
text, so every arena is read from libxml2's tree, as before the slimming).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memforensics.errors import InputDataError
from memforensics.model.heap import HeapDump
from memforensics.sources.malloc_info import malloc_texts, malloc_xml
from memforensics.sources.malloc_info.malloc_xml import iter_dumps
from tests.unit.test_malloc_xml import MODERN

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def _facts(dumps: list[HeapDump]) -> list[object]:
    """Everything a report reads from the dumps, bucket lines and their line numbers too."""
    return [
        (
            d.sequence,
            d.line,
            d.system_bytes,
            d.rest_bytes,
            d.extra,
            d.notes,
            [
                (
                    a.index,
                    a.line,
                    a.rest_bytes,
                    a.system_bytes,
                    a.subheaps,
                    a.extra,
                    a.top_bytes,
                    [
                        (
                            b.kind,
                            b.from_bytes,
                            b.to_bytes,
                            b.total_bytes,
                            b.count,
                            b.line,
                            b.suspect,
                        )
                        for b in a.sizes
                    ],
                )
                for a in d.arenas
            ],
        )
        for d in dumps
    ]


def _tree_path(xml: bytes) -> list[object]:
    return _facts(list(iter_dumps(b"<!-- tree path -->" + xml, name="t.xml")))


SERIES = MODERN + b"=== later ===\n" + MODERN.replace(b'count="2"/>', b'count="4"/>') + MODERN


@pytest.mark.parametrize("chunk_bytes", [1, 2, 5, 6, 7, 13, 64, 333, 1 << 20])
def test_every_chunk_size_gives_the_tree_paths_figures(
    monkeypatch: pytest.MonkeyPatch, chunk_bytes: int
) -> None:
    """A "<heap", a bucket line or a whole arena cut by a chunk boundary changes nothing."""
    expected = _tree_path(SERIES)
    monkeypatch.setattr(malloc_xml, "READ_CHUNK_BYTES", chunk_bytes)
    assert _facts(list(iter_dumps(SERIES, name="t.xml"))) == expected


@pytest.mark.parametrize(
    "name",
    [
        *sorted(
            str(p.relative_to(FIXTURES))
            for p in (FIXTURES / "dialects").glob("*.xml")
            if "jemalloc" not in p.name and "hardened" not in p.name
        ),
        "series-5.xml",
        "threads-fragmented.xml",
        "arena-max-1.xml",
    ],
)
def test_real_dumps_and_dialects_read_the_same_both_ways(name: str) -> None:
    xml = (FIXTURES / name).read_bytes()
    assert _facts(list(iter_dumps(xml, name="t.xml"))) == _tree_path(xml)


def test_an_arena_too_long_to_hold_is_read_from_the_tree(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past MAX_HELD_HEAP_BYTES nothing more is held back or replaced; figures are kept."""
    monkeypatch.setattr(malloc_xml, "READ_CHUNK_BYTES", 16)
    monkeypatch.setattr(malloc_texts, "MAX_HELD_HEAP_BYTES", 40)
    assert _facts(list(iter_dumps(SERIES, name="t.xml"))) == _tree_path(SERIES)


def test_the_parser_sees_heaps_without_their_bucket_lines() -> None:
    """What libxml2 is given: the table replaced, every newline kept, the rest verbatim."""
    texts = malloc_texts.HeapTexts()
    fed = texts.take(MODERN, final=True)
    assert fed.count(b"\n") == MODERN.count(b"\n")
    expected = re.sub(
        rb"<sizes>.*?</sizes>",
        lambda m: b"<sizes/>" + b"\n" * m.group(0).count(b"\n"),
        MODERN,
        flags=re.DOTALL,
    )
    assert fed == expected and b"<size " not in fed
    assert [m.group(1) for m in texts.entries if m is not None] == [b"0", b"1"]


@pytest.mark.parametrize(
    ("xml", "fragment", "line"),
    [
        # Faults after a replaced table are reported on their real lines.
        (
            MODERN.replace(b'<system type="max" size="0"/>', b'<system type="max" size="x"/>'),
            "not a number",
            21,
        ),
        (MODERN.replace(b'<heap nr="1">', b'<heap nr="1"><<'), "well-formed XML", 15),
        (
            MODERN.replace(b'<heap nr="1">\n<sizes>', b'<heap nr="1">\n<sizes>\n<heap nr="2"/>'),
            "<heap> outside",
            17,
        ),
    ],
)
def test_errors_after_a_replaced_table_name_the_real_line(
    xml: bytes, fragment: str, line: int
) -> None:
    with pytest.raises(InputDataError) as info:
        list(iter_dumps(xml, name="t.xml"))
    assert fragment in str(info.value)
    assert info.value.line == line
    assert info.value.exit_code == 7


@pytest.mark.timeout(60)
@pytest.mark.parametrize("opening", [b"<heap>", b'<heap nr="1"><sizes>', b"<heap/>"])
def test_a_flood_of_opening_heap_tags_is_refused_in_one_pass(opening: bytes) -> None:
    """Hundreds of thousands of "<heap" with no glibc arena among them: each one must not
    search the rest of the input again (that was quadratic: hours for a few MB)."""
    xml = b'<malloc version="1">\n' + opening * (2_000_000 // len(opening)) + b"\n</malloc>\n"
    with pytest.raises(InputDataError) as info:
        list(iter_dumps(xml, name="t.xml"))
    assert info.value.line == 2 and info.value.exit_code == 7


@pytest.mark.parametrize("control", [b"\x0c", b"\x0b"])
def test_a_character_xml_forbids_between_bucket_lines_is_still_refused(control: bytes) -> None:
    """A replaced table is never seen by libxml2, so its pattern admits XML's whitespace only
    (a regex "\\s" would also take form feed and vertical tab, which libxml2 refuses)."""
    xml = MODERN.replace(
        b'count="2"/>\n  <size from="1041"', b'count="2"/>\n' + control + b'  <size from="1041"'
    )
    with pytest.raises(InputDataError) as info:
        list(iter_dumps(xml, name="t.xml"))
    assert "invalid Char" in str(info.value) and info.value.line == 5


@pytest.mark.parametrize("newline", [b"\r\n", b"\n\t \r\n"])
def test_other_line_breaks_give_the_tree_paths_lines(newline: bytes) -> None:
    # (A lone CR is no line for libxml2; the tree path's bucket lines count it after
    # serialising, as they did before the tables were replaced: not compared here.)
    xml = SERIES.replace(b"\n", newline)
    assert _facts(list(iter_dumps(xml, name="t.xml"))) == _tree_path(xml)


_ARENA = MODERN[MODERN.index(b'<heap nr="0">') : MODERN.index(b'<heap nr="1">')]
# Pieces a document is assembled from: glibc's arena, arenas of other shapes (read from the
# tree), and markup that must not shift which text pairs with which element.
_PIECES = [
    _ARENA,
    _ARENA.replace(b"<sizes>\n", b"<sizes>\n<odd/>\n"),  # not glibc's shape
    _ARENA.replace(b'<heap nr="0">', b'<heap  nr="0" >'),  # well-formed, not glibc's text
    _ARENA.replace(b"</sizes>", b"</sizes>\n<future kind='x'/>"),
    b"\n",
    b"\t \r\n",
]


@settings(max_examples=60, deadline=None)
@given(
    picks=st.lists(st.sampled_from(range(len(_PIECES))), min_size=1, max_size=12),
    chunk_bytes=st.one_of(st.integers(min_value=1, max_value=600), st.just(1 << 20)),
    held_bytes=st.sampled_from([64, 1 << 20]),
)
def test_any_mix_of_arena_shapes_reads_as_the_tree_path_does(
    picks: list[int], chunk_bytes: int, held_bytes: int
) -> None:
    """Whatever the mix of shapes, chunk boundaries and holding limit, every arena gets its
    own figures: the same as reading every arena from libxml2's tree."""
    numbered = []
    for index, pick in enumerate(picks):
        piece = _PIECES[pick]
        numbered.append(piece.replace(b'nr="0"', f'nr="{index}"'.encode()))
    head, tail = MODERN[: MODERN.index(b"<heap")], MODERN[MODERN.index(b"</heap>\n<total") + 8 :]
    xml = head + b"".join(numbered) + tail
    expected = _tree_path(xml)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(malloc_xml, "READ_CHUNK_BYTES", chunk_bytes)
        patch.setattr(malloc_texts, "MAX_HELD_HEAP_BYTES", held_bytes)
        assert _facts(list(iter_dumps(xml, name="t.xml"))) == expected
