"""The malloc_info parser: shapes of every glibc generation, series, and refusals."""

from __future__ import annotations

import io

import pytest

from memforensics.errors import InputDataError
from memforensics.sources.malloc_info.malloc_xml import iter_dumps, parse_dump

# A glibc 2.36 document as the real thing prints it (values from a real dump on Debian 12).
MODERN = b"""<malloc version="1">
<heap nr="0">
<sizes>
  <size from="33" to="48" total="96" count="2"/>
  <size from="1041" to="1041" total="3123" count="3"/>
  <unsorted from="2049" to="4097" total="6146" count="2"/>
</sizes>
<total type="fast" count="2" size="96"/>
<total type="rest" count="6" size="109269"/>
<system type="current" size="135168"/>
<system type="max" size="135168"/>
<aspace type="total" size="135168"/>
<aspace type="mprotect" size="135168"/>
</heap>
<heap nr="1">
<sizes>
</sizes>
<total type="fast" count="0" size="0"/>
<total type="rest" count="1" size="0"/>
<system type="current" size="0"/>
<system type="max" size="0"/>
<aspace type="total" size="0"/>
<aspace type="mprotect" size="0"/>
<aspace type="subheaps" size="0"/>
</heap>
<total type="fast" count="2" size="96"/>
<total type="rest" count="7" size="109269"/>
<total type="mmap" count="3" size="3158016"/>
<system type="current" size="135168"/>
<system type="max" size="135168"/>
<aspace type="total" size="135168"/>
<aspace type="mprotect" size="135168"/>
</malloc>
"""


def one(xml: bytes):
    return parse_dump(xml, name="t.xml")


def error_of(xml: bytes) -> InputDataError:
    with pytest.raises(InputDataError) as info:
        list(iter_dumps(xml, name="t.xml"))
    return info.value


def test_modern_dump_figures_and_nesting() -> None:
    dump = one(MODERN)
    assert [a.index for a in dump.arenas] == [0, 1]
    main = dump.arenas[0]
    # Top-level totals are the process's, not the last arena's (nesting decides).
    assert dump.rest_chunks == 7 and main.rest_chunks == 6
    assert dump.mmap_chunks == 3 and dump.mmap_bytes == 3158016
    assert main.free_bytes == 96 + 109269
    assert main.in_use_bytes == 135168 - (96 + 109269)
    assert dump.arenas[1].subheaps == 0 and main.subheaps is None


def test_bucket_kinds_and_prev_inuse_artefact() -> None:
    sizes = list(one(MODERN).arenas[0].sizes)
    assert [b.kind for b in sizes] == ["fast", "bin", "unsorted"]
    assert sizes[1].chunk_bytes == 3123 - 3  # odd sizes carry PREV_INUSE once per chunk
    assert sizes[0].chunk_bytes == 96
    assert sizes[1].line == 5


def test_top_chunk_derived_from_rest_on_2_31_plus() -> None:
    main = one(MODERN).arenas[0]
    # rest.count == 1 + bins, so top = rest - bins.
    assert main.top_bytes == 109269 - 3123 - 6146
    assert any("top chunk" in note for note in one(MODERN).notes)


def test_unused_arena_has_pseudo_top_of_zero() -> None:
    assert one(MODERN).arenas[1].top_bytes == 0


def test_old_glibc_without_top_mmap_or_fast() -> None:
    xml = (
        MODERN.replace(b'<total type="mmap" count="3" size="3158016"/>\n', b"")
        .replace(b'<total type="fast" count="2" size="96"/>\n', b"")
        .replace(b'<total type="fast" count="0" size="0"/>\n', b"")
        .replace(
            b'<total type="rest" count="6" size="109269"/>',
            b'<total type="rest" count="5" size="9269"/>',
        )
    )
    dump = one(xml)
    assert dump.mmap_bytes is None and dump.mmap_chunks is None
    assert dump.fast_bytes is None and dump.arenas[0].fast_bytes is None
    assert dump.arenas[0].top_bytes is None
    notes = " ".join(dump.notes)
    assert "no mmap total" in notes and "no fastbin totals" in notes


