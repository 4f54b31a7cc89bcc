"""The HTML report as a person sees it: headless Chromium opens it offline and draws the charts.

A real recording (watch on the fragmenting target) becomes a page; Chromium loads it from a
file with every host name unresolvable, runs its script (the time axis is drawn by it), and
takes a screenshot in which the chart's colours must be present over many pixels.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from memforensics.cli import cli
from tests.support.png import decode
from tests.support.targets import c_target, live_skip_reason

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # Offline: no name resolves, so any fetch the page tried would fail (and show).
    "--host-resolver-rules=MAP * ~NOTFOUND",
)


def hex_rgb(value: str) -> tuple[int, int, int]:
    return int(value[1:3], 16), int(value[3:5], 16), int(value[5:7], 16)


@pytest.fixture(scope="module")
def page() -> Iterator[Path]:
    """A report page made from a real watch of the fragmenting target."""
    reason = live_skip_reason()
    if reason:
        pytest.skip(reason)
    with tempfile.TemporaryDirectory(prefix="memforensics-html-") as tmp:
        record = Path(tmp) / "fragment.jsonl"
        with c_target("watch_pattern", "fragment", "500", "60") as target:
            watched = CliRunner().invoke(
                cli,
                [
                    "watch",
                    str(target.pid),
                    "--interval",
                    "1s",
                    "--count",
                    "6",
                    "--record",
                    str(record),
                ],
            )
            assert watched.exit_code == 0, watched.output
        out = Path(tmp) / "report.html"
        made = CliRunner().invoke(cli, ["report", str(record), "--html", str(out)])
        assert made.exit_code == 0, made.output
        yield out


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[str]:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (the nox tests session installs it)")
    return subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_page_fetches_nothing(page: Path) -> None:
    html = page.read_text()
    assert re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html) is None
    assert "url(" not in html and "@import" not in html and "fetch(" not in html


def test_chromium_renders_the_charts_and_runs_the_script(page: Path, tmp_path: Path) -> None:
    result = chromium("--dump-dom", page.as_uri(), profile=tmp_path / "profile")
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert 'class="chart time-chart"' in dom
    assert dom.count('class="layer layer-') == 3
    assert 'class="rss"' in dom and 'class="chart histogram"' in dom
    assert "free-growing" in dom
    # The time axis labels are drawn by the inline script: present only if it ran.
    ticks = re.search(r'<g class="xticks"[^>]*>(.*?)</g>', dom, re.DOTALL)
    assert ticks is not None and ticks.group(1).count("<text") == 7


def test_screenshot_shows_the_chart(page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "page.png"
    result = chromium(
        "--window-size=1040,960", f"--screenshot={shot}", page.as_uri(), profile=tmp_path / "p"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    image = decode(shot.read_bytes())
    colours = image.colours()
    assert len(colours) > 50, "a blank or single-colour page"
    # The stacked areas are filled with flat colours: the fragmenting target's free chunks
    # are resident, so many pixels of that layer's colour must be on screen.
    assert colours[hex_rgb("#e39b26")] > 5000, "the free-resident area is not drawn"
    red = hex_rgb("#c0392b")
    near_red = sum(n for c, n in colours.items() if all(abs(c[i] - red[i]) < 40 for i in range(3)))
    assert near_red > 100, "the RSS line is not drawn"


# Dispatched after the page's own script: hover over the middle of the first chart, then drag
# from 25 % to 50 % of its width. Written into a copy of the page only.
_INTERACT = """<script>
(function(){
var plot=document.querySelector('svg.plot');var r=plot.getBoundingClientRect();
function at(type,f){plot.dispatchEvent(new MouseEvent(type,{bubbles:true,
clientX:r.left+r.width*f,clientY:r.top+r.height/2}))}
at('mousemove',0.5);
document.body.setAttribute('data-tip',document.querySelector('.tip').textContent);
at('mousedown',0.25);at('mousemove',0.5);at('mouseup',0.5);
document.body.setAttribute('data-view',plot.getAttribute('viewBox'));
})();
</script></body>"""


def test_hover_shows_values_and_drag_zooms(page: Path, tmp_path: Path) -> None:
    interactive = tmp_path / "interactive.html"
    interactive.write_text(page.read_text().replace("</body>", _INTERACT))
    result = chromium(
        "--window-size=1100,1400",
        "--enable-logging=stderr",
        "--dump-dom",
        interactive.as_uri(),
        profile=tmp_path / "profile",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Uncaught" not in result.stderr, result.stderr[-2000:]
    tip = re.search(r'data-tip="([^"]*)"', result.stdout)
    assert tip is not None
    assert "RSS" in tip.group(1) and "in use" in tip.group(1) and "MiB" in tip.group(1)
    view = re.search(r'data-view="([^"]*)"', result.stdout)
    assert view is not None
    x, _, width, _ = map(float, view.group(1).split())
    # The plot is 866 units wide: a quarter to a half of it is x ~216, width ~216.
    assert 180 < x < 250 and 180 < width < 250, view.group(1)


def test_page_prints(page: Path, tmp_path: Path) -> None:
    """Printing (to PDF) works offline: Chromium lays the page out for paper and writes it."""
    pdf = tmp_path / "page.pdf"
    result = chromium(
        "--no-pdf-header-footer", f"--print-to-pdf={pdf}", page.as_uri(), profile=tmp_path / "p"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF") and len(data) > 20_000
