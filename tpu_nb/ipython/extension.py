"""Loading and unloading the extension: settings, the per-cell hook, magics, formatters.

`%reload_ext tpu_nb` and `%unload_ext tpu_nb` leave no duplicate hook, magic or formatter:
everything registered is recorded in one `_Loaded` per shell and removed from there. Unloading
also gives torch_xla back what tpu_nb changed in it (its counter reset, the PT_XLA_DEBUG_*
variables `%tpu_setup` set), or says in one line what cannot be undone in this process.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from traitlets import Bool
from traitlets.config import Configurable

from tpu_nb.runtime.backend import current as backend
from tpu_nb.runtime.metrics import MetricsDelta, MetricsSnapshot

if TYPE_CHECKING:
    from tpu_nb.ipython.interrupts import InterruptNotice


class TpuNb(Configurable):
    """tpu_nb settings: `%config TpuNb.show_xla_line = False`."""

    show_xla_line = Bool(
        True,
        help="After each cell that did XLA work outside %%on_tpu, print one line: "
        "graphs compiled, executions, transfers, host reads, CPU fallbacks. To show "
        "complete execute times it waits for the device's work (never when off).",
    ).tag(config=True)
    show_report = Bool(
        True,
        help="Show the expandable report after each %%on_tpu cell (--quiet turns it "
        "off for one cell).",
    ).tag(config=True)


# Cells kept for `%xla_metrics --cells`: a long session must not grow without bound.
MAX_HISTORY = 1000


class CellWatcher:
    """pre/post_run_cell hooks: what each cell did on XLA, and the compact line after it.

    Never imports torch_xla: a cell that has not touched it costs a dict lookup.
    """

    def __init__(self, settings: TpuNb, shell):
        self.settings, self.shell = settings, shell
        self.before: MetricsSnapshot | None = None
        self.last_delta: MetricsDelta | None = None
        self.reported_by_magic = False  # %%on_tpu shows its own, fuller report
        # The runtime's counters when %%on_tpu's report was complete: work after it (showing
        # the cell's value runs what the value left pending) gets its own line.
        self.reported_at: MetricsSnapshot | None = None
        # The last MAX_HISTORY cells that did XLA work; `cells_seen` counts them all.
        self.history: deque[tuple[int, str, MetricsDelta]] = deque(maxlen=MAX_HISTORY)
        self.cells_seen = 0
        self._first_line = ""
        # The files cells were compiled into -> their execution numbers, where IPython keeps
        # no such map (IPython 7 under ipykernel 6: /tmp/ipykernel_<pid>/<hash>.py).
        self.cell_files: dict[str, int] = {}

    def pre_run_cell(self, info=None) -> None:
        self.reported_by_magic = False
        self.reported_at = None
        raw = getattr(info, "raw_cell", "") or ""
        self._first_line = next((ln.strip() for ln in raw.splitlines() if ln.strip()), "")
        self._note_cell_file(raw)
        self.before = _snapshot_if_loaded()

    def _note_cell_file(self, raw: str) -> None:
        compiler = getattr(self.shell, "compile", None)
        if compiler is None or hasattr(compiler, "_filename_map") or not raw:
            return  # IPython >= 8 maps file names to numbers itself
        try:
            count = self.shell.execution_count
            self.cell_files[compiler.get_code_name(raw, raw, count)] = count
        except Exception:
            logging.getLogger("tpu_nb").debug("naming a cell's file", exc_info=True)
        while len(self.cell_files) > 2000:
            self.cell_files.pop(next(iter(self.cell_files)))

    def report_shown(self) -> None:
        """%%on_tpu's report is complete: work after it gets its own line (a broken runtime:
        no line, the report stands)."""
        self.reported_at = _snapshot_if_loaded()

    def post_run_cell(self, result=None) -> None:
        after = _snapshot_if_loaded()
        if after is None:
            return
        before = self.before or MetricsSnapshot({}, {}, after.taken_at, after.generation)
        delta = after.since(before)
        reported = self.reported_at if self.reported_by_magic else None
        shown = after.since(reported) if reported is not None else delta  # what the line says
        shows_line = (
            self.settings.show_xla_line
            and shown.did_xla_work
            and (reported is not None or not self.reported_by_magic)
        )
        if shows_line and (shown.syncs or shown.executions):
            # The line shows execute seconds, and an execution launched by the cell may
            # still run: wait for the device, so they are complete (the same figures every
            # run). Waiting runs nothing, but it is a wait the plain cell does not make:
            # only for the line, never when it is off (the times then land in a later cell).
            after = _snapshot_if_loaded(wait=True) or after
            delta = after.since(before)
            shown = after.since(reported) if reported is not None else delta
        self.last_delta = delta
        if delta.did_xla_work:
            self.cells_seen += 1
            count = getattr(result, "execution_count", None) or self.cells_seen
            self.history.append((count, self._first_line, delta))
        if shows_line and reported is not None:
            print(f"XLA after the report (showing the cell's value): {shown.summary()}")
        elif shows_line:
            print(f"XLA: {delta.summary()}")


def _snapshot_if_loaded(wait: bool = False) -> MetricsSnapshot | None:
    if not backend().process.is_loaded():
        return None
    from tpu_nb.runtime.environment import wait_device_ops
    from tpu_nb.runtime.metrics import snapshot

    try:
        if wait:
            wait_device_ops()
        return snapshot()
    except Exception:  # a broken runtime must not break every cell
        logging.getLogger("tpu_nb").debug("reading XLA metrics after a cell", exc_info=True)
        return None


@dataclass
class _Loaded:
    settings: TpuNb
    watcher: CellWatcher
    notice: InterruptNotice
    namer: Callable[[str], str | None]  # "In [n]" for a cell's file, not its temp file
    formatter_types: list[type] = field(default_factory=list)
    magics: Any = None  # the TpuMagics instance IPython also lists in shell.configurables


_loaded: dict[int, _Loaded] = {}


def get_state(shell) -> _Loaded:
    return _loaded[id(shell)]


def _register_formatters(shell, state: _Loaded) -> None:
    from tpu_nb.display.reports import EnvironmentView, RunView, TimingView
    from tpu_nb.runtime.environment import Environment
    from tpu_nb.runtime.graph import Graph
    from tpu_nb.runtime.metrics import DeviceTiming
    from tpu_nb.runtime.parallel import LaunchResult
    from tpu_nb.runtime.tracking import RunReport

    html = shell.display_formatter.formatters["text/html"]
    plain = shell.display_formatter.formatters["text/plain"]
    views = {Environment: EnvironmentView, RunReport: RunView, DeviceTiming: TimingView}
    for typ, view in views.items():
        html.for_type(typ, lambda obj, view=view: view(obj)._repr_html_())
        plain.for_type(typ, lambda obj, p, cycle, view=view: p.text(repr(view(obj))))
    plain.for_type(LaunchResult, lambda obj, p, cycle: p.text(str(obj)))

    def graph_html(obj):
        from tpu_nb.display.graph_view import GraphView

        return GraphView(obj)._repr_html_()

    html.for_type(Graph, graph_html)
    plain.for_type(Graph, lambda obj, p, cycle: p.text(f"<Graph: {obj.summary()}>"))
    state.formatter_types += [*views, LaunchResult, Graph]


def load_ipython_extension(shell) -> None:
    if id(shell) in _loaded:  # %load_ext twice: already there
        return
    from tpu_nb.ipython._cell import cell_name
    from tpu_nb.ipython.interrupts import InterruptNotice
    from tpu_nb.ipython.magics import TpuMagics
    from tpu_nb.runtime.environment import install_legacy_names
    from tpu_nb.runtime.sources import add_file_namer

    settings = TpuNb(parent=shell)
    shell.configurables.append(settings)
    watcher = CellWatcher(settings, shell)
    notice = InterruptNotice()
    state = _Loaded(
        settings, watcher, notice, functools.partial(cell_name, shell, watcher.cell_files)
    )
    _loaded[id(shell)] = state
    for event in ("pre_run_cell", "post_run_cell"):
        shell.events.register(event, getattr(watcher, event))
        shell.events.register(event, getattr(notice, event))  # after the watcher: covers its wait
    state.magics = TpuMagics(shell, state)
    shell.register_magics(state.magics)
    add_file_namer(state.namer)
    install_legacy_names()  # old tutorials' names say their replacement
    if backend().process.is_loaded():  # else at the first snapshot, once torch_xla is imported
        from tpu_nb.runtime.metrics import watch_counter_resets

        watch_counter_resets()
    _register_formatters(shell, state)


def unload_ipython_extension(shell) -> None:
    state = _loaded.pop(id(shell), None)
    if state is None:
        return
    from tpu_nb.runtime.environment import undo_debug_settings, uninstall_legacy_names
    from tpu_nb.runtime.metrics import stop_watching_counter_resets
    from tpu_nb.runtime.sources import remove_file_namer

    state.notice.post_run_cell()  # a running cell's watcher stops with the extension
    for event in ("pre_run_cell", "post_run_cell"):
        shell.events.unregister(event, getattr(state.watcher, event))
        shell.events.unregister(event, getattr(state.notice, event))
    manager = shell.magics_manager
    for kind, names in state.magics.magics.items():
        for name in names:
            manager.magics[kind].pop(name, None)
    manager.registry.pop("TpuMagics", None)
    remove_file_namer(state.namer)
    uninstall_legacy_names()
    if backend().process.is_loaded():
        stop_watching_counter_resets()  # torch_xla's reset is its own again
    undone = undo_debug_settings()  # or one line on what stays for the life of the process
    if undone:
        print(f"tpu_nb unloaded, but {undone}")
    for fmt in ("text/html", "text/plain"):
        formatter = shell.display_formatter.formatters[fmt]
        for typ in state.formatter_types:
            formatter.pop(typ, None)
    for configurable in (state.settings, state.magics):  # Magics.__init__ listed it there
        if configurable in shell.configurables:
            shell.configurables.remove(configurable)
