"""A torch_xla profiler trace drawn in the notebook: one lane per thread, no TensorBoard.

Inline SVG with a tooltip per span (no script, no image), like the graph view: it renders in
JupyterLab, Colab, VS Code and exported HTML. Theme colours (display/style.py); every name
(thread, op, HLO instruction) is escaped.
"""

from __future__ import annotations

from html import escape

from tpu_nb.display import style
from tpu_nb.runtime.tracking import ProfileTrace
from tpu_nb.runtime.units import format_seconds

MAX_SPANS = 3000  # spans drawn (the longest); a tooltip says how many were left out
_WIDTH, _LANE, _LEFT = 760, 14, 150
# What a span is, by name: the step's sync, the device's execution, the rest.
_SYNC = ("StepMarker", "SyncTensorsGraph")
_EXECUTE = ("ThunkExecutor::Execute", "PjRtComputationClient::ExecuteComputation")


def _colour(name: str) -> str:
    if name.startswith(_SYNC):
        return style.MUTED
    if name.startswith(_EXECUTE):
        return style.OK
    if "Compile" in name:
        return style.RED
    if "Transfer" in name:
        return style.WARN
    return style.ACCENT


class TraceView:
    """`TraceView(capture.trace)`: the timeline of a profiler trace."""

    def __init__(self, trace: ProfileTrace, title: str = "profiler trace"):
        self.trace = trace
        self.title = title

    def __repr__(self) -> str:
        t = self.trace
        return (
            f"{self.title}: {t.steps} steps, {len(t.events)} events on "
            f"{len(t.threads)} threads over {format_seconds(t.seconds)}"
        )

    def to_svg(self) -> str:
        t = self.trace
        span = max(t.seconds, 1e-9)
        scale = (_WIDTH - _LEFT - 4) / span
        lanes = {name: i for i, name in enumerate(t.threads)}
        shown = sorted(t.events, key=lambda e: -e.duration)[:MAX_SPANS]
        spans = []
        for e in sorted(shown, key=lambda e: e.start):
            fill = f"{_colour(e.name)};fill-opacity:0.45"
            tip = f"{e.name}: {format_seconds(e.duration)}"
            x, y = _LEFT + e.start * scale, lanes[e.thread] * (_LANE + 4)
            spans.append(style.timeline_span(x, y, e.duration * scale, _LANE, fill, tip))
        labels = [(name[:24], i * (_LANE + 4) + 11) for name, i in lanes.items()]
        height = len(lanes) * (_LANE + 4) + 16
        return style.timeline_svg(_WIDTH, height, _LEFT, span, labels, spans)

    def _repr_html_(self) -> str:
        t = self.trace
        left_out = len(t.events) - min(len(t.events), MAX_SPANS) + t.dropped
        note = f" ({left_out} shorter spans not drawn)" if left_out else ""
        head = (
            f"<b>{escape(self.title)}</b>: {t.steps} steps over "
            f"{escape(format_seconds(t.seconds))}, {len(t.threads)} threads"
            f"<span style='color:{style.MUTED}'>{escape(note)}; hover a span for its "
            "name and time; nested calls darken</span>"
        )
        return style.root(
            f"<div>{head}</div><div style='overflow-x:auto'>{self.to_svg()}</div>", "tpunb-profile"
        )
