"""The HTML report: one self-contained page (inline CSS, SVG and script; fetches nothing)."""

from __future__ import annotations

from datetime import datetime, timezone
from html import escape

from memforensics.analysis.census_growth import growth_sentence
from memforensics.analysis.trend import RUNTIME_NAMES, Fit
from memforensics.model.process import Waterfall
from memforensics.model.report import ProcessReport, Report
from memforensics.model.series import Sample
from memforensics.render.heap_picture import CSS as PICTURE_CSS
from memforensics.render.heap_picture import SCRIPT as PICTURE_SCRIPT
from memforensics.render.heap_picture import picture_html
from memforensics.render.sample_json import iso_time
from memforensics.render.svg_chart import histogram_svg, script_json, time_chart
from memforensics.units import format_bytes, format_duration

_CSS = """
:root{--ink:#1d2330;--muted:#667085;--line:#d0d5dd;--bg:#fff}
*{box-sizing:border-box}
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
color:var(--ink);background:var(--bg);margin:0 auto;max-width:1040px;padding:24px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:20px;margin:28px 0 8px;
border-top:2px solid var(--line);padding-top:16px}h3{font-size:16px;margin:18px 0 6px}
.muted{color:var(--muted)}.verdict{display:inline-block;padding:2px 10px;border-radius:12px;
font-weight:600;color:#fff}.v-in-use-growing,.v-mmap-growing,.v-outside-malloc-growing,.v-rss-growing{background:#c0392b}.v-free-growing{background:#d68910}
.v-stable{background:#1e8449}.v-unknown{background:#7f8c8d}
.chart{width:100%;height:auto;display:block}.grid{stroke:#eaecf0}.frame{fill:none;stroke:var(--line)}
.tick{font-size:11px;fill:var(--muted)}.legend{font-size:13px;margin:4px 0 0 78px}
.key{margin-right:16px;white-space:nowrap}.key i{display:inline-block;width:12px;height:12px;
margin-right:5px;vertical-align:-1px;border-radius:2px}
.selection{fill:rgba(47,109,181,.15)}.chart-box{position:relative}
.tip{position:absolute;pointer-events:none;background:rgba(29,35,48,.92);color:#fff;
font-size:12px;padding:6px 8px;border-radius:4px;white-space:pre;display:none}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{padding:3px 10px;text-align:right;border-bottom:1px solid #eaecf0}
th:first-child,td:first-child{text-align:left}td.bar{width:200px}
.b{display:inline-block;height:10px;background:#2f6db5;vertical-align:middle}
.b.free{background:#e39b26}ul{margin:4px 0 8px 20px;padding:0}
.evidence li{margin:2px 0}.hint{font-size:12px;color:var(--muted)}
@media print{body{max-width:none;padding:0;font-size:12px}.hint{display:none}
section{break-inside:avoid-page}.tip{display:none!important}}
"""

