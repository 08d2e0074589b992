"""The dashboard's matplotlib charts for its final static view, drawn off-screen to PNG bytes
(Agg; pyplot never used). The live view draws SVG instead (display/live_charts.py).

Drawing a figure costs ~20-40 ms of Python (ticks, text): once, when the dashboard stops,
never while the loop runs. The step-time chart keeps the background drawn for each set of
axis limits, so a chart reused by the next dashboard usually draws only its data lines.
"""

from __future__ import annotations

import io
import time
from typing import TypeVar

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, MaxNLocator, NullLocator

from tpu_nb.display.live_charts import CHART_SIZES, INITIAL_LIMITS, compile_label, grow_limits
from tpu_nb.runtime.live import LiveCompile, StepPoint

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
_Chart = TypeVar("_Chart", "StepTimeChart", "CompileChart")


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
        self.limits = INITIAL_LIMITS
        self._shown_limits: tuple[float, float, float] | None = None
        self._backgrounds: dict[tuple, object] = {}
        self.full_draws = 0
        self.last_cost = 0.0
        self.last_full = False  # whether the last render redrew everything

    def reset(self) -> None:
        """Start over for a new dashboard (the kept backgrounds stay)."""
        self.limits = INITIAL_LIMITS

    def render(
        self,
        series: tuple[StepPoint, ...],
        compile_steps,
        *,
        final: bool = False,
        compress_level: int = 1,
    ) -> bytes:
        start = time.perf_counter()
        self.limits = grow_limits(self.limits, series, compile_steps, final)
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


class CompileChart:
    """Compile seconds per compiled graph (the most recent ones), labelled by line and hash."""

    SHOWN = 10
    last_full = True

    def __init__(self, size: tuple[float, float] = _COMPILE_INCHES) -> None:
        self.figure = Figure(figsize=size, dpi=DPI)
        self.canvas = FigureCanvasAgg(self.figure)
        self.ax = self.figure.add_subplot(1, 1, 1)
        self.last_cost = 0.0

    def reset(self) -> None:
        """Nothing to reset: each render draws the chart whole."""

    def render(
        self, compiles: tuple[LiveCompile, ...], *, final: bool = False, compress_level: int = 1
    ) -> bytes:
        start = time.perf_counter()
        ax = self.ax
        ax.clear()
        ax.tick_params(labelsize=LABEL_POINTS, colors=_TEXT)
        shown = [(c, c.seconds) for c in compiles if c.seconds is not None][-self.SHOWN :]
        if shown:
            # A "$" in a file name would start matplotlib's math text: escape it. (The graph
            # hash is in the compile table; at 10 px there is no room for it here.)
            labels = [compile_label(c, 20).replace("$", r"\$") for c, _ in shown]
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


# Charts released by stopped dashboards, by class: a figure costs ~20 ms to make, and a
# step-time chart keeps its backgrounds. Two dashboards never share one.
_free: dict[type, list] = {StepTimeChart: [], CompileChart: []}


def acquire(cls: type[_Chart]) -> _Chart:
    """A chart of class `cls` for one dashboard: a released one, reset, or a new one."""
    free = _free[cls]
    if not free:
        return cls()
    chart = free.pop()
    chart.reset()
    return chart


def release(chart: StepTimeChart | CompileChart) -> None:
    """Give a chart back when its dashboard stops."""
    free = _free[type(chart)]
    if chart not in free and len(free) < 2:
        free.append(chart)
