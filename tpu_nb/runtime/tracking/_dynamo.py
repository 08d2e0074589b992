"""Dynamo's own facts about a tracked run: what `torch.compile` compiled, why it compiled again,
and where it broke the graph.

`torch.compile(backend="openxla")` puts Dynamo in front of torch_xla: Dynamo turns a Python
function into FX graphs, guarded by facts about its inputs (shapes, dtypes, constants), and
torch_xla compiles each graph to HLO. Dynamo publishes what it did through torch._logging's
structured trace: a handler on the `torch.__trace` logger receives each event as a record
(without TORCH_TRACE; torch keeps a handler there, so payloads are built anyway). `Watch`
installs such a handler for the length of one tracked run and keeps what it needs:

- `dynamo_start`: a frame starts compiling. The stack at that moment reaches the tracked code's
  line that called the function (and the function's arguments, to name the variable the line
  passed: `passed_as`); the compile-log offset and the XLA compile count are noted.
- `artifact` "recompile_reasons": the guards of the cached graphs that failed, in Dynamo's
  words ("tensor 'x' size mismatch at index 0. expected 8, actual 9").
- `artifact` "dynamo_graph_break_reason": a graph break; its reason and line are read from the
  locals of Dynamo's `log_graph_break` (the payload's text is the fallback).
- `compilation_metrics`: the frame is done (compile time, function, its graph's input shapes).

Nothing runs on a call that hits Dynamo's cache: the handler costs only while Dynamo compiles.
"""

from __future__ import annotations

import ast
import functools
import json
import linecache
import logging
import re
import sys
from dataclasses import dataclass, field, replace
from types import CodeType
from typing import Any

from tpu_nb.runtime.frame import frame_variables
from tpu_nb.runtime.metrics._compile_log import CompileEvent, Frame
from tpu_nb.runtime.metrics._counters import snapshot
from tpu_nb.runtime.probe import Hooks, Subscription, probe
from tpu_nb.runtime.sources import caller, innermost_frame, short_path
from tpu_nb.runtime.tracking._store import store
from tpu_nb.runtime.units import format_seconds

_TRACE_LOGGER = "torch.__trace"
_SIZE = re.compile(r"tensor '(.+)' size mismatch at index (\d+)\. expected (\d+), actual (\d+)")
_DTYPE = re.compile(r"tensor '(.+)' dtype mismatch\. expected (\S+), actual (\S+)")
_RANK = re.compile(r"tensor '(.+)' rank mismatch\. expected (\d+), actual (\d+)")
_HEADER = re.compile(r"Graph break in user code at (.+):(\d+)\nGraph Break Reason: (.+)")


@dataclass(frozen=True)
class GraphBreak:
    """Where Dynamo stopped a graph and ran Python instead (then started a new graph)."""

    reason: str  # Dynamo's reason, first line ("Unsupported Tensor.item() call ...")
    file: str
    line: int
    explanation: str = ""  # Dynamo's explanation line, when it gave one
    hint: str = ""  # Dynamo's first hint, when it gave one

    def describe(self) -> str:
        return f"graph break at {short_path(self.file)}:{self.line}: {self.reason}"


@dataclass(frozen=True)
class ChangedInput:
    """One input whose guard failed: what it is now and what the cached graph was built for."""

    name: str  # the input as Dynamo names it ("x", "batch['ids']")
    what: str  # "size", "dtype", "rank" or "other"
    dim: int | None = None
    expected: str = ""
    actual: str = ""

    def describe(self, ndim: int | None = None, shown: str = "") -> str:
        """In the user's words; `shown`: the variable the calling line passed as this input,
        when it has another name ("`batch` (the function's `x`) has 9 rows, ...")."""
        name = f"`{self.name}`"
        if shown and shown != self.name:
            name = f"`{shown}` (the function's `{self.name}`)"
        if self.what == "size" and self.dim is not None:
            if ndim == 2 and self.dim in (0, 1):
                has = f"{self.actual} {'rows' if self.dim == 0 else 'columns'}"
            else:
                has = f"size {self.actual} in dimension {self.dim}"
        elif self.what in ("dtype", "rank"):
            has = f"{self.what} {self.actual}"
        else:
            return self.actual
        return f"{name} has {has}, the cached graph was built for {self.expected}"


