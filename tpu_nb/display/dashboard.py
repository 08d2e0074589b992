"""The live XLA dashboard: core ipywidgets with SVG charts, updated while a cell runs.

    with tpu_nb.dashboard():          # or %%on_tpu --live, or %tpu_dashboard in the cell
        train()

A polling thread, started and joined inside the running cell (Colab does not render widget
updates a thread sends after its cell ended: colabtools #3373), calls the runtime's
`LiveMonitor.poll()` every `refresh` seconds (0.5: at most 2 updates a second) and sets widget
traits only; it never prints. It shows only the one `LiveState` the monitor publishes
(counters, step times, compiles, the recompilation alert, the step anatomy); the panels' HTML
and the summary text are pure functions of it (display/dashboard_html.py).

The thread shares the interpreter with the training loop, so its Python time is the loop's
loss: a panel or chart is written only when its part of the state changed (the state's
version counters), and the live charts are SVG text (display/live_charts.py says what a
matplotlib chart cost), at most every `chart_refresh` seconds. When the cell ends, fails or
is interrupted, the thread is joined, the final state is drawn (the same SVG charts, once
more, their axes fitted to the data), and the live view is replaced in place by a static one
(HTML with the charts, and a plain-text summary without timings): the cell's prints keep
their place below it, and with the widgets closed a notebook that ran 100 live cells holds
no widget comms for them and saves no widget state.

nbval ignores display updates, so it sees the live view (an empty text/plain, a one-line HTML
placeholder) where the saved notebook has the final view. tools/nbval-sanitize.cfg masks the
dashboard's HTML (between <!--tpunb-dashboard--> markers) and its final text in both; the
figures are checked by tests/test_dashboard*.py instead.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from dataclasses import dataclass
from html import escape
from typing import Any

from tpu_nb.display.dashboard_html import (
    COMPILE_CAPTION,
    STEP_CAPTION,
    anatomy_html,
    caption_html,
    live_panels_html,
    static_html,
    summary_text,
)
from tpu_nb.display.live_charts import (
    CHART_SIZES,
    CompileSvg,
    StepTimeSvg,
    compiled_count,
    wrap,
)
from tpu_nb.display.style import STYLE
from tpu_nb.runtime.errors import RuntimeStateError, check_seconds, check_whole_number
from tpu_nb.runtime.live import LiveMonitor, LiveState

__all__ = ["Dashboard", "RefreshStats", "dashboard"]

VIEW_MIME = "application/vnd.jupyter.widget-view+json"
# Charts may take at most this share of wall time: after a costly draw the next one waits
# longer, up to _CHART_MAX_GAP seconds.
_CHART_DUTY = 0.02
_CHART_MAX_GAP = 5.0


def _mean(total: str, count: str) -> Any:
    """A read-only property: the field `total` over the field `count` (0.0 while it is 0)."""

    def get(stats: RefreshStats) -> float:
        n = getattr(stats, count)
        return getattr(stats, total) / n if n else 0.0

    return property(get)


@dataclass
class RefreshStats:
    """What the dashboard's own work cost (for the benchmark and the curious).

    `refreshes` and their times count the polling thread's refreshes only; the first view
    (`start_seconds`) and the final state (`stop_seconds`) are counted apart."""

    refreshes: int = 0
    refresh_seconds: float = 0.0  # wall time inside the thread's refreshes
    refresh_cpu: float = 0.0  # CPU time inside them (thread time)
    chart_draws: int = 0  # live (SVG) charts drawn by the thread (each chart counts)
    chart_seconds: float = 0.0
    chart_full_draws: int = 0  # of those, full redraws (an axis grew; compile chart)
    chart_full_seconds: float = 0.0
    anatomy_builds: int = 0  # live step anatomies the monitor built (while tracked)
    anatomy_seconds: float = 0.0
    thread_cpu: float = 0.0  # the polling thread's CPU time over its life
    thread_seconds: float = 0.0  # how long the polling thread ran
    start_seconds: float = 0.0  # start(): first poll, widgets, display
    stop_seconds: float = 0.0  # stop(): join, final poll, final charts, display

    # Means, 0 before the first: wall and CPU seconds of one refresh (poll + widget updates +
    # any chart); seconds to draw one live chart (mostly data updates; a full redraw when an
    # axis grows), to build one live step anatomy, of a full chart redraw; and the polling
    # thread's CPU seconds per wall second.
    refresh_cost = _mean("refresh_seconds", "refreshes")
    refresh_cpu_cost = _mean("refresh_cpu", "refreshes")
    chart_cost = _mean("chart_seconds", "chart_draws")
    anatomy_cost = _mean("anatomy_seconds", "anatomy_builds")
    full_draw_cost = _mean("chart_full_seconds", "chart_full_draws")
    cpu_per_second = _mean("thread_cpu", "thread_seconds")


# Upper bounds of the options: a dashboard that refreshes less than hourly shows nothing
# live, and a polling thread cannot wait for inf or 1e308 seconds (the wait overflows).
MAX_REFRESH_SECONDS = 3600.0
MAX_ALERT_GRAPHS = 10_000


def _check_seconds(name: str, value, minimum: float) -> float:
    # NaN compares false with everything: it would pass a plain `value < minimum` and make the
    # polling thread spin without waiting.
    return check_seconds(
        value, name, low=minimum, high=MAX_REFRESH_SECONDS, fix=f"e.g. {name}={max(minimum, 0.5):g}"
    )


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
    charts: draw the charts (SVG in the theme's colours, live and in the final view).
    widgets: show live widgets (default: when running in a Jupyter kernel). Without them the
        dashboard still polls, and shows its final state when it stops.

    As a context manager it starts on entry and stops on exit (also on error and interrupt).
    `repr()` is a summary without timings, stable for nbval.
    """

    def __init__(
        self,
        *,
        refresh: float = 0.5,
        chart_refresh: float | None = None,
        alert_graphs: int = 3,
        charts: bool = True,
        widgets: bool | None = None,
        title: str = "XLA dashboard",
    ):
        self.refresh = _check_seconds("refresh", refresh, 0.1)
        if chart_refresh is None:
            chart_refresh = max(1.0, self.refresh)
        self.chart_refresh = _check_seconds("chart_refresh", chart_refresh, self.refresh)
        self.alert_graphs = check_whole_number(
            alert_graphs, "alert_graphs", high=MAX_ALERT_GRAPHS, fix="e.g. alert_graphs=3"
        )
        self.charts = bool(charts)
        self.title = str(title)
        self._want_widgets = widgets
        self.status = "ready"
        self.state: LiveState | None = None
        self.stats = RefreshStats()
        self.error: BaseException | None = None  # what the polling thread hit
        self._monitor: LiveMonitor | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._widgets: list = []
        self._root: Any = None  # an ipywidgets VBox (ipywidgets has no types)
        self._handle = None
        self._shown_in: int | None = None  # the cell (execution count) it was shown in
        self._hooks: list = []
        self._svg_charts: dict[str, StepTimeSvg | CompileSvg] = {
            "step": StepTimeSvg(),
            "compile": CompileSvg(),
        }
        self._svgs: dict[str, str] = {}  # the charts as last drawn (then the final view's)
        self._next_chart = 0.0
        self._anatomy_drawn: int | None = None  # the anatomy version the panel shows
        self._code_start: float | None = None
        self._code_end: float | None = None
        # True when the dashboard watches one tracked run and nothing else (%%on_tpu --live):
        # it then shows that run's wall time, the figure of its report.
        self.same_as_run = False

    # -- life cycle ---------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> Dashboard:
        """Show the live view (in a kernel) and start the polling thread."""
        if self.running:
            return self
        if self.status != "ready":
            raise RuntimeStateError(
                "this dashboard has already run and stopped. Fix: make a new "
                "one: tpu_nb.dashboard() (or %%on_tpu --live)."
            )
        began = time.perf_counter()
        self._monitor = monitor = LiveMonitor(alert_graphs=self.alert_graphs)
        try:
            ip = _ipython()
            use_widgets = self._want_widgets
            if use_widgets is None:
                use_widgets = getattr(ip, "kernel", None) is not None
            if use_widgets:
                self._build_widgets()
            self.status = "running"
            self._refresh_once(final=False)
            if self._root is not None and ip is not None:
                from IPython.display import display

                self._handle = display(self._live_data(), raw=True, display_id=True)
                self._shown_in = _cell()
        except BaseException:
            self._close_widgets()
            monitor.close()
            self.status = "ready"
            raise
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="tpu_nb-dashboard", daemon=True)
        self._thread.start()
        self.stats.start_seconds = time.perf_counter() - began
        self._code_start = time.perf_counter()  # the user's code runs from here
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
            except Exception as exc:  # drawing the final state must not fail the cell
                self.error = self.error or exc
            finally:
                if self._monitor is not None:  # start() made it before the thread
                    self.stats.anatomy_builds = self._monitor.anatomy_builds
                    self.stats.anatomy_seconds = self._monitor.anatomy_seconds
                    self._monitor.close()
                self._close_widgets()
                self.stats.stop_seconds = time.perf_counter() - began

    def _finish(self, error: BaseException | None) -> None:
        if error is None:
            self.status = "finished"
            try:
                from tpu_nb.runtime.environment import wait_device_ops

                wait_device_ops()  # the last executions' times are then recorded
            except Exception:  # the final state is drawn anyway, with what was recorded
                logging.getLogger("tpu_nb").debug(
                    "waiting for the device before the dashboard's final state", exc_info=True
                )
        elif isinstance(error, KeyboardInterrupt):
            self.status = "interrupted"
        else:
            self.status = f"failed: {type(error).__name__}"
        try:
            self._refresh_once(final=True)
        except Exception as exc:  # the last state polled is shown, with a line saying so
            self.error = self.error or exc
        ip = _ipython()
        if ip is None:
            return
        from IPython.display import display

        final = self._final_data()
        if self._handle is not None:
            # In place of the live view: the cell's prints stay below it, in their order.
            self._handle.update(final, raw=True)
            self._handle = None
        else:
            display(final, raw=True)
            self._shown_in = _cell()

    def __enter__(self) -> Dashboard:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop(exc)  # the exception, if any, goes on

    def stop_at_cell_end(self) -> Dashboard:
        """Stop when the running IPython cell ends (even if it fails); the next cell's start
        stops it too, should the end of this one not be reported."""
        ip = _ipython()
        if ip is None or self._hooks:
            return self

        def cell_ended(result=None, *args):
            self.stop(
                getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
            )
            self._shown_in = None  # its cell is over: a later cell may show it again

        def next_cell(*args):
            self.stop()

        ip.events.register("post_run_cell", cell_ended)
        ip.events.register("pre_run_cell", next_cell)
        self._hooks = [(ip, "post_run_cell", cell_ended), (ip, "pre_run_cell", next_cell)]
        return self

    def _unhook(self) -> None:
        for ip, event, callback in self._hooks:
            with contextlib.suppress(ValueError):  # already unregistered
                ip.events.unregister(event, callback)
        self._hooks = []

    # -- polling ------------------------------------------------------------------------------

    def _loop(self) -> None:
        cpu, wall = time.thread_time(), time.perf_counter()
        try:
            while not self._stopping.wait(self.refresh):
                self._refresh_once(final=False, counted=True)
        except BaseException as exc:  # shown in the final state; the thread never prints
            self.error = exc
        finally:
            self.stats.thread_cpu += time.thread_time() - cpu
            self.stats.thread_seconds += time.perf_counter() - wall

    def refresh_now(self) -> LiveState:
        """Poll and update the view once, now (the polling thread does this every
        `refresh` seconds)."""
        if not self.running:
            raise RuntimeStateError(
                f"the dashboard is not running ({self.status}). Fix: "
                "dash.start() first, or use `with tpu_nb.dashboard(): ...`."
            )
        return self._refresh_once(final=False)

    def _refresh_once(self, final: bool, counted: bool = False) -> LiveState:
        monitor = self._monitor
        assert monitor is not None, "start() makes the monitor before the first refresh"
        with self._lock:
            cpu, wall = time.thread_time(), time.perf_counter()
            self.state = state = monitor.poll(final=True) if final else monitor.poll()
            if self._widgets and not final:  # the final view replaces the widgets
                self._update_widgets(state, counted)
            if final and self.charts:
                self._draw_final_charts(state)
            if counted:
                self.stats.refreshes += 1
                self.stats.refresh_cpu += time.thread_time() - cpu
                self.stats.refresh_seconds += time.perf_counter() - wall
        return state

    # -- widgets ------------------------------------------------------------------------------

    def _build_widgets(self) -> None:
        import ipywidgets as W

        # The header and the counters' panels are one widget: they change at every refresh,
        # and each widget update is a message of its own (~0.3 ms of the thread's Python).
        self._panels = W.HTML()
        self._anatomy_panel = W.HTML(layout=W.Layout(width="97%", min_width="240px"))
        rows = [self._panels, self._anatomy_panel]
        made = list(rows)
        if self.charts:
            # Sized from the start: the view does not jump when the first chart arrives.
            self._step_chart, self._compile_chart = (
                W.HTML(layout=W.Layout(width=f"{w}px", height=f"{h}px", max_width="100%"))
                for w, h in (CHART_SIZES["step"], CHART_SIZES["compile"])
            )
            captions = [W.HTML(caption_html(STEP_CAPTION)), W.HTML(caption_html(COMPILE_CAPTION))]
            columns = [
                W.VBox(
                    [captions[0], self._step_chart],
                    layout=W.Layout(max_width="62%", margin="0 6px 0 0"),
                ),
                W.VBox([captions[1], self._compile_chart], layout=W.Layout(max_width="38%")),
            ]
            chart_row = W.HBox(columns, layout=W.Layout(flex_flow="row wrap"))
            rows.append(chart_row)
            made += [self._step_chart, self._compile_chart, *captions, *columns, chart_row]
        self._root = W.VBox(rows)
        self._widgets = made + [self._root]

    def _close_widgets(self) -> None:
        # A widget's layout and style are widgets (comms) of their own: close them too.
        parts = [getattr(w, name, None) for w in self._widgets for name in ("layout", "style")]
        for widget in self._widgets + [p for p in parts if hasattr(p, "close")]:
            try:
                widget.close()
            except Exception:  # a comm the front end already dropped: the rest still close
                logging.getLogger("tpu_nb").debug("closing a dashboard widget", exc_info=True)
        self._widgets = []
        self._root = None

    def _update_widgets(self, state: LiveState, counted: bool) -> None:
        _set(self._panels, live_panels_html(state, self.status, self.title, self.elapsed))
        if state.anatomy_version != self._anatomy_drawn:  # its SVG only when it changed
            self._anatomy_drawn = state.anatomy_version
            # The theme's stylesheet rides with this seldom-changing panel, sent once.
            _set(self._anatomy_panel, STYLE + anatomy_html(state))
        if self.charts:
            slots = {"step": self._step_chart, "compile": self._compile_chart}
            for name, svg in self._draw_live_charts(state, counted).items():
                slots[name].value = wrap(svg)

    def _draw_live_charts(self, state: LiveState, counted: bool = False) -> dict[str, str]:
        """The SVG charts whose data changed, if a redraw is due."""
        now = time.perf_counter()
        if now < self._next_chart:
            return {}
        drawn, cost = {}, 0.0
        for name, chart in self._svg_charts.items():
            began = time.perf_counter()
            svg = chart.update(state)
            if svg is None:
                continue  # its data did not change
            seconds = time.perf_counter() - began
            cost += seconds
            if counted and chart.last_full:
                self.stats.chart_full_draws += 1
                self.stats.chart_full_seconds += seconds
            self._svgs[name] = drawn[name] = svg
        if drawn:
            if counted:
                self.stats.chart_draws += len(drawn)
                self.stats.chart_seconds += cost
            self._next_chart = now + max(
                self.chart_refresh, min(_CHART_MAX_GAP, cost / _CHART_DUTY)
            )
        return drawn

    def _draw_final_charts(self, state: LiveState) -> None:
        """The final view's charts, drawn once after the loop from the final state: new
        charts, their axes fitted to the data (the live ones only grew)."""
        steps = [c.step for c in state.compiles]
        self._svgs = {
            "step": StepTimeSvg().render(
                state.series, steps, final=True, compiled=compiled_count(state.compiles)
            ),
            "compile": CompileSvg().render(state.compiles, final=True),
        }

    # -- text and display ---------------------------------------------------------------------

    def summary(self) -> str:
        """A plain-text summary without timings (stable across runs, for nbval)."""
        return summary_text(self.state, self.status, self.title, self.error)

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        if self.running:  # shown while it runs: the state now (else the last one polled)
            try:
                self._refresh_once(final=False)
            except Exception:
                logging.getLogger("tpu_nb").debug("the dashboard's poll failed", exc_info=True)
        return static_html(
            self.state,
            self.status,
            self.title,
            self._svgs,
            self.error,
            elapsed=self.elapsed,
            anatomy=anatomy_html(self.state),
        )

    @property
    def elapsed(self) -> float | None:
        """Wall seconds of the work watched: from the end of `start()` to `stop()` (not the
        dashboard's own set-up and final drawing). With `same_as_run` (an %%on_tpu --live
        cell), the wall time of the tracked run it watched: the report and the dashboard then
        show one figure. A tracked block among other work inside is not the whole span."""
        if self._code_start is None:
            return None
        state = self.state
        if (
            self.same_as_run
            and self._code_end is not None
            and state is not None
            and state.run_wall_seconds is not None
        ):
            return state.run_wall_seconds
        return (self._code_end or time.perf_counter()) - self._code_start

    def _live_data(self) -> dict[str, Any]:
        """The live view's display data: the widget view, and for front ends without widgets
        (nbviewer, exported HTML) a line saying what was here. Both are replaced by the final
        view when the dashboard stops."""
        note = (
            f"{escape(self.title)}: live view (needs a front end with ipywidgets); its "
            "final state replaces it when the cell ends"
        )
        return {
            VIEW_MIME: self._root.get_view_spec(),
            "text/plain": "",
            "text/html": _marked(f"<div class='tpunb-dashboard-live'>{note}</div>"),
        }

    def _final_data(self) -> dict[str, str]:
        """The final state as a plain output (no widgets)."""
        return {"text/plain": self.summary(), "text/html": _marked(self._repr_html_())}

    def _ipython_display_(self) -> None:
        """Shown once per cell: `tpu_nb.dashboard()` as a cell's last line does not show it
        twice; a later cell shows it again."""
        if self._shown_in is not None and self._shown_in == _cell():
            return
        from IPython.display import display

        self._shown_in = _cell()
        if self.running and self._root is not None:
            self._handle = display(self._live_data(), raw=True, display_id=True)
        else:
            display(self._final_data(), raw=True)


