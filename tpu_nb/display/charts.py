"""The dashboard's matplotlib charts for its final static view, drawn off-screen to PNG bytes
(Agg; pyplot never used). The live view draws SVG instead (display/live_charts.py).

Drawing a figure costs ~20-40 ms of Python (ticks, text): once, when the dashboard stops,
never while the loop runs. The step-time chart keeps the background drawn for each set of
axis limits, so a chart reused by the next dashboard usually draws only its data lines.
"""

from __future__ import annotations

import io
import math
import time

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, MaxNLocator, NullLocator

from tpu_nb.display.live_charts import CHART_SIZES, nice_ceiling
from tpu_nb.runtime.live import LiveCompile, StepPoint
from tpu_nb.runtime.sources import place_text

# Drawn at twice the pixels they are shown at: sharp on HiDPI screens. At 160 dpi shown at
# half size, one point is 1.11 CSS pixels: 9-point labels are 10 px on screen.
PIXEL_DENSITY = 2
DPI = 80 * PIXEL_DENSITY
LABEL_POINTS = 9
# The same size as the live view's SVG charts (name -> CSS pixels), shown at 80 px an inch.
_STEP_INCHES = (CHART_SIZES["step"][0] / 80, CHART_SIZES["step"][1] / 80)
_COMPILE_INCHES = (CHART_SIZES["compile"][0] / 80, CHART_SIZES["compile"][1] / 80)
# Light colours (the theme's dark mode inverts the image, keeping hues: display/style.py).
_BLUE, _LIGHT, _RED, _TEXT = "#1565c0", "#5e9fe0", "#c62828", "#333333"


