"""Where the steps' time went, drawn: a stacked bar of the host's parts and a timeline of the
last few steps, host spans above device spans, so their overlap (or its absence) shows.

Plain HTML and inline SVG (no script, no image): renders the same in JupyterLab, Colab,
VS Code and exported HTML. Colours are the theme's CSS variables (display/style.py), every
string is escaped. The dashboard shows `panel_html(state.anatomy)` (the anatomy its monitor
published); `AnatomyView(report.anatomy)` shows a finished run's anatomy on its own.
"""

from __future__ import annotations

from html import escape

from tpu_nb.display import style
from tpu_nb.runtime.tracking import HOST_PARTS, Anatomy
from tpu_nb.runtime.units import format_seconds, percentile

# What each part is called on screen, and its colour (a palette colour: light and dark sets).
LABELS = {
    "trace": "tracing (Python)",
    "sync": "sync",
    "compile": "compile",
    "input": "waiting for input",
    "read": "value reads",
    "wait": "waiting for device",
    "tpu_nb": "tpu_nb recording",
    "device": "device executing",
}
COLOURS = {
    "trace": style.ACCENT,
    "sync": style.MUTED,
    "compile": style.RED,
    "input": style.WARN,
    "read": style.color("red-bg"),
    "wait": style.OK,
    "tpu_nb": style.LINE,
    "device": style.OK,
}
SHOWN_STEPS = 5  # steps on the timeline
BAR_STEPS = 50  # steps the live bar sums over
_WIDTH, _LANE, _GAP, _LEFT = 560, 16, 6, 52


def bar_html(a: Anatomy) -> str:
    """A stacked bar of the last BAR_STEPS steps' wall time by host part, with a legend."""
    steps = a.steps[-BAR_STEPS:]
    total = sum(s.wall for s in steps)
    if total <= 0:
        return ""
    shares = [(name, sum(getattr(s, name) for s in steps) / total) for name in HOST_PARTS]
    shares = [(n, v) for n, v in shares if v > 0.001]
    segments = "".join(
        f"<div title='{escape(LABELS[n])}: {v:.0%}' style='width:{100 * v:.2f}%;"
        f"background:{COLOURS[n]};height:100%'></div>"
        for n, v in shares
    )
    busy = sum(s.wall - s.idle for s in steps) / total
    legend = " ".join(
        f"<span style='white-space:nowrap;margin-right:8px'><span style='display:inline-block;"
        f"width:9px;height:9px;background:{COLOURS[n]};border:1px solid {style.LINE};"
        f"margin-right:3px'></span>{escape(LABELS[n])} {v:.0%}</span>"
        for n, v in shares
    )
    return (
        f"<div style='display:flex;width:100%;max-width:{_WIDTH}px;height:14px;"
        f"border:1px solid {style.LINE};box-sizing:border-box'>{segments}</div>"
        f"<div style='font-size:11px'>{legend}"
        f"<span style='white-space:nowrap;color:{style.MUTED}'>· device busy "
        f"{busy:.0%}</span></div>"
    )


def timeline_svg(a: Anatomy) -> str:
    """The last SHOWN_STEPS steps on one time axis: the host's spans, then the device's."""
    steps = a.steps[-SHOWN_STEPS:]
    if not steps:
        return ""
    t0 = steps[0].start
    t1 = max([steps[-1].end] + [e for s in steps for _, e in s.device_spans])
    span = max(t1 - t0, 1e-6)
    scale = (_WIDTH - _LEFT - 4) / span

    def x(t: float) -> float:
        return _LEFT + (min(max(t, t0), t1) - t0) * scale

    def rect(lo: float, hi: float, y: int, kind: str, tip: str) -> str:
        fill = COLOURS.get(kind, style.MUTED)
        return style.timeline_span(x(lo), y, x(hi) - x(lo), _LANE, fill, tip)

    host_y, dev_y = 2, 2 + _LANE + _GAP
    parts = []
    for s in steps:
        parts.append(
            rect(s.start, s.end, host_y, "trace", f"step {s.index}: {format_seconds(s.wall)}")
        )
        parts += [
            rect(lo, hi, host_y, kind, f"{LABELS.get(kind, kind)}: {format_seconds(hi - lo)}")
            for kind, lo, hi in s.host_spans
        ]
        parts += [
            rect(lo, hi, dev_y, "device", f"step {s.index} executing: {format_seconds(hi - lo)}")
            for lo, hi in s.device_spans
        ]
        parts.append(
            f"<line x1='{x(s.end):.1f}' x2='{x(s.end):.1f}' y1='0' "
            f"y2='{dev_y + _LANE + 2}' style='stroke:{style.FG};stroke-width:1'/>"
        )
    lanes = [("host", host_y + 12), ("device", dev_y + 12)]
    return style.timeline_svg(_WIDTH, dev_y + _LANE + 16, _LEFT, span, lanes, parts)


