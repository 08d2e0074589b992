"""Where a tracked run's syncs, value reads and CPU fallbacks came from, and what compiled.

torch_xla's compile-cause log keeps 8 Python frames, so below a library (Hugging Face's
stack, ParallelLoader, a helper 8 calls deep) the user's line is lost, and counters carry no
line at all. While a run is tracked, a `Recorder` records the stack itself at the three
moments that matter:

- syncs: `torch_xla.sync` (which `xm.mark_step`, ParallelLoader and MpDeviceLoader call) is
  wrapped; a sync that compiled records its stack, tied to the compile-log blocks written
  during it;
- value reads: `Tensor.item`, `tolist`, `numpy`, `cpu`, `bool()`, `float()`, `int()`,
  formatting and printing are wrapped; a call that copied device data to the host (the
  runtime's counters moved) records its stack and how many reads it made — a `print` of a
  Python float or a branch never taken records nothing;
- CPU fallbacks: the Python entry points of ops torch_xla runs on the CPU (`torch.unique`,
  `median`, `bucketize`, `grid_sample`, ... and any op seen falling back during the run) are
  wrapped; a call that moved a fallback counter records its stack.

A stack becomes a `Site`: the outermost line of the tracked code (the cell's line), the
innermost user frame below it (a helper in another cell) and the innermost library function
that did it. Each wrapper costs one or two counter reads (~0.2 us each) and does nothing else
unless the counters moved; everything is restored when the run ends. Graphs: the pending
graph is captured just before the first sync of each line and before the sync after each
compile at a line, so recompile findings can say which op and shape changed (bounded: a few
graphs per line; captures that do not follow a compile at their line also by a time budget).
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tpu_nb.runtime.metrics._compile_log import Frame
from tpu_nb.runtime.sources import as_caller, is_library, short_path
from tpu_nb.runtime.tracking import _dynamo as dynamo
from tpu_nb.runtime.units import format_place

log = logging.getLogger("tpu_nb")

HOST_READ = "aten::_local_scalar_dense"
_TENSOR_TYPES: tuple = ()  # torch.Tensor and Parameter, set by Recorder.start()
# Counters that move when device data reaches the host: a scalar read, a copy to the CPU.
_READ_COUNTERS = (HOST_READ, "xla::_to_cpu", "xla::_to_copy")
# Tensor methods that read device values, and how a finding names them.
_READ_METHODS = {
    "item": ".item()",
    "tolist": ".tolist()",
    "numpy": ".numpy()",
    "cpu": ".cpu()",
    "__bool__": "bool(tensor)",
    "__float__": "float(tensor)",
    "__int__": "int(tensor)",
    "__index__": "a tensor used as an index",
    "__format__": "formatting a tensor",
    "__repr__": "printing a tensor",
}
# Python entry points of ops torch_xla 2.9 runs on the CPU (no XLA lowering), as
# (namespace, attribute); the op each becomes, for the finding's wording.
_FALLBACK_ENTRY_POINTS = (
    ("torch", "unique"),
    ("torch", "unique_consecutive"),
    ("torch", "nonzero"),
    ("torch", "masked_select"),
    ("torch", "histc"),
    ("torch", "median"),
    ("torch", "nanmedian"),
    ("torch", "bucketize"),
    ("torch", "searchsorted"),
    ("torch", "kthvalue"),
    ("torch", "mode"),
    ("torch", "bincount"),
    ("Tensor", "nonzero"),
    ("Tensor", "masked_select"),
    ("Tensor", "histc"),
    ("Tensor", "median"),
    ("Tensor", "nanmedian"),
    ("Tensor", "kthvalue"),
    ("Tensor", "bincount"),
    ("functional", "grid_sample"),
)
# Library frames that only pass a call along: a finding names the function behind them.
_PLUMBING_FILES = (
    "torch/_tensor.py",
    "torch/_tensor_str.py",
    "torch/overrides.py",
    "torch/utils/_contextlib.py",
    "torch/utils/_device.py",
    "torch_xla/torch_xla.py",
    "typing_extensions.py",
    "functools.py",
    "contextlib.py",
    "torch/_jit_internal.py",
    "torch/functional.py",
)
_PLUMBING_FUNCTIONS = {"mark_step", "sync"}
# Syncs that are the runtime's plumbing around a compiled function, not a step of the user's:
# torch_xla's Dynamo bridge syncing a graph's inputs, and torch_xla.compile running the work
# pending before the function.
_BRIDGE_FILE = "torch_xla/_dynamo/dynamo_bridge.py"
_INPUTS_SYNC = ("torch_xla/torch_xla.py", "_clear_pending_ops_before_compile")


def _plumbing_sync(frame) -> bool:
    code = frame.f_code
    path = code.co_filename
    return path.endswith(_BRIDGE_FILE) or (
        code.co_name == _INPUTS_SYNC[1] and path.endswith(_INPUTS_SYNC[0])
    )


_MAX_DEPTH = 400  # frames walked at most from a hook to the tracked code


@dataclass(frozen=True)
class Site:
    """Where in the tracked code something happened."""

    line: Frame | None  # the tracked code's own line (a cell line); None: not reached
    # from it (another thread, a callback after the run)
    user: Frame | None = None  # the innermost user-code frame below `line` (a helper)
    library: Frame | None = None  # the innermost library function that did it

    @property
    def via(self) -> str:
        """The code between the line and the event: "helpers.py:12 step →
        torch/optim/optimizer.py:95 _get_value"; "" when the line did it itself."""
        hops = []
        for frame in (self.user, self.library):
            if frame is not None:
                where = format_place(short_path(frame.file), frame.line)
                hops.append(f"{where} {frame.function}")
        return " \u2192 ".join(hops)