def test_tab_junk_and_column_zero_indentation_parse_the_same() -> None:
    tabs = MODERN.replace(b"  <size", b"\t\t\t\t\t\t\t        <size")
    column_zero = MODERN.replace(b"  <size", b"<size").replace(b"  <unsorted", b"<unsorted")
    assert one(tabs).arenas[0].sizes == one(MODERN).arenas[0].sizes or [
        (b.from_bytes, b.total_bytes) for b in one(tabs).arenas[0].sizes
    ] == [(b.from_bytes, b.total_bytes) for b in one(MODERN).arenas[0].sizes]
    assert [b.count for b in one(column_zero).arenas[0].sizes] == [2, 3, 2]


def test_garbage_unsorted_counts_are_parsed_and_flagged() -> None:
    xml = MODERN.replace(
        b'<unsorted from="2049" to="4097" total="6146" count="2"/>',
        b'<unsorted from="0" to="140737488355328" total="140737488355328"'
        b' count="140737488355328"/>',
    )
    arena = one(xml).arenas[0]
    assert arena.suspect
    assert [b.suspect for b in arena.sizes] == [False, False, True]


def test_unknown_attributes_and_elements_are_kept_not_fatal() -> None:
    xml = MODERN.replace(
        b'<size from="33" to="48" total="96" count="2"/>',
        b'<size from="33" to="48" total="96" count="2" colour="blue"/>',
    ).replace(b'<heap nr="1">', b'<heap nr="1" owner="x">\n<future kind="k"/>')
    dump = one(xml)
    assert ("size@colour", "blue") in dump.arenas[0].extra
    assert ("heap@owner", "x") in dump.arenas[1].extra
    assert any(key == "future" for key, _ in dump.arenas[1].extra)
    assert [b.count for b in dump.arenas[0].sizes] == [2, 3, 2]


def test_series_yields_every_document_in_order_with_text_between() -> None:
    head, tail = MODERN.rsplit(b'<system type="current" size="135168"/>', 1)
    second = head + b'<system type="current" size="1"/>' + tail
    data = MODERN + b"=== 2026-11-21T08:00:00Z ===\n" + second + MODERN
    dumps = list(iter_dumps(io.BytesIO(data), name="series"))
    assert [d.sequence for d in dumps] == [0, 1, 2]
    assert [d.system_bytes for d in dumps] == [135168, 1, 135168]
    assert dumps[1].line == MODERN.count(b"\n") + 2


def test_series_split_across_read_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    from memforensics.sources.malloc_info import malloc_xml

    monkeypatch.setattr(malloc_xml, "READ_CHUNK_BYTES", 7)
    dumps = list(iter_dumps(MODERN * 3))
    assert len(dumps) == 3 and all(len(d.arenas) == 2 for d in dumps)


def test_xml_declaration_and_bom_are_accepted() -> None:
    dump = one(b'\xef\xbb\xbf<?xml version="1.0" encoding="UTF-8"?>\n' + MODERN)
    assert dump.arenas[0].sizes[0].line == 4 + 1  # one line of declaration before


