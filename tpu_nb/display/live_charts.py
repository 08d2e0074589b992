"""The dashboard's live charts: inline SVG written from the monitor's published data.

While a cell runs, every millisecond of Python the dashboard's thread spends is taken from the
training loop (they share the interpreter). A matplotlib update (restore the background, draw
the lines, encode a PNG) cost ~6 ms and a full redraw ~20-40 ms; writing the chart as SVG text
costs a fraction of a millisecond, and less again because only what changed is written anew:

- `update(state)` returns None when the data it draws did not change (its version counters);
- the frame (axes, grid, tick labels) is written once per set of axis limits, which only grow
  (x to twice the steps so far, y by decades), so it is rewritten a handful of times a run;
- each point of the step-time lines is formatted once: later updates format the new points
  and join the strings (a series halved by the monitor starts over).

Colours are the theme's CSS variables (display/style.py): the charts follow JupyterLab's light
and dark themes without being inverted. Every string written into the SVG is escaped. The
final static view draws the same charts once more from the final state (`final=True`): the axes
fitted to the data, and an empty chart says that nothing happened in the run.
"""

from __future__ import annotations

import math
import re
from base64 import b64encode

from tpu_nb.display import style
from tpu_nb.runtime.live import LiveCompile, LiveState, StepPoint
from tpu_nb.runtime.sources import place_text
from tpu_nb.runtime.units import format_seconds

# name -> (width, height) in CSS pixels: the chart slots the dashboard reserves (the charts
# of the final view have the same size).
CHART_SIZES = {"step": (496, 184), "compile": (304, 184)}
LABEL_PX = 10  # the smallest text drawn, at the natural size
_LEFT, _RIGHT, _TOP, _BOTTOM = 46, 16, 8, 22  # the step chart's plot margins


def _round_up(value: float, mults: tuple[float, ...]) -> float:
    """The smallest of `mults` x 10^k at or above `value` (value > 0)."""
    exp = math.floor(math.log10(value))
    return next((m * 10**exp for m in mults if m * 10**exp >= value), 10 ** (exp + 1))


# The step-time charts' axis limits at the start: x: steps; y: ms, bottom and top (decades).
INITIAL_LIMITS = (10.0, 0.1, 10.0)


def grow_limits(limits, series, compile_steps, final: bool = False) -> tuple[float, float, float]:
    """Step-time axis limits that fit the data. While live they only grow (x to twice the
    steps so far, y by decades); `final` fits them to the data (x to the first tick past the
    last step, so the data spans most of the width)."""
    x_top, y_bottom, y_top = limits
    last = max([p.step for p in series] + list(compile_steps) + [1])
    if final:
        step = _tick_step(last * 1.05)
        x_top = step * math.ceil(last * 1.05 / step)
    elif last > x_top:
        x_top = _round_up(last * 2, (1, 1.5, 2, 3, 5, 7.5, 10))  # the data fills half or more
    values = [v * 1e3 for p in series for v in (p.median, p.p90) if v > 0]
    if values:
        if final:
            y_bottom = 10 ** math.floor(math.log10(min(values) / 1.05))
            y_top = 10 ** math.ceil(math.log10(max(values) * 1.05))
        while min(values) < y_bottom * 1.05 and y_bottom > 1e-4:
            y_bottom /= 10
        while max(values) > y_top / 1.05:
            y_top *= 10
    return x_top, y_bottom, y_top


def _tick_step(top: float) -> float:
    """A round step (1, 2, 2.5, 5 x 10^k; a whole number, at least 1) giving at most 5
    intervals."""
    step = _round_up(max(top / 5, 1.0), (1, 2, 2.5, 5, 10))
    return step if step == int(step) else 2 * step


def _number(value: float) -> str:
    return f"{value:g}" if value < 1e5 else f"{value:.0e}"


def _steps(value: float) -> str:
    """A step count as a tick label: 125k, not 1e+05 (which 100000 and 150000 would share)."""
    return f"{value:g}" if value < 1e5 else f"{value / 1e3:g}k"