KIND_WORDS = {"host": "", "sync": "sync", "input": "waiting for its iterator"}
SHOWN_LINES = 5  # host lines listed
MIN_LINE_SHARE = 0.01  # and only those with at least this share of the wall time


def _shown_lines(a: Anatomy | None) -> list:
    """The largest host lines of a loop (a run with a verdict: a cell that is not a loop has
    no time worth placing)."""
    if getattr(a, "verdict", None) is None:
        return []
    lines = getattr(a, "host_lines", ()) or ()
    return [h for h in lines if h.share >= MIN_LINE_SHARE][:SHOWN_LINES]


def host_lines_text(a: Anatomy | None, scope: str = "") -> list[str]:
    """Where the host's time went by line (the host sampler's), as text lines; [] if none.
    `scope`: which steps the lines cover when not all ("the 18 steps after the warm-up")."""
    shown = _shown_lines(a)
    if not shown:
        return []
    return [f"host time by line (sampled{', ' + scope if scope else ''}):"] + [
        f"  {h}" for h in shown
    ]


def host_lines_html(a: Anatomy | None, scope: str = "") -> str:
    """The same as a small table, every string escaped; "" if none."""
    shown = _shown_lines(a)
    if not shown:
        return ""
    over = f" over {escape(scope)}" if scope else ""
    cell = f"style='padding:0 8px 0 0;text-align:left;font-family:{style.MONO}'"
    num = "style='padding:0 8px 0 0;text-align:right;white-space:nowrap'"
    rows = "".join(
        f"<tr><td {cell}>{escape(h.where)}</td><td {cell}>{escape(h.via)}</td>"
        f"<td style='padding:0 8px 0 0;text-align:left;color:{style.MUTED}'>"
        f"{escape(KIND_WORDS.get(h.kind, h.kind))}</td>"
        f"<td {num}>{escape(format_seconds(h.seconds))}</td><td {num}>{h.share:.0%}</td></tr>"
        for h in shown
    )
    return (
        f"<div class='tpunb-host-lines' style='font-size:11px;margin-top:4px'>"
        f"<div style='color:{style.MUTED}'>host time by line (sampled{over}): the line, the "
        f"function under it, time and share of the wall time</div>"
        f"<table style='border-collapse:collapse;margin:0'>{rows}</table></div>"
    )


def verdict_html(a: Anatomy) -> str:
    v = a.verdict
    if v is None:
        return ""
    colour = style.OK if v.good else style.WARN
    where = f"; {v.where}" if getattr(v, "where", "") else ""
    return (
        f"<div><b style='color:{colour}'>{escape(v.kind)}</b>: "
        f"{escape(v.reason + where)}. <span style='color:{style.MUTED}'>Fix: "
        f"{escape(v.fix)}</span></div>"
    )


def anatomy_html(
    a: Anatomy | None, *, title: str = "where the steps' time went", lines: bool = False
) -> str:
    """Bar, timeline and verdict as one block (no outer root: for panels); `lines`: and the
    host time by line (not in the dashboard's fixed-height panel)."""
    if a is None or not a.steps:
        return (
            f"<span style='color:{style.MUTED}'>no step yet: the anatomy appears from "
            "the first sync of a tracked run (%%on_tpu)</span>"
        )
    shown = min(len(a.steps), SHOWN_STEPS)
    barred = sorted(s.wall for s in a.steps[-BAR_STEPS:])  # the steps the head names
    head = (
        f"{escape(title)}: last {len(barred)} steps, median "
        f"{escape(format_seconds(percentile(barred, 0.5)))}"
    )
    return (
        f"<div style='font-size:11px;color:{style.MUTED}'>{head}</div>{bar_html(a)}"
        f"<div style='font-size:11px;color:{style.MUTED};margin-top:4px'>the last "
        f"{shown} steps: host spans above, device executions below</div>"
        f"{timeline_svg(a)}{verdict_html(a)}{host_lines_html(a) if lines else ''}"
    )


class AnatomyView:
    """A run's anatomy in a notebook: `AnatomyView(report.anatomy)`."""

    def __init__(self, a: Anatomy | None):
        self.anatomy = a

    def __repr__(self) -> str:
        return "no steps" if self.anatomy is None else str(self.anatomy)

    def _repr_html_(self) -> str:
        return style.root(anatomy_html(self.anatomy, lines=True), "tpunb-anatomy")


def panel_html(a: Anatomy | None) -> str:
    """The dashboard's anatomy panel body (a failure here says so; it never stops the
    dashboard's other panels)."""
    try:
        return anatomy_html(a, title="where the last steps' time went")
    except Exception as exc:
        return (
            f"<span style='color:{style.MUTED}'>step anatomy unavailable: "
            f"{escape(type(exc).__name__)}</span>"
        )