@dataclass(frozen=True)
class DynamoCompile:
    """One frame Dynamo compiled during the run (a function, or the rest of one after a
    graph break), with the facts Dynamo gave about it."""

    compile_id: str  # Dynamo's "frame/attempt" id: "0/0" first compile, "0/1" a recompile
    function: str  # the compiled code's name (torch_dynamo_resume_in_<fn>_at_<line> after a break)
    file: str
    first_line: int
    site: Any = None  # provenance.Site: the tracked code's line that called it (None: unknown)
    seconds: float = 0.0  # Dynamo's whole compile of this frame
    guard_failures: tuple[str, ...] = ()  # Dynamo's words, one per cached graph that failed
    changed: tuple[ChangedInput, ...] = ()  # the inputs named by the first failure
    input_shapes: dict[str, tuple] = field(default_factory=dict)  # graph input -> shape
    dynamic: tuple[str, ...] = ()  # inputs with a dimension compiled as dynamic
    graph_breaks: tuple[GraphBreak, ...] = ()
    # XLA graphs compiled from this frame's start to the next frame's (torch_xla compiles a
    # Dynamo graph when it first runs, and syncs the inputs' pending work before), and the
    # compile-log offsets written meanwhile.
    xla_compiles: int = 0
    log_span: tuple[int, int] = (0, 0)
    failed: str = ""  # Dynamo's failure, when the frame could not be compiled
    # argument -> the variable the calling line passed for it, when that is known exactly
    # and named otherwise (see `passed_as`)
    passed: tuple[tuple[str, str], ...] = ()

    @property
    def gave_up(self) -> bool:
        """Dynamo stopped compiling this frame (its recompile limit): it runs eagerly from
        then on, and the XLA compiles that follow are its eager code's."""
        return "recompile_limit" in self.failed or "cache_size_limit" in self.failed

    @property
    def recompile(self) -> bool:
        """A frame compiled again because the guards of its cached graphs failed."""
        return bool(self.guard_failures)

    @property
    def state_appeared(self) -> bool:
        """Compiled again only because the optimizer's state appeared: torch.optim's step
        was first compiled with its state dict empty, the first step() filled it (SGD's
        momentum buffers), and Dynamo's guard on its length failed once. A one-time
        compile, not a recompile anything could avoid."""
        # (the graphs it compiled for other objects fail on theirs: an optimizer made again)
        return (
            self.recompile
            and "torch/optim/" in self.file.replace("\\", "/")
            and any(_STATE_GUARD.match(g) for g in self.guard_failures)
            and all(_STATE_GUARD.match(g) or _OBJECT_GUARD.match(g) for g in self.guard_failures)
        )

    @property
    def line(self) -> Frame | None:
        """The tracked code's line that called the function, when known."""
        return getattr(self.site, "line", None)

    @property
    def new_object(self) -> bool:
        """Compiled again only because it was given another object than the one its graphs
        were compiled for (Dynamo's guard on an object's identity: an optimizer or model
        made again, whose class's code Dynamo compiled for the earlier one)."""
        return self.recompile and all(_OBJECT_GUARD.match(g) for g in self.guard_failures)

    def why(self) -> str:
        """Why it compiled again, in the user's words; "" for a first compile."""
        if not self.recompile:
            return ""
        if self.new_object:
            guard = self.guard_failures[0]
            found = _OBJECT_GUARD.match(guard)
            name = _SOURCE.sub(r"\1", (found.group(1) or found.group(2)) if found else "")
            return (
                f"`{name}` is {NEW_OBJECT} (an optimizer or model made again, say), and "
                f"Dynamo compiles per object; Dynamo's guard: {guard.split('#')[0].strip()}"
            )
        if self.state_appeared:
            guard = next(g for g in self.guard_failures if _STATE_GUARD.match(g))
            return (
                f"{STATE_APPEARED} (its first step() made it, e.g. momentum buffers), once; "
                f"Dynamo's guard: {guard}"
            )
        if not self.changed:
            return f"a guard failed: {self.guard_failures[0]}"
        passed = dict(self.passed)
        parts = []
        for c in self.changed:
            head, bracket, rest = c.name.partition("[")
            shown = passed.get(head, "")
            shape = self.input_shapes.get(_placeholder(c.name))
            ndim = len(shape) if shape is not None else None
            parts.append(c.describe(ndim, shown + bracket + rest if shown else ""))
        return "; ".join(parts)

    def describe(self) -> str:
        where = f"{short_path(self.file)}:{self.first_line}"
        head = f"{self.function} ({where}) compiled by Dynamo in {format_seconds(self.seconds)}"
        if self.recompile:
            head += f", again: {self.why()}"
            if self.dynamic:
                head += f"; Dynamo now compiles {', '.join(self.dynamic)} as dynamic"
            elif self.changed and any(c.what == "size" for c in self.changed):
                head += "; a new graph for this shape (automatic dynamic shapes are off)"
        if self.xla_compiles:
            head += f" ({self.xla_compiles} XLA compile{'s' if self.xla_compiles > 1 else ''})"
        return head