@dataclass
class Occurrence:
    """Reads or fallbacks of one kind at one site, aggregated over the run."""

    kind: str  # "read" or "fallback"
    what: str  # ".item()", "aten::_unique2"
    site: Site
    calls: int = 0  # calls that did it
    count: int = 0  # host reads / fallback ops they made
    order: int = 0  # when the first happened (a sequence number within the run)
    # Inside a sync: a step closure (xm.add_step_closure) or other work the sync runs after
    # the step's graph, not a read that stalls the step.
    in_sync: bool = False
    steps: int = 0  # distinct steps (syncs of the run) it happened in
    first_step: int = 0  # syncs the run had made when it first happened
    last_step: int = -1  # ... when it last happened


@dataclass(frozen=True)
class CompileAnchor:
    """A sync or read during which the runtime compiled: blocks of the compile log written
    before `log_end` (and after the previous anchor) came from it."""

    kind: str  # "sync", "read" or "fallback" (a CPU fallback materialising its inputs)
    site: Site
    log_end: int
    compiles: int
    order: int
    graph: Any = None  # the pending graph captured just before it (a runtime Graph)
    step: int = 0  # syncs the run had made before it
    call: int = 0  # calls (syncs and reads) its line had made before it


@dataclass
class Recording:
    """What a Recorder saw; read by `track()` when the run ends."""

    anchors: list[CompileAnchor] = field(default_factory=list)
    occurrences: dict[tuple, Occurrence] = field(default_factory=dict)
    capture_seconds: float = 0.0
    captures: int = 0
    hook_errors: int = 0
    syncs: int = 0  # torch_xla.sync calls the tracked thread made
    # (file, line) of the tracked code -> syncs and device reads it made (the steps a line
    # took part in: whether it compiled again after its last compile)
    line_calls: dict[tuple[str, int], int] = field(default_factory=dict)


