"""Server-side SVG for the HTML report: the memory-over-time chart and the size histogram.

Why SVG drawn here rather than a JavaScript chart library: the page must be one file that
opens offline and prints; SVG needs no dependency, is vector (sharp on paper and at any
zoom), is already drawn when the page opens (no script has to run for the chart to exist),
and a few lines of inline script add hover values and zoom on time by changing the plot's
viewBox. Long recordings are downsampled first (analysis/timeline.py), so the SVG stays a
few thousand points whatever the recording's length.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from memforensics.analysis.timeline import min_max_buckets, representative_buckets
from memforensics.model.series import Sample, SeriesEvent, SizeClassPoint
from memforensics.units import format_bytes

WIDTH = 960
HEIGHT = 340
LEFT, RIGHT, TOP, BOTTOM = 78, 16, 16, 34
PLOT_W = WIDTH - LEFT - RIGHT
PLOT_H = HEIGHT - TOP - BOTTOM
RSS_BUCKETS = 1000
HEAP_BUCKETS = 600
Y_TICKS = 5

COLORS = {
    "in_use": "#2f6db5",
    "free_resident": "#e39b26",
    "free_released": "#f3d9a6",
    "free": "#e39b26",
    "rss": "#c0392b",
    "trim": "#1e8449",
    "oom-kill": "#c0392b",
    "exit": "#333333",
    "gap": "#999999",
}


@dataclass(frozen=True)
class Axis:
    """Maps sample times (or sample numbers) onto the plot's x pixels."""

    start: float
    end: float
    timed: bool

    def x(self, value: float) -> float:
        if self.end <= self.start:
            return PLOT_W / 2  # one moment: drawn in the middle
        return (value - self.start) / (self.end - self.start) * PLOT_W


def _x_value(sample: Sample | SeriesEvent, position: int, timed: bool) -> float:
    if timed and sample.time is not None:
        return sample.time.timestamp()
    return float(getattr(sample, "sequence", position))