# Dynamo's guard on an optimizer's state dict that was empty when its step was compiled
_STATE_GUARD = re.compile(r"^len\(self\.state\b.*\) != 0$")
STATE_APPEARED = "the optimizer's state appeared"
# Dynamo's guard on an object's identity ("___check_obj_id(self, 1401...)"), or its word
# that the object a graph was compiled for is gone ("Cache line invalidated because
# G['opt'] got deallocated")
_OBJECT_GUARD = re.compile(
    r"^(?:___check_obj_id\(([^,]+),|Cache line invalidated because (.+) got deallocated)"
)
_SOURCE = re.compile(r"^[LG]\['([^']+)'\]")  # Dynamo's L['self'], G['opt']: self, opt
NEW_OBJECT = "another object than the one it was compiled for"


def _placeholder(name: str) -> str:
    # Dynamo names the graph input of local `x` "l_x_", of `batch['ids']` "l_batch_ids_"
    # (its source, L['batch']['ids'], with each run of non-word characters as one _).
    head, bracket, rest = name.partition("[")
    return re.sub(r"\W+", "_", f"L['{head}']{bracket}{rest}").lower()


def passed_as(caller, arguments: dict[str, Any]) -> dict[str, str]:
    """For each argument of a compiled function, the variable of the tracked code (`caller`,
    its frame) that the calling line passed: the one name on that line whose value is the
    very object passed. Left out when no name on the line holds it (an expression was
    passed), when two do, or when it is the argument's own name: never a guess."""
    if caller is None or not arguments:
        return {}
    text = linecache.getline(caller.f_code.co_filename, caller.f_lineno)
    words = set(_WORD.findall(text))
    if not words:
        return {}
    local, glob = frame_variables(caller), caller.f_globals
    out = {}
    for argument, value in arguments.items():
        holders = [w for w in words if (local[w] if w in local else glob.get(w, _MISSING)) is value]
        if len(holders) == 1 and holders[0] != argument:
            out[argument] = holders[0]
    return out


_WORD = re.compile(r"[A-Za-z_]\w*")
_MISSING = object()


def _function_arguments(frame) -> dict[str, Any]:
    """The arguments of the function Dynamo is compiling, from its convert_frame callback's
    `frame` (on the stack above the handler); {} when not found."""
    found = innermost_frame(
        frame,
        lambda f: f.f_code.co_name == "__call__" and f.f_code.co_filename.endswith(_CONVERT_FRAME),
        40,
    )
    if found is None:
        return {}
    compiled = found.f_locals.get("frame")
    code = getattr(compiled, "f_code", None)
    values = getattr(compiled, "f_locals", None)
    if code is None or not isinstance(values, dict):
        return {}
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    tensor = sys.modules["torch"].Tensor  # Dynamo is compiling: torch is imported
    return {n: values[n] for n in names if n in values and isinstance(values[n], tensor)}


