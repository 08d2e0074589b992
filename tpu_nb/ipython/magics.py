"""The magics. Each parses its arguments (_args.py), calls a public tpu_nb function, shows
the result."""

from __future__ import annotations

import functools
from dataclasses import fields
from typing import TYPE_CHECKING

from IPython.core.error import UsageError
from IPython.core.magic import (
    Magics,
    cell_magic,
    line_cell_magic,
    line_magic,
    magics_class,
    no_var_expand,
)
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display

from tpu_nb.ipython._args import evaluate_tensors, parse, seconds, user_mistake, whole
from tpu_nb.ipython._cell import CellCode, last_change
from tpu_nb.ipython._on_tpu import launch_cell, run_tracked, start_dashboard
from tpu_nb.runtime.backend import current as backend
from tpu_nb.runtime.environment import MAX_CPU_DEVICES
from tpu_nb.runtime.metrics import MAX_NUMBER, MAX_REPEAT
from tpu_nb.runtime.plan import MAX_GRAPHS, Plan

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

flag = functools.partial(argument, action="store_true")  # an option that takes no value


def options(magic):
    """A magic's argument parser (the options decorated below this), with -h/--help first."""
    return magic_arguments()(flag("-h", "--help", help="show this help and exit")(magic))


@magics_class
class TpuMagics(Magics):
    shell: InteractiveShell  # Magics types it Optional; the extension always passes one

    def __init__(self, shell, state):
        super().__init__(shell)
        self.state = state

    @options
    @argument(
        "--device",
        default="auto",
        metavar="{auto,tpu,cpu}",
        help="the XLA device: a TPU if there is one (auto), or tpu, or cpu",
    )
    @argument(
        "--devices",
        type=whole("--devices", 1, MAX_CPU_DEVICES, 4),
        metavar="N",
        help="number of virtual XLA:CPU devices (for SPMD on a CPU)",
    )
    @flag("--ir-debug", help="record the Python line of each IR node (for the graph viewer)")
    @argument(
        "--cache",
        metavar="DIR",
        help="persistent compile cache directory (faster restarts on TPU); quote a "
        "path with spaces, ~ is your home",
    )
    @flag("--check", help="only check the environment (torch_xla imported in a subprocess)")
    @flag("--install", help="pip-install the matching torch/torch_xla pair ([tpu] on TPU hosts)")
    @flag("--dry-run", help="with --install: show what pip would do")
    @argument(
        "--target",
        metavar="CHIP",
        help="the TPU to judge runs for when this machine has none: v4, v5e (the default), "
        "v5p, v6e or TPU7x",
    )
    @line_magic
    def tpu_setup(self, line=""):
        """Check the environment, choose the XLA device, switch on compile-cause analysis.

        Run it before the first XLA work of the kernel: torch_xla reads its settings once.
        `%tpu_setup --target v6e` judges runs for a v6e when this machine has no TPU.
        """
        args = parse(self.tpu_setup, line)
        if args is None:
            return
        from tpu_nb.runtime.environment import detect, install_pair, setup, setup_action

        settings = dict(
            device=args.device,
            num_devices=args.devices,
            ir_debug=args.ir_debug,
            cache_dir=args.cache,
            target=args.target,
        )
        with user_mistake("%tpu_setup"):
            action = setup_action(
                install=args.install, check=args.check, dry_run=args.dry_run, **settings
            )
        if action == "check":
            return display(detect(check_import=True))
        if action == "install":
            status, restart = install_pair(dry_run=args.dry_run)
            if status != 0:
                raise UsageError(
                    f"pip exited with status {status}. Fix: see pip's error "
                    f"above, or try %tpu_setup --install --dry-run"
                )
            if restart:
                print(
                    "torch was already imported in this kernel: restart the runtime "
                    "(Colab: Runtime > Restart session) for the new install to take effect."
                )
            return display(detect())
        with user_mistake():
            display(setup(**settings))

    @options
    @flag("-o", dest="output", help="return the RunReport (like %%timeit -o)")
    @flag(
        "--sync",
        help="sync at the end of the cell, so work left pending runs and is counted in this "
        "cell (a sync the plain cell does not make; default: pending work stays pending)",
    )
    @flag("--no-sync", help="the default: no sync at the cell's end (for older notebooks)")
    @flag("--quiet", help="do not show the report")
    @argument(
        "--max-graphs",
        metavar="N",
        help="fail when the steps of this cell trace more than N distinct graphs",
    )
    @flag("--live", help="attach the live dashboard")
    @argument(
        "--replicas",
        nargs="?",
        const="all",
        metavar="all|N",
        help="run the cell once per device (replica), `index` set in each",
    )
    @argument(
        "--timeout",
        metavar="SECONDS",
        help="with --replicas: stop replicas still running after this many seconds",
    )
    @argument(
        "--spmd",
        nargs="?",
        const="all",
        metavar="MESH",
        help="run the cell once over all devices (SPMD); `mesh` and `shard_batch` set",
    )
    @argument(
        "--hosts",
        nargs="?",
        const="all",
        metavar="all|N",
        help="run the cell once per host of a TPU pod slice through Ray (ray.init(address=...) "
        "first), `host` and `hosts` set in each",
    )
    @flag("--graph", help="show the graph the cell leaves pending at its end")
    @argument(
        "--profile",
        metavar="N",
        help="capture a profiler trace of the cell's first N steps (syncs) and draw its timeline",
    )
    @no_var_expand
    @cell_magic
    def on_tpu(self, line, cell):
        """Run the cell on the XLA device and report what compiled, ran and cost.

        Tensors and modules the cell creates without device= land on the XLA device; the cell
        makes the same compiles, syncs and reads as a plain cell (pending work stays pending
        unless --sync) and waits for the device at its end, so the times are complete.
        --replicas runs it once per device, --spmd once over all devices, --hosts once per
        host of a TPU pod slice (connect Ray first: ray.init(address=...)).

        Examples
        --------
        ::

          %%on_tpu --max-graphs 2      # stop at the step that traces a third graph
          for batch in loader:
              loss = train_step(batch)

          %%on_tpu --spmd 2x2 -o       # one program over 4 devices; returns the RunReport
          loss = model(shard_batch(batch)).sum()
        """
        __tracebackhide__ = True  # noqa: F841
        args = parse(self.on_tpu, line)
        if args is None:
            return None
        with user_mistake("%on_tpu"):
            plan = Plan(**{option.name: getattr(args, option.name) for option in fields(Plan)})
        with user_mistake():
            plan.check()  # before anything: the switch to SPMD cannot be undone
        code = CellCode(self.shell, cell, files=self.state.watcher.cell_files)  # syntax first
        if plan.mode in ("replicas", "hosts"):
            return launch_cell(self.shell, self.state, code, plan, args)
        return run_tracked(self.shell, self.state, code, plan, args)

    @options
    @argument(
        "--refresh",
        type=seconds("--refresh", 0.1, 3600, 0.5),
        default=0.5,
        metavar="SECONDS",
        help="seconds between updates (default 0.5: at most 2 a second)",
    )
    @argument(
        "--chart-refresh",
        type=seconds("--chart-refresh", 0.1, 3600, 1),
        metavar="SECONDS",
        help="at least this many seconds between chart redraws (default 1)",
    )
    @argument(
        "--alert-graphs",
        type=whole("--alert-graphs", 1, MAX_GRAPHS, 3),
        default=3,
        metavar="K",
        help="alert when one line compiles more than K distinct graphs (default 3)",
    )
    @flag("--no-charts", help="panels only, no charts")
    @line_magic
    def tpu_dashboard(self, line=""):
        """Show the live XLA dashboard for the rest of this cell.

        Put it at the top of a training cell: compiles (cause, line), step time, transfers,
        CPU fallbacks, host reads and memory update while the cell runs; the final state stays
        when the cell ends (also on error or interrupt). `%%on_tpu --live` does the same for
        an %%on_tpu cell, `tpu_nb.dashboard()` from code.
        """
        args = parse(self.tpu_dashboard, line)
        if args is None:
            return
        dash = start_dashboard(
            refresh=args.refresh,
            chart_refresh=args.chart_refresh,
            alert_graphs=args.alert_graphs,
            charts=not args.no_charts,
        )
        dash.stop_at_cell_end()

    @options
    @argument(
        "-n",
        dest="number",
        type=whole("-n", 1, MAX_NUMBER, 10),
        help="runs per repeat (default: enough for about 0.2 s)",
    )
    @argument(
        "-r",
        dest="repeat",
        type=whole("-r", 1, MAX_REPEAT, 7),
        default=7,
        help="repeats (default 7)",
    )
    @flag("-o", dest="output", help="return the DeviceTiming")
    @argument("statement", nargs="*", help="what to time (line mode)")
    @no_var_expand  # the statement is code: {...} and $x stay as written, as in %timeit
    @line_cell_magic
    def tpu_time(self, line, cell=None):
        """Time code on the XLA device: every run synced and waited for.

        %time/%timeit on XLA time only the tracing (the work runs later). This reports the
        first run (tracing + compile + execute) apart from the steady state, and says when
        the steady state still recompiles.
        """
        args = parse(self.tpu_time, line, code=True)
        if args is None:
            return
        body = cell if cell is not None else " ".join(args.statement)
        if not body.strip():
            raise UsageError("nothing to time. Fix: %tpu_time step() or a %%tpu_time cell")
        lines = 1 if cell is not None else 0
        code = CellCode(self.shell, body, lines, files=self.state.watcher.cell_files)
        from tpu_nb.runtime.environment import default_device, device
        from tpu_nb.runtime.metrics import time_device

        with user_mistake(), default_device(device(), code=code.codes):
            timing = time_device(
                lambda: code.run(self.shell), number=args.number, repeat=args.repeat
            )
        self.state.watcher.reported_by_magic = True
        if args.output:
            return timing
        display(timing)

    @options
    @flag("--since-cell", help="what the previous cell did")
    @flag("--all", help="every counter and metric of the runtime")
    @flag("--reset", help="clear the runtime's counters and metrics")
    @flag("--cells", help="one row per cell that did XLA work")
    @line_magic
    def xla_metrics(self, line=""):
        """XLA counters, timings, CPU fallbacks and scalar reads, readable."""
        args = parse(self.xla_metrics, line)
        if args is None:
            return
        if sum((args.since_cell, args.all, args.reset, args.cells)) > 1:
            raise UsageError(
                "choose one of --since-cell, --all, --reset, --cells. Fix: e.g. "
                "%xla_metrics --since-cell"
            )
        from tpu_nb.display.reports import CellsView, MetricsView

        if args.cells:
            watcher = self.state.watcher
            if watcher.cells_seen > len(kept := watcher.history):
                print(f"the last {len(kept)} of {watcher.cells_seen} cells that did XLA work:")
            return display(CellsView(list(watcher.history)))
        if args.since_cell:
            delta = self.state.watcher.last_delta
            if delta is None:
                print("the previous cell did no XLA work")
                return
            return display(MetricsView("XLA work of the previous cell", delta=delta))
        if not backend().process.is_loaded():
            print("no XLA work in this kernel yet")
            return
        from tpu_nb.runtime.metrics import MetricsSnapshot, reset_metrics, snapshot

        if args.reset:
            reset_metrics()
            print("XLA counters and metrics cleared")
            return
        if args.all:
            return display(MetricsView("XLA counters and metrics", full=snapshot(full=True)))
        now = snapshot()
        delta = now.since(MetricsSnapshot({}, {}, now.taken_at, now.generation))
        display(MetricsView("XLA work since the kernel started (or the last --reset)", delta=delta))

    @options
    @argument(
        "--by",
        choices=("auto", "module", "line", "scope"),
        default="auto",
        help="how to group nodes above the budget (default: auto)",
    )
    @argument(
        "--budget",
        type=whole("--budget", 1, 100_000, 200),
        metavar="N",
        help="nodes drawn one by one before grouping (default about 500)",
    )
    @argument(
        "--expand",
        action="append",
        default=[],
        metavar="GROUP",
        help="draw this group node by node (repeatable)",
    )
    @flag("--diff", help="the latest line's last two graphs, what changed outlined")
    @flag("-o", dest="output", help="return the Graph (the GraphDiff with --diff)")
    @argument(
        "expression",
        nargs="*",
        help="tensors (or objects holding them); none: every live XLA tensor with pending work",
    )
    @line_magic
    def xla_graph(self, line=""):
        """Show the pending (lazy) XLA graph of tensors: where each node came from, as SVG."""
        args = parse(self.xla_graph, line, code=True)
        if args is None:
            return
        from tpu_nb.display.graph_view import GraphView
        from tpu_nb.runtime.graph import NODE_BUDGET, pending_graph

        diff = None
        if args.diff and args.expression:
            given = " ".join(args.expression)
            raise UsageError(
                "%xla_graph: --diff draws the last two graphs of the line that changed last, "
                f"and takes no expression (got {given!r}). Fix: %xla_graph --diff, or "
                f"%xla_graph {given}"
            )
        if args.diff:
            found, diff, where = last_change()
        else:
            source = " ".join(args.expression).strip()
            found = (
                pending_graph(evaluate_tensors(self.shell, source)) if source else pending_graph()
            )
            if found is None:
                print(
                    "nothing pending: no XLA tensor here has work waiting (it ran at a sync or "
                    "a value read)"
                )
        if found is None:
            return
        if args.output:
            return diff if args.diff else found
        if args.diff:
            print(f"the last two graphs of {where}")
        budget, names = args.budget or NODE_BUDGET, self.state.namer
        view = GraphView(
            found, by=args.by, budget=budget, expand=args.expand, diff=diff, source_names=names
        )
        display(view)