class Recorder:
    """Installs the hooks for one tracked run (see the module docstring).

    root: what counts as the tracked code's own frames — code objects (a cell's compiled
    code) or one frame (the frame that entered `track()`). A site's `line` is the line that
    frame was running.
    """

    def __init__(
        self, *, root_codes: tuple = (), root_frame=None, log=None, capture_graphs: bool = True
    ):
        # Code objects compared by identity: `code in set` hashes the code object (~1-2 us
        # for a cell or Module._call_impl), on every frame of every walk.
        self._code_ids = frozenset(id(c) for c in root_codes if c is not None)
        self._codes = tuple(c for c in root_codes if c is not None)  # kept alive
        self._root_frame = root_frame
        self.root_codes, self.root_frame = self._codes, root_frame  # the tracked code
        self._log = log
        self._capture = capture_graphs
        self.recording = Recording()
        self._order = 0
        self._local = threading.local()
        self._restore: list[tuple[Any, str, Any, bool]] = []
        self._fallback_names: tuple[str, ...] = ()
        self._started = 0.0
        self._capture_next: set[tuple[str, int]] = set()
        self._captured_here: dict[tuple[str, int], int] = {}
        # Lines that compiled more than one graph are watched: the shapes of the tensors the
        # tracked code names (~2 us for a cell's 20 names) are compared at each of their
        # syncs, and a change (a ragged last batch) captures the graph about to compile.
        self._compiled_at: dict[tuple[str, int], int] = {}
        self._shapes_at: dict[tuple[str, int], tuple] = {}
        named = self._codes or ((root_frame.f_code,) if root_frame is not None else ())
        self._names = tuple(sorted(names_in(named)))
        self.active = False
        # Called with wall-clock times (time.time()) of each sync and value read: (the hook
        # entered, the call started, it returned), for the step anatomy (runtime/anatomy.py).
        self.on_sync: list[Callable[[float, float, float], None]] = []
        self.on_read: list[Callable[[float, float, float], None]] = []

    # -- install / remove ---------------------------------------------------------------------

    def start(self) -> Recorder:
        import torch
        import torch_xla

        self._xc = torch_xla._XLAC
        self._counter = self._xc._xla_counter_value
        self._compiling = torch.compiler.is_compiling
        global _TENSOR_TYPES
        _TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
        self._started = time.perf_counter()
        self._fallback_names = tuple(self._xc._get_executed_fallback_ops())
        self._log_read = self._log.size() if self._log is not None else 0
        dynamo.keep_out_of_dynamo()
        self._patch(torch_xla, "sync", self._sync_wrapper)
        # torch_xla.compile(fn) syncs through its own module's global (before fn: the
        # inputs' pending work; after: fn's graph): the same hook there.
        self._patch(sys.modules["torch_xla.torch_xla"], "sync", self._sync_wrapper)
        for name, label in _READ_METHODS.items():
            self._patch(
                torch.Tensor,
                name,
                lambda original, label=label: self._read_wrapper(original, label),
            )
        for namespace, name in _FALLBACK_ENTRY_POINTS:
            self._wrap_fallback(_namespace(torch, namespace), name)
        self.active = True
        return self

    def stop(self) -> Recording:
        self.active = False
        for owner, name, original, had_own in reversed(self._restore):
            try:
                if had_own:
                    setattr(owner, name, original)
                else:
                    delattr(owner, name)
            except (AttributeError, TypeError):
                pass
        self._restore.clear()
        return self.recording

    def _patch(self, owner, name: str, make: Callable) -> None:
        original = getattr(owner, name, None)
        # A hook of another recorder (a track() inside a tracked cell) is wrapped in turn:
        # both record, and each removes only its own.
        if original is None or getattr(original, "__tpu_nb_hook__", None) is self:
            return
        wrapper = make(original)
        wrapper.__tpu_nb_hook__ = self
        had_own = name in vars(owner)
        setattr(owner, name, wrapper)
        self._restore.append((owner, name, original, had_own))

    def _wrap_fallback(self, owner, name: str) -> None:
        if owner is not None and callable(getattr(owner, name, None)):
            self._patch(owner, name, self._fallback_wrapper)

    # -- hooks ---------------------------------------------------------------------------------

    def _sync_wrapper(self, original):
        recorder = self

        @functools.wraps(original)
        def sync(*args, **kwargs):
            __tracebackhide__ = True  # noqa: F841
            caller = sys._getframe(1)
            if not recorder.active or recorder._compiling():
                return as_caller(caller)(original, args, kwargs)
            before = recorder._counter("UncachedCompile")
            if _plumbing_sync(caller):  # not a step: its compiles are still anchored
                result = as_caller(caller)(original, args, kwargs)
                recorder._after_sync(before, None, None, caller)
                return result
            entry = time.time()
            graph, site = (
                recorder._maybe_capture(sys._getframe(1)) if recorder._capture else (None, None)
            )
            start = time.time()
            local = recorder._local
            local.in_sync = True  # reads during the sync are its step closures
            try:
                result = as_caller(sys._getframe(1))(original, args, kwargs)
            finally:
                local.in_sync = False
            recorder._notify(recorder.on_sync, entry, start)
            recorder._after_sync(before, graph, site, caller)
            recorder.recording.syncs += 1
            return result

        return sync

    def _read_wrapper(self, original, label: str):
        recorder = self

        @functools.wraps(original)
        def read(tensor, *args, **kwargs):
            __tracebackhide__ = True  # noqa: F841
            local = recorder._local
            # A CPU tensor's read cannot move XLA's counters: nothing to record.
            if (
                not recorder.active
                or not getattr(tensor, "is_xla", False)
                or getattr(local, "depth", 0)
                or recorder._compiling()
            ):
                return as_caller(sys._getframe(1))(original, (tensor, *args), kwargs)
            entry = time.time()
            counter = recorder._counter
            before = [counter(n) or 0 for n in _READ_COUNTERS]
            compiles = counter("UncachedCompile")
            local.depth = 1
            graph, site = (
                recorder._maybe_capture(sys._getframe(1), tensor)
                if recorder._capture
                else (None, None)
            )
            start = time.time()
            try:
                return as_caller(sys._getframe(1))(original, (tensor, *args), kwargs)
            finally:
                recorder._notify(recorder.on_read, entry, start)
                local.depth = 0
                after = [counter(n) or 0 for n in _READ_COUNTERS]
                if after != before:
                    recorder._record_read(
                        label, before, after, compiles, sys._getframe(1), graph, site
                    )

        return read

    def _fallback_wrapper(self, original):
        recorder = self

        @functools.wraps(original)
        def op(*args, **kwargs):
            __tracebackhide__ = True  # noqa: F841
            if not recorder.active or recorder._compiling():
                return as_caller(sys._getframe(1))(original, args, kwargs)
            before = recorder._fallback_counts()
            compiles = recorder._counter("UncachedCompile")
            tensor = next((a for a in args if getattr(a, "is_xla", False)), None)
            graph = site = None
            if tensor is not None:  # running on the CPU materialises its input
                graph, site = recorder._maybe_capture(sys._getframe(1), tensor)
            result = as_caller(sys._getframe(1))(original, args, kwargs)
            after = recorder._fallback_counts()
            if after != before:
                recorder._record_fallbacks(before, after, compiles, sys._getframe(1), graph, site)
            return result

        return op

    # -- bookkeeping (never raises into the user's code) ---------------------------------------

    def _notify(self, hooks, entry: float, start: float) -> None:
        if hooks:
            end = time.time()
            try:
                for hook in hooks:
                    hook(entry, start, end)
            except Exception:
                self._failed()

    def _after_sync(self, before: int, graph, site, frame) -> None:
        try:
            compiles = (self._counter("UncachedCompile") or 0) - (before or 0)
            if compiles > 0:
                site = site or self.site_of(frame)
                self._anchor("sync", site, compiles, graph)
                self._note_compiled(site)
            self._notice_new_fallbacks()
        except Exception:
            self._failed()

    def _record_read(
        self, label, before, after, compiles_before, frame, graph=None, site=None
    ) -> None:
        try:
            site = site or self.site_of(frame)
            closure = getattr(self._local, "in_sync", False)
            self._occur("read", label, site, max(0, after[0] - before[0]), closure)
            compiled = (self._counter("UncachedCompile") or 0) - (compiles_before or 0)
            if compiled > 0:
                self._anchor("read", site, compiled, graph)
                self._note_compiled(site)
        except Exception:
            self._failed()

    def _record_fallbacks(
        self, before, after, compiles_before, frame, graph=None, site=None
    ) -> None:
        try:
            site = site or self.site_of(frame)
            for name, value in after.items():
                moved = value - before.get(name, 0)
                if moved > 0:
                    self._occur("fallback", name, site, moved)
            # Running on the CPU materialises the op's inputs: a value-access compile.
            compiled = (self._counter("UncachedCompile") or 0) - (compiles_before or 0)
            if compiled > 0:
                self._anchor("fallback", site, compiled, graph)
                self._note_compiled(site)
        except Exception:
            self._failed()

    def _fallback_counts(self) -> dict[str, int]:
        names = self._xc._get_executed_fallback_ops()
        return {n: self._counter(n) or 0 for n in names if n != HOST_READ}

    def _notice_new_fallbacks(self) -> None:
        """An op seen falling back for the first time: wrap its Python entry points, so its
        next calls in this run are placed on a line (the first ones are counted, unplaced)."""
        names = tuple(self._xc._get_executed_fallback_ops())
        if len(names) == len(self._fallback_names):
            return
        import torch

        for name in set(names) - set(self._fallback_names):
            for namespace, attr in _entry_points_for(name):
                self._wrap_fallback(_namespace(torch, namespace), attr)
        self._fallback_names = names

    def _occur(self, kind: str, what: str, site: Site, count: int, in_sync: bool = False) -> None:
        key = (kind, what, site, in_sync)
        occ = self.recording.occurrences.get(key)
        step = self.recording.syncs
        if occ is None:
            if len(self.recording.occurrences) >= 10_000:  # bounded: one run, many sites
                key = (kind, what, Site(None), in_sync)
                occ = self.recording.occurrences.get(key)
            if occ is None:
                occ = self.recording.occurrences[key] = Occurrence(
                    kind, what, key[2], order=self._next(), in_sync=in_sync, first_step=step
                )
        occ.calls += 1
        occ.count += count
        if occ.last_step != step:
            occ.steps += 1
            occ.last_step = step

    def _anchor(self, kind: str, site: Site, compiles: int, graph) -> None:
        log_end = self._log.size() if self._log is not None else 0
        anchors = self.recording.anchors
        if len(anchors) < 100_000:
            recording = self.recording
            # The call was counted as it began (_maybe_capture) and a sync is counted once
            # its anchor is made: `step` is the step it ends or happened in.
            call = recording.line_calls.get(_key(site.line), 1) - 1 if site.line else 0
            anchors.append(
                CompileAnchor(
                    kind, site, log_end, compiles, self._next(), graph, recording.syncs, call
                )
            )
        if graph is not None and compiles == 1 and self._log is not None:
            # The block this compile wrote is the last one in the log: key the graph by its
            # hash now, so a guard or the report can diff it against the line's previous one.
            events = self._log.events_since(self._log_read)
            self._log_read = log_end
            if events:
                graphs_by_hash[events[-1].graph_hash] = graph
                graphs_by_hash.move_to_end(events[-1].graph_hash)
                while len(graphs_by_hash) > _MAX_BY_HASH:
                    graphs_by_hash.popitem(last=False)

    def _next(self) -> int:
        self._order += 1
        return self._order

    def _failed(self) -> None:
        self.recording.hook_errors += 1
        log.debug("tpu_nb: a recording hook failed", exc_info=True)

    # -- sites ---------------------------------------------------------------------------------

    def site_of(self, frame) -> Site:
        """The Site of the code running in `frame` (the hook's caller)."""
        user = library = None
        depth = 0
        ids, root = self._code_ids, self._root_frame
        while frame is not None and depth < _MAX_DEPTH:
            code = frame.f_code
            if id(code) in ids or frame is root:
                return Site(_frame(frame), user, library)
            path = code.co_filename
            if is_library(path):
                # The library function that did it: inside the innermost user frame, if any
                # (a library frame outside it, like Module._call_impl, only called the user).
                if library is None and user is None and not _plumbing(path, code.co_name):
                    library = _frame(frame)
            elif user is None:
                user = _frame(frame)
            frame = frame.f_back
            depth += 1
        return Site(None, user, library)

    # -- graph capture -------------------------------------------------------------------------

    def _maybe_capture(self, frame, tensor=None):
        """Before a sync (or a read of `tensor`): the pending graph, when this line is due a
        capture; else (None, None) after a walk that allocates nothing (the steady state)."""
        try:
            root = _root_of(frame, self._code_ids, self._root_frame)
            if root is None:
                return None, None
            key = (root.f_code.co_filename, root.f_lineno)
            calls = self.recording.line_calls
            calls[key] = calls.get(key, 0) + 1
            forced = key in force_capture
            due = forced or key in self._capture_next or line_graphs.get(key) is None
            if not due and self._compiled_at.get(key, 0) >= 2:
                due = self._shapes_changed(root, key)
            if not due:
                return None, None
            taken = self._captured_here.get(key, 0)
            # A capture after a compile at this line is what names the next recompile's
            # change; each follows a compile (far costlier), so only the others are held to
            # the time budget (under load, the first capture alone could use it all up).
            after_compile = key in self._capture_next
            if (not forced and taken >= 16) or not (after_compile or self._within_budget()):
                return None, None
            self._capture_next.discard(key)
            self._captured_here[key] = taken + 1
            start = time.perf_counter()
            graph = (
                _capture_tensor(tensor)
                if tensor is not None
                else _capture_pending(root, self._names)
            )
            self.recording.capture_seconds += time.perf_counter() - start
            self.recording.captures += 1
            line_graphs.note(key, graph)
            return graph, self.site_of(frame)
        except Exception:
            self._failed()
            return None, None

    def _shapes_changed(self, root, key) -> bool:
        values = root.f_locals
        shapes = tuple(
            (v.shape, v.dtype)
            for v in (values.get(n) for n in self._names)
            if type(v) in _TENSOR_TYPES
        )
        before = self._shapes_at.get(key)
        self._shapes_at[key] = shapes
        return before is not None and before != shapes

    def _note_compiled(self, site: Site) -> None:
        if site.line is not None:
            key = _key(site.line)
            self._capture_next.add(key)
            self._compiled_at[key] = self._compiled_at.get(key, 0) + 1

    def _within_budget(self) -> bool:
        spent = self.recording.capture_seconds
        elapsed = time.perf_counter() - self._started
        return spent < max(0.5, 0.05 * elapsed)