_CONVERT_FRAME = "torch/_dynamo/convert_frame.py"


def report_lines(compiled) -> list[str]:
    """A RunReport's text lines for what Dynamo compiled ([] when nothing)."""
    if not compiled:
        return []
    lines = ["  compiled by Dynamo (torch.compile):"]
    for c in compiled:
        lines.append(f"    {c.describe()}")
        lines += [f"      {b.describe()}" for b in c.graph_breaks]
    return lines


def changed_inputs(reason: str) -> tuple[ChangedInput, ...]:
    """The inputs a Dynamo guard failure names (size, dtype or rank); () for other guards."""
    if found := _SIZE.search(reason):
        name, dim, expected, actual = found.groups()
        return (ChangedInput(name, "size", int(dim), expected, actual),)
    for pattern, what in ((_DTYPE, "dtype"), (_RANK, "rank")):
        if found := pattern.search(reason):
            name, expected, actual = found.groups()
            return (ChangedInput(name, what, None, expected, actual),)
    return ()


class _Dispatch(logging.Handler):
    """The one handler on Dynamo's structured trace: hands each record to the watches that
    subscribed (the probe's "dynamo-trace" kind)."""

    def emit(self, record: logging.LogRecord) -> None:
        for watch in probe().listeners["dynamo-trace"]:
            watch.handle(record)


def _install(hooks: Hooks) -> None:
    logger, dispatch = logging.getLogger(_TRACE_LOGGER), _Dispatch(logging.DEBUG)
    logger.addHandler(dispatch)
    hooks.undo(lambda: logger.removeHandler(dispatch), "Dynamo's structured trace handler")


probe().define("dynamo-trace", _install)


def _watches() -> list[Watch]:
    """The watches of the tracked runs now running, in the order the runs began."""
    watches = (getattr(run, "dynamo", None) for run in probe().active_runs)
    return [w for w in watches if w is not None and w.watching]


def latest_recompile() -> DynamoCompile | None:
    """The frame Dynamo most recently compiled again in a tracked run now running (for
    max_graphs, which checks after each sync), or None."""
    for watch in reversed(_watches()):
        for frame in reversed(watch.compiles):
            if frame.recompile:
                return frame
    return None


def _frame_of(event: CompileEvent) -> DynamoCompile | None:
    """For an XLA graph of a Dynamo frame, the frame (finished, of a tracked run now running)
    that started last at or before the event's compile-log offset; None otherwise."""
    if event.kind != "dynamo" or inputs_sync(event):
        return None
    best: tuple[int, Any] = (-1, None)
    for watch in _watches():
        for (start, _), frame in zip(watch._starts, watch.compiles, strict=False):
            if best[0] < start <= event.offset:
                best = (start, frame)
    return best[1]


def frame_graph(event: CompileEvent) -> str:
    """An identity for `event`'s graph when counting a line's graphs live: for an XLA graph of
    a Dynamo frame compiled in a tracked run now running, the frame's compile (its forward,
    backward and other graphs are one compile of the function); else the graph's hash."""
    frame = _frame_of(event)
    return f"dynamo frame {frame.compile_id}" if frame is not None else event.graph_hash


def function_of(event: CompileEvent) -> Frame | None:
    """For an XLA graph of a Dynamo frame compiled in a tracked run now running, the compiled
    function (its file, first line and name); None otherwise. torch_xla's compile log keeps
    8 frames, all inside Dynamo and torch_xla when it compiles a Dynamo graph."""
    frame = _frame_of(event)
    return Frame(frame.file, frame.first_line, frame.function) if frame is not None else None


def recompiles() -> int:
    """How many frames Dynamo compiled again in the tracked runs now running."""
    return sum(c.recompile for watch in _watches() for c in watch.compiles)


@dataclass(slots=True)
class _Pending:
    """What the trace told about a frame being compiled, until its compile is done."""

    site: Any = None
    code: CodeType | None = None  # the frame's code, as Dynamo's _compile got it
    passed: tuple[tuple[str, str], ...] = ()
    start_compiles: int = 0
    start_log: int = 0
    reasons: tuple[str, ...] = ()
    breaks: list[GraphBreak] = field(default_factory=list)
    started: bool = False


