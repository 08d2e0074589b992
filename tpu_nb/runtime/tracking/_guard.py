"""`max_graphs(n)`: fail at the step that makes one line compile more than n distinct graphs.

Counted the way the report counts: per line of the tracked code, as the run's report places
each compile on a line (`track.compile_events_so_far`; a compiled function's graphs on the line
that calls it, its inputs' pending work apart), every distinct graph of the line inside the
block, the first step's included; outside a tracked run, per innermost user frame of the sync.
The check runs right after each sync (`torch_xla.sync`, which `xm.mark_step` and the device
loaders call: a subscriber of the probe, runtime/probe.py), so the step that compiled
graph n+1 has run when RecompilationError is raised; the error says what differs from the line's
previous graph (the op and shape when `%%on_tpu`'s recorder captured both graphs — lines at
their limit are captured at every sync while the guard is on — else the log's counts).

torch_xla's dynamic-shape detector (the guard behind `torch_xla.compile(max_different_graphs=
n)`) runs too, one session per sync line: it sees graphs the compile cache already holds (a
loop re-run in a later cell compiles nothing) and stops the step that traces one too many
before it compiles, saying what the trace got and expected; it compares the steps after a
line's first sync. Without compile-cause analysis (no `setup()` before the first compile)
it is the only check.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from tpu_nb.runtime.backend import current as current_backend
from tpu_nb.runtime.errors import TpuNbError, check_whole_number
from tpu_nb.runtime.metrics._compile_log import compile_log
from tpu_nb.runtime.probe import Subscription, own_sync, probe
from tpu_nb.runtime.sources import caller, cut_at_user_code, innermost_frame, short_path, user_frame
from tpu_nb.runtime.tracking import _attribution as attribution
from tpu_nb.runtime.tracking import _dynamo as dynamo
from tpu_nb.runtime.tracking import _policy as policy
from tpu_nb.runtime.tracking._provenance import frame_of
from tpu_nb.runtime.tracking._store import add_graph, store
from tpu_nb.runtime.units import format_place

_MARK = "Maximum number of different graphs allowed per function exceeded"
_ids = itertools.count()
_FIX = (
    "Fix: keep shapes and Python values in the step fixed (pad or bucket the batch), or allow "
    "more graphs."
)


class RecompilationError(TpuNbError):
    """More distinct graphs than allowed were traced (raised by `max_graphs`)."""

    @classmethod
    def at_line(cls, limit: int, where, graphs: list) -> RecompilationError:
        """The error for a line (a compile_log.Frame) that compiled `graphs`, one too many."""
        before, after = graphs[-2], graphs[-1]
        a, b = (store.captured_graph(g) for g in (before, after))
        facts = attribution.graph_facts(a, b) if a is not None and b is not None else ()
        facts = facts or dynamo.guard_facts(after) or attribution._log_facts(before, after)
        place = format_place(short_path(where.file), where.line)
        error = cls.__new__(cls)
        error.limit, error.got, error.expected = limit, "; ".join(facts), []
        TpuNbError.__init__(
            error,
            f"{place} compiled graph {len(graphs)} (max_graphs={limit}): it differs from the "
            f"line's previous graph: {'; '.join(facts)}. {_FIX}",
        )
        return error

    def __init__(self, limit: int, got: str, expected: list[str]):
        self.limit, self.got, self.expected = limit, _node(got), [_node(e) for e in expected]
        earlier = " or ".join(self.expected) or "something else"
        super().__init__(
            f"more than {limit} distinct graph{'s' if limit != 1 else ''} traced "
            f"(max_graphs={limit}): this step traced {self.got} where earlier steps traced "
            f"{earlier}. {_FIX}"
        )


def _node(text: str) -> str:
    # "[] aten::mm, xla_shape=f32[3,8]{1,0}, dynamic_dims: ()" -> "aten::mm f32[3,8]"
    op = re.search(r"(\w+::\w+)", text)
    shape = re.search(r"xla_shape=(\w+\[[^\]]*\])", text)
    parts = [p.group(1) for p in (op, shape) if p]
    return " ".join(parts) if parts else (text.strip() or "a different op")


def as_recompilation_error(exc: BaseException, limit: int) -> RecompilationError | None:
    """The readable error for torch_xla's guard violation, or None for any other error."""
    text = str(exc)
    if _MARK not in text:
        return None
    got = re.search(r"Got:(.*)", text)
    tail = text.split("Expected", 1)[1] if "Expected" in text else ""
    expected = re.findall(r"^\s*-\s*(.*)$", tail, flags=re.M)
    if not expected and (single := re.match(r"\s*:(.*)", tail)):
        expected = [single.group(1)]
    return RecompilationError(limit, got.group(1) if got else "", expected)