@pytest.mark.parametrize(
    ("xml", "fragment", "line"),
    [
        (b"", "empty input", 1),
        (b"   \n\n", "empty input", 1),
        (b"\x00\x01\xff\xfe garbage", "not a malloc_info dump", 1),
        (MODERN[:400], "truncated", None),
        (b'<svg xmlns="http://www.w3.org/2000/svg"><rect/></svg>', "found <svg>", 1),
        (MODERN.replace(b' version="1"', b""), "no version", 1),
        (MODERN.replace(b'version="1"', b'version="2"'), 'unsupported <malloc version="2">', 1),
        (MODERN.replace(b'version="1"', b'version="jemalloc-1"'), "jemalloc", 1),
        (MODERN.replace(b'version="1"', b'version="hardened_malloc-1"'), "hardened_malloc", 1),
        (MODERN.replace(b'total="3123"', b'total="31x3"'), "not a number: <size> total", 5),
        (MODERN.replace(b'total="3123"', b'total="-3123"'), "negative number", 5),
        (MODERN.replace(b'total="3123"', b'total="18446744073709551616"'), "over 2^64", 5),
        (MODERN.replace(b' count="3"', b""), "missing attribute: <size> count", 5),
        (MODERN.replace(b'<system type="max" size="135168"/>\n', b"", 1), "arena 0 has no", 2),
        (MODERN.replace(b'<heap nr="0">', b'<heap nr="zero">'), "<heap> nr", 2),
        (
            MODERN[
                MODERN.index(b"<heap") : MODERN.index(
                    b'<total type="fast" count="2" size="96"/>\n<total type="rest" count="7"'
                )
            ],
            "<heap> outside",
            1,
        ),
    ],
)
def test_bad_input_is_one_error_with_file_and_line(
    xml: bytes, fragment: str, line: int | None
) -> None:
    err = error_of(xml)
    assert fragment in str(err)
    assert str(err).startswith("t.xml:")
    if line is not None:
        assert err.line == line
    assert err.exit_code == 7


def test_billion_laughs_is_refused_before_expansion() -> None:
    xml = (
        b'<?xml version="1.0"?>\n<!DOCTYPE malloc [\n<!ENTITY a "aaaaaaaaaa">\n'
        + b"".join(
            b'<!ENTITY %s "%s">\n' % (bytes([98 + i]), (b"&%s;" % bytes([97 + i])) * 10)
            for i in range(9)
        )
        + b']>\n<malloc version="1">&j;</malloc>\n'
    )
    err = error_of(xml)
    assert "DTD" in str(err) and err.line == 2