class Watch(logging.Handler):
    """Dynamo's events during one tracked run (see the module docstring).

    recorder: the run's provenance.Recorder (gives the tracked code's line), or None.
    log: the run's compile log (to tie the XLA compiles of a frame to it), or None.
    """

    def __init__(self, recorder=None, log=None):
        super().__init__(logging.DEBUG)
        self._recorder, self._log = recorder, log
        self._pending: dict[tuple, _Pending] = {}
        self.compiles: list[DynamoCompile] = []
        self._starts: list[tuple[int, int]] = []  # per compile: (log offset, XLA compiles)
        self._subscription: Subscription | None = None
        self.watching = False  # started and not stopped
        # Called with True when Dynamo starts compiling a frame in this run, False when done:
        # max_graphs pauses torch_xla's shape detector meanwhile (Dynamo's tracing of a graph
        # is not a step's graph, and the bridge traces each FX node on its own).
        self.on_frame_compile: list = []

    def start(self) -> Watch:
        self.watching = True
        # Only once torch is imported (it creates the logger and its level); a run that
        # imports torch itself has no Dynamo compile before that import finishes anyway.
        if "torch._logging" in sys.modules:
            self._subscription = probe().subscribe(self, ("dynamo-trace",))
        return self

    def stop(self) -> tuple[DynamoCompile, ...]:
        """Leave the structured trace; the frames compiled, each with the XLA compiles that
        followed it until the next frame started compiling (or the run ended)."""
        self.watching = False
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None
        return self.so_far()

    def so_far(self) -> tuple[DynamoCompile, ...]:
        """The frames compiled until now, each with the XLA compiles that followed it (what
        `stop()` returns, while the run goes on: `max_graphs` counts with it)."""
        if not self.compiles:
            return ()
        # torch_xla compiles a Dynamo graph to HLO when it first runs, just after Dynamo is
        # done with the frame: a frame's XLA compiles are those up to the next frame's start.
        starts = self._starts
        order = sorted(range(len(starts)), key=starts.__getitem__)
        now = (
            self._log.size() if self._log is not None else 0,
            snapshot().counter("UncachedCompile"),
        )
        out = list(self.compiles)
        for i, nxt in zip(order, [*order[1:], None], strict=True):
            end_log, end_count = starts[nxt] if nxt is not None else now
            span = (starts[i][0], end_log)
            out[i] = replace(out[i], log_span=span, xla_compiles=max(0, end_count - starts[i][1]))
        return tuple(out)

    def emit(self, record: logging.LogRecord) -> None:
        meta = getattr(record, "metadata", None)
        if not meta:
            return
        try:
            if "dynamo_start" in meta:
                self._started(meta)
            elif "artifact" in meta:
                name = meta["artifact"].get("name")
                if name == "recompile_reasons":
                    self._entry(meta).reasons = tuple(_json_list(getattr(record, "payload", "")))
                elif name == "dynamo_graph_break_reason":
                    self._graph_break(meta, getattr(record, "payload", "") or "")
            elif "compilation_metrics" in meta:
                self._finished(meta)
        except Exception:  # never let tpu_nb break the user's compile
            logging.getLogger("tpu_nb").debug("reading a Dynamo trace event", exc_info=True)

    def _entry(self, meta) -> _Pending:
        key = (meta.get("frame_id"), meta.get("frame_compile_id"))
        return self._pending.setdefault(key, _Pending())

    def _started(self, meta) -> None:
        entry = self._entry(meta)
        if entry.started:  # a restart of the same frame (after a graph break): same compile
            return
        entry.started = True
        for callback in list(self.on_frame_compile):
            callback(True)
        here = caller(2)
        entry.code = _code_being_compiled(here)
        if self._recorder is not None:
            site = entry.site = self._recorder.site_of(here)
            if site.line is not None:
                tracked = self._recorder.caller_frame(here)
                passed = passed_as(tracked, _function_arguments(here))
                entry.passed = tuple(sorted(passed.items()))
        entry.start_compiles = snapshot().counter("UncachedCompile")
        entry.start_log = self._log.size() if self._log is not None else 0

    def _graph_break(self, meta, payload: str) -> None:
        reason, where = _graph_break_locals()
        if reason is None:
            found = _HEADER.search(payload)
            if found is None:
                return
            where = (found.group(1), int(found.group(2)))
            reason = payload[found.start(3) :]
        lines = [s.strip() for s in str(reason).splitlines() if s.strip()]
        first = lines[0] if lines else ""
        explanation = next((s[12:].strip() for s in lines if s.startswith("Explanation:")), "")
        hint = next((s[5:].strip() for s in lines if s.startswith("Hint:")), "")
        brk = GraphBreak(first, str(where[0]), int(where[1]), explanation, hint)
        entry = self._entry(meta)
        if brk not in entry.breaks:
            entry.breaks.append(brk)

    def _finished(self, meta) -> None:
        for callback in list(self.on_frame_compile):
            callback(False)
        key = (meta.get("frame_id"), meta.get("frame_compile_id"))
        entry = self._pending.pop(key, None) or _Pending()
        m = meta["compilation_metrics"]
        shapes = _shapes(m.get("graph_node_shapes"))
        changed = changed_inputs(entry.reasons[0]) if entry.reasons else ()
        dynamic = tuple(n for n, s in shapes.items() if not all(isinstance(d, int) for d in s))
        code = entry.code
        if not m.get("co_name"):
            # A frame past Dynamo's recompile limit: no start event, and metrics without its
            # names; Dynamo's _compile still holds its code, and the tracked line called it.
            here = caller(2)
            code = code or _code_being_compiled(here)
            if entry.site is None and self._recorder is not None:
                entry.site = self._recorder.site_of(here)
            if not entry.started:  # its span of the log starts now, not at the run's start
                entry.start_compiles = snapshot().counter("UncachedCompile")
                entry.start_log = self._log.size() if self._log is not None else 0
        function = str(m.get("co_name") or (code.co_name if code else "?"))
        file = str(m.get("co_filename") or (code.co_filename if code else "?"))
        first_line = int(m.get("co_firstlineno") or (code.co_firstlineno if code else 0))
        site = entry.site
        if site is not None and site.line is not None:
            # The compiled function is where its graphs belong (not Dynamo's own frames).
            site = replace(site, user=Frame(file, first_line, function), library=None)
        self._starts.append((entry.start_log, entry.start_compiles))
        self.compiles.append(
            DynamoCompile(
                compile_id=str(m.get("compile_id") or ""),
                function=function,
                file=file,
                first_line=first_line,
                site=site,
                seconds=float(m.get("entire_frame_compile_time_s") or 0.0),
                guard_failures=tuple(_without_id(r) for r in entry.reasons),
                changed=changed,
                input_shapes=shapes,
                dynamic=dynamic,
                graph_breaks=tuple(entry.breaks),
                log_span=(entry.start_log, entry.start_log),
                failed=str(m.get("fail_reason") or ""),
                passed=entry.passed,
            )
        )


