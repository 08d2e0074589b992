"""Running an %%on_tpu cell as its Plan says: in this kernel under tracking (with the dashboard
and the profiler around it when asked), or launched as replicas or on a slice's hosts; then
showing what it did."""

from __future__ import annotations

import functools
from contextlib import ExitStack, suppress

from IPython.core.error import UsageError
from IPython.display import display

from tpu_nb.ipython._args import user_mistake
from tpu_nb.ipython._cell import CellCode, assigned_in
from tpu_nb.runtime.errors import TpuNbError
from tpu_nb.runtime.plan import Plan
from tpu_nb.runtime.sources import traceback_from


def launch_cell(shell, state, code: CellCode, plan: Plan, args):
    """Modes "replicas" and "hosts": the cell as a function, launched; a failing replica's (or
    host's) traceback printed before its error is raised."""
    __tracebackhide__ = True  # noqa: F841
    from tpu_nb.display.pod_view import PodView
    from tpu_nb.runtime.parallel import (
        CellFunction,
        ReplicaCrash,
        ReplicaError,
        ReplicasTimedOut,
        launch,
        launch_hosts,
    )

    cell = CellFunction.from_namespace(code.source, code.filename, shell.user_ns, code.codes)
    state.watcher.reported_by_magic = True
    try:
        if plan.mode == "hosts":
            pod = launch_hosts(cell, hosts=plan.hosts or "all")
            if not args.quiet:
                display(PodView(pod))
            return pod if args.output else None
        result = launch(cell, devices=plan.replicas or "all", timeout=plan.timeout)
    except ReplicaError as exc:  # a HostError too: its unit is a host
        print(f"--- {exc.unit} {exc.ordinal} of {exc.world}: traceback ---")
        print(exc.traceback.rstrip())
        raise
    except ReplicaCrash:  # not a mistake: its message sends the user to its .stack
        raise
    except ReplicasTimedOut as exc:  # the option as the cell spells it
        raise UsageError(exc.said_as("--timeout")) from None
    except TpuNbError as exc:
        raise UsageError(str(exc)) from None
    if not args.quiet:
        print(result)
    return result if args.output else None


def run_tracked(shell, state, code: CellCode, plan: Plan, args):
    """Modes "process" and "spmd": the cell in this kernel under on_tpu; its report shown, and
    returned with -o (else the cell's value)."""
    __tracebackhide__ = True  # noqa: F841
    from tpu_nb.runtime.environment import device
    from tpu_nb.runtime.tracking import on_tpu, profile

    with user_mistake():
        if plan.mode == "spmd":
            spmd = plan.enter_spmd()
            shell.user_ns.update(spmd=spmd, mesh=spmd.mesh, shard_batch=spmd.shard_batch)
        dev = device()
    state.watcher.reported_by_magic = True
    session = on_tpu(
        f"In[{code.number}]",
        code=code.codes,
        source=code.source,
        filename=code.filename,
        namespace=shell.user_ns,
        sync=plan.sync,
        max_graphs=plan.max_graphs,
        locations=plan.graph,
        device=dev,
        assigned_in=functools.partial(assigned_in, shell, code.number),
    )
    report = capture = None
    ran = False  # a profiler that cannot start stops the cell before it runs: no report then
    try:
        with ExitStack() as stack:
            if plan.live:  # outermost: its final state includes the cell's last work
                stack.enter_context(start_dashboard(same_as_run=True))
            report = stack.enter_context(session)
            if plan.profile:  # inside the tracked run: it counts the run's syncs
                with user_mistake():
                    capture = stack.enter_context(profile(plan.profile))
            ran = True
            value = code.run(shell)
            session.holds(value)
            if plan.graph:  # before --sync runs it
                _show_pending_graph(shell, state, value, plan.sync)
    except Exception as exc:
        # An error raised in the cell's code (a RecompilationError at the step that traced
        # one graph too many) travels out through tpu_nb's context managers: the traceback
        # starts at the cell's own frame, as it would without %%on_tpu.
        # An error of the device work the cell launched, raised when the run's end waited for
        # it, has no line of the cell in its traceback: tpu_nb's frames would be all it shows.
        cut = traceback_from(exc.__traceback__, lambda f: f.f_code.co_filename == code.filename)
        if cut is None and getattr(exc, "tpu_nb_at_end", False):
            _shown_as_the_cells(exc, code.number)
        if cut is None:
            raise
        raise exc.with_traceback(cut)  # noqa: B904 (the same error, its context kept)
    finally:
        if ran and report is not None and report.complete:
            _show_report(state, report, args)
            state.watcher.report_shown()
        if capture is not None and capture.trace is not None:
            from tpu_nb.display.profile_view import TraceView

            display(TraceView(capture.trace, title=f"profile of In [{code.number}]"))
    return report if args.output else value


def _shown_as_the_cells(exc: BaseException, number) -> None:
    """Have IPython show `exc` (an error of device work the cell launched, raised at the
    run's end) as the error and where it came from: its traceback holds no line of the cell,
    only tpu_nb's frames."""
    lines = [
        f"{type(exc).__name__}: {exc}",
        f"(In [{number}]: raised by the device work this cell launched, when %%on_tpu waited "
        "for it at the cell's end; without %%on_tpu the next line that waits for the device "
        "raises it.)",
    ]
    with suppress(AttributeError, TypeError):  # a type without a __dict__
        exc._render_traceback_ = lambda: lines  # type: ignore[attr-defined]


def start_dashboard(*, same_as_run: bool = False, **options):
    from tpu_nb.display.dashboard import Dashboard

    with user_mistake():
        dash = Dashboard(**options)
        dash.same_as_run = same_as_run  # the cell's tracked run is all it watches
        return dash.start()


def _show_pending_graph(shell, state, value, sync: bool) -> None:
    from tpu_nb.display.graph_view import GraphView
    from tpu_nb.runtime.graph import pending_graph

    pending = pending_graph(shell.user_ns, value)
    if pending is None:
        print("nothing pending: the cell's XLA work already ran (a sync or a value read)")
        return
    title = (
        "pending graph (about to run at tpu_nb's end-of-cell sync)"
        if sync
        else "pending graph (left pending: the next sync or read runs it)"
    )
    display(GraphView(pending, title=title, source_names=state.namer))


def _show_report(state, report, args) -> None:
    if args.quiet or not state.settings.show_report:
        return
    if args.output and report.error is None:
        return  # -o: the returned report shows itself as Out[n], once
    from tpu_nb.display.reports import RunView

    display(RunView(report))
