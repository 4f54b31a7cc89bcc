"""A week recorded at 1 s: how long `report --html` takes, how big the page is, and how long
headless Chromium takes to open it, against a one-hour recording's page in the same run.

The recording is written with the real writer: 604,800 RSS lines (1 s) and 10,080 heap lines
(60 s) of a process whose free memory grows (fragmentation) and that is trimmed once a day.
Chromium's time is ``--dump-dom`` (load, parse, run the inline script) minus the same for an
empty page, so browser start-up is not counted. Asserts nothing.

usage: python benchmarks/bench_report.py [--days D]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from memforensics.entry.reporting import build_report  # noqa: E402
from memforensics.model.series import Sample  # noqa: E402
from memforensics.render.report_html import report_html  # noqa: E402
from memforensics.render.sample_json import sample_line  # noqa: E402
from memforensics.sources.files.recording import RecordingWriter  # noqa: E402

MiB = 1 << 20
T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def write_recording(path: Path, seconds: int) -> None:
    with RecordingWriter(path) as writer:
        for second in range(seconds):
            day_part = second % 86400  # a daily trim gives the free-resident part back
            in_use = 400 * MiB + (second % 600) * 1024
            free = 50 * MiB + second * 200
            resident = min(free, 50 * MiB + day_part * 200)
            rss = in_use + resident + 30 * MiB
            when = T0 + timedelta(seconds=second)
            if second % 60 == 0:
                totals = {
                    "arenas": 8,
                    "system_bytes": in_use + free,
                    "free_bytes": free,
                    "in_use_bytes": in_use,
                    "mmap_bytes": 0,
                }
                writer.write(
                    sample_line(
                        Sample(
                            "heap",
                            when,
                            1,
                            "svc",
                            rss,
                            totals=totals,
                            pause_seconds=0.03,
                            free_resident_bytes=resident,
                        )
                    )
                )
            else:
                writer.write(sample_line(Sample("rss", when, 1, "svc", rss)))


def chromium_seconds(page: Path, profile: Path) -> float:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        return float("nan")
    started = time.monotonic()
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
            f"--user-data-dir={profile}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        check=True,
        timeout=120,
    )
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--days", type=float, default=7.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        root = Path(tmp)
        results = {}
        for name, seconds in (("1 hour", 3600), (f"{args.days:g} days", int(args.days * 86400))):
            record = root / f"{seconds}.jsonl"
            write_recording(record, seconds)
            started = time.monotonic()
            report = build_report([record])
            read_seconds = time.monotonic() - started
            html = report_html(report)
            render_seconds = time.monotonic() - started - read_seconds
            page = root / f"{seconds}.html"
            page.write_text(html)
            results[name] = (record.stat().st_size, read_seconds, render_seconds, len(html), page)
        empty = root / "empty.html"
        empty.write_text("<!DOCTYPE html><html><body></body></html>")
        baseline = min(chromium_seconds(empty, root / f"p{i}") for i in range(3))
        print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        opened = {}
        for name, (size, read_s, render_s, html_bytes, page) in results.items():
            browser = min(chromium_seconds(page, root / f"q{name}{i}") for i in range(3))
            opened[name] = max(browser - baseline, 0.0)
            print(
                f"{name:>8}: recording {size / MiB:7.1f} MiB, read+trend {read_s:6.2f} s, "
                f"HTML {render_s:5.2f} s, page {html_bytes / 1024:6.0f} KiB, "
                f"Chromium open {opened[name]:.2f} s beyond an empty page"
            )
        names = list(results)
        print(
            f"ratio {names[1]}/{names[0]}: page size "
            f"{results[names[1]][3] / results[names[0]][3]:.2f}, Chromium open "
            f"{(opened[names[1]] or 1e-3) / (opened[names[0]] or 1e-3):.2f}"
        )


if __name__ == "__main__":
    main()