def _code_being_compiled(frame) -> CodeType | None:
    """The code object Dynamo's `_compile(code, ...)` is compiling, from its frame above
    `frame` (the trace handler runs inside it); None when not found."""
    found = innermost_frame(
        frame,
        lambda f: f.f_code.co_name == "_compile" and isinstance(f.f_locals.get("code"), CodeType),
        30,
    )
    return found.f_locals["code"] if found is not None else None


def _graph_break_locals():
    """Dynamo's own reason and (file, line), from its `log_graph_break` frame (the handler
    runs inside it); (None, None) when not found."""
    frame = innermost_frame(caller(1), lambda f: f.f_code.co_name == "log_graph_break", 12)
    values = frame.f_locals if frame is not None else {}
    where = values.get("frame_loc")
    if where is not None and "reason" in values:
        return values["reason"], where
    return None, None


def _json_list(payload) -> list[str]:
    if isinstance(payload, list):
        return [str(p) for p in payload]
    try:
        value = json.loads(payload)
    except (TypeError, ValueError):
        return [str(payload)] if payload else []
    return [str(p) for p in value] if isinstance(value, list) else [str(value)]


def _without_id(reason: str) -> str:
    # "0/0: tensor 'x' size mismatch ..." -> the guard of cached graph 0/0
    head, sep, rest = reason.partition(": ")
    return rest if sep and "/" in head and " " not in head else reason


