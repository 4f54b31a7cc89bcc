"""The picture of each heap (`inspect --html`, `report --html`): a grid of page-aggregated
cells coloured by what fills them, the pins marked and labelled, a legend and the figures
beside it; inline SVG and CSS, a few lines of script, nothing fetched."""

from __future__ import annotations

from html import escape

from memforensics.analysis.pins import heap_name, pin_sentence
from memforensics.model.pins import HeapMap, HeapPicture, HeapPins, Pin
from memforensics.units import format_bytes

COLUMNS = 128
CELL_PX = 5
PIN_COLOUR = "#d62728"
# What a cell is drawn as: the kind holding most of its bytes.
KINDS = (
    ("live", "#2f6db5", "live chunks"),
    ("free_resident", "#f0a020", "free, resident (malloc_trim can release)"),
    ("free_released", "#cfe3f3", "free, already released (address space only)"),
    ("top", "#3a9d5d", "top chunk"),
    ("other", "#8c8c8c", "glibc's bookkeeping, not walked"),
)

CSS = """
.heap-picture{margin:10px 0 22px}.heap-picture h3{margin:14px 0 4px}
.hp-row{display:flex;gap:18px;align-items:flex-start;flex-wrap:wrap}
.hp-grid{display:block;border:1px solid #d0d5dd;background:#fff}
.hp-figures{font-size:13px;border-collapse:collapse}.hp-figures td{padding:1px 8px;
border-bottom:1px solid #eaecf0;text-align:right}.hp-figures td:first-child{text-align:left}
.hp-legend{font-size:13px;margin:6px 0}.hp-legend span{margin-right:14px;white-space:nowrap}
.hp-legend i{display:inline-block;width:12px;height:12px;margin-right:5px;vertical-align:-1px}
.hp-pins{font-size:13px;margin:4px 0 0 18px;padding:0}.hp-pins li{margin:2px 0}
.hp-label{font:bold 10px system-ui,sans-serif;fill:#d62728}
"""

# Each pin marker's place on the screen, written into data attributes after layout: the
# tests read them from the DOM and look at the screenshot's pixels there.
SCRIPT = """
(function(){document.querySelectorAll('.hp-pin').forEach(function(el){
var r=el.getBoundingClientRect();el.setAttribute('data-screen-x',Math.round(r.left+r.width/2));
el.setAttribute('data-screen-y',Math.round(r.top+r.height/2));});
document.body.setAttribute('data-picture-ready','1');})();
"""


def legend_html() -> str:
    keys = "".join(
        f'<span><i style="background:{colour}"></i>{escape(label)}</span>'
        for _, colour, label in KINDS
    )
    pin = (
        f'<span><i style="background:{PIN_COLOUR}"></i>'
        "pin: a live chunk keeping the free memory below it</span>"
    )
    return f'<div class="hp-legend">{keys}{pin}</div>'


def _cell_kind(heap_map: HeapMap, index: int) -> int | None:
    values = [getattr(heap_map, name)[index] for name, _, _ in KINDS]
    best = max(range(len(values)), key=lambda k: values[k])
    return best if values[best] > 0 else None