# Hover shows the figures of the nearest sample; dragging selects a time range to zoom
# into (the plot's viewBox changes, the strokes keep their width); a double click resets.
_JS = """
(function(){
function fmt(b){if(b===null||b===undefined)return 'n/a';var u=['B','KiB','MiB','GiB','TiB'],
i=0,v=Math.abs(b);while(v>=1024&&i<u.length-1){v/=1024;i++}return (b<0?'-':'')+
(i?v.toFixed(1):v)+' '+u[i]}
function when(d,x){var v=d.start+(d.end-d.start)*x/d.width;if(!d.timed)return 'dump #'+
Math.round(v);var t=new Date(v*1000);var span=d.end-d.start;var s=t.toISOString();
return span>86400?s.slice(5,16).replace('T',' '):span<120?s.slice(11,21):s.slice(11,19)}
function nearest(rows,x){var best=null,dist=1e18;for(var i=0;i<rows.length;i++){
var e=Math.abs(rows[i][0]-x);if(e<dist){dist=e;best=rows[i]}}return best}
document.querySelectorAll('script.chart-data').forEach(function(el){
var d=JSON.parse(el.textContent);var svg=document.getElementById(d.id);if(!svg)return;
var plot=svg.querySelector('svg.plot'),cursor=svg.querySelector('.cursor'),
sel=svg.querySelector('.selection'),ticks=svg.querySelector('.xticks');
var tip=svg.parentNode.querySelector('.tip');var view=[0,d.width];var drag=null;
var NS='http://www.w3.org/2000/svg';
function drawTicks(){while(ticks.firstChild)ticks.removeChild(ticks.firstChild);
var n=d.timed?6:Math.max(1,Math.min(6,Math.round((d.end-d.start)*(view[1]-view[0])/d.width)));
var one=d.end<=d.start;if(one)n=0;
for(var i=0;i<=n;i++){var px=one?d.width/2:d.width*i/n;var x=one?0:view[0]+(view[1]-view[0])*i/n;
var t=document.createElementNS(NS,'text');t.setAttribute('x',px);t.setAttribute('y',18);
t.setAttribute('class','tick');t.setAttribute('text-anchor',one?'middle':i==0?'start':i==n?'end':'middle');
t.textContent=when(d,x);ticks.appendChild(t)}}
function dataX(ev){var r=plot.getBoundingClientRect();var f=(ev.clientX-r.left)/r.width;
return view[0]+(view[1]-view[0])*Math.min(Math.max(f,0),1)}
function setView(a,b){view=[a,b];plot.setAttribute('viewBox',a+' 0 '+(b-a)+' '+
plot.viewBox.baseVal.height);drawTicks()}
plot.addEventListener('mousemove',function(ev){var x=dataX(ev);
cursor.setAttribute('x1',x);cursor.setAttribute('x2',x);
if(drag!==null){sel.setAttribute('x',Math.min(drag,x));sel.setAttribute('width',Math.abs(x-drag))}
var h=nearest(d.heap,x),r=nearest(d.rss,x);var lines=[when(d,x)];
if(r)lines.push('RSS           '+fmt(r[1]));if(h){lines.push('in use        '+fmt(h[2]));
lines.push('free          '+fmt(h[3]));lines.push('free resident '+fmt(h[4]));
if(h[5]!==null)lines.push('paused        '+(h[5]*1000).toFixed(1)+' ms')}
d.marks.forEach(function(m){if(Math.abs(m.x-x)<(view[1]-view[0])/80)lines.push(m.kind+': '+
m.message)});tip.textContent=lines.join('\\n');tip.style.display='block';
var box=svg.parentNode.getBoundingClientRect();var left=ev.clientX-box.left+14;
if(left>box.width-260)left=ev.clientX-box.left-260;tip.style.left=left+'px';
tip.style.top=(ev.clientY-box.top+10)+'px'});
plot.addEventListener('mouseleave',function(){tip.style.display='none';drag=null;
sel.setAttribute('width',0)});
plot.addEventListener('mousedown',function(ev){drag=dataX(ev);ev.preventDefault()});
plot.addEventListener('mouseup',function(ev){if(drag===null)return;var x=dataX(ev);
var a=Math.min(drag,x),b=Math.max(drag,x);drag=null;sel.setAttribute('width',0);
if(b-a>(view[1]-view[0])/200)setView(a,b)});
plot.addEventListener('dblclick',function(){setView(0,d.width)});
drawTicks()});
})();
"""


def _rate(fit: Fit | None) -> str:
    if fit is None:
        return "–"
    if fit.per_hour is None:
        return f"{format_bytes(fit.slope_per_unit, signed=True)} per dump"
    return f"{format_bytes(fit.per_hour, signed=True)}/h"