def _sync_site() -> str:
    """file:line of the user code that called the sync now running (called in a closure)."""
    frame = user_frame(caller(1))
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame else "?"


# The most distinct graphs a limit may allow (as %%on_tpu --max-graphs): more is never a
# useful limit, and torch_xla's detector takes a C++ int (a pybind TypeError beyond it).
MAX_GRAPHS = 10_000


class max_graphs:
    """Raise RecompilationError at the step that makes a line compile more than `limit`
    distinct graphs (see the module docstring)."""

    def __init__(self, limit: int):
        check_whole_number(
            limit,
            "max_graphs",
            high=MAX_GRAPHS,
            fix="e.g. max_graphs(2) (a training loop's first step often traces its own graph, "
            "so allow 2 or more)",
        )
        self.limit = limit
        self._fallback: AbstractContextManager[None] | None = None
        self._subscription: Subscription | None = None

    def __enter__(self) -> None:
        # The tracked run around the block (%%on_tpu's): its report places each compile on a
        # line, and the limit counts the graphs of that same line.
        runs = probe().local.runs
        self._run = runs[-1] if runs and hasattr(runs[-1], "compile_events_so_far") else None
        self._recorder = getattr(self._run, "recorder", None)
        # torch_xla's detector sees every traced graph, cached or not (a line re-run in a
        # later cell); the compile log's count sees the first step's graph too.
        watch = getattr(self._run, "dynamo", None)
        detector = self._fallback = _detector_guard(self.limit, watch)
        detector.__enter__()
        log = self._log = compile_log()
        if log is not None:
            self._read = log.size()
            self._graphs: dict[tuple[str, int], list] = {}
            try:
                self._subscription = probe().subscribe(self, ("sync",))
            except BaseException:
                detector.__exit__(*sys.exc_info())
                raise

    # the probe's sync events (runtime/probe.py): checked after the recorder placed the sync
    priority = 2

    before = None

    def after(self, event, state) -> None:
        __tracebackhide__ = True  # noqa: F841
        if not event.inner:  # torch_xla.compile's own syncs are not a step's
            self._check(event.frame)

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if self._subscription is not None:
                self._subscription.close()
        finally:  # an interrupt in the close still ends the detector's session
            forced: set = getattr(getattr(self, "_recorder", None), "force_capture", set())
            forced.difference_update(getattr(self, "_graphs", {}))
            if isinstance(exc, RecompilationError):
                cut_at_user_code(tb)
            suppressed = False
            if self._fallback is not None:
                try:
                    suppressed = bool(self._fallback.__exit__(exc_type, exc, tb))
                except RecompilationError as error:
                    cut_at_user_code(error.__traceback__)
                    raise
        return suppressed

    def _check(self, frame) -> None:
        __tracebackhide__ = True  # noqa: F841
        log = self._log
        if log is None:
            return
        if self._run is not None:
            if log.size() != self._read:  # something compiled since the last check
                self._read = log.size()
                self._check_run()
            return
        events = log.events_since(self._read)
        self._read = log.size()
        site = frame_of(user_frame(frame))
        for event in events:
            where = site if event.kind != "value-access" else event.user_frame
            if where is None or dynamo.inputs_sync(event):  # not the function's own graph
                continue
            key = (where.file, where.line)
            add_graph(self._graphs, key, event)
            if len(self._graphs[key]) > self.limit:
                raise RecompilationError.at_line(self.limit, where, self._graphs[key])

    def _check_run(self) -> None:
        # The run's compiles, placed as its report places them: per line (policy.line_key),
        # the distinct graphs of the line's own code (a compiled function's graphs counted on
        # the line that calls it, its inputs' pending work apart), tpu_nb's own syncs left out.
        __tracebackhide__ = True  # noqa: F841
        graphs: dict[tuple[str, int], list] = {}
        assert self._run is not None
        for event in self._run.compile_events_so_far():
            key = policy.line_key(event)
            own = (event.site is not None and event.site.own) or event.trigger == "end"
            if key is None or own or dynamo.inputs_sync(event):
                continue
            add_graph(graphs, key, event)
        for key, line in graphs.items():
            if len(line) >= self.limit - 1:  # capture the last allowed graph and the next
                if self._recorder is not None:
                    self._recorder.force_capture.add(key)
                self._graphs[key] = line
            if len(line) > self.limit:
                site = line[-1].site
                where = site.line if site is not None and site.line else line[-1].user_frame
                raise RecompilationError.at_line(self.limit, where, line)


