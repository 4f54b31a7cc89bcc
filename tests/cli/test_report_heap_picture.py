"""`report --html` draws the heap picture a saved heap document carries (`inspect --json
--pins`), and refuses a hostile one with exit 7."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from memforensics.cli import cli
from memforensics.render.pins_json import heap_maps_json, pin_heaps_json, pins_json
from tests.support.heap_pictures import known_picture

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "free-all-but-last-before-trim.xml"


def heap_document_with_pins(tmp_path: Path) -> dict[str, Any]:
    parsed = CliRunner().invoke(cli, ["parse", "--json", str(FIXTURE)])
    assert parsed.exit_code == 0, parsed.output
    document: dict[str, Any] = json.loads(parsed.stdout)
    picture = known_picture()
    document["pins"] = pins_json(picture)
    document["pin_heaps"] = pin_heaps_json(picture)
    document["heap_maps"] = heap_maps_json(picture)
    return document


def test_report_html_draws_the_saved_pins(tmp_path: Path) -> None:
    saved = tmp_path / "inspect.json"
    saved.write_text(json.dumps(heap_document_with_pins(tmp_path)))
    page = tmp_path / "report.html"
    result = CliRunner().invoke(cli, ["report", str(saved), "--html", str(page)])
    assert result.exit_code == 0, result.output + result.stderr
    html = page.read_text()
    marked = re.findall(r'class="hp-pin" data-address="(0x[0-9a-f]+)"', html)
    assert marked == [f"{pin.address:#x}" for pin in known_picture().pins]
    assert html.count('class="hp-heap"') == 2
    assert "keeps 195.0 MiB of free memory in the main heap" in html
    # The JSON's maps are coarser (at most 512 cells) but add up to the same bytes.
    assert "one cell" in html


def test_report_without_pins_draws_no_picture(tmp_path: Path) -> None:
    parsed = CliRunner().invoke(cli, ["parse", "--json", str(FIXTURE)])
    saved = tmp_path / "parse.json"
    saved.write_text(parsed.stdout)
    page = tmp_path / "report.html"
    result = CliRunner().invoke(cli, ["report", str(saved), "--html", str(page)])
    assert result.exit_code == 0, result.output
    assert "hp-heap" not in page.read_text().split("<style>")[1].split("</style>")[1]


def test_hostile_maps_are_refused_with_exit_7(tmp_path: Path) -> None:
    document = heap_document_with_pins(tmp_path)
    document["heap_maps"]["heaps"][0]["cells"]["live"] = [-1]
    saved = tmp_path / "hostile.json"
    saved.write_text(json.dumps(document))
    result = CliRunner().invoke(cli, ["report", str(saved), "--html", str(tmp_path / "x.html")])
    assert result.exit_code == 7, result.output
    assert "Traceback" not in result.output + result.stderr