def _cell() -> int | None:
    """The running cell's execution count (None outside IPython)."""
    return getattr(_ipython(), "execution_count", None)


def _marked(html: str) -> str:
    """The dashboard's HTML between markers tools/nbval-sanitize.cfg masks: its live view is
    updated in place to the final one, which nbval (it ignores display updates) never sees."""
    return f"<!--tpunb-dashboard-->{html}<!--/tpunb-dashboard-->"


def _set(widget, value: str) -> None:
    if widget.value != value:  # an unchanged trait sends nothing anyway; skip the work
        widget.value = value


def dashboard(
    *,
    refresh: float = 0.5,
    chart_refresh: float | None = None,
    alert_graphs: int = 3,
    charts: bool = True,
) -> Dashboard:
    """Show a live XLA dashboard for the rest of the running cell, and return it.

        tpu_nb.dashboard()                 # stops when the cell ends
        with tpu_nb.dashboard():           # or: stops when the block ends
            train()

    Panels: compiles (with causes and lines), executions and step time, transfers, CPU
    fallbacks and scalar reads (each with what to do, when it applies), memory; charts of step
    time over steps and compile seconds per graph. Outside IPython it polls without showing anything
    until stopped; `print(dash)` then gives the summary.
    """
    dash = Dashboard(
        refresh=refresh, chart_refresh=chart_refresh, alert_graphs=alert_graphs, charts=charts
    )
    dash.start()
    return dash.stop_at_cell_end()
