"""The live XLA dashboard: core ipywidgets and matplotlib, updated while a cell runs.

    with tpu_nb.dashboard():          # or %%on_tpu --live, or %tpu_dashboard in the cell
        train()

A polling thread, started and joined inside the running cell (Colab does not render widget
updates a thread sends after its cell ended: colabtools #3373), calls the runtime's
`LiveMonitor.poll()` every `refresh` seconds (0.5: at most 2 updates a second) and sets widget
traits only; it never prints. Charts are redrawn at most every `chart_refresh` seconds and only
when their data changed. When the cell ends, fails or is interrupted, the thread is joined, the
final state is drawn, and the live view is replaced in place by a static one (HTML panels with
the charts, and a plain-text summary without timings), so the cell's prints keep their place
below it: the widgets are closed, so a notebook that ran 100 live cells holds no widget comms
for them, and its saved outputs need no widget state.

nbval: it ignores display updates, so it sees the live view (an empty text/plain, a one-line
HTML placeholder) where the saved notebook has the final view. tools/nbval-sanitize.cfg masks
the dashboard's HTML (between <!--tpunb-dashboard--> markers) and its final text in both; the
figures are checked by tests/test_dashboard*.py instead.
"""

from __future__ import annotations

import sys
import threading
import time
from base64 import b64encode
from dataclasses import dataclass
from html import escape

from tpu_nb.display import style
from tpu_nb.display.anatomy_view import panel_html as anatomy_panel_html
from tpu_nb.runtime.errors import TpuNbError
from tpu_nb.runtime.live import LiveMonitor, LiveState
from tpu_nb.runtime.sources import place_text
from tpu_nb.runtime.tracking import HOST_READ_HINT, fallback_hint
from tpu_nb.runtime.units import format_seconds

VIEW_MIME = "application/vnd.jupyter.widget-view+json"
# Charts may take at most this share of wall time: after a costly draw (a full redraw when
# an axis grows) the next one waits longer, up to _CHART_MAX_GAP seconds.
_CHART_DUTY = 0.02
_CHART_MAX_GAP = 5.0
_SHOWN_EVENTS = 8         # compile events listed in the final panel (newest first)
_SHOWN_LIVE = 5           # ... and in the live one, whose height is reserved
# Panel heights reserved from the first paint (the live view must not jump as rows and lines
# arrive): the top row fits 5 compile rows, the bottom row a fallback with its hint.
_TOP_HEIGHT, _BOTTOM_HEIGHT = "178px", "96px"
_ANATOMY_HEIGHT = "204px"  # the step anatomy: bar, legend, timeline and a two-line verdict
# Theme colours (CSS variables with light fallbacks; display/style.py sets them per theme).
_RED, _RED_BG, _GREY = style.RED, style.RED_BG, style.MUTED
_FONT = style.FONT
_PANEL = (f"{style.ROOT};border:1px solid {style.LINE};border-radius:4px;padding:4px 8px;"
          "margin:2px;overflow:hidden;flex:1 1 auto")


@dataclass
class RefreshStats:
    """What the dashboard's own work cost (for the benchmark and the curious).

    `refreshes` and their times count the polling thread's refreshes only; the first view
    (`start_seconds`) and the final state (`stop_seconds`) are counted apart."""

    refreshes: int = 0
    refresh_seconds: float = 0.0      # wall time inside the thread's refreshes
    refresh_cpu: float = 0.0          # CPU time inside them (thread time)
    chart_draws: int = 0              # charts drawn by the thread (each chart counts)
    chart_seconds: float = 0.0
    chart_full_draws: int = 0         # of those, full redraws (an axis grew; compile chart)
    chart_full_seconds: float = 0.0
    thread_cpu: float = 0.0           # the polling thread's CPU time over its life
    thread_seconds: float = 0.0       # how long the polling thread ran
    start_seconds: float = 0.0        # start(): first poll, widgets, display
    stop_seconds: float = 0.0         # stop(): join, final poll, final charts, display

    @property
    def refresh_cost(self) -> float:
        """Mean wall seconds of one refresh (poll + widget updates + any chart)."""
        return self.refresh_seconds / self.refreshes if self.refreshes else 0.0

    @property
    def refresh_cpu_cost(self) -> float:
        """Mean CPU seconds of one refresh."""
        return self.refresh_cpu / self.refreshes if self.refreshes else 0.0

    @property
    def chart_cost(self) -> float:
        """Mean seconds to draw one chart (mostly blits; a full redraw when an axis grows)."""
        return self.chart_seconds / self.chart_draws if self.chart_draws else 0.0

    @property
    def blit_cost(self) -> float:
        """Mean seconds of a chart update that only redrew the data (the usual case)."""
        blits = self.chart_draws - self.chart_full_draws
        return (self.chart_seconds - self.chart_full_seconds) / blits if blits else 0.0

    @property
    def full_draw_cost(self) -> float:
        """Mean seconds of a full chart redraw."""
        return (self.chart_full_seconds / self.chart_full_draws if self.chart_full_draws
                else 0.0)

    @property
    def cpu_per_second(self) -> float:
        """The polling thread's CPU seconds per wall second."""
        return self.thread_cpu / self.thread_seconds if self.thread_seconds else 0.0