class LineGraphs:
    """Graphs captured per line over the process (bounded: recent lines, few graphs each)."""

    def __init__(self, lines: int = 64, per_line: int = 4):
        self._lines: OrderedDict[tuple[str, int], list] = OrderedDict()
        self._max_lines, self._per_line = lines, per_line

    def get(self, key):
        return self._lines.get(key)

    def note(self, key, graph) -> None:
        kept = self._lines.setdefault(key, [])
        self._lines.move_to_end(key)
        if graph is not None and not any(g.hash == graph.hash for g in kept):
            kept.append(graph)
            del kept[: -self._per_line]
        while len(self._lines) > self._max_lines:
            self._lines.popitem(last=False)

    def clear(self) -> None:
        self._lines.clear()
        graphs_by_hash.clear()

    def graph_for(self, where, event):
        """The pending graph captured just before `event` compiled, if it was captured."""
        return graphs_by_hash.get(event.graph_hash)


line_graphs = LineGraphs()
# Compile-log graph hash -> the pending graph captured just before that graph compiled.
graphs_by_hash: OrderedDict[str, Any] = OrderedDict()
_MAX_BY_HASH = 48
# Lines captured at every sync, whatever the budget (max_graphs: lines at their limit, whose
# next graph is an error that should name what changed).
force_capture: set[tuple[str, int]] = set()