def _figures_table(report: ProcessReport) -> str:
    trend, latest = report.trend, report.series.latest_heap
    rows = (
        ("arena in use", trend.in_use, latest.in_use_bytes if latest else None),
        ("free (in bins)", trend.free, latest.free_bytes if latest else None),
        ("free, resident", trend.free_resident, latest.free_resident_bytes if latest else None),
        ("RSS", trend.rss, latest.rss_bytes if latest else None),
        *(
            (
                name,
                fit,
                None if latest is None or latest.waterfall is None else latest.waterfall.get(key),
            )
            for key, name, fit in trend.fits()
            if fit is not None and key in ("mmap_chunks", "other_anon", "stacks", "shmem", "file")
        ),
    )
    body = "".join(
        f"<tr><td>{name}</td><td>{escape(format_bytes(value))}</td>"
        f"<td>{'–' if fit is None else escape(format_bytes(fit.change_bytes, signed=True))}</td>"
        f"<td>{escape(_rate(fit))}</td><td>{'growing' if fit and fit.growing else ''}</td></tr>"
        for name, fit, value in rows
    )
    return (
        "<table><tr><th>figure</th><th>latest</th><th>change</th><th>rate</th><th></th></tr>"
        f"{body}</table>"
    )


def _waterfall(wf: Waterfall | None) -> str:
    if wf is None:
        return '<p class="muted">no waterfall: residency was not measured in these inputs</p>'
    rss = wf.get("rss") or 1
    rows = []
    for line in wf.lines:
        width = 0.0 if line.bytes is None or not line.in_rss else min(line.bytes / rss, 1) * 200
        label = ("&nbsp;" * 4 * line.depth) + escape(line.label)
        if not line.in_rss:
            label += ' <span class="muted">(not in RSS)</span>'
        amount = ("~" if line.estimate and line.bytes is not None else "") + format_bytes(
            line.bytes
        )
        rows.append(
            f"<tr><td>{label}</td><td>{escape(amount)}</td>"
            f'<td class="bar"><span class="b" style="width:{width:.0f}px"></span></td></tr>'
        )
    return f'<table class="waterfall">{"".join(rows)}</table>'


def _arena_table(latest: Sample | None) -> str:
    if latest is None or not latest.arenas:
        return '<p class="muted">no per-arena figures</p>'
    arenas = sorted(latest.arenas, key=lambda a: (-a.free_bytes, a.index))
    rows = []
    for arena in arenas:
        whole = max(arena.in_use_bytes + arena.free_bytes, 1)
        used = arena.in_use_bytes / whole * 160
        free = arena.free_bytes / whole * 160
        rows.append(
            f"<tr><td>{arena.index}</td><td>{escape(format_bytes(arena.system_bytes))}</td>"
            f"<td>{escape(format_bytes(arena.in_use_bytes))}</td>"
            f"<td>{escape(format_bytes(arena.free_bytes))}</td><td>{arena.free_ratio:.0%}</td>"
            f'<td class="bar"><span class="b" style="width:{used:.0f}px"></span>'
            f'<span class="b free" style="width:{free:.0f}px"></span></td></tr>'
        )
    return (
        "<table><tr><th>arena</th><th>system</th><th>in use</th><th>free</th><th>free%</th>"
        f"<th>in use / free</th></tr>{''.join(rows)}</table>"
    )


