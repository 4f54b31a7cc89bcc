"""Make docs/images/report.png: a real watch of a fragmenting process, trimmed half-way, as
the HTML report shows it in headless Chromium.

Starts tests/targets/watch_pattern.c in "fragment" mode, records it with
``memforensics watch --interval 1s --rss-interval 250ms --count 16``, runs
``memforensics trim`` on it after the 8th heap sample (the chart marks the release), renders
``memforensics report --html`` and screenshots the top of the page. Needs gdb, cc, chromium.

usage: python scripts/make_report_screenshot.py [OUT.png]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.targets import c_target  # noqa: E402


def memforensics(*args: str, **kwargs: object) -> subprocess.Popen[bytes]:
    kwargs.setdefault("cwd", REPO)
    return subprocess.Popen([sys.executable, "-m", "memforensics", *args], **kwargs)  # type: ignore[call-overload]


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "docs" / "images" / "report.png"
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("chromium is needed for the screenshot")
    with tempfile.TemporaryDirectory(prefix="report-shot-") as tmp:
        record = Path(tmp) / "fragmenting-service.jsonl"
        with c_target("watch_pattern", "fragment", "500", "40") as target:
            watcher = memforensics(
                "watch",
                str(target.pid),
                "--interval",
                "1s",
                "--rss-interval",
                "250ms",
                "--count",
                "16",
                "--record",
                str(record),
                stdout=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + 120
            while not record.exists() or record.read_text().count('"kind": "heap"') < 8:
                if watcher.poll() is not None or time.monotonic() > deadline:
                    sys.exit("the watch ended before its 8th heap sample")
                time.sleep(0.05)
            # The watch attaches every second: a trim that meets it attached is refused
            # (already traced), so try again shortly (the watch records a gap if it is the
            # one that finds the trim attached).
            for _ in range(20):
                trim = memforensics(
                    "trim", str(target.pid), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
                if trim.wait(timeout=120) == 0:
                    break
                time.sleep(0.2)
            else:
                sys.exit("memforensics trim failed 20 times")
            if watcher.wait(timeout=120) != 0:
                sys.exit("memforensics watch failed")
        page = Path(tmp) / "report.html"
        report = memforensics("report", record.name, "--html", str(page), cwd=tmp)
        if report.wait(timeout=120) != 0:
            sys.exit("memforensics report failed")
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                f"--user-data-dir={Path(tmp) / 'profile'}",
                "--window-size=1040,1020",
                f"--screenshot={out}",
                page.as_uri(),
            ],
            capture_output=True,
            check=True,
            timeout=120,
        )
    print(f"wrote {out} ({out.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