def _shapes(value) -> dict[str, tuple]:
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return {}
    if not isinstance(value, dict):
        return {}
    return {str(k): tuple(v) for k, v in value.items() if isinstance(v, (list, tuple))}


# torch_xla's cause for the graph of the pending work of a Dynamo frame's inputs
_INPUT_SYNC = "dynamo processing input graphs"
_INPUT_SYNC_FACT = (
    "the pending work of the compiled function's inputs, which torch_xla runs before its "
    "graph (a new shape of an input's creation is a new graph)"
)


def place(events: list[CompileEvent], compiles) -> list[CompileEvent]:
    """Tie each XLA compile that followed a Dynamo frame's compile to that frame: the site of
    the tracked code's line that called the compiled function (when it has none), and, for a
    frame compiled again, what Dynamo said changed (see `what_changed`)."""
    spans = [(c.log_span, c) for c in compiles if c.log_span[1] > c.log_span[0]]
    if not spans:
        return events
    placed = []
    for event in events:
        for (start, end), frame in spans:
            if not start <= event.offset < end:
                continue
            if frame.site is not None and frame.site.line is not None:
                if event.site is None:
                    event = replace(event, site=frame.site)
                elif event.site.line is None and (event.kind == "dynamo" or inputs_sync(event)):
                    # Not reached from the tracked code (a backward graph on autograd's
                    # thread): the line stays unknown, the compiled function is named.
                    event = replace(event, site=replace(frame.site, line=None))
            if _INPUT_SYNC in event.cause and event.site is not None and event.site.line:
                # The inputs' graph is the calling line's work, not the function's graph:
                # grouped apart, so that neither passes for the other's recompilation.
                event = replace(event, site=replace(event.site, user=None))
            if _INPUT_SYNC in event.cause:
                note_changed(event.graph_hash, (_INPUT_SYNC_FACT,))
            elif frame.recompile:
                note_changed(event.graph_hash, (_guard_fact(frame),))
            break
        placed.append(event)
    return placed


def own_compiles(compiles, events: list[CompileEvent]) -> tuple:
    """`compiles` with each frame's XLA compiles counted from the placed `events`: those in
    its log span on the line that called the function, not the graph of a sync on a later
    line that ran before the next frame compiled (the step's end after a compiled forward).
    A frame Dynamo gave up on keeps its count: from then on its calls run eagerly."""
    out = []
    for frame in compiles:
        line = frame.site.line if frame.site is not None else None
        if line is None or frame.gave_up:
            out.append(frame)
            continue
        start, end = frame.log_span
        spanned = [e for e in events if start <= e.offset < end]
        own = [e for e in spanned if e.site is None or e.site.line is None or _same_line(e, line)]
        out.append(replace(frame, xla_compiles=min(frame.xla_compiles, len(own))))
    return tuple(out)


def _same_line(event: CompileEvent, line: Frame) -> bool:
    return (event.site.line.file, event.site.line.line) == (line.file, line.line)


# torch_xla.compile(fn) runs the pending work of fn's inputs first, in a graph of its own.
_PENDING_FIRST = "clear the pending graph prior calling the target function"


def pending_first(event: CompileEvent) -> bool:
    """Whether `event` is torch_xla.compile's sync before the function: every pending
    tensor's work, the function's inputs' and any other (the Dynamo bridge runs only its
    inputs')."""
    return _PENDING_FIRST in event.cause


def inputs_sync(event: CompileEvent) -> bool:
    """Whether `event` is the graph of a compiled function's inputs (their pending work, run
    by torch_xla.compile or the Dynamo bridge before the function's graph), not the
    function's own graph: a new one is not the function's recompilation."""
    return _PENDING_FIRST in event.cause or _INPUT_SYNC in event.cause