# Graphs captured, by torch_xla's hash of the captured tensors' graph: the same pending graph
# is read once (reading the IR text of a GPT-2 step costs ~0.5 s; its hash ~2 ms).
_by_own_hash: OrderedDict[str, Any] = OrderedDict()


def _capture_pending(frame, names: tuple = ()):
    """The pending graph of the XLA tensors the frame's variables reach (bounded walk): the
    variables the tracked code names first (a notebook's namespace holds much else, which
    could use up the walk's budget before reaching them), then the rest, newest first."""
    import torch

    from tpu_nb.runtime.graph._capture import is_pending, walk_limited

    found: dict[int, Any] = {}
    budget = [20_000]
    spaces = (
        [frame.f_locals] if frame.f_locals is frame.f_globals else [frame.f_locals, frame.f_globals]
    )
    named = {n: space[n] for space in spaces for n in names if n in space}
    rest = [dict(reversed(list(space.items()))) for space in spaces]
    for namespace in (named, *rest):
        for t in walk_limited(namespace, torch, depth=4, seen=set(), budget=budget):
            if id(t) not in found and is_pending(t):
                found[id(t)] = t
    return _graph_once(list(found.values()))


def _capture_tensor(tensor):
    from tpu_nb.runtime.graph._capture import is_pending

    return _graph_once([tensor]) if is_pending(tensor) else None