# Upper bounds of the options: a dashboard that refreshes less than hourly shows nothing
# live, and a polling thread cannot wait for inf or 1e308 seconds (the wait overflows).
MAX_REFRESH_SECONDS = 3600.0
MAX_ALERT_GRAPHS = 10_000


def _check_seconds(name: str, value, minimum: float) -> float:
    # NaN compares false with everything: it would pass a plain `value < minimum` and make the
    # polling thread spin without waiting.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not minimum <= value <= MAX_REFRESH_SECONDS:
        raise TpuNbError(f"{name} must be a number of seconds from {minimum:g} to "
                         f"{MAX_REFRESH_SECONDS:g}; got {value!r}. Fix: e.g. "
                         f"{name}={max(minimum, 0.5):g}.")
    return float(value)


def _ipython():
    if "IPython" not in sys.modules:
        return None
    from IPython import get_ipython

    return get_ipython()


class Dashboard:
    """The live XLA dashboard. `start()` shows and starts it, `stop()` draws the final state.

    refresh: seconds between updates (0.5: at most 2 a second).
    chart_refresh: at least this many seconds between chart redraws, which happen only when
        their data changed (default: 1, or `refresh` if longer).
    alert_graphs: the recompilation alert fires when one line compiles more than this many
        distinct graphs.
    charts: draw the matplotlib charts.
    widgets: show live widgets (default: when running in a Jupyter kernel). Without them the
        dashboard still polls, and shows its final state when it stops.

    As a context manager it starts on entry and stops on exit (also on error and interrupt).
    `repr()` is a summary without timings, stable for nbval.
    """

    def __init__(self, *, refresh: float = 0.5, chart_refresh: float | None = None,
                 alert_graphs: int = 3, charts: bool = True, widgets: bool | None = None,
                 title: str = "XLA dashboard"):
        self.refresh = _check_seconds("refresh", refresh, 0.1)
        if chart_refresh is None:
            chart_refresh = max(1.0, self.refresh)
        self.chart_refresh = _check_seconds("chart_refresh", chart_refresh, self.refresh)
        if isinstance(alert_graphs, bool) or not isinstance(alert_graphs, int) \
                or not 1 <= alert_graphs <= MAX_ALERT_GRAPHS:
            raise TpuNbError(f"alert_graphs must be a whole number from 1 to "
                             f"{MAX_ALERT_GRAPHS:,}; got {alert_graphs!r}. Fix: e.g. "
                             f"alert_graphs=3.")
        self.alert_graphs = alert_graphs
        self.charts = bool(charts)
        self.title = str(title)
        self._want_widgets = widgets
        self.status = "ready"
        self.state: LiveState | None = None
        self.stats = RefreshStats()
        self.error: BaseException | None = None          # what the polling thread hit
        self._monitor: LiveMonitor | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._widgets: list = []
        self._root = None
        self._handle = None
        self._shown = False
        self._hooks: list = []
        self._charts = None
        self._pngs: dict[str, bytes] = {}
        self._drawn: dict[str, tuple] = {}
        self._next_chart = 0.0
        self._code_start: float | None = None
        self._code_end: float | None = None
        self._last_report = None
        self._since = time.time()      # the step anatomy panel shows runs from here on

    # -- life cycle ---------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> "Dashboard":
        """Show the live view (in a kernel) and start the polling thread."""
        if self.running:
            return self
        if self.status != "ready":
            raise TpuNbError("this dashboard has already run and stopped. Fix: make a new "
                             "one: tpu_nb.dashboard() (or %%on_tpu --live).")
        began = time.perf_counter()
        self._monitor = LiveMonitor(alert_graphs=self.alert_graphs)
        try:
            ip = _ipython()
            use_widgets = self._want_widgets
            if use_widgets is None:
                use_widgets = getattr(ip, "kernel", None) is not None
            if use_widgets:
                self._build_widgets()
            self.status = "running"
            if self.charts:
                self._make_charts()      # imports matplotlib here, not in the polling thread
            self._refresh_once(final=False, charts=False)   # charts: from the first poll on
            if self._root is not None and ip is not None:
                from IPython.display import display

                self._handle = display(self._live_data(), raw=True, display_id=True)
                self._shown = True
        except BaseException:
            self._close_widgets()
            self._release_charts()
            self._monitor.close()
            self.status = "ready"
            raise
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="tpu_nb-dashboard", daemon=True)
        self._thread.start()
        self.stats.start_seconds = time.perf_counter() - began
        self._code_start = time.perf_counter()      # the user's code runs from here
        self._last_report = _last_report()
        return self

    def stop(self, error: BaseException | None = None) -> None:
        """Join the thread, draw the final state, replace the live view by a static one."""
        thread = self._thread
        if thread is None:
            return
        began = time.perf_counter()
        self._code_end = began
        self._stopping.set()
        try:
            thread.join()
        finally:
            self._thread = None
            self._unhook()
            try:
                self._finish(error)
            except Exception as exc:     # drawing the final state must not fail the cell
                self.error = self.error or exc
            finally:
                self._monitor.close()
                self._close_widgets()
                self._release_charts()
                self.stats.stop_seconds = time.perf_counter() - began

    def _finish(self, error: BaseException | None) -> None:
        if error is None:
            self.status = "finished"
            try:
                from tpu_nb.runtime.environment import wait_device_ops

                wait_device_ops()              # the last executions' times are then recorded
            except Exception:
                pass
        elif isinstance(error, KeyboardInterrupt):
            self.status = "interrupted"
        else:
            self.status = f"failed: {type(error).__name__}"
        self._refresh_once(final=True)
        ip = _ipython()
        if ip is None:
            return
        from IPython.display import display

        final = _FinalView(self)
        if self._handle is not None:
            # In place of the live view: the cell's prints stay below it, in their order.
            self._handle.update(final)
            self._handle = None
        else:
            display(final)
        self._shown = True

    def __enter__(self) -> "Dashboard":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.stop(exc)
        return False

    def stop_at_cell_end(self) -> "Dashboard":
        """Stop when the running IPython cell ends (even if it fails); the next cell's start
        stops it too, should the end of this one not be reported."""
        ip = _ipython()
        if ip is None or self._hooks:
            return self
        dash = self

        def cell_ended(result=None, *args):
            error = getattr(result, "error_in_exec", None) or getattr(
                result, "error_before_exec", None)
            dash.stop(error)

        def next_cell(*args):
            dash.stop()

        ip.events.register("post_run_cell", cell_ended)
        ip.events.register("pre_run_cell", next_cell)
        self._hooks = [(ip, "post_run_cell", cell_ended), (ip, "pre_run_cell", next_cell)]
        return self

    def _unhook(self) -> None:
        for ip, event, callback in self._hooks:
            try:
                ip.events.unregister(event, callback)
            except ValueError:
                pass
        self._hooks = []

    # -- polling ------------------------------------------------------------------------------

    def _loop(self) -> None:
        cpu, wall = time.thread_time(), time.perf_counter()
        try:
            while not self._stopping.wait(self.refresh):
                self._refresh_once(final=False, counted=True)
        except BaseException as exc:     # shown in the final state; the thread never prints
            self.error = exc
        finally:
            self.stats.thread_cpu += time.thread_time() - cpu
            self.stats.thread_seconds += time.perf_counter() - wall

    def refresh_now(self) -> LiveState:
        """Poll and update the view once, now (the polling thread does this every
        `refresh` seconds)."""
        if not self.running:
            raise TpuNbError(f"the dashboard is not running ({self.status}). Fix: "
                             "dash.start() first, or use `with tpu_nb.dashboard(): ...`.")
        self._refresh_once(final=False)
        return self.state

    def _refresh_once(self, final: bool, charts: bool = True, counted: bool = False) -> None:
        with self._lock:
            cpu, wall = time.thread_time(), time.perf_counter()
            self.state = self._monitor.poll()
            if self._widgets:
                self._update_widgets(self.state, final, charts and self.charts, counted)
            elif final and self.charts:
                self._draw_charts(self.state, final=True)
            if counted:
                self.stats.refreshes += 1
                self.stats.refresh_cpu += time.thread_time() - cpu
                self.stats.refresh_seconds += time.perf_counter() - wall

    # -- widgets ------------------------------------------------------------------------------

    def _build_widgets(self) -> None:
        import ipywidgets as W

        def panel(width):
            return W.HTML(layout=W.Layout(width=width, min_width="240px"))

        self._header = W.HTML()
        self._alert = W.HTML()
        self._compile_panel = panel("42%")        # the rows wrap below ~1000 px
        self._exec_panel = panel("31%")
        self._transfer_panel = panel("24%")
        self._fallback_panel = panel("63%")
        self._memory_panel = panel("34%")
        self._anatomy_panel = panel("97%")
        rows = [self._header, self._alert,
                W.HBox([self._compile_panel, self._exec_panel, self._transfer_panel],
                       layout=W.Layout(flex_flow="row wrap")),
                W.HBox([self._fallback_panel, self._memory_panel],
                       layout=W.Layout(flex_flow="row wrap"))]
        made = [self._header, self._alert, self._compile_panel, self._exec_panel,
                self._transfer_panel, self._fallback_panel, self._memory_panel] + rows[2:]
        rows.append(self._anatomy_panel)
        made.append(self._anatomy_panel)
        if self.charts:
            from tpu_nb.display.charts import CHART_SIZES

            # Sized from the start (no jump when the first chart arrives), shown at their
            # natural size (charts are drawn at twice the pixels: sharp on HiDPI screens).
            def image(name):
                width, height = CHART_SIZES[name]
                img = W.Image(format="png", layout=W.Layout(
                    width=f"{width}px", height=f"{height}px", max_width="100%",
                    object_fit="contain"))
                img.add_class("tpunb-chart")         # inverted in dark themes (style.py)
                return img

            self._step_image = image("step")
            self._compile_image = image("compile")
            for img in (self._step_image, self._compile_image):
                img.value = _BLANK_PNG        # until the first draw: no broken-image icon
            captions = [W.HTML(_caption(_STEP_CAPTION)), W.HTML(_caption(_COMPILE_CAPTION))]
            columns = [W.VBox([captions[0], self._step_image],
                              layout=W.Layout(max_width="62%", margin="0 6px 0 0")),
                       W.VBox([captions[1], self._compile_image],
                              layout=W.Layout(max_width="38%"))]
            chart_row = W.HBox(columns, layout=W.Layout(flex_flow="row wrap"))
            rows.append(chart_row)
            made += [self._step_image, self._compile_image, *captions, *columns, chart_row]
        self._root = W.VBox(rows)
        self._widgets = made + [self._root]

    def _close_widgets(self) -> None:
        # A widget's layout and style are widgets (comms) of their own: close them too.
        parts = [getattr(w, name, None) for w in self._widgets for name in ("layout", "style")]
        for widget in self._widgets + [p for p in parts if hasattr(p, "close")]:
            try:
                widget.close()
            except Exception:
                pass
        self._widgets = []
        self._root = None

    def _update_widgets(self, state: LiveState, final: bool, charts: bool,
                        counted: bool) -> None:
        _set(self._header, header_html(state, self.status, self.title, self.elapsed))
        _set(self._alert, alert_html(state))
        _set(self._compile_panel, compile_html(state, final))
        _set(self._exec_panel, execution_html(state, final))
        _set(self._transfer_panel, transfers_html(state))
        _set(self._fallback_panel, fallbacks_html(state))
        _set(self._memory_panel, memory_html(state))
        _set(self._anatomy_panel, _anatomy_html(self._since))
        if charts:
            pngs = self._draw_charts(state, final, counted)
            if "step" in pngs:
                self._step_image.value = pngs["step"]
            if "compile" in pngs:
                self._compile_image.value = pngs["compile"]

    def _make_charts(self) -> None:
        if self._charts is None:
            from tpu_nb.display.mpl_import import import_charts

            charts = import_charts()      # matplotlib: an interrupt cannot leave it half-imported
            self._charts = {"step": charts.acquire_step_chart(), "compile": charts.CompileChart()}

    def _release_charts(self) -> None:
        if self._charts is not None:
            from tpu_nb.display.charts import release_step_chart

            release_step_chart(self._charts["step"])
            self._charts = None

    def _draw_charts(self, state: LiveState, final: bool,
                     counted: bool = False) -> dict[str, bytes]:
        """Redraw the charts whose data changed, if one is due (always when final)."""
        now = time.perf_counter()
        if not final and now < self._next_chart:
            return {}
        self._make_charts()
        # `final` in the key: the final drawing fits the axes to the data and says "in this
        # run", even when no new data came since the last live drawing.
        keys = {"step": (state.series_version, state.compile_version, final),
                "compile": (state.compile_version, final)}
        drawn, cost = {}, 0.0
        for name, key in keys.items():
            if self._drawn.get(name) == key and name in self._pngs:
                continue                 # (an empty chart says why it is empty)
            chart = self._charts[name]
            level = 6 if final else 1
            if name == "step":
                png = chart.render(state.series, [c.step for c in state.compiles],
                                   final=final, compress_level=level)
            else:
                png = chart.render(state.compiles, final=final, compress_level=level)
            cost += chart.last_cost
            if counted and chart.last_full:
                self.stats.chart_full_draws += 1
                self.stats.chart_full_seconds += chart.last_cost
            self._pngs[name] = drawn[name] = png
            self._drawn[name] = key
        if drawn:
            if counted:
                self.stats.chart_draws += len(drawn)
                self.stats.chart_seconds += cost
            self._next_chart = now + max(self.chart_refresh,
                                         min(_CHART_MAX_GAP, cost / _CHART_DUTY))
        return drawn

    # -- text and display ---------------------------------------------------------------------

    def summary(self) -> str:
        """A plain-text summary without timings (stable across runs, for nbval)."""
        return summary_text(self.state, self.status, self.title, self.error)

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        return static_html(self.state, self.status, self.title, self._pngs, self.error,
                           elapsed=self.elapsed, anatomy=_anatomy_html(self._since))

    @property
    def elapsed(self) -> float | None:
        """Wall seconds of the work watched: from the end of `start()` to `stop()` (not the
        dashboard's own set-up and final drawing). When a tracked run (an %%on_tpu cell)
        completed inside, its wall time: the report and the dashboard then show one figure."""
        if self._code_start is None:
            return None
        report = _last_report()
        if (self._code_end is not None and report is not None
                and report is not self._last_report and report.complete):
            return report.wall_seconds
        return (self._code_end or time.perf_counter()) - self._code_start

    def _live_data(self) -> dict:
        """The live view's display data: the widget view, and for front ends without widgets
        (nbviewer, exported HTML) a line saying what was here. Both are replaced by the final
        view when the dashboard stops."""
        note = (f"{escape(self.title)}: live view (needs a front end with ipywidgets); its "
                "final state replaces it when the cell ends")
        return {VIEW_MIME: self._root.get_view_spec(), "text/plain": "",
                "text/html": _marked(f"<div class='tpunb-dashboard-live'>{note}</div>")}

    def _ipython_display_(self) -> None:
        """Shown once: `tpu_nb.dashboard()` as a cell's last line does not show it twice."""
        if self._shown:
            return
        from IPython.display import display

        self._shown = True
        if self.running and self._root is not None:
            self._handle = display(self._live_data(), raw=True, display_id=True)
        else:
            display(_FinalView(self))