def _svg_open(name: str, width: int, height: int, title: str) -> str:
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' class='tpunb-svg-chart tpunb-{name}-chart' "
        f"width='{width}' height='{height}' viewBox='0 0 {width} {height}' role='img' "
        f"aria-label='{style.esc(title)}' style='display:block;max-width:100%;height:auto;"
        f"font-family:{style.MONO};font-size:{LABEL_PX}px'><title>{style.esc(title)}</title>"
    )


def wrap(svg: str) -> str:
    """A chart as the HTML its slot shows: inside a themed block (the colour variables)."""
    return f"<div class='tpunb' style='{style.ROOT};padding:0;background:transparent'>{svg}</div>"


def with_picture(svg: str) -> str:
    """A chart as `wrap` shows it, followed by the same chart as a picture: an <img> of the SVG
    with its own colours and background (style.PICTURE_STYLE). A rule of its own
    (style.PICTURE_HIDDEN) hides the picture after the inline SVG. JupyterLab's sanitizer (an
    untrusted notebook: one downloaded, or run by someone else) strips the inline SVG and
    every <style> but keeps an <img> with a data: URI: there the picture shows instead, and
    the font size of 0 hides the text the stripped SVG leaves behind."""
    tag = _OPEN.match(svg)  # a chart's opening tag (_svg_open), its attributes escaped
    if tag is None:
        return wrap(svg)
    width, height, label = tag.groups()
    picture = (
        f"{tag.group()}{style.PICTURE_STYLE}<rect width='100%' height='100%' "
        f"style='fill:var(--tpunb-bg)'/>{svg[tag.end() :]}"
    )
    return (
        f"{style.PICTURE_HIDDEN}<div class='tpunb' style='{style.ROOT};padding:0;"
        "background:transparent;font-size:0px;line-height:0'>"
        f"{svg}<img class='tpunb-chart-picture' alt='{label}' "
        f"width='{width}' height='{height}' style='display:block;max-width:100%;height:auto' "
        f"src='data:image/svg+xml;base64,{b64encode(picture.encode()).decode()}'></div>"
    )


_OPEN = re.compile(r"<svg [^>]* width='(\d+)' height='(\d+)' [^>]*aria-label='([^']*)'[^>]*>")