def _process_section(report: ProcessReport, number: int) -> str:
    series, trend = report.series, report.trend
    latest = series.latest_heap
    title = f"PID {series.pid} {series.process}" if series.pid is not None else series.process
    chart_id = f"chart-{number}"
    svg, data = time_chart(series.samples, report.marks, chart_id=chart_id)
    span = trend.span_seconds
    window = (
        f"{escape(iso_time(trend.first_time) or '')} → {escape(iso_time(trend.last_time) or '')}"
        f" ({format_duration(span)})"
        if span
        else "no times in the inputs"
    )
    pauses = [s.pause_seconds for s in series.heap_samples if s.pause_seconds is not None]
    pause = (
        f"; the target was paused {format_duration(sum(pauses))} in all, "
        f"{format_duration(sum(pauses) / len(pauses))} per heap sample"
        if pauses
        else ""
    )
    evidence = "".join(f"<li>{escape(item)}</li>" for item in trend.evidence)
    runtime = (
        ""
        if trend.runtime is None
        else f"runtime: {escape(RUNTIME_NAMES.get(trend.runtime, trend.runtime))}; "
    )
    marks = "".join(
        f"<li><b>{escape(m.kind)}</b> "
        f"{escape(m.time.strftime('%Y-%m-%d %H:%M:%S') if m.time else '')}: "
        f"{escape(m.message)}</li>"
        for m in report.marks[:50]
    )
    advice = "".join(
        f"<li>{escape(a.message)} <code>{escape(a.code)}</code></li>"
        for a in (latest.advice if latest else ())
    )
    growing = (
        f'<p class="growing"><b>{escape(growth_sentence(report.growing_types))}</b></p>'
        if report.growing_types
        else ""
    )
    kills = "".join(
        f'<p class="kill"><b>OOM kill</b> '
        f"{escape(k.time.strftime('%Y-%m-%d %H:%M:%S') if k.time else '')}: "
        f"{escape(heap.sentence)}</p>"
        for k, heap in report.kills
        if heap is not None
    )
    return f"""
<section class="process" id="process-{number}">
<h2>{escape(title)} <span class="verdict v-{trend.verdict}">{trend.verdict}</span></h2>
<p class="muted">{runtime}{trend.heap_samples} heap samples, {trend.rss_samples} RSS readings;
{window}{pause}.</p>
{growing}<ul class="evidence">{evidence}</ul>
{kills}
<h3>Memory over time</h3>
<div class="chart-box">{svg}<div class="tip"></div></div>
<p class="hint">Hover for values; drag across the chart to zoom on a time range,
double-click to zoom out. Vertical lines mark memory given back (green), OOM kills (red),
skipped samples and exits (dashed).</p>
<script type="application/json" class="chart-data">{script_json(data)}</script>
{_figures_table(report)}
{f"<h3>Marks</h3><ul>{marks}</ul>" if marks else ""}
<h3>Where the RSS went (latest heap sample)</h3>
{_waterfall(latest.waterfall if latest else None)}
<h3>Arenas (latest heap sample)</h3>
{_arena_table(latest)}
<h3>Free chunks by size (latest heap sample)</h3>
{histogram_svg(latest.histogram if latest else ())}
<h3>Advice</h3>
{f"<ul>{advice}</ul>" if advice else '<p class="muted">nothing stands out</p>'}
{picture_html(latest.picture) if latest is not None and latest.picture is not None else ""}
</section>"""


def report_html(report: Report, *, now: datetime | None = None) -> str:
    """The whole page as one string."""
    generated = iso_time(now or datetime.now(timezone.utc))
    sections = "".join(_process_section(p, n) for n, p in enumerate(report.processes, 1))
    notes = "".join(f"<li>{escape(n)}</li>" for n in report.notes)
    inputs = ", ".join(escape(i) for i in report.inputs)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>memforensics report</title><style>{_CSS}{PICTURE_CSS}</style></head>
<body>
<h1>memforensics report</h1>
<p class="muted">from {inputs}; made {escape(generated or "")}</p>
<p>Is it a leak (memory in use grows) or fragmentation (free chunks pile up while in use
stays flat), and does giving memory back help? <b>in use</b> = arena memory minus free
chunks (an upper bound); <b>free, resident</b> = free chunks still in RAM (what trimming can
give back); <b>free, released</b> = free chunks whose pages are already gone.</p>
{sections or '<p class="muted">No samples in the inputs.</p>'}
{f"<h2>Notes</h2><ul>{notes}</ul>" if notes else ""}
<script>{_JS}</script>
<script>{PICTURE_SCRIPT}</script>
</body></html>
"""