class _FinalView:
    """The dashboard's final state as a plain output (no widgets)."""

    def __init__(self, dash: Dashboard):
        self.text = dash.summary()
        self.html = dash._repr_html_()

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return _marked(self.html)


def _marked(html: str) -> str:
    """The dashboard's HTML between markers tools/nbval-sanitize.cfg masks: its live view is
    updated in place to the final one, which nbval (it ignores display updates) never sees."""
    return f"<!--tpunb-dashboard-->{html}<!--/tpunb-dashboard-->"


def _last_report():
    from tpu_nb.runtime.tracking import last_report

    return last_report()


def _set(widget, value: str) -> None:
    if widget.value != value:       # an unchanged trait sends nothing anyway; skip the work
        widget.value = value


def dashboard(*, refresh: float = 0.5, chart_refresh: float | None = None,
              alert_graphs: int = 3, charts: bool = True) -> Dashboard:
    """Show a live XLA dashboard for the rest of the running cell, and return it.

        tpu_nb.dashboard()                 # stops when the cell ends
        with tpu_nb.dashboard():           # or: stops when the block ends
            train()

    Panels: compiles (with causes and lines), executions and step time, transfers, CPU
    fallbacks and device->host reads (each with what to do), memory; charts of step time over
    steps and compile seconds per graph. Outside IPython it polls without showing anything
    until stopped; `print(dash)` then gives the summary.
    """
    dash = Dashboard(refresh=refresh, chart_refresh=chart_refresh, alert_graphs=alert_graphs,
                     charts=charts)
    dash.start()
    return dash.stop_at_cell_end()