class StepTimeSvg:
    """Step time (median and p90 per refresh, ms, log scale) over steps; compiles as red lines.

    `x(step)` and `y(ms)` are the pixel positions of a data point under the current axis
    limits."""

    def __init__(self, size: tuple[int, int] = CHART_SIZES["step"]) -> None:
        self.width, self.height = size
        self.limits = INITIAL_LIMITS
        self._key: tuple | None = None
        self._frame = ""  # axes, grid and tick labels for self.limits
        self._framed: tuple | None = None
        self._median: list[str] = []  # formatted points, one per StepPoint drawn
        self._p90: list[str] = []
        self._last_point: StepPoint | None = None
        self.last_full = False  # whether the last render rewrote the frame

    # -- the coordinates --

    def x(self, step: float) -> float:
        plot = self.width - _LEFT - _RIGHT
        return _LEFT + plot * min(max(step, 0.0), self.limits[0]) / self.limits[0]

    def y(self, ms: float) -> float:
        _, bottom, top = self.limits
        plot = self.height - _TOP - _BOTTOM
        low, high = math.log10(bottom), math.log10(top)
        value = min(max(math.log10(ms) if ms > 0 else low, low), high)
        return _TOP + plot * (high - value) / (high - low)

    # -- drawing --

    def update(self, state: LiveState) -> str | None:
        """The chart's SVG, or None when the data it draws did not change since the last."""
        key = (state.series_version, state.compile_version)
        if key == self._key:
            return None
        self._key = key
        steps = [c.step for c in state.compiles]
        return self.render(state.series, steps, compiled=compiled_count(state.compiles))

    def render(
        self,
        series: tuple[StepPoint, ...],
        compile_steps,
        *,
        final: bool = False,
        compiled: int | None = None,
    ) -> str:
        """The chart's SVG. `final`: the final view's, its axes fitted to the data.
        `compiled`: the graphs compiled in the run (default: one per compile step given)."""
        self.limits = grow_limits(self.limits, series, compile_steps, final)
        self.last_full = self.limits != self._framed
        if self.last_full:
            self._frame = self._draw_frame()
            self._framed = self.limits
            self._median, self._p90, self._last_point = [], [], None
        self._extend(series)
        bottom, top = self.height - _BOTTOM, _TOP
        compiles = "".join(f"M{self.x(s):.1f} {top}V{bottom}" for s in compile_steps)
        parts = [self._frame]
        if compiles:
            parts.append(
                f"<path d='{compiles}' style='stroke:{style.RED};stroke-width:1;opacity:.8'/>"
            )
        if self._median:
            parts.append(
                f"<polyline points='{' '.join(self._p90)}' style='fill:none;stroke:"
                f"{style.ACCENT};stroke-width:1;stroke-dasharray:4 3;opacity:.7'/>"
                f"<polyline points='{' '.join(self._median)}' style='fill:none;stroke:"
                f"{style.ACCENT};stroke-width:1.6'/>"
            )
        else:
            note = (
                "no step completed: no torch_xla.sync() ran twice"
                if final
                else "waiting for the first steps (torch_xla.sync)"
            )
            parts.append(
                f"<text x='{(_LEFT + self.width - _RIGHT) / 2:.0f}' y='{self.height / 2:.0f}' "
                f"text-anchor='middle' style='fill:{style.MUTED}'>{style.esc(note)}</text>"
            )
        count = len(compile_steps) if compiled is None else compiled
        title = _step_title(series, count, final)
        return _svg_open("steps", self.width, self.height, title) + "".join(parts) + "</svg>"

    def _extend(self, series) -> None:
        """Format the points not drawn yet; start over if the series is not an extension of
        the one drawn (the monitor halved it)."""
        n = len(self._median)
        if n > len(series) or (n and series[n - 1] is not self._last_point):
            self._median, self._p90, n = [], [], 0
        for p in series[n:]:
            x = f"{self.x(p.step):.1f},"
            self._median.append(f"{x}{self.y(p.median * 1e3):.1f}")
            self._p90.append(f"{x}{self.y(p.p90 * 1e3):.1f}")
        if series:
            self._last_point = series[-1]

    def _draw_frame(self) -> str:
        x_top, y_bottom, y_top = self.limits
        left, right, top, bottom = _LEFT, self.width - _RIGHT, _TOP, self.height - _BOTTOM
        grid, labels = [], []
        decades = range(round(math.log10(y_bottom)), round(math.log10(y_top)) + 1)
        every = 1 if len(decades) <= 6 else 2
        for k in decades[::every]:
            y = self.y(10.0**k)
            grid.append(f"M{left} {y:.1f}H{right}")
            labels.append(
                f"<text x='{left - 4}' y='{y + 3.5:.1f}' text-anchor='end'>"
                f"{_number(10.0**k)}</text>"
            )
        step = _tick_step(x_top)
        ticks = [step * i for i in range(int(x_top / step + 1e-9) + 1)]
        for t in ticks:
            x = self.x(t)
            grid.append(f"M{x:.1f} {top}V{bottom}")
            labels.append(
                f"<text x='{x:.1f}' y='{bottom + 14}' text-anchor='middle'>{_steps(t)}</text>"
            )
        return (
            f"<path d='{''.join(grid)}' style='stroke:{style.LINE};stroke-width:1'/>"
            f"<rect x='{left}' y='{top}' width='{right - left}' height='{bottom - top}' "
            f"style='fill:none;stroke:{style.MUTED};stroke-width:1'/>"
            f"<g style='fill:{style.FG}'>{''.join(labels)}</g>"
        )


def _step_title(series, compiled: int, final: bool = False) -> str:
    """What the chart shows, in words (its tooltip and its accessible name)."""
    compiles = f"{compiled} compile{'' if compiled == 1 else 's'}"
    if not series:
        return f"step time: no step measured{'' if final else ' yet'}; {compiles}"
    last = series[-1]
    return (
        f"step time at step {last.step}: median {format_seconds(last.median)}, p90 "
        f"{format_seconds(last.p90)}; {compiles}"
    )