def _graph_once(tensors: list):
    from tpu_nb.runtime.backend import xlac
    from tpu_nb.runtime.graph._capture import graph, hash_hex

    if not tensors:
        return None
    own_hash = hash_hex(xlac()._get_graph_hash(tensors))
    known = _by_own_hash.get(own_hash)
    if known is None:
        known = _by_own_hash[own_hash] = graph(*tensors, hlo=False, frames=False)
        while len(_by_own_hash) > _MAX_BY_HASH:
            _by_own_hash.popitem(last=False)
    _by_own_hash.move_to_end(own_hash)
    return known


def names_in(codes) -> set[str]:
    """Names a code object and the functions it defines refer to (globals and locals)."""
    names: set[str] = set()
    for code in codes:
        names.update(code.co_names, code.co_varnames)
        names |= names_in(c for c in code.co_consts if hasattr(c, "co_names"))
    return names


def _root_of(frame, code_ids, root):
    depth = 0
    while frame is not None and depth < _MAX_DEPTH:
        if id(frame.f_code) in code_ids or frame is root:
            return frame
        frame = frame.f_back
        depth += 1
    return None


def _frame(frame) -> Frame:
    code = frame.f_code
    return Frame(code.co_filename, frame.f_lineno, code.co_name)


def _key(frame: Frame) -> tuple[str, int]:
    return (frame.file, frame.line)