def _png(canvas: FigureCanvasAgg, compress_level: int) -> bytes:
    from PIL import Image

    width, height = canvas.get_width_height()
    image = Image.frombuffer("RGBA", (width, height), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
    out = io.BytesIO()
    image.save(out, format="png", compress_level=compress_level)
    return out.getvalue()


class StepTimeChart:
    """Step time (median and p90 per refresh, ms) over steps, compile events as red lines.

    No title or axis label in the figure: the dashboard captions it in HTML, as text is the
    costly part of a draw. The axes only grow while live (x to twice the steps so far, y by
    decades), and the background drawn for each set of limits is kept: a chart reused by the
    next dashboard (`acquire`/`release`) usually starts without a full redraw. The final
    render fits the axes to the data.
    """

    _INITIAL = (10.0, 0.1, 10.0)  # x: steps; y: ms, bottom and top (decades)
    _KEPT_BACKGROUNDS = 8

    def __init__(self, size: tuple[float, float] = _STEP_INCHES) -> None:
        self.figure = Figure(figsize=size, dpi=DPI)
        self.canvas = FigureCanvasAgg(self.figure)
        ax = self.ax = self.figure.add_subplot(1, 1, 1)
        ax.tick_params(labelsize=LABEL_POINTS, colors=_TEXT)
        ax.grid(True, alpha=0.3)
        (self.median_line,) = ax.plot([], [], color=_BLUE, lw=1.4, animated=True)
        (self.p90_line,) = ax.plot([], [], color=_LIGHT, lw=1.0, ls="--", animated=True)
        self.compile_lines = LineCollection(
            [],
            colors=_RED,
            linewidths=0.9,
            alpha=0.8,
            transform=ax.get_xaxis_transform(),
            animated=True,
        )
        ax.add_collection(self.compile_lines)
        # Said on an empty chart: why there is nothing to plot.
        self.note = ax.text(
            0.5,
            0.5,
            "",
            ha="center",
            va="center",
            transform=ax.transAxes,
            fontsize=LABEL_POINTS + 1,
            color=_TEXT,
            animated=True,
        )
        # Log scale: a compile step (seconds) and steady steps (ms) both stay readable. Few
        # ticks and no minor ones: tick text is most of a full redraw's cost.
        ax.set_yscale("log")
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_locator(LogLocator(numticks=5))
        ax.xaxis.set_major_locator(MaxNLocator(5, integer=True))
        # Room for the last x tick's label at the right edge, and for the labels' size.
        self.figure.subplots_adjust(left=0.1, right=0.95, top=0.95, bottom=0.15)
        self.limits = self._INITIAL
        self._shown_limits: tuple[float, float, float] | None = None
        self._backgrounds: dict[tuple, object] = {}
        self.full_draws = 0
        self.last_cost = 0.0
        self.last_full = False  # whether the last render redrew everything

    def reset(self) -> None:
        """Start over for a new dashboard (the kept backgrounds stay)."""
        self.limits = self._INITIAL

    def _wanted_limits(self, series, compile_steps, final: bool) -> tuple[float, float, float]:
        x_top, y_bottom, y_top = self.limits
        last = max([p.step for p in series] + list(compile_steps) + [1])
        if final:
            x_top = nice_ceiling(last * 1.05)
        elif last > x_top:
            x_top = nice_ceiling(last * 2)  # the data fills at least half the width
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

    def render(
        self,
        series: tuple[StepPoint, ...],
        compile_steps,
        *,
        final: bool = False,
        compress_level: int = 1,
    ) -> bytes:
        start = time.perf_counter()
        self.limits = self._wanted_limits(series, compile_steps, final)
        background = self._backgrounds.get(self.limits)
        self.last_full = background is None
        if self.limits != self._shown_limits:
            x_top, y_bottom, y_top = self.limits
            self.ax.set_xlim(0, x_top)
            self.ax.set_ylim(y_bottom, y_top)
            self._shown_limits = self.limits
        if background is None:
            self.canvas.draw()  # everything but the animated artists
            background = self.canvas.copy_from_bbox(self.figure.bbox)
            self._backgrounds[self.limits] = background
            while len(self._backgrounds) > self._KEPT_BACKGROUNDS:
                del self._backgrounds[next(iter(self._backgrounds))]
            self.full_draws += 1
        else:
            self.canvas.restore_region(background)
        steps = [p.step for p in series]
        self.median_line.set_data(steps, [p.median * 1e3 for p in series])
        self.p90_line.set_data(steps, [p.p90 * 1e3 for p in series])
        self.compile_lines.set_segments([[(s, 0), (s, 1)] for s in compile_steps])
        self.note.set_text(
            ""
            if series
            else (
                "no step completed: no torch_xla.sync() ran twice"
                if final
                else "waiting for the first steps (torch_xla.sync)"
            )
        )
        for artist in (self.p90_line, self.median_line, self.compile_lines, self.note):
            self.ax.draw_artist(artist)
        png = _png(self.canvas, compress_level)
        self.last_cost = time.perf_counter() - start
        return png


_free_charts: list[StepTimeChart] = []


def acquire_step_chart() -> StepTimeChart:
    """A step-time chart for one dashboard: a released one (its backgrounds kept) or new."""
    try:
        chart = _free_charts.pop()
    except IndexError:
        return StepTimeChart()
    chart.reset()
    return chart


def release_step_chart(chart: StepTimeChart) -> None:
    """Give a chart back when its dashboard stops (two dashboards never share one)."""
    if chart not in _free_charts and len(_free_charts) < 2:
        _free_charts.append(chart)


_free_compile_charts: list[CompileChart] = []


def acquire_compile_chart() -> CompileChart:
    """A compile chart for one dashboard: a released one (a figure costs ~20 ms) or new."""
    try:
        return _free_compile_charts.pop()
    except IndexError:
        return CompileChart()


def release_compile_chart(chart: CompileChart) -> None:
    """Give a compile chart back when its dashboard stops."""
    if chart not in _free_compile_charts and len(_free_compile_charts) < 2:
        _free_compile_charts.append(chart)


class CompileChart:
    """Compile seconds per compiled graph (the most recent ones), labelled by line and hash."""

    SHOWN = 10
    last_full = True

    def __init__(self, size: tuple[float, float] = _COMPILE_INCHES) -> None:
        self.figure = Figure(figsize=size, dpi=DPI)
        self.canvas = FigureCanvasAgg(self.figure)
        self.ax = self.figure.add_subplot(1, 1, 1)
        self.last_cost = 0.0

    def render(
        self, compiles: tuple[LiveCompile, ...], *, final: bool = False, compress_level: int = 1
    ) -> bytes:
        start = time.perf_counter()
        ax = self.ax
        ax.clear()
        ax.tick_params(labelsize=LABEL_POINTS, colors=_TEXT)
        shown = [(c, c.seconds) for c in compiles if c.seconds is not None][-self.SHOWN :]
        if shown:
            labels = [_label(c) for c, _ in shown]
            ax.barh(range(len(shown)), [seconds for _, seconds in shown], color=_RED, alpha=0.75)
            ax.set_yticks(range(len(shown)))
            ax.set_yticklabels(labels, fontsize=LABEL_POINTS)
            ax.invert_yaxis()
            ax.grid(True, axis="x", alpha=0.3)
        else:
            ax.set_xticks([])
            ax.set_yticks([])
            ax.text(
                0.5,
                0.5,
                "no graph compiled in this run" if final else "no graph compiled yet",
                ha="center",
                va="center",
                transform=ax.transAxes,
                fontsize=LABEL_POINTS + 1,
                color=_TEXT,
            )
        self.figure.subplots_adjust(left=0.5 if shown else 0.05, right=0.95, top=0.95, bottom=0.15)
        self.canvas.draw()
        png = _png(self.canvas, compress_level)
        self.last_cost = time.perf_counter() - start
        return png


def _label(c: LiveCompile) -> str:
    if c.event is None:
        return f"#{c.index}"
    where = place_text(c.place) if c.place is not None else "library"
    if len(where) > 20:  # drop the function, then the file's start: the line
        where = where.split(" (")[0]  # number is what tells the bars apart
        where = where if len(where) <= 20 else "\u2026" + where[-19:]
    # A "$" in a file name would start matplotlib's math text: escape it. (The graph hash is
    # in the compile table; at 10 px there is no room for it here.)
    return f"#{c.index} {where}".replace("$", r"\$")