def guard_facts(event: CompileEvent) -> tuple[str, ...]:
    """For an XLA compile of a Dynamo graph during a tracked run: the guard Dynamo saw fail
    when it compiled the frame again; () otherwise."""
    if event.kind != "dynamo" or inputs_sync(event):
        return ()
    frame = latest_recompile()
    return (_guard_fact(frame),) if frame is not None else ()


def _guard_fact(frame: DynamoCompile) -> str:
    return f"Dynamo compiled {frame.function} again: {frame.why()}"


def functions_graphs(events: list[CompileEvent]) -> list[CompileEvent]:
    """`events` without the compiled functions' input syncs (see `inputs_sync`) and without
    the XLA graphs of Dynamo's frames, whose recompilations Dynamo itself tells (see
    `recompilations`)."""
    return [e for e in events if not inputs_sync(e) and e.kind != "dynamo"]


def recompilations(events: list[CompileEvent], compiles) -> dict[tuple[str, int], tuple]:
    """Functions Dynamo compiled again in this run: (file, first line) -> one graph hash per
    compile of the function (the first XLA graph after each of its frame compiles; a frame
    compiles a forward, a backward and others, which are not recompilations). A function
    whose first compile in the run is already a recompile starts with "(earlier)"."""
    out: dict[tuple[str, int], list[str]] = {}
    for frame in compiles:
        start, end = frame.log_span
        own = (e for e in events if start <= e.offset < end and e.kind == "dynamo")
        first = next((e for e in own if not inputs_sync(e)), None)
        key = (frame.file, frame.first_line)
        graphs = out.setdefault(key, ["(earlier)"] if frame.recompile else [])
        if first is not None and first.graph_hash not in graphs:
            graphs.append(first.graph_hash)
    return {k: tuple(v) for k, v in out.items() if len(v) > 1}


def note_changed(graph_hash: str, facts: tuple[str, ...]) -> None:
    """Record what changed for the graph `graph_hash` compiled (read by `what_changed`): a
    guard Dynamo saw fail, or the input torch_xla.compile'd function got in a new shape."""
    if graph_hash:
        store.keep_dynamo_change(graph_hash, facts)


def state_appeared(event: CompileEvent) -> bool:
    """Whether `event`'s graph is that of a frame Dynamo compiled again only because the
    optimizer's state appeared (see DynamoCompile.state_appeared)."""
    changed = what_changed(event)
    return bool(changed) and STATE_APPEARED in changed[0]


def new_object(event: CompileEvent) -> bool:
    """Whether `event`'s graph is that of a frame Dynamo compiled again only because it was
    given another object (see DynamoCompile.new_object)."""
    changed = what_changed(event)
    return bool(changed) and NEW_OBJECT in changed[0]


def what_changed(event: CompileEvent) -> tuple[str, ...]:
    """What the compiler in front of XLA said about `event`'s graph: the guard that failed
    when Dynamo compiled the frame again, that the graph is the sync of the frame's inputs,
    or the input a torch_xla.compile'd function got in a new shape; () otherwise."""
    return store.dynamo_changes.get(event.graph_hash, ())


@functools.cache
def keep_out_of_dynamo() -> None:
    """Have Dynamo never compile tpu_nb's runtime code (its hooks on torch methods), once per
    process. Code after a graph break runs under Dynamo, which compiles each Python function
    it calls as a frame of its own: it compiled tpu_nb's `.item()` hook, and broke a graph
    inside tpu_nb — work and findings the program without tpu_nb does not have. Dynamo skips
    its own and other libraries' files the same way (torch._dynamo.trace_rules.add)."""
    rules = sys.modules.get("torch._dynamo.trace_rules")  # imported by torch_xla
    if rules is None:
        return
    try:
        rules.add("tpu_nb.runtime")
    except Exception:  # another torch: the hooks are then compiled as before
        logging.getLogger("tpu_nb").debug("cannot keep tpu_nb out of Dynamo", exc_info=True)
