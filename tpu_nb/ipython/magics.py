"""The magics. Each parses its arguments, calls a public tpu_nb function, shows the result.

User mistakes raise UsageError (one line, no traceback); `-h/--help` prints the help.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import shlex
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from types import FrameType
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
from IPython.utils.process import arg_split

from tpu_nb.runtime.backend import current as backend
from tpu_nb.runtime.environment import MAX_CPU_DEVICES
from tpu_nb.runtime.errors import (
    TpuNbError,
    TpuNbUsageError,
    check_seconds,
    check_whole_number,
)
from tpu_nb.runtime.metrics import MAX_NUMBER, MAX_REPEAT
from tpu_nb.runtime.sources import innermost_frame

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

# The most distinct graphs --max-graphs and --alert-graphs accept: more is never a useful
# limit, and a huge number would reach torch_xla's C++ as an overflowing int.
MAX_GRAPHS = 10_000
MAX_PROFILE_STEPS = 1000  # --profile N: a trace of more steps is too large to draw


def _parse(magic, line: str, *, code: bool = False):
    """Parse a magic's line; None after printing the help for -h/--help.

    Options-only magics split the line as a shell does, so quotes are removed and a quoted
    path may hold spaces; magics taking Python code (code=True) keep the quotes, which belong
    to the code. Every mistake is a one-line UsageError.
    """
    name = "%" + magic.__name__
    try:
        argv = shlex.split(line) if not code else arg_split(line, posix=False, strict=True)
    except ValueError as exc:  # shlex: "No closing quotation"
        raise UsageError(
            f"{name}: cannot split {line.strip()!r} into arguments ({exc}). "
            f"Fix: close the quote (a path with spaces goes in matching quotes: "
            f"'my dir')."
        ) from None
    try:
        args = magic.parser.parse_args(argv)
    except UsageError as exc:  # argparse's message, e.g. unknown argument
        text = str(exc).rstrip(".")
        raise UsageError(
            f"{name}: {text}" if "Fix:" in text else f"{name}: {text}. Fix: see {name} --help."
        ) from None
    except SystemExit:  # argparse's exit on a bad value
        raise UsageError(
            f"{name}: could not parse arguments {line!r}. Fix: see {name} --help."
        ) from None
    if getattr(args, "help", False):
        print(magic.parser.format_help())
        return None
    return args


def _whole(option: str, low: int, high: int, example: int):
    """An argparse type: a whole number from low to high, else the library's one-line message
    (a huge number would otherwise reach torch_xla's C++ and fail there)."""

    def parse(text: str) -> int:
        return _option_number(
            check_whole_number, text, option, low=low, high=high, fix=f"e.g. {option} {example}"
        )

    return parse


def _seconds(option: str, low: float, high: float, example: float):
    """An argparse type: finite seconds from low to high (NaN and inf are refused)."""

    def parse(text: str) -> float:
        return _option_number(
            check_seconds, text, option, low=low, high=high, fix=f"e.g. {option} {example:g}"
        )

    return parse


def _option_number(check, text: str, option: str, *, magic: str = "", **bounds):
    """An option's text checked by the library's validator; its message raised as UsageError,
    which argparse lets through (it catches only its own kinds), so it reads as the library's."""
    try:
        value: int | float | str = int(text) if check is check_whole_number else float(text)
    except ValueError:
        value = text
    try:
        return check(value, option, shown=repr(text), **bounds)
    except TpuNbUsageError as exc:
        raise UsageError(f"{magic}: {exc}" if magic else str(exc)) from None


def _whole_number(text: str) -> int:
    """--replicas' device count: a whole number of at least 1 (launch() checks the upper
    bound: the chips of a TPU host, or MAX_CPU_DEVICES)."""
    return _option_number(
        check_whole_number,
        text,
        "--replicas",
        magic="%on_tpu",
        alternative="'all'",
        fix="e.g. --replicas 4, or --replicas alone for every device",
    )


def _host_count(text: str) -> int | str:
    if text == "all":
        return text
    return _option_number(
        check_whole_number,
        text,
        "--hosts",
        magic="%on_tpu",
        alternative="'all'",
        fix="e.g. --hosts all, or --hosts 2",
    )


def _check_hosts_options(args) -> None:
    """--hosts runs the cell on other machines: options about this kernel do not apply."""
    for option, given in (
        ("--replicas", args.replicas is not None),
        ("--spmd", args.spmd is not None),
        ("--live", args.live),
        ("--profile", args.profile),
        ("--graph", args.graph),
        ("--max-graphs", args.max_graphs is not None),
        ("--sync", args.sync),
        ("--no-sync", args.no_sync),
    ):
        if given:
            raise UsageError(
                f"{option} works on this kernel's device, and --hosts runs the cell on the "
                f"slice's hosts. Fix: drop {option} (each host reports to the view of "
                "every host)"
            )


def _spmd_request(mesh: str) -> tuple[int | str, str | None]:
    """--spmd's value as (devices, mesh) for spmd_context: "all", or a shape like 4 or 2x2."""
    from tpu_nb.runtime.launch import parse_mesh

    if mesh in ("all", None, ""):
        return "all", None
    try:
        shape = parse_mesh(mesh)
    except TpuNbError as exc:
        raise UsageError(f"--spmd: {exc}") from None
    assert shape is not None  # None means all devices, returned above
    rows, columns = shape
    return rows * columns, mesh


def _check_spmd(mesh: str) -> None:
    from tpu_nb.runtime.launch import check_spmd

    with _user_mistake():
        check_spmd(*_spmd_request(mesh))


def _check_holds_xla_tensor(source: str, value) -> None:
    """%xla_graph EXPR: a value without any XLA tensor is a mistake, not 'nothing pending'."""
    import torch

    from tpu_nb.runtime.graph import walk_limited

    if isinstance(value, torch.Tensor) and value.device.type != "xla":
        raise UsageError(
            f"{source} is a tensor on {value.device}, which has no pending graph "
            f"(only XLA tensors are lazy). Fix: %xla_graph a tensor on the XLA "
            f"device, e.g. one made with .to(tpu_nb.device())."
        )
    if next(walk_limited(value, torch, depth=4, seen=set(), budget=[100_000]), None) is None:
        kind = type(value).__name__
        shown = " ".join(repr(value).split())[:40]  # one line, whatever the repr
        raise UsageError(
            f"{source} is of type {kind} ({shown}), not an XLA tensor nor "
            f"anything holding one. Fix: %xla_graph loss (tensors, a module or a "
            f"list of them), or %xla_graph alone for every tensor with pending "
            f"work."
        )


def _snapshot():
    from tpu_nb.runtime.metrics import snapshot

    try:
        return snapshot()
    except Exception:  # a broken runtime: no line after the report, the report stands
        return None


def _start_dashboard(**options):
    """A started live dashboard; a bad option or environment is a one-line UsageError."""
    from tpu_nb.display.dashboard import Dashboard

    with _user_mistake():
        return Dashboard(**options).start()


@contextmanager
def _user_mistake() -> Iterator[None]:
    """A TpuNbError from setting up a magic (not from the user's code) is a one-line
    UsageError, as IPython shows user mistakes."""
    try:
        yield
    except TpuNbError as exc:
        raise UsageError(str(exc)) from None


def _running_cell_number(shell) -> int:
    """The execution number of the cell running this magic: the cell file of the nearest
    calling frame. (`shell.execution_count` is already the next cell's number on IPython >= 8
    while a cell runs, which made tracebacks say In [n+1].)"""
    names = getattr(shell.compile, "_filename_map", {})  # IPython >= 8

    def number(frame: FrameType) -> int | None:
        path = frame.f_code.co_filename
        if path in names:
            return int(names[path])
        if match := re.match(r"<ipython-input-(\d+)-", path):  # IPython 7
            return int(match.group(1))
        return None

    cell = innermost_frame(sys._getframe(1), lambda frame: number(frame) is not None)
    found = number(cell) if cell is not None else None
    return found if found is not None else shell.execution_count


def _assigned_in(shell, before: int, name: str) -> str | None:
    """The latest cell before `before` that assigns `name` ("In [12]"), from the raw input
    history; magic and shell lines are read as blank lines."""
    from tpu_nb.runtime.tracking import assigned_lines

    raw = shell.history_manager.input_hist_raw
    for number in range(min(before, len(raw)) - 1, 0, -1):
        lines = [
            "" if ln.lstrip().startswith(("%", "!")) else ln for ln in raw[number].splitlines()
        ]
        if assigned_lines("\n".join(lines), name):
            return f"In [{number}]"
    return None


class _CellCode:
    """A cell body compiled the way %%time runs it: statements, then the last expression.

    The body is registered with IPython's compiler under the cell's execution number, so
    tracebacks say "Cell In[n], line k" with k the line in the whole cell (the magic line is 1).
    """

    def __init__(self, shell, body: str, magic_lines: int = 1, files: dict | None = None):
        self.source = "\n" * magic_lines + shell.transform_cell(body)
        self.number = _running_cell_number(shell)
        self.filename = shell.compile.cache(self.source, self.number, raw_code=self.source)
        if files is not None:
            files[self.filename] = self.number
        # Registered AST transformers run, as for any cell (IPython's own run_cell does this).
        tree = shell.transform_ast(ast.parse(self.source, filename=self.filename))
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        self.statements = shell.compile(tree, self.filename, "exec")
        self.expression = shell.compile(last, self.filename, "eval") if last else None
        # The cell's own code: what tpu_nb places findings on and gives the default device.
        self.codes = (self.statements, self.expression)

    def run(self, shell):
        __tracebackhide__ = True  # noqa: F841  (IPython hides this frame in tracebacks)
        exec(self.statements, shell.user_global_ns, shell.user_ns)
        if self.expression is not None:
            return eval(self.expression, shell.user_global_ns, shell.user_ns)
        return None


@magics_class
class TpuMagics(Magics):
    shell: InteractiveShell  # Magics types it Optional; the extension always passes one

    def __init__(self, shell, state):
        super().__init__(shell)
        self.state = state

    # -- %tpu_setup -------------------------------------------------------------------------

    @magic_arguments()
    @argument("-h", "--help", action="store_true", help="show this help and exit")
    @argument(
        "--device",
        default="auto",
        metavar="{auto,tpu,cpu}",
        help="the XLA device: a TPU if there is one (auto), or tpu, or cpu",
    )
    @argument(
        "--devices",
        type=_whole("--devices", 1, MAX_CPU_DEVICES, 4),
        default=None,
        metavar="N",
        help="number of virtual XLA:CPU devices (for SPMD on a CPU)",
    )
    @argument(
        "--ir-debug",
        action="store_true",
        help="record the Python line of each IR node (for the graph viewer)",
    )
    @argument(
        "--cache",
        default=None,
        metavar="DIR",
        help="persistent compile cache directory (faster restarts on TPU); quote a "
        "path with spaces, ~ is your home",
    )
    @argument(
        "--check",
        action="store_true",
        help="only check the environment (imports torch_xla in a subprocess); change nothing",
    )
    @argument(
        "--install",
        action="store_true",
        help="pip-install the matching torch/torch_xla pair (with [tpu] on TPU hosts)",
    )
    @argument("--dry-run", action="store_true", help="with --install: show what pip would do")
    @argument(
        "--target",
        default=None,
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
        args = _parse(self.tpu_setup, line)
        if args is None:
            return
        from tpu_nb.runtime import detect, setup
        from tpu_nb.runtime.environment import install_pair

        if args.dry_run and not args.install:
            raise UsageError(
                "%tpu_setup: --dry-run shows what --install would do, and changes "
                "nothing on its own. Fix: %tpu_setup --install --dry-run"
            )
        if args.install:
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
        if args.check:
            return display(detect(check_import=True))
        with _user_mistake():
            env = setup(
                args.device,
                num_devices=args.devices,
                ir_debug=args.ir_debug,
                cache_dir=args.cache,
                target=args.target,
            )
        display(env)

    # -- %%on_tpu ---------------------------------------------------------------------------

    @magic_arguments()
    @argument("-h", "--help", action="store_true", help="show this help and exit")
    @argument(
        "-o", dest="output", action="store_true", help="return the RunReport (like %%timeit -o)"
    )
    @argument(
        "--sync",
        action="store_true",
        help="sync at the end of the cell, so work left pending runs and is counted in this "
        "cell (a sync the plain cell does not make; default: pending work stays pending)",
    )
    @argument(
        "--no-sync",
        action="store_true",
        help="the default: no sync at the end of the cell (kept for older notebooks)",
    )
    @argument("--quiet", action="store_true", help="do not show the report")
    @argument(
        "--max-graphs",
        type=_whole("--max-graphs", 1, MAX_GRAPHS, 2),
        default=None,
        metavar="N",
        help="fail when the steps of this cell trace more than N distinct graphs",
    )
    @argument("--live", action="store_true", help="attach the live dashboard")
    @argument(
        "--replicas",
        nargs="?",
        const="all",
        default=None,
        metavar="all|N",
        help="run the cell once per device (replica), `index` set in each",
    )
    @argument(
        "--timeout",
        type=_seconds("--timeout", 1, 7 * 24 * 3600, 600),
        default=None,
        metavar="SECONDS",
        help="with --replicas: stop replicas still running after this many seconds",
    )
    @argument(
        "--spmd",
        nargs="?",
        const="all",
        default=None,
        metavar="MESH",
        help="run the cell once over all devices (SPMD); `mesh` and `shard_batch` set",
    )
    @argument(
        "--hosts",
        nargs="?",
        const="all",
        default=None,
        metavar="all|N",
        help="run the cell once per host of a TPU pod slice through Ray (ray.init(address=...) "
        "first), `host` and `hosts` set in each",
    )
    @argument(
        "--graph", action="store_true", help="show the graph the cell leaves pending at its end"
    )
    @argument(
        "--profile",
        type=_whole("--profile", 1, MAX_PROFILE_STEPS, 3),
        default=None,
        metavar="N",
        help="capture a profiler trace of the cell's first N steps (syncs) and draw its timeline",
    )
    @no_var_expand
    @cell_magic
    def on_tpu(self, line, cell):
        """Run the cell on the XLA device and report what compiled, ran and cost.

        Inside the cell, tensors and modules created without device= land on the XLA
        device. The cell makes the same compiles, executions, syncs and reads as the same
        code in a plain cell: work it leaves pending stays pending (the report says what),
        unless --sync asks for a sync at the end. It waits for the device at the end, so
        the executions' times are complete.
        With --hosts, the cell runs once on each host of a TPU pod slice (Ray connected
        first: ray.init(address=...)), `host` and `hosts` set, and one view of every host
        follows.
        """
        __tracebackhide__ = True  # noqa: F841
        args = _parse(self.on_tpu, line)
        if args is None:
            return
        if args.replicas is not None and args.spmd is not None:
            raise UsageError(
                "choose one of --replicas and --spmd. Fix: --replicas for a "
                "process per device, or --spmd for one program over all of them"
            )
        if args.sync and args.no_sync:
            raise UsageError("choose one of --sync and --no-sync. Fix: drop --no-sync")
        if args.hosts is not None:
            _check_hosts_options(args)
        if args.spmd is not None:
            _check_spmd(args.spmd)  # before anything: the switch to SPMD cannot be undone
        if args.live and args.replicas is not None:
            raise UsageError(
                "--live watches this kernel's XLA runtime, and --replicas runs "
                "the cell elsewhere. Fix: drop --live (each replica reports), or "
                "use --spmd --live"
            )
        if args.profile and args.replicas is not None:
            raise UsageError(
                "--profile traces this kernel, and --replicas runs the cell "
                "elsewhere. Fix: drop --profile, or use --spmd --profile N"
            )
        if args.timeout is not None and args.replicas is None:
            raise UsageError(
                "--timeout bounds a --replicas run. Fix: add --replicas, or drop --timeout"
            )
        # a syntax error stops here, nothing run
        code = _CellCode(self.shell, cell, files=self.state.watcher.cell_files)
        if args.replicas is not None:
            return self._run_replicas(code, args)
        if args.hosts is not None:
            return self._run_hosts(code, args)
        if args.spmd is not None:
            self._enter_spmd(args.spmd)
        return self._run_on_tpu(code, args)

    def _run_replicas(self, code: _CellCode, args):
        __tracebackhide__ = True  # noqa: F841
        from tpu_nb.runtime.launch import CellFunction, ReplicaError, launch

        devices = args.replicas if args.replicas == "all" else _whole_number(args.replicas)
        cell = CellFunction.from_namespace(
            code.source, code.filename, self.shell.user_ns, code.codes
        )
        self.state.watcher.reported_by_magic = True
        try:
            result = launch(cell, devices=devices, timeout=args.timeout)
        except ReplicaError as exc:
            print(f"--- replica {exc.ordinal} of {exc.world}: traceback ---")
            print(exc.traceback.rstrip())
            raise
        except TpuNbError as exc:
            raise UsageError(str(exc)) from None
        if not args.quiet:
            print(result)
        return result if args.output else None

    def _run_hosts(self, code: _CellCode, args):
        __tracebackhide__ = True  # noqa: F841
        from tpu_nb.display.pod_view import PodView
        from tpu_nb.runtime.launch import CellFunction, HostError, launch

        cell = CellFunction.from_namespace(
            code.source, code.filename, self.shell.user_ns, code.codes
        )
        self.state.watcher.reported_by_magic = True
        try:
            result = launch(cell, hosts=_host_count(args.hosts))
        except HostError as exc:
            print(f"--- host {exc.host} of {exc.hosts}: traceback ---")
            print(exc.traceback.rstrip())
            raise
        except TpuNbError as exc:
            raise UsageError(str(exc)) from None
        if not args.quiet:
            display(PodView(result))
        return result if args.output else None

    def _enter_spmd(self, mesh: str) -> None:
        from tpu_nb.runtime.launch import spmd_context

        with _user_mistake():
            spmd = spmd_context(*_spmd_request(mesh))
        self.shell.user_ns.update(spmd=spmd, mesh=spmd.mesh, shard_batch=spmd.shard_batch)

    def _run_on_tpu(self, code: _CellCode, args):
        __tracebackhide__ = True  # noqa: F841
        from tpu_nb.runtime.environment import device
        from tpu_nb.runtime.tracking import on_tpu

        with _user_mistake():
            dev = device()
        self.state.watcher.reported_by_magic = True
        session = on_tpu(
            f"In[{code.number}]",
            code=code.codes,
            source=code.source,
            filename=code.filename,
            namespace=self.shell.user_ns,
            sync=args.sync,
            max_graphs=args.max_graphs,
            locations=args.graph,
            device=dev,
            assigned_in=functools.partial(_assigned_in, self.shell, code.number),
        )
        report = capture = None
        try:
            with ExitStack() as stack:
                if args.live:  # outermost: its final state includes the cell's last work
                    stack.enter_context(_start_dashboard())
                report = stack.enter_context(session)
                if args.profile:  # inside the tracked run: it counts the run's syncs
                    from tpu_nb.runtime.tracking import profile

                    with _user_mistake():
                        capture = stack.enter_context(profile(args.profile))
                value = code.run(self.shell)
                if args.graph:  # before --sync runs it
                    self._show_pending_graph(value, args.sync)
        finally:
            if report is not None and report.complete:
                self._show(report, args)
                self.state.watcher.reported_at = _snapshot()
            if capture is not None and capture.trace is not None:
                from tpu_nb.display.profile_view import TraceView

                display(TraceView(capture.trace, title=f"profile of In [{code.number}]"))
        return report if args.output else value

    def _show_pending_graph(self, value, sync: bool) -> None:
        from tpu_nb.display.graph_view import GraphView
        from tpu_nb.runtime.graph import pending_graph

        pending = pending_graph(self.shell.user_ns, value)
        if pending is None:
            print("nothing pending: the cell's XLA work already ran (a sync or a value read)")
        else:
            display(
                GraphView(
                    pending,
                    title=(
                        "pending graph (about to run at tpu_nb's end-of-cell sync)"
                        if sync
                        else "pending graph (left pending: the next sync or read runs it)"
                    ),
                    source_names=self._cell_name,
                )
            )

    def _show(self, report, args) -> None:
        if args.quiet or not self.state.settings.show_report:
            return
        if args.output and report.error is None:
            return  # -o: the returned report shows itself as Out[n], once
        from tpu_nb.display.reports import RunView

        display(
            RunView(
                report, report.findings, allowed_graphs=report.allowed_graphs, source=report.source
            )
        )

    # -- %tpu_dashboard ----------------------------------------------------------------------

    @magic_arguments()
    @argument("-h", "--help", action="store_true", help="show this help and exit")
    @argument(
        "--refresh",
        type=_seconds("--refresh", 0.1, 3600, 0.5),
        default=0.5,
        metavar="SECONDS",
        help="seconds between updates (default 0.5: at most 2 a second)",
    )
    @argument(
        "--chart-refresh",
        type=_seconds("--chart-refresh", 0.1, 3600, 1),
        default=None,
        metavar="SECONDS",
        help="at least this many seconds between chart redraws (default 1)",
    )
    @argument(
        "--alert-graphs",
        type=_whole("--alert-graphs", 1, MAX_GRAPHS, 3),
        default=3,
        metavar="K",
        help="alert when one line compiles more than K distinct graphs (default 3)",
    )
    @argument("--no-charts", action="store_true", help="panels only, no matplotlib charts")
    @line_magic
    def tpu_dashboard(self, line=""):
        """Show the live XLA dashboard for the rest of this cell.

        Put it at the top of a training cell: compiles (cause, line), step time, transfers,
        CPU fallbacks, host reads and memory update while the cell runs; the final state stays
        when the cell ends (also on error or interrupt). `%%on_tpu --live` does the same for
        an %%on_tpu cell, `tpu_nb.dashboard()` from code.
        """
        args = _parse(self.tpu_dashboard, line)
        if args is None:
            return
        dash = _start_dashboard(
            refresh=args.refresh,
            chart_refresh=args.chart_refresh,
            alert_graphs=args.alert_graphs,
            charts=not args.no_charts,
        )
        dash.stop_at_cell_end()

    # -- %tpu_time --------------------------------------------------------------------------

    @magic_arguments()
    @argument("-h", "--help", action="store_true", help="show this help and exit")
    @argument(
        "-n",
        dest="number",
        type=_whole("-n", 1, MAX_NUMBER, 10),
        default=None,
        help="runs per repeat (default: enough for about 0.2 s)",
    )
    @argument(
        "-r",
        dest="repeat",
        type=_whole("-r", 1, MAX_REPEAT, 7),
        default=7,
        help="repeats (default 7)",
    )
    @argument("-o", dest="output", action="store_true", help="return the DeviceTiming")
    @argument("statement", nargs="*", help="what to time (line mode)")
    @no_var_expand  # the statement is code: {...} and $x stay as written, as in %timeit
    @line_cell_magic
    def tpu_time(self, line, cell=None):
        """Time code on the XLA device: every run synced and waited for.

        %time/%timeit on XLA time only the tracing (the work runs later). This reports the
        first run (tracing + compile + execute) apart from the steady state, and says when
        the steady state still recompiles.
        """
        args = _parse(self.tpu_time, line, code=True)
        if args is None:
            return
        body = cell if cell is not None else " ".join(args.statement)
        if not body.strip():
            raise UsageError("nothing to time. Fix: %tpu_time step() or a %%tpu_time cell")
        code = _CellCode(
            self.shell,
            body,
            magic_lines=1 if cell is not None else 0,
            files=self.state.watcher.cell_files,
        )
        from tpu_nb.runtime.environment import default_device, device
        from tpu_nb.runtime.metrics import time_device

        try:
            dev = device()
            with default_device(dev, code=code.codes):
                timing = time_device(
                    lambda: code.run(self.shell), number=args.number, repeat=args.repeat
                )
        except TpuNbError as exc:
            raise UsageError(str(exc)) from None
        self.state.watcher.reported_by_magic = True
        if args.output:
            return timing
        display(timing)

    # -- %xla_metrics -----------------------------------------------------------------------

    @magic_arguments()
    @argument("-h", "--help", action="store_true", help="show this help and exit")
    @argument("--since-cell", action="store_true", help="what the previous cell did")
    @argument("--all", action="store_true", help="every counter and metric of the runtime")
    @argument("--reset", action="store_true", help="clear the runtime's counters and metrics")
    @argument("--cells", action="store_true", help="one row per cell that did XLA work")
    @line_magic
    def xla_metrics(self, line=""):
        """XLA counters, timings, CPU fallbacks and scalar reads, readable."""
        args = _parse(self.xla_metrics, line)
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
            if watcher.cells_seen > len(watcher.history):
                kept, seen = len(watcher.history), watcher.cells_seen
                print(f"the last {kept} of {seen} cells that did XLA work:")
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
        start = MetricsSnapshot({}, {}, now.taken_at, now.generation)
        display(
            MetricsView(
                "XLA work since the kernel started (or the last --reset)", delta=now.since(start)
            )
        )

    # -- %xla_graph -------------------------------------------------------------------------

    @magic_arguments()
    @argument("-h", "--help", action="store_true", help="show this help and exit")
    @argument(
        "--by",
        choices=("auto", "line", "scope"),
        default="auto",
        help="how to group nodes above the budget (default: auto)",
    )
    @argument(
        "--budget",
        type=_whole("--budget", 1, 100_000, 200),
        default=None,
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
    @argument("-o", dest="output", action="store_true", help="return the Graph")
    @argument(
        "expression",
        nargs="*",
        help="tensors (or objects holding them); none: every live XLA tensor with pending work",
    )
    @line_magic
    def xla_graph(self, line=""):
        """Show the pending (lazy) XLA graph of tensors: where each node came from, as SVG."""
        args = _parse(self.xla_graph, line, code=True)
        if args is None:
            return
        from tpu_nb.display.graph_view import GraphView
        from tpu_nb.runtime.graph import NODE_BUDGET, pending_graph

        source = " ".join(args.expression).strip()
        if source:
            try:
                value = self.shell.ev(source)
            except Exception as exc:
                detail = " ".join(str(exc).split())
                raise UsageError(
                    f"could not evaluate {source!r}: {type(exc).__name__}: "
                    f"{detail}. Fix: give an expression of this kernel, e.g. "
                    f"%xla_graph loss"
                ) from None
            _check_holds_xla_tensor(source, value)
            found = pending_graph(value)
        else:
            found = pending_graph()
        if found is None:
            print(
                "nothing pending: no XLA tensor here has work waiting (it ran at a sync or "
                "a value read)"
            )
            return
        if args.output:
            return found
        display(
            GraphView(
                found,
                by=args.by,
                budget=args.budget or NODE_BUDGET,
                expand=args.expand,
                source_names=self._cell_name,
            )
        )

    def _cell_name(self, path: str) -> str | None:
        """'In [3]' for the file IPython compiled cell 3 into (labels say the cell, not a
        temp file); None for any other file."""
        files = getattr(self.shell.compile, "_filename_map", {})  # IPython >= 8
        number = files.get(path)
        if number is None:  # IPython 7 under ipykernel 6: temp files, noted by the watcher
            number = self.state.watcher.cell_files.get(path)
        if number is None and os.sep not in path:  # a bare name (IR debug's locations)
            number = next(
                (
                    n
                    for f, n in [*files.items(), *self.state.watcher.cell_files.items()]
                    if os.path.basename(f) == path
                ),
                None,
            )
        if number is None and (match := re.match(r"<ipython-input-(\d+)-", path)):
            number = match.group(1)  # IPython 7
        return f"In [{number}]" if number is not None else None