# -- HTML and text of the panels --------------------------------------------------------------

def _panel(title: str, body: str, *, alert: bool = False, height: str = "") -> str:
    css = _PANEL + (f";border:2px solid {_RED};background:{_RED_BG}" if alert else "") + (
        f";min-height:{height}" if height else "")
    # class tpunb: the theme's colour variables apply inside (display/style.py)
    return f"<div class='tpunb' style='{css}'><b>{escape(title)}</b><br>{body}</div>"


def _bytes(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _rate(per_second: float) -> str:
    return f"{per_second:.1f}/s" if per_second < 100 else f"{per_second:.0f}/s"


def header_html(state: LiveState | None, status: str, title: str,
                elapsed: float | None = None) -> str:
    """The title line; present tense while running, past tense once stopped.

    elapsed: the run's wall time, when the caller measured it (the dashboard: from the end of
    its start to its stop, the span of the cell's code like the report's wall time)."""
    steps = state.steps if state is not None else 0
    if elapsed is None and state is not None:
        elapsed = state.elapsed
    running = status in ("running", "ready")
    colour = {"running": style.OK, "finished": style.ACCENT}.get(status, _RED)
    recompiled = state is not None and state.alerts
    alert = (f" <b style='color:{_RED}'>{'RECOMPILING' if running else 'RECOMPILED'}</b>"
             if recompiled else "")
    counted = (f"sync <span class='tpunb-steps'>{steps}</span> · {format_seconds(elapsed)}"
               if running else
               f"<span class='tpunb-steps'>{steps}</span> syncs in {format_seconds(elapsed)}")
    return (f"{style.STYLE}<div class='tpunb' style='{style.ROOT}'><b>{escape(title)}</b> "
            f"<span style='color:{colour}' class='tpunb-status'>{escape(status)}</span> · "
            f"{counted}{alert}</div>")


def alert_html(state: LiveState | None) -> str:
    if state is None or not state.alerts:
        return ""
    parts = []
    for alert in state.alerts:
        how = ("captured graphs of its next syncs" if alert.source == "graphs"
               else "its compile-log blocks (counts and sizes; the ops are not logged)")
        lines = "".join(f"<li>{escape(line)}</li>" for line in alert.differs)
        parts.append(
            f"<div><b style='color:{_RED}'>Recompilation: {escape(alert.describe())}</b><br>"
            f"what differs between its last two graphs, from {escape(how)}:"
            f"<ul style='margin:2px 0 2px 1.2em;padding:0'>{lines}</ul>"
            "what to do: keep shapes, dtypes and Python values in the step fixed (pad or "
            "bucket batches; pass changing scalars as tensors)</div>")
    css = f"{_PANEL};border:2px solid {_RED};background:{_RED_BG}"
    return f"<div class='tpunb' style='{css}'>{''.join(parts)}</div>"


def compile_html(state: LiveState | None, final: bool = False) -> str:
    if state is None:
        return _panel("Compiles", "-", height=_TOP_HEIGHT)
    m = state.metrics
    head = (f"graphs compiled <b>{m.compiles}</b> ({format_seconds(m.compile_seconds)}) · "
            f"cache hits <b>{m.cache_hits}</b>")
    rows = []
    shown = _SHOWN_EVENTS if final else _SHOWN_LIVE
    for c in reversed(state.compiles[-shown:]):
        secs = format_seconds(c.seconds) if c.seconds is not None else "compiling"
        if c.event is None:
            rows.append(_row(f"#{c.index}", "cause unknown", "", "", secs))
            continue
        rows.append(_row(f"#{c.index}", escape(place_text(c.place)),
                         f"<span title='{escape(c.event.cause)}'>"
                         f"{escape(_short_cause(c.event))}</span>",
                         f"<code style='font-size:inherit'>{escape(c.event.graph_hash[:8])}"
                         "</code>", secs))
    body = head
    if rows:
        earlier = len(state.compiles) - min(len(state.compiles), shown)
        more = f"<br><span style='color:{_GREY}'>… {earlier} earlier</span>" if earlier else ""
        head_row = _row("#", "line", "cause", "graph", "time", tag="th")
        body += ("<table style='border-collapse:collapse;font-size:11px;margin:2px 0;"
                 "color:inherit;border:none;background:none'>"
                 f"{head_row}{''.join(rows)}</table>{more}")
    if m.compiles and not state.compile_analysis:
        body += (f"<br><span style='color:{_GREY}'>compile causes unknown: run %tpu_setup "
                 "(tpu_nb.setup()) before the first compile to record them</span>")
    return _panel("Compiles", body, alert=bool(state.alerts), height=_TOP_HEIGHT)


# Inline styles: notebook front ends restyle bare tables (JupyterLab right-aligns cells).
_CELL = ("text-align:left;padding:0 8px 0 0;border:none;background:none;vertical-align:top;"
         "color:inherit;font-size:inherit;line-height:1.35")


def _row(*cells: str, tag: str = "td") -> str:
    return "<tr style='background:none'>" + "".join(
        f"<{tag} style='{_CELL}'>{cell}</{tag}>" for cell in cells) + "</tr>"


_CAUSES = {"sync": "sync", "value-access": "value read", "dynamo": "dynamo",
           "compile": "torch_xla.compile"}


def _short_cause(event) -> str:
    """A few words for the table (the full cause is the cell's tooltip)."""
    short = _CAUSES.get(event.kind)
    if short is not None:
        return short
    return event.cause if len(event.cause) <= 24 else event.cause[:23] + "\u2026"


def execution_html(state: LiveState | None, final: bool = False) -> str:
    if state is None:
        return _panel("Execution", "-", height=_TOP_HEIGHT)
    m = state.metrics
    if state.step_median is not None:
        measured = "" if final else f", {state.steps_measured} measured"
        steps = (f"step time median <b>{format_seconds(state.step_median)}</b> · p90 "
                 f"<b>{format_seconds(state.step_p90)}</b><br><span style='color:{_GREY}'>"
                 f"device-synced: between step completions{measured}</span>")
    else:
        steps = (f"<span style='color:{_GREY}'>step time: no step completed"
                 f"{'' if final else ' yet'}</span>")
    rate = (m.executions / state.elapsed if final and state.elapsed > 0
            else state.execution_rate)
    body = (f"syncs <b>{state.steps}</b> <span style='color:{_GREY}' title='torch_xla.sync() "
            "and mark_step calls: one per training step, plus any sync tpu_nb adds at the "
            "end of a cell'>(torch_xla.sync calls: one per training step)</span><br>"
            f"executions <b>{m.executions}</b> · {_rate(rate)}"
            f"{' on average' if final else ''}<br>{steps}<br>"
            f"on device {format_seconds(m.execute_seconds)}")
    return _panel("Execution", body, height=_TOP_HEIGHT)


def transfers_html(state: LiveState | None) -> str:
    if state is None:
        return _panel("Transfers", "-", height=_TOP_HEIGHT)
    m = state.metrics
    body = (f"to device <b>{m.to_device_transfers}</b> ({format_seconds(m.to_device_seconds)})<br>"
            f"to host <b>{m.from_device_transfers}</b> ({format_seconds(m.from_device_seconds)})")
    return _panel("Transfers", body, height=_TOP_HEIGHT)


def fallbacks_html(state: LiveState | None) -> str:
    if state is None:
        return _panel("CPU fallbacks and device\u2192host reads", "-", height=_BOTTOM_HEIGHT)
    m = state.metrics
    if m.fallbacks:
        fall = "".join(f"<code>aten::{escape(op)}</code> ran on the CPU <b>{n}</b>\u00d7<br>"
                       f"<span style='color:{_GREY}'>{escape(fallback_hint(op))}</span><br>"
                       for op, n in sorted(m.fallbacks.items()))
    else:
        fall = "CPU fallbacks: none<br>"
    reads = f"device\u2192host reads <b>{m.host_reads}</b>"
    if m.host_reads:
        reads += f"<br><span style='color:{_GREY}'>{escape(HOST_READ_HINT)}</span>"
    return _panel("CPU fallbacks and device\u2192host reads", f"{fall}{reads}",
                  height=_BOTTOM_HEIGHT)


def memory_html(state: LiveState | None) -> str:
    if state is None:
        return _panel("Memory", "-", height=_BOTTOM_HEIGHT)
    mem = state.memory
    if mem.device_note:
        device = f"<span style='color:{_GREY}'>{escape(mem.device_note)}</span>"
    else:
        device = (f"device used <b>{_bytes(mem.device_used)}</b> of {_bytes(mem.device_limit)}"
                  + (f" · peak {_bytes(mem.device_peak)}" if mem.device_peak is not None
                     else ""))
    host = f"host RSS <b>{_bytes(mem.host_rss)}</b> · peak {_bytes(mem.host_peak)}"
    return _panel("Memory", f"{device}<br>{host}", height=_BOTTOM_HEIGHT)


def _caption(text: str) -> str:
    return (f"<div class='tpunb' style='{_FONT};font-size:11px;color:{_GREY}'>"
            f"{escape(text)}</div>")


def _img(png: bytes | None, caption: str) -> str:
    if not png:
        return ""
    width, height = _css_size(png)
    return (f"<div style='margin:2px 6px 2px 0;width:{width}px;max-width:100%'>"
            f"{_caption(caption)}"
            f"<img class='tpunb-chart' alt='{escape(caption)}' width='{width}' "
            f"height='{height}' style='max-width:100%;height:auto;display:block' "
            f"src='data:image/png;base64,{b64encode(png).decode()}'></div>")


def _css_size(png: bytes) -> tuple[int, int]:
    """The size a chart is shown at: its pixels over the charts' density (sharp at 2x)."""
    from tpu_nb.display.charts import PIXEL_DENSITY

    width = int.from_bytes(png[16:20], "big")       # the PNG header's width and height
    height = int.from_bytes(png[20:24], "big")
    return round(width / PIXEL_DENSITY), round(height / PIXEL_DENSITY)


# A 1x1 transparent PNG: what a chart slot holds before its first draw.
_BLANK_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
    "0000000b49444154789c6360000200000500017a5eab3f0000000049454e44ae426082")