class CompileSvg:
    """Compile seconds per compiled graph (the last `SHOWN`), labelled by line, as SVG."""

    SHOWN = 10
    _LABEL_CHARS = 20

    def __init__(self, size: tuple[int, int] = CHART_SIZES["compile"]) -> None:
        self.width, self.height = size
        self._key: int | None = None
        self.last_full = True  # drawn whole each time (only when a graph compiled)

    def update(self, state: LiveState) -> str | None:
        """The chart's SVG, or None when no compile changed since the last."""
        if state.compile_version == self._key:
            return None
        self._key = state.compile_version
        return self.render(state.compiles)

    def render(self, compiles: tuple[LiveCompile, ...], *, final: bool = False) -> str:
        """The chart's SVG. `final`: the final view's (an empty chart speaks of the run)."""
        shown = [c for c in compiles if c.seconds is not None][-self.SHOWN :]
        count = compiled_count(compiles)
        title = f"{count} graph{'' if count == 1 else 's'} compiled"
        if shown:
            title += "; the last: " + ", ".join(
                f"#{c.index} {format_seconds(c.seconds)}" for c in shown[-3:]
            )
        parts = [_svg_open("compile", self.width, self.height, title)]
        if not shown:
            note = "no graph compiled in this run" if final else "no graph compiled yet"
            parts.append(
                f"<text x='{self.width / 2:.0f}' y='{self.height / 2:.0f}' text-anchor='middle'"
                f" style='fill:{style.MUTED}'>{style.esc(note)}</text>"
            )
        else:
            label_w = round(self._LABEL_CHARS * LABEL_PX * 0.62) + 6
            left, right = label_w, self.width - 44  # room for the time at the bar's end
            lane = min(16.0, (self.height - 4) / len(shown))
            longest = max(c.seconds or 0.0 for c in shown) or 1.0
            bars, texts = [], []
            for i, c in enumerate(shown):
                seconds = c.seconds or 0.0
                y = 2 + i * lane
                w = max(1.0, (right - left) * seconds / longest)
                bars.append(
                    f"<rect x='{left}' y='{y + 2:.1f}' width='{w:.1f}' height='{lane - 4:.1f}'>"
                    f"<title>{style.esc(_compile_tip(c))}</title></rect>"
                )
                mid = y + lane / 2 + 3.5
                label = compile_label(c, self._LABEL_CHARS - len(f"#{c.index} "))
                texts.append(
                    f"<text x='{left - 4}' y='{mid:.1f}' text-anchor='end'>{style.esc(label)}"
                    f"</text><text x='{left + w + 3:.1f}' y='{mid:.1f}'>"
                    f"{style.esc(format_seconds(seconds))}</text>"
                )
            parts.append(
                f"<g style='fill:{style.RED};opacity:.8'>{''.join(bars)}</g>"
                f"<g style='fill:{style.FG}'>{''.join(texts)}</g>"
            )
        parts.append("</svg>")
        return "".join(parts)


def compiled_count(compiles: tuple[LiveCompile, ...]) -> int:
    """The graphs compiled since the monitor started: the monitor keeps only the most recent
    compiles, numbered from its start, so the count is the last one's number."""
    return max((c.index for c in compiles), default=0)


def compile_label(c: LiveCompile, room: int) -> str:
    """ "#3 cell line 7", its place cut to `room` characters: the line number is what tells
    the bars apart."""
    if c.event is None:
        return f"#{c.index}"
    where = place_text(c.place) if c.place is not None else "library"
    room = max(room, 2)
    if len(where) > room:
        where = where.split(" (")[0]  # without the function
    if len(where) > room:
        where = "\u2026" + where[-(room - 1) :]  # the file's end and the line number
    return f"#{c.index} {where}"


def _compile_tip(c: LiveCompile) -> str:
    seconds = format_seconds(c.seconds) if c.seconds is not None else "compiling"
    if c.event is None:
        return f"#{c.index}: {seconds} (cause unknown)"
    where = place_text(c.place) if c.place is not None else "library code"
    return f"#{c.index} {where}: {seconds}; {c.event.cause}; graph {c.event.graph_hash[:8]}"