def test_external_entity_is_never_resolved(tmp_path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-CONTENT")
    xml = (
        b'<!DOCTYPE malloc [<!ENTITY x SYSTEM "file://%s">]>\n<malloc version="1">&x;</malloc>'
        % str(secret).encode()
    )
    err = error_of(xml)
    assert "TOP-SECRET" not in str(err) and "DTD" in str(err)


def test_undeclared_entity_reference_is_malformed_not_resolved() -> None:
    err = error_of(MODERN.replace(b"<sizes>", b"<sizes>&passwd;", 1))
    assert "Entity 'passwd' not defined" in str(err) and err.line == 3


def test_paths_and_streams(tmp_path) -> None:
    path = tmp_path / "d.xml"
    path.write_bytes(MODERN)
    assert one(MODERN).arenas[0].sizes == next(iter_dumps(path)).arenas[0].sizes
    assert next(iter_dumps(str(path))).source == str(path)
    with path.open("rb") as stream:
        assert len(next(iter_dumps(stream)).arenas) == 2
    missing = error_of_path(tmp_path / "nope.xml")
    assert "no such file" in str(missing)
    assert "is a directory" in str(error_of_path(tmp_path))


def error_of_path(path) -> InputDataError:
    with pytest.raises(InputDataError) as info:
        list(iter_dumps(path))
    return info.value


def test_parse_dump_wants_exactly_one_document() -> None:
    with pytest.raises(InputDataError, match="expected one <malloc> document, found 2"):
        parse_dump(MODERN + MODERN)


def test_all_zero_dump_means_another_allocator() -> None:
    zero = b"""<malloc version="1">
<heap nr="0">
<sizes>
</sizes>
<total type="fast" count="0" size="0"/>
<total type="rest" count="1" size="0"/>
<system type="current" size="0"/>
<system type="max" size="0"/>
<aspace type="total" size="0"/>
<aspace type="mprotect" size="0"/>
</heap>
<total type="fast" count="0" size="0"/>
<total type="rest" count="1" size="0"/>
<total type="mmap" count="0" size="0"/>
<system type="current" size="0"/>
<system type="max" size="0"/>
<aspace type="total" size="0"/>
<aspace type="mprotect" size="0"/>
</malloc>
"""
    assert one(zero).all_zero
    assert not one(MODERN).all_zero


def test_one_line_dump_reports_real_lines_not_invented_ones() -> None:
    """Bucket lines used to be numbered as if each sat on its own line: a dump written on one
    line reported lines 3, 4, 5 … that do not exist. They come from the text now."""
    flat = b" ".join(MODERN.split(b"\n"))
    dump = one(flat)
    assert [b.line for b in dump.arenas[0].sizes] == [1, 1, 1]
    assert dump.arenas[0].line == 1 and dump.line == 1


def test_two_buckets_on_a_line_share_its_number() -> None:
    packed = MODERN.replace(b'count="2"/>\n  <size from="1041"', b'count="2"/><size from="1041"')
    assert [b.line for b in one(packed).arenas[0].sizes] == [4, 4, 5]


def test_fast_and_careful_bucket_paths_agree() -> None:
    """The checked-text path (columns) and the element-by-element path build equal buckets."""
    fast = one(MODERN).arenas[0].sizes
    # An unknown attribute sends the table down the careful path (and is kept in `extra`).
    careful_dump = one(MODERN.replace(b'<size from="33"', b'<size x="1" from="33"'))
    careful = careful_dump.arenas[0].sizes
    assert type(fast) is not type(careful)
    assert [(b.kind, b.from_bytes, b.to_bytes, b.total_bytes, b.count, b.line) for b in fast] == [
        (b.kind, b.from_bytes, b.to_bytes, b.total_bytes, b.count, b.line) for b in careful
    ]


def test_leading_zeros_are_read_as_decimal() -> None:
    """``007`` is not a JSON number: the columns decoder falls back and still reads 7."""
    dump = one(MODERN.replace(b'total="96" count="2"', b'total="096" count="02"'))
    assert (dump.arenas[0].sizes[0].total_bytes, dump.arenas[0].sizes[0].count) == (96, 2)


def test_a_project_error_from_the_stream_is_not_rewrapped() -> None:
    """TargetPermissionError is also an OSError; reading must not turn it into 'cannot read'."""
    from memforensics.errors import TargetPermissionError

    class Refusing(io.RawIOBase):
        def read(self, size: int = -1) -> bytes:
            raise TargetPermissionError("not allowed to read PID 1's memory", pid=1)

    with pytest.raises(TargetPermissionError):
        list(iter_dumps(Refusing(), name="pid:1"))  # type: ignore[arg-type]


def _figures(xml: bytes) -> list[tuple[int, int, int, list[tuple[int, int]]]]:
    return [
        (a.index, a.rest_bytes, a.system_bytes, [(b.total_bytes, b.count) for b in a.sizes])
        for a in one(xml).arenas
    ]


def test_a_fake_heap_in_a_comment_is_not_taken_for_the_real_one() -> None:
    """Arenas are read from the input text where it is safe; a comment holding a heap of the
    same number must not lend its figures to the real element."""
    fake = (
        b'<!-- <heap nr="0"><sizes></sizes><total type="rest" count="1" size="999"/>'
        b'<system type="current" size="999"/><system type="max" size="999"/></heap> -->\n'
    )
    commented = MODERN.replace(b'<heap nr="0">', fake + b'<heap nr="0">', 1)
    assert _figures(commented) == _figures(MODERN)


def test_an_odd_heap_does_not_shift_the_ones_after_it() -> None:
    """A heap glibc would not print (an unknown element) takes the careful path; the
    heaps after it still get their own figures."""
    odd = MODERN.replace(b'<heap nr="0">\n<sizes>', b'<heap nr="0">\n<note x="1"/>\n<sizes>', 1)
    assert _figures(odd) == _figures(MODERN)
    assert ("note", "x=1") in one(odd).arenas[0].extra
    many = MODERN.replace(b"</malloc>", b"").replace(b'<heap nr="1">', b'<heap nr="1" >')
    assert [a.index for a in one(many + b"</malloc>").arenas] == [0, 1]
