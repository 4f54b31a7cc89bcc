"""The heap picture as a person sees it: headless Chromium opens the page offline, its script
writes where each pin marker landed on the screen, and the screenshot has the pin's colour at
exactly those places, and the cells' colours over many pixels (not a blank page).

One page is drawn from a picture whose figures are known (tests/support/heap_pictures.py),
one by the real CLI (`inspect --html`) from a real target whose pins are printed by it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from memforensics.cli import cli
from memforensics.render.heap_picture import KINDS, PIN_COLOUR, picture_page
from tests.integration.test_report_html import chromium, hex_rgb
from tests.support.heap_pictures import known_picture
from tests.support.png import Image, decode
from tests.support.targets import compile_target, ptrace_skip_reason, running

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WINDOW = "--window-size=1280,1400"


def near(colour: tuple[int, int, int], wanted: tuple[int, int, int], tolerance: int = 30) -> bool:
    return all(abs(colour[i] - wanted[i]) <= tolerance for i in range(3))


def pin_positions(page: Path, profile: Path) -> list[tuple[str, int, int]]:
    """(address, x, y) of each pin marker on the screen, as the page's script measured it."""
    result = chromium(WINDOW, "--dump-dom", page.as_uri(), profile=profile)
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert 'data-picture-ready="1"' in dom, "the page's script did not run"
    found = []
    for tag in re.findall(r"<rect class=\"hp-pin\"[^>]*>", dom):
        address = re.search(r'data-address="(0x[0-9a-f]+)"', tag)
        x = re.search(r'data-screen-x="(\d+)"', tag)
        y = re.search(r'data-screen-y="(\d+)"', tag)
        assert address and x and y, tag
        found.append((address.group(1), int(x.group(1)), int(y.group(1))))
    return found


def screenshot(page: Path, tmp_path: Path, height: int = 1400) -> Image:
    """The page at WINDOW's width, ``height`` pixels tall (the width decides the layout)."""
    shot = tmp_path / "picture.png"
    window = f"--window-size=1280,{height}"
    result = chromium(window, f"--screenshot={shot}", page.as_uri(), profile=tmp_path / "shot")
    assert result.returncode == 0, result.stderr[-2000:]
    return decode(shot.read_bytes())


def check_picture(page: Path, tmp_path: Path, pin_addresses: set[str]) -> Image:
    """The checks every picture passes; returns the screenshot for more."""
    positions = pin_positions(page, tmp_path / "dom")
    assert {address for address, _, _ in positions} == pin_addresses
    image = screenshot(page, tmp_path, max(1400, max((y for _, _, y in positions), default=0) + 60))
    colours = image.colours()
    assert len(colours) > 20, "a blank or single-colour page"
    pin = hex_rgb(PIN_COLOUR)
    for address, x, y in positions:
        assert 0 <= x < image.width and 0 <= y < image.height, (address, x, y)
        assert near(image.pixels[y * image.width + x], pin), (
            f"no pin colour where the pin at {address} is drawn ({x}, {y})"
        )
    return image


def test_picture_of_known_heaps(tmp_path: Path) -> None:
    picture = known_picture()
    page = tmp_path / "heaps.html"
    page.write_text(picture_page("The heaps of PID 1", "known figures", picture))
    image = check_picture(page, tmp_path, {f"{pin.address:#x}" for pin in picture.pins})
    colours = image.colours()
    cell_pixels = 25  # 5 x 5 pixels a cell
    main = picture.maps[0]
    for kind, colour, _ in KINDS:
        if kind in ("free_resident", "free_released", "top"):
            cells = sum(1 for value in getattr(main, kind) if value > main.cell_bytes // 2)
            drawn = sum(n for c, n in colours.items() if near(c, hex_rgb(colour), 4))
            # Every cell mostly of that kind is drawn in its colour (at least 80% of them:
            # pin markers and labels cover a few).
            assert drawn >= 0.8 * cells * cell_pixels, (kind, drawn, cells)


@pytest.mark.skipif(ptrace_skip_reason() is not None, reason=str(ptrace_skip_reason()))
def test_inspect_html_of_a_real_target_marks_its_pins(tmp_path: Path) -> None:
    """Four thread arenas, each pinned by a buffer the target names: the page the CLI writes
    marks each at the place its address falls, and the screenshot shows them there."""
    with running([str(compile_target("pin_shapes")), "arenas", "4", "120"]) as target:
        printed = re.findall(r"pin=(0x[0-9a-f]+):", target.ready_line)
        page = tmp_path / "heaps.html"
        result = CliRunner().invoke(cli, ["inspect", "--html", str(page), str(target.pid)])
        assert result.exit_code == 0, result.output + result.stderr
    html = page.read_text()
    assert re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html) is None
    marked = set(re.findall(r'class="hp-pin" data-address="(0x[0-9a-f]+)"', html))
    assert {f"{int(a, 16):#x}" for a in printed} <= marked
    assert html.count('class="hp-heap"') >= 5  # the main heap and four arenas' heaps
    image = check_picture(page, tmp_path, marked)
    assert sum(n for c, n in image.colours().items() if near(c, hex_rgb(KINDS[1][1]), 4)) > 500


@pytest.mark.skipif(ptrace_skip_reason() is not None, reason=str(ptrace_skip_reason()))
def test_report_html_of_a_saved_inspection_marks_its_pins(tmp_path: Path) -> None:
    """`inspect --json --pins` saved, then `report --html` of it: the report's page draws the
    heaps with the target's pins where its script measured them."""
    with running([str(compile_target("pin_shapes")), "thread", "300"]) as target:
        printed = re.findall(r"pin=(0x[0-9a-f]+):", target.ready_line)
        saved = tmp_path / "inspect.json"
        result = CliRunner().invoke(cli, ["inspect", "--json", "--pins", str(target.pid)])
        assert result.exit_code == 0, result.output + result.stderr
        saved.write_text(result.stdout)
    page = tmp_path / "report.html"
    made = CliRunner().invoke(cli, ["report", str(saved), "--html", str(page)])
    assert made.exit_code == 0, made.output + made.stderr
    marked = set(re.findall(r'class="hp-pin" data-address="(0x[0-9a-f]+)"', page.read_text()))
    assert {f"{int(a, 16):#x}" for a in printed} <= marked
    check_picture(page, tmp_path, marked)