def _in_dynamo_bridge() -> bool:
    bridge = current_backend().syncs.compiler_paths

    def in_bridge(frame) -> bool:
        path = frame.f_code.co_filename.replace(os.sep, "/")
        return any(fragment in path for fragment in bridge)

    return innermost_frame(caller(1), in_bridge) is not None


@contextmanager
def _detector_guard(limit: int, watch=None) -> Iterator[None]:
    runtime = current_backend()
    prefix = f"tpu_nb-{next(_ids)}"
    sessions = {f"{prefix}:start"}
    state: dict[str, Any] = {"active": True, "paused": False, "recompiles": dynamo.recompiles()}

    def renew():
        if state["active"] and state["paused"] and _in_dynamo_bridge():
            runtime.syncs.after_next(renew)  # the bridge's own sync: still compiling
        elif state["active"]:
            session = f"{prefix}:{_sync_site()}"
            state["recompiles"] = dynamo.recompiles()
            sessions.add(session)
            if not state["paused"]:
                runtime.graphs.stop_counting()
            state["paused"] = False
            runtime.graphs.start_counting(session)
            runtime.syncs.after_next(renew)

    def pause(compiling: bool) -> None:
        # Dynamo started compiling a frame (see _dynamo.py): torch_xla's bridge traces the
        # graph, node by node, when it first runs: not a step's graph. The detector resumes
        # at the next sync; the compile log still counts the function's graphs.
        if state["active"] and compiling and not state["paused"]:
            state["paused"] = True
            runtime.graphs.stop_counting()

    with own_sync("guard-start"):
        runtime.syncs.function()()  # work pending from before is not this block's
    saved = runtime.graphs.limit()
    runtime.graphs.set_limit(limit)
    runtime.graphs.start_counting(f"{prefix}:start")
    runtime.syncs.after_next(renew)
    pauses = watch.on_frame_compile if watch is not None else []  # (the run's Dynamo watch)
    pauses.append(pause)
    try:
        yield
    except RuntimeError as exc:
        readable = as_recompilation_error(exc, limit)
        if readable is None:
            raise
        recompiled = dynamo.latest_recompile()
        if recompiled is not None and dynamo.recompiles() > state["recompiles"]:
            # This step's trace followed Dynamo compiling a function again: say why it did.
            readable.args = (
                f"{readable.args[0]} Dynamo compiled {recompiled.function} again in this "
                f"step: {recompiled.why()}.",
            )
        raise readable.with_traceback(exc.__traceback__) from None
    finally:
        state["active"] = False
        pauses.remove(pause)
        if not state["paused"]:
            runtime.graphs.stop_counting()
        for session in sessions:
            runtime.graphs.forget_counted(session)
        runtime.graphs.set_limit(saved)