def _plumbing(path: str, function: str) -> bool:
    return function in _PLUMBING_FUNCTIONS or path.replace("\\", "/").endswith(_PLUMBING_FILES)


def _namespace(torch, name: str):
    if name == "torch":
        return torch
    if name == "Tensor":
        return torch.Tensor
    if name == "functional":
        return torch.nn.functional
    return None


def _entry_points_for(counter: str) -> list[tuple[str, str]]:
    """Python callables a fallback counter's op may come from: "aten::_unique2" ->
    torch.unique; "aten::median.dim_values" -> torch.median and Tensor.median."""
    base = counter.split("::", 1)[-1].split(".", 1)[0].strip("_")
    base = USER_OPS.get(base, base).split(".")[-1]
    return [("torch", base), ("Tensor", base), ("functional", base)]


# Counter op (no namespace, no overload, leading underscores dropped) -> what the user wrote.
USER_OPS = {
    "unique2": "torch.unique",
    "unique_dim": "torch.unique",
    "unique": "torch.unique",
    "unique_consecutive": "torch.unique_consecutive",
    "grid_sampler_2d": "F.grid_sample",
    "grid_sampler_3d": "F.grid_sample",
    "nonzero": "torch.nonzero",
    "masked_select": "torch.masked_select",
    "histc": "torch.histc",
    "median": "torch.median",
    "nanmedian": "torch.nanmedian",
    "bucketize": "torch.bucketize",
    "searchsorted": "torch.searchsorted",
    "kthvalue": "torch.kthvalue",
    "mode": "torch.mode",
    "bincount": "torch.bincount",
}


def user_op(counter: str) -> str:
    """The op the user wrote for a fallback counter: "aten::_unique2" -> "torch.unique"."""
    base = counter.split("::", 1)[-1].split(".", 1)[0].strip("_")
    return USER_OPS.get(base, f"aten::{counter.split('::', 1)[-1]}")