# The charts' captions, without importing matplotlib for a text-only dashboard.
_STEP_CAPTION = ("step time (ms, log scale) over steps: median (solid) and p90 (dashed) per "
                 "refresh; red lines: compiles")
_COMPILE_CAPTION = "compile seconds per graph (the last 10)"


def _anatomy_html(since: float) -> str:
    """The step anatomy panel (display/anatomy_view.py)."""
    return _panel("where the steps' time went", anatomy_panel_html(since),
                  height=_ANATOMY_HEIGHT)


def static_html(state: LiveState | None, status: str, title: str, pngs: dict[str, bytes],
                error: BaseException | None = None, elapsed: float | None = None,
                anatomy: str = "") -> str:
    """The final (or any) state as one self-contained HTML block."""
    row = "display:flex;flex-wrap:wrap;align-items:stretch"
    panels = [(compile_html(state, True), 2), (execution_html(state, True), 1),
              (transfers_html(state), 1), (fallbacks_html(state), 2), (memory_html(state), 1)]
    broken = ""
    if error is not None:
        broken = (f"<div style='{_FONT};color:{_RED}'>the dashboard stopped updating: "
                  f"{escape(type(error).__name__)}: {escape(str(error)[:300])}</div>")
    # The live view reserves panel heights (no jumps while it updates); the final one is
    # drawn once and needs no reserve.
    for height in (_TOP_HEIGHT, _BOTTOM_HEIGHT):
        panels = [(p.replace(f";min-height:{height}", ""), grow) for p, grow in panels]
    anatomy = anatomy.replace(f";min-height:{_ANATOMY_HEIGHT}", "")
    return (f"<div class='tpunb tpunb-dashboard' style='{style.ROOT};padding:0'>"
            f"{header_html(state, status, title, elapsed)}{broken}"
            f"{alert_html(state)}<div style='{row}'>"
            + "".join(f"<div style='flex:{grow} 1 {240 * grow}px;display:flex'>{p}</div>"
                      for p, grow in panels) + "</div>" + anatomy +
            f"<div style='{row}'>{_img(pngs.get('step'), _STEP_CAPTION)}"
            f"{_img(pngs.get('compile'), _COMPILE_CAPTION)}</div></div>")