def _pin_cell(heap_map: HeapMap, pin: Pin) -> int:
    return min(heap_map.cells - 1, max(0, (pin.address - heap_map.start) // heap_map.cell_bytes))


def grid_svg(heap_map: HeapMap, pins: tuple[Pin, ...]) -> str:
    """The heap's cells, left to right and top to bottom in address order, pins outlined."""
    rows = -(-heap_map.cells // COLUMNS)
    width, height = COLUMNS * CELL_PX, rows * CELL_PX
    parts = [
        f'<svg class="hp-grid" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" shape-rendering="crispEdges">'
    ]
    kinds = [_cell_kind(heap_map, index) for index in range(heap_map.cells)]
    for number, (kind, colour, _) in enumerate(KINDS):
        parts.append(f'<g class="hp-{kind.replace("_", "-")}" fill="{colour}">')
        for index in range(heap_map.cells):
            if kinds[index] == number:
                x, y = (index % COLUMNS) * CELL_PX, (index // COLUMNS) * CELL_PX
                parts.append(f'<rect x="{x}" y="{y}" width="{CELL_PX}" height="{CELL_PX}"/>')
        parts.append("</g>")
    for pin in pins:
        cell = _pin_cell(heap_map, pin)
        x, y = (cell % COLUMNS) * CELL_PX, (cell // COLUMNS) * CELL_PX
        parts.append(
            f'<rect class="hp-pin" data-address="{pin.address:#x}" data-rank="{pin.rank}" '
            f'data-cell="{cell}" x="{x - 2}" y="{y - 2}" width="{CELL_PX + 4}" '
            f'height="{CELL_PX + 4}" fill="{PIN_COLOUR}" stroke="#fff" stroke-width="1">'
            f"<title>{escape(pin_sentence(pin))}</title></rect>"
        )
        label_x = x + CELL_PX + 4 if x < width - 40 else x - 24
        parts.append(
            f'<text class="hp-label" x="{label_x}" y="{max(y + CELL_PX, 10)}">P{pin.rank}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _figures(heap: HeapPins, heap_map: HeapMap) -> str:
    rows = [
        ("heap", f"{format_bytes(heap.heap_bytes)} at {heap.start:#x}"),
        ("live", format_bytes(heap.live_bytes)),
        ("free, resident", format_bytes(sum(heap_map.free_resident))),
        ("free, released", format_bytes(sum(heap_map.free_released))),
        ("top chunk", format_bytes(heap.top_bytes)),
        ("free below the topmost live chunk", format_bytes(heap.held_free_bytes)),
        (
            "one cell",
            f"{heap_map.pages_per_cell} page{'s' if heap_map.pages_per_cell > 1 else ''}"
            f" ({format_bytes(heap_map.cell_bytes)})",
        ),
    ]
    if not heap.complete:
        rows.append(("walk", "stopped early: the picture ends where it stopped"))
    body = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="hp-figures">{body}</table>'


def picture_html(picture: HeapPicture) -> str:
    """Every heap's grid, figures and pins: a fragment for a page that includes CSS and
    SCRIPT."""
    sections = ['<section class="heap-picture"><h2>The heaps, page by page</h2>', legend_html()]
    if not picture.resident_known:
        sections.append(
            '<p class="muted">Residency unknown (a core): free bytes are drawn as resident.</p>'
        )
    for heap, heap_map in zip(picture.heaps, picture.maps, strict=True):
        title = heap_name(heap.arena, heap.heap)
        sections.append(
            f'<div class="hp-heap" data-arena="{heap.arena}" data-heap="{heap.heap}">'
            f"<h3>{escape(title[0].upper() + title[1:])} ({format_bytes(heap.heap_bytes)})</h3>"
            f'<div class="hp-row">{grid_svg(heap_map, heap.pins)}{_figures(heap, heap_map)}</div>'
        )
        if heap.pins:
            items = "".join(
                f"<li><b>P{pin.rank}</b> {escape(pin_sentence(pin))}</li>" for pin in heap.pins
            )
            more = f"<li>… and {heap.pins_omitted} more</li>" if heap.pins_omitted else ""
            sections.append(f'<ol class="hp-pins">{items}{more}</ol>')
        else:
            sections.append(
                f'<p class="muted">No live chunk keeps {format_bytes(heap.threshold_bytes)} '
                "of free memory below it here.</p>"
            )
        sections.append("</div>")
    sections.append("</section>")
    return "".join(sections)


PAGE_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
color:#1d2330;background:#fff;margin:0 auto;max-width:1200px;padding:24px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:20px 0 6px}.muted{color:#667085}
"""


def picture_page(title: str, subtitle: str, picture: HeapPicture) -> str:
    """A whole offline page holding the picture (`inspect --html FILE`)."""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{PAGE_CSS}{CSS}</style></head><body>"
        f'<h1>{escape(title)}</h1><p class="muted">{escape(subtitle)}</p>'
        f"{picture_html(picture)}<script>{SCRIPT}</script></body></html>\n"
    )
