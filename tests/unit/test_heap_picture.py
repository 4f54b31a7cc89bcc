"""The heap picture's page and the pins' JSON and sentences, from a picture whose figures are
known (tests/support/heap_pictures.py)."""

from __future__ import annotations

import re

from memforensics.render.heap_picture import COLUMNS, picture_page
from memforensics.render.pins_json import pin_heaps_json, pins_json
from tests.support.heap_pictures import MAIN_START, MIB, known_picture


def test_pins_from_the_top_down_with_their_figures() -> None:
    picture = known_picture()
    main = picture.heaps[0]
    assert [pin.pinned_free_bytes for pin in main.pins] == [40 * MIB, 195 * MIB]
    assert main.pins[1].address == MAIN_START + 0x10000 + 195 * MIB + 16
    # 195 MiB free from 0x10000 up; pages in [0x20000, 100 MiB) are released.
    assert main.pins[1].resident_bytes == 195 * MIB - (100 * MIB - 0x20000)
    assert main.pins[0].kind == "text" and main.pins[0].preview.startswith("GET /api/v1/orders")
    assert picture.heaps[1].pins[0].pinned_free_bytes == 30 * MIB - 0x8B0


def test_json_pins_carry_the_documented_keys_and_a_sentence() -> None:
    picture = known_picture()
    pins = pins_json(picture)
    assert len(pins) == 3
    for pin in pins:
        for key in (
            "arena",
            "heap",
            "address",
            "chunk_bytes",
            "pinned_free_bytes",
            "resident_bytes",
            "type",
            "kind",
            "preview",
            "rank",
            "sentence",
        ):
            assert key in pin
    assert pins[1]["sentence"].startswith("one live 4.0 KiB chunk at 0x")
    assert (
        "keeps 195.0 MiB of free memory in the main heap below it: free() cannot return it"
        in pins[1]["sentence"]
    )
    assert "arena 1's heap" in pins[2]["sentence"]
    heaps = pin_heaps_json(picture)
    assert heaps[0]["held_free_bytes"] == 235 * MIB and heaps[0]["pins"] == 2


def test_page_is_offline_and_marks_each_pin_in_its_cell() -> None:
    picture = known_picture()
    page = picture_page("t", "s", picture)
    assert re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page) is None
    assert "url(" not in page and "fetch(" not in page and "@import" not in page
    markers = re.findall(
        r'<rect class="hp-pin" data-address="(0x[0-9a-f]+)" data-rank="(\d)" '
        r'data-cell="(\d+)" x="(-?\d+)" y="(-?\d+)"',
        page,
    )
    assert len(markers) == 3
    main_map = picture.maps[0]
    for address, _rank, cell, x, y in markers[:2]:
        expected = (int(address, 16) - main_map.start) // main_map.cell_bytes
        assert int(cell) == expected
        assert (int(x) + 2, int(y) + 2) == ((expected % COLUMNS) * 5, (expected // COLUMNS) * 5)
    assert "free, resident (malloc_trim can release)" in page


def test_terminal_pins_section_names_each_pin_in_one_sentence() -> None:
    from io import StringIO

    from rich.console import Console

    from memforensics.render.inspect import render_pins

    out = StringIO()
    console = Console(file=out, width=400, color_system=None)
    for part in render_pins(known_picture()):
        console.print(part)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("Pins: 265.0 MiB of free memory lies below the topmost live chunk")
    # The biggest first, one line each.
    assert lines[1].startswith("one live 4.0 KiB chunk at 0x")
    assert 'text "GET /api/v1/orders?page=7' in lines[1]
    assert "keeps 195.0 MiB of free memory in the main heap below it" in lines[1]
    assert "arena 1's heap" in lines[3]