def _scale(value: float) -> tuple[float, float]:
    """The axis top and tick step: a round step (1, 2 or 5 × 10^k × a power of 1024),
    at most ``Y_TICKS`` steps, the top the first step at or above ``value``."""
    if value <= 0:
        return float(1 << 20), float(1 << 18)
    raw = value / Y_TICKS
    unit = 1.0
    while raw / unit >= 1024:
        unit *= 1024
    step = 1024 * unit
    for factor in (1, 2, 5, 10, 20, 50, 100, 200, 500):
        if factor * unit >= raw:
            step = factor * unit
            break
    ticks = max(int(-(-value // step)), 1)
    return ticks * step, step


def _y(value: float, top: float) -> float:
    return PLOT_H - value / top * PLOT_H


def _area(points: Sequence[tuple[float, float, float]], top: float) -> str:
    """A closed polygon between a lower and an upper line: (x, low, high) per point."""
    upper = " ".join(f"{x:.1f},{_y(high, top):.1f}" for x, _, high in points)
    lower = " ".join(f"{x:.1f},{_y(low, top):.1f}" for x, low, _ in reversed(points))
    return f"M{upper} L{lower} Z"


def _mark_lines(
    marks: Sequence[SeriesEvent], axis: Axis, body: list[str]
) -> list[dict[str, object]]:
    """A vertical line in ``body`` for each timed mark; the marks' data for the script."""
    mark_data: list[dict[str, object]] = []
    for mark in marks:
        if mark.time is None:
            continue
        x = axis.x(mark.time.timestamp())
        color = COLORS.get(mark.kind, "#333")
        dash = ' stroke-dasharray="4 3"' if mark.kind in ("gap", "exit") else ""
        body.append(
            f'<line class="mark mark-{escape(mark.kind)}" x1="{x:.1f}" x2="{x:.1f}" y1="0" '
            f'y2="{PLOT_H}" stroke="{color}" stroke-width="1.5"{dash} '
            f'vector-effect="non-scaling-stroke"><title>{escape(mark.kind)}: '
            f"{escape(mark.message)}</title></line>"
        )
        mark_data.append({"x": x, "kind": mark.kind, "message": mark.message})
    return mark_data


def _grid_lines(top: float, step: float) -> list[str]:
    """The horizontal grid lines and their byte labels, every ``step`` up to ``top``."""
    grid = []
    for tick in range(round(top / step) + 1):
        value = step * tick
        y = TOP + _y(value, top)
        grid.append(
            f'<line x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">'
            f"{escape(format_bytes(value))}</text>"
        )
    return grid


def time_chart(
    samples: Sequence[Sample], marks: Sequence[SeriesEvent], *, chart_id: str
) -> tuple[str, dict[str, object]]:
    """The SVG of RSS against stacked in-use / free-resident / free-released, and its data.

    Returns the markup and the (downsampled) data the inline script uses for hover values.
    """
    timed = bool(samples) and all(s.time is not None for s in samples)
    xs = {id(s): _x_value(s, i, timed) for i, s in enumerate(samples)}
    heap_all = [s for s in samples if s.kind == "heap"]
    rss_all = [s for s in samples if s.rss_bytes is not None]
    heap = representative_buckets(
        heap_all, lambda s: xs[id(s)], lambda s: float(s.total("system_bytes") or 0), HEAP_BUCKETS
    )
    rss = min_max_buckets(
        rss_all, lambda s: xs[id(s)], lambda s: float(s.rss_bytes or 0), RSS_BUCKETS
    )
    all_x = [xs[id(s)] for s in samples] or [0.0, 1.0]
    axis = Axis(min(all_x), max(all_x), timed)
    stacked = [
        (s.in_use_bytes or 0) + (s.free_bytes or 0) for s in heap if s.in_use_bytes is not None
    ]
    top, step = _scale(max([*(s.rss_bytes or 0 for s in rss), *stacked, 0]))
    body: list[str] = []
    have_residency = any(s.free_resident_bytes is not None for s in heap)
    layers = [("in_use", "arena in use")]
    layers += (
        [("free_resident", "free, resident"), ("free_released", "free, released")]
        if have_residency
        else [("free", "free (residency not measured)")]
    )
    heap_points = [s for s in heap if s.in_use_bytes is not None]
    if heap_points:
        base = [0.0] * len(heap_points)
        for key, _label in layers:
            points = []
            for position, sample in enumerate(heap_points):
                if key == "in_use":
                    part = sample.in_use_bytes or 0
                elif key == "free_resident":
                    part = sample.free_resident_bytes or 0
                elif key == "free_released":
                    part = sample.free_released_bytes or 0
                else:
                    part = sample.free_bytes or 0
                points.append((axis.x(xs[id(sample)]), base[position], base[position] + part))
                base[position] += part
            if len(points) == 1:  # one dump: a bar, not an invisible line
                x, low, high = points[0]
                points = [(x - 12, low, high), (x + 12, low, high)]
            body.append(
                f'<path class="layer layer-{key}" d="{_area(points, top)}" '
                f'fill="{COLORS[key]}" stroke="none"/>'
            )
    if rss:
        line = " ".join(
            f"{axis.x(xs[id(s)]):.1f},{_y(float(s.rss_bytes or 0), top):.1f}" for s in rss
        )
        body.append(
            f'<polyline class="rss" points="{line}" fill="none" stroke="{COLORS["rss"]}" '
            'stroke-width="1.6" vector-effect="non-scaling-stroke"/>'
        )
    mark_data = _mark_lines(marks, axis, body) if timed else []
    grid = _grid_lines(top, step)
    legend = ([("rss", "RSS")] if rss else []) + (layers if heap_points else [])
    legend_html = "".join(
        f'<span class="key"><i style="background:{COLORS[k]}"></i>{escape(label)}</span>'
        for k, label in legend
    )
    svg = (
        f'<svg id="{chart_id}" class="chart time-chart" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-label="memory over time" data-start="{axis.start}" '
        f'data-end="{axis.end}" data-timed="{int(timed)}">'
        + "".join(grid)
        + f'<svg class="plot" x="{LEFT}" y="{TOP}" width="{PLOT_W}" height="{PLOT_H}" '
        f'viewBox="0 0 {PLOT_W} {PLOT_H}" preserveAspectRatio="none">'
        + "".join(body)
        + f'<line class="cursor" x1="-10" x2="-10" y1="0" y2="{PLOT_H}" stroke="#555" '
        'stroke-width="1" vector-effect="non-scaling-stroke"/>'
        + f'<rect class="selection" x="0" y="0" width="0" height="{PLOT_H}"/>'
        + "</svg>"
        + f'<g class="xticks" transform="translate({LEFT},{TOP + PLOT_H})"></g>'
        + f'<rect x="{LEFT}" y="{TOP}" width="{PLOT_W}" height="{PLOT_H}" class="frame"/>'
        + "</svg>"
        + f'<div class="legend">{legend_html}</div>'
    )
    data: dict[str, object] = {
        "id": chart_id,
        "width": PLOT_W,
        "start": axis.start,
        "end": axis.end,
        "timed": timed,
        "heap": [
            [
                round(axis.x(xs[id(s)]), 1),
                s.rss_bytes,
                s.in_use_bytes,
                s.free_bytes,
                s.free_resident_bytes,
                s.pause_seconds,
            ]
            for s in heap_points
        ],
        "rss": [[round(axis.x(xs[id(s)]), 1), s.rss_bytes] for s in rss],
        "marks": mark_data,
    }
    return svg, data


def histogram_svg(rows: Sequence[SizeClassPoint]) -> str:
    """Free bytes per chunk-size class as horizontal bars (page-sized and up in another colour)."""
    if not rows:
        return '<p class="muted">no free chunks in the latest heap sample</p>'
    bar_h, gap, label_w, width = 20, 6, 150, 700
    most = max(r.bytes for r in rows) or 1
    height = len(rows) * (bar_h + gap)
    parts = []
    for position, row in enumerate(rows):
        y = position * (bar_h + gap)
        span = (
            f"≥ {format_bytes(row.from_bytes)}"
            if row.to_bytes is None
            else f"{format_bytes(row.from_bytes)} – {format_bytes(row.to_bytes)}"
        )
        length = max(row.bytes / most * (width - label_w - 170), 1)
        color = COLORS["free_resident"] if row.from_bytes >= 4096 else "#8e5ea2"
        parts.append(
            f'<text x="{label_w - 8}" y="{y + 14}" text-anchor="end" class="tick">'
            f"{escape(span)}</text>"
            f'<rect class="bar" x="{label_w}" y="{y}" width="{length:.1f}" height="{bar_h}" '
            f'fill="{color}"><title>{row.chunks:,} chunks, {escape(format_bytes(row.bytes))}'
            "</title></rect>"
            f'<text x="{label_w + length + 6:.1f}" y="{y + 14}" class="tick">'
            f"{escape(format_bytes(row.bytes))} in {row.chunks:,} chunks</text>"
        )
    return (
        f'<svg class="chart histogram" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="free chunks by size">{"".join(parts)}</svg>'
    )


def script_json(data: object) -> str:
    """JSON safe inside a <script> element."""
    return json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