def summary_text(state: LiveState | None, status: str, title: str = "XLA dashboard",
                 error: BaseException | None = None) -> str:
    """Counts and findings, no timings: the same text for the same work on every run."""
    if state is None:
        return f"{title} ({status})"
    m = state.metrics
    lines = [f"{title} ({status}): {state.steps} steps, {m.executions} executions, "
             f"{m.compiles} graphs compiled, {m.cache_hits} cache hits, "
             f"{sum(m.fallbacks.values())} CPU fallbacks, {m.host_reads} device->host reads"]
    for c in state.compiles[-_SHOWN_EVENTS:]:
        if c.event is not None:
            lines.append(f"  compiled graph {c.event.graph_hash[:8]} at {place_text(c.place)}: "
                         f"{c.event.cause}")
    for alert in state.alerts:
        lines.append(f"  RECOMPILATION ALERT: {alert.describe()}; what differs:")
        lines += [f"    {line}" for line in alert.differs]
    for op, n in sorted(m.fallbacks.items()):
        lines.append(f"  CPU fallback aten::{op} x{n}: {fallback_hint(op)}")
    if m.host_reads:
        lines.append(f"  device->host reads: {m.host_reads}: {HOST_READ_HINT}")
    if error is not None:
        lines.append(f"  the dashboard stopped updating: {type(error).__name__}")
    return "\n".join(lines)
