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
innermost user frame below it (a helper in another cell), the innermost library function
that did it, and the function the line called (`trainer.train`). Each sync and read is
counted per site (`Site.key`: the line and the frame below it that did it), so a loop inside
one call of the cell is judged as a loop written in the cell. A sync on another thread is
placed on the tracked code's line only when the tracked thread is waiting in an autograd
backward call (autograd runs a compiled function's backward on a thread of its own). At a
sync of torch_xla.compile that compiled, the function's tensor inputs are compared with
those of its previous compile, so that a recompile names the input and dimension that
changed. Each wrapper costs one or two counter
reads (~0.2 us each) and does nothing else unless the counters moved; everything is
restored when the run ends. Graphs: the pending graph is captured just before the first sync
at each site and before the sync after each compile at a site, so recompile findings can say
which op and shape changed (bounded: a few graphs per site; captures that do not follow a
compile at their site also by a time budget).
"""

from __future__ import annotations

import builtins
import dis
import logging
import threading
import time
import weakref
from collections import UserDict
from dataclasses import dataclass, field, replace
from typing import Any

from tpu_nb.runtime.backend import current as current_backend
from tpu_nb.runtime.frame import Frame, StackWalkError, frame_variables, walk_stack
from tpu_nb.runtime.graph._capture import (
    frame_spaces,
    graph,
    is_pending,
    pending_tensors,
    search_order,
)
from tpu_nb.runtime.probe import ReadEvent, Subscription, SyncEvent, probe
from tpu_nb.runtime.sources import (
    call_site,
    frames_between,
    innermost_frame,
    short_path,
    site_key,
    tracked_frame,
)
from tpu_nb.runtime.tracking import _cost as cost
from tpu_nb.runtime.tracking import _dynamo as dynamo
from tpu_nb.runtime.tracking._libraries import Loaders, sync_role
from tpu_nb.runtime.tracking._store import store
from tpu_nb.runtime.units import format_place

log = logging.getLogger("tpu_nb")

HOST_READ = "aten::_local_scalar_dense"
_STEADY_CALL = 3  # a line's call captured again for the step's cost (see _maybe_capture)
_LIVE_SAMPLES = 256  # samples of the live device tensors a run keeps
_TENSOR_TYPES: tuple = ()  # torch.Tensor and Parameter, set by Recorder.start()
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


@dataclass(frozen=True)
class Site:
    """Where in the tracked code something happened."""

    line: Frame | None  # the tracked code's own line (a cell line); None: not reached
    # from it (another thread, a callback after the run)
    user: Frame | None = None  # the innermost user-code frame below `line` (a helper)
    library: Frame | None = None  # the innermost library function that did it
    own: str = ""  # tpu_nb's own sync ("end": track()'s last, "guard-start": max_graphs')
    # the function the line called (`transformers/trainer.py train`): which library's loop
    # this is, when the site is inside one
    entry: Frame | None = field(default=None, compare=False)

    @property
    def inner(self) -> Frame | None:
        """The frame below the line that did it (the library function, else the helper);
        None when the line did it itself."""
        return self.library or self.user

    @property
    def key(self) -> tuple:
        """What a site is judged as one of: (file, line) of the tracked code's line, then
        (file, line) of the frame below it that did it, when not the line itself. A loop inside
        `trainer.train()` syncs at one site and reads the mask at another, as a loop in the
        cell would on two lines."""
        head = (self.line.file, self.line.line) if self.line is not None else ("", 0)
        inner = self.inner
        return head + ((inner.file, inner.line) if inner is not None else ())

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
    # Compiles a fallback inside autograd's backward forced (its inputs' graph): torch_xla
    # starts them from C++ and writes no cause for them in its log; they are the fallback's.
    compiles: int = 0


@dataclass(frozen=True)
class CompileAnchor:
    """A sync or read during which the runtime compiled: blocks of the compile log written
    before `log_end` (and after the previous anchor) came from it."""

    kind: str  # "sync", "read" or "fallback" (a CPU fallback materialising its inputs)
    site: Site
    log_end: int
    compiles: int
    step: int = 0  # syncs the run had made before it
    call: int = 0  # calls (syncs and reads) its site had made before it
    same_shapes: bool = False  # see CompileEvent.same_shapes
    step_end: bool = False  # see CompileEvent.step_end


@dataclass
class Recording:
    """What a Recorder saw; read by `track()` when the run ends."""

    anchors: list[CompileAnchor] = field(default_factory=list)
    occurrences: dict[tuple, Occurrence] = field(default_factory=dict)
    capture_seconds: float = 0.0
    captures: int = 0
    hook_errors: int = 0
    # the steps: torch_xla.sync calls the tracked thread made, less those that ran nothing,
    # a library's logging syncs inside a step and a loader's before its first batch
    syncs: int = 0
    # Site.key -> the syncs and device reads made there (a line's calls, per site below it;
    # RunReport.line_calls sums them per line)
    site_calls: dict[tuple, int] = field(default_factory=dict)
    # Compile-log spans (start, end) of the run's own end-of-run sync (track(sync=True)).
    own_end: list[tuple[int, int]] = field(default_factory=list)
    # Site.key -> the hash of the last graph captured there (the graph a loop's site runs in
    # its steady state: what a step costs; a library's loop under one line of the cell runs
    # its step's graph at one site and its logging's at others)
    line_graphs: dict[tuple, str] = field(default_factory=dict)
    # Site.key -> {graph hash: the site's calls that ran it}: a call not captured runs the
    # site's last captured graph (a line that compiled has its shapes compared at each
    # call, and a change is captured). A loop over 4 batches of 48 and one of 8 runs the
    # 48's graph most, whichever was captured last.
    graph_calls: dict[tuple, dict[str, int]] = field(default_factory=dict)
    # every graph captured in the run, by hash: what the code held at each capture (a
    # gradient accumulation's syncs between two optimizer steps hold the gradients)
    graphs: set[str] = field(default_factory=set)
    # (steps made, live device tensors) just after a step's sync, every few steps (at most
    # _LIVE_SAMPLES, spaced wider as the run goes on): a loop that keeps tensors step over
    # step. Always at the same point of a step: mid-step the step's own tensors are alive.
    live_tensors: list[tuple[int, int]] = field(default_factory=list)

    def steady_graphs(self) -> dict[tuple, str]:
        """Site.key -> the graph the site ran at most of its calls (the last captured of
        those that tie): what a steady step of the loop runs there."""
        out = {}
        for site, last in self.line_graphs.items():
            calls = self.graph_calls.get(site, {})
            out[site] = max(calls, key=lambda h: (calls[h], h == last), default=last)
        return out


class Recorder:
    """Records one tracked run from the probe's sync, read and fallback events (see the module
    docstring and runtime/probe.py).

    root: what counts as the tracked code's own frames — code objects (a cell's compiled
    code) or one frame (the frame that entered `track()`). A site's `line` is the line that
    frame was running.
    """

    def __init__(self, *, root_codes: tuple = (), root_frame=None, log=None):
        # Code objects compared by identity: `code in set` hashes the code object (~1-2 us
        # for a cell or Module._call_impl), on every frame of every walk.
        self._code_ids = frozenset(id(c) for c in root_codes if c is not None)
        self.root_codes = tuple(c for c in root_codes if c is not None)  # kept alive
        self.root_frame = root_frame
        self._log = log
        self.recording = Recording()
        self._order = 0
        self._live_every = 2  # steps between two samples of the live tensors
        self._subscription: Subscription | None = None
        self._fallback_names: tuple[str, ...] = ()
        # forward entry point ("interpolate") -> the library frame of its last call on the
        # device with gradients, for the fallback of its backward
        self._forwards: dict[str, Frame | None] = {}
        self._started = 0.0
        self._capture_next: set[tuple] = set()
        self._passing: dict[int, tuple] = {}  # site_key's: which functions pass a call along
        # site -> its captures in a row that found nothing pending: one more is tried
        self._empty_at: dict[tuple, int] = {}
        # Lines captured at every sync, whatever the budget (max_graphs: lines at their
        # limit, whose next graph is an error that should name what changed).
        self.force_capture: set[tuple[str, int]] = set()
        self._captured_here: dict[tuple, int] = {}  # site -> captures (or tries) in this run
        # Lines that compiled are watched: the shapes of the tensors the tracked code binds
        # are compared at each of their syncs, and a change (a ragged last batch) captures the
        # graph about to compile.
        self._compiled_at: set[tuple[str, int]] = set()
        self._shapes_at: dict[tuple[str, int], list] = {}
        # line -> the syncs made when its watch last found the shapes unchanged
        self._same_shapes: dict[tuple[str, int], int] = {}
        named = self.root_codes or ((root_frame.f_code,) if root_frame is not None else ())
        self._names = names_in(named)
        self._named = named
        self._watched: tuple[str, ...] | None = None  # names_watched, at the first compare
        self._kinds: dict[type, Any] = {}  # a watched value's type -> _watch_kind
        # device loaders' iterators seen (their first sync is no step): the run's
        self.loaders: weakref.WeakSet = Loaders()
        self.active = False

    # -- subscribing --------------------------------------------------------------------------

    priority = 1  # after the step anatomy's timestamps, before max_graphs' check

    def start(self) -> Recorder:
        import torch

        runtime = current_backend()
        self._counter = runtime.counters.reader()
        self._fallback_ops = runtime.counters.fallbacks_reader()
        global _TENSOR_TYPES
        _TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
        self._started = time.perf_counter()
        self._thread = threading.get_ident()
        self._fallback_names = ()
        self._log_read = self._log.size() if self._log is not None else 0
        self._log_at_start = self._log_read
        dynamo.keep_out_of_dynamo()
        self._subscription = probe().subscribe(self, ("sync", "read", "fallback"))
        self.active = True
        self._notice_new_fallbacks()  # ops earlier code saw fall back: placed from the start
        return self

    def stop(self) -> Recording:
        self.active = False
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            subscription.close()
        return self.recording

    # -- events (see runtime/probe.py) -------------------------------------------------------

    def before(self, event):
        """The probe's call as a sync, read or fallback starts: a graph capture when the
        line is due one; returns (graph, site) for `after`."""
        if not self.active:
            return None
        if type(event) is SyncEvent:
            if event.owner is self:  # this run's own end: where its compiles start in the log
                return self._log.size() if self._log is not None else 0
            if event.plumbing:
                return None, None
            return self._maybe_capture(event.frame)
        if type(event) is ReadEvent:
            return self._maybe_capture(event.frame, event.tensor)
        if event.op in _FORWARDS:  # runs on the device: only where it was called from
            self._note_forward(event)
            return None
        before = {} if event.none_before else self._fallback_counts()
        tensor = next((a for a in event.args if getattr(a, "is_xla", False)), None)
        if tensor is not None and not event.backward:  # on the CPU, its input is materialised
            return before, *self._maybe_capture(event.frame, tensor)
        return before, None, None

    def after(self, event, state) -> None:
        if state is None and not self.active:
            return
        kind = type(event)
        if kind is SyncEvent:
            if event.owner is self:  # tpu_nb's sync at the end of this run: not the user's
                end = self._log.size() if self._log is not None else 0
                if end > state:
                    self.recording.own_end.append((state, end))
                return
            graph, site = state if state is not None else (None, None)
            # not a step: one with nothing to run, the runtime's own around a compiled
            # function (its compiles are still anchored), a library's logging sync inside a
            # step, a data loader's before its first batch (it runs what the code set up
            # before the loop: part of the first step), as the step anatomy counts
            loaders = self.loaders  # the step anatomy asked first: its answer, inlined
            role = event.role if event.role_of is loaders else sync_role(event, loaders)
            self._after_sync(event, graph, site, counted=role == "step")
        elif kind is ReadEvent:
            if event.counters_after != event.counters_before or event.copied:
                graph, site = state if state is not None else (None, None)
                self._record_read(event, graph, site)
        elif state is not None:
            before, graph, site = state
            after = self._fallback_counts()
            if after != before:
                self._record_fallbacks(before, after, event, graph, site)

    # -- bookkeeping (never raises into the user's code) ---------------------------------------

    def _after_sync(self, event, graph, site, *, counted: bool) -> None:
        try:
            compiles = event.compiled
            if compiles > 0:
                site = site or self.site_of(event.frame)
                if event.own and not site.own:
                    site = replace(site, own=event.own)
                anchors = self.recording.anchors
                log_start = anchors[-1].log_end if anchors else self._log_at_start
                same = self._same_shapes.get(_key(site.line)) if site.line else None
                same = same == self.recording.syncs
                self._anchor("sync", site, compiles, graph, same, step_end=counted)
                if event.frame.f_code.co_name == "_compile":  # torch_xla.compile's own sync
                    self._compiled_inputs(event.frame, site, log_start)
            self._notice_new_fallbacks()
        except Exception:
            self._failed()
        if counted:
            self.recording.syncs += 1
            if self.recording.syncs % self._live_every == 0:
                self._note_live_tensors()

    def _record_read(self, event, graph=None, site=None) -> None:
        try:
            site = site or self.site_of(event.frame)
            before, after = event.counters_before, event.counters_after
            self._occur("read", event.label, site, max(0, after[0] - before[0]), event.in_sync)
            self._notice_new_fallbacks()
            compiled = (self._counter("UncachedCompile") or 0) - (event.compiles_before or 0)
            if compiled > 0:
                self._anchor("read", site, compiled, graph)
        except Exception:
            self._failed()

    def _record_fallbacks(self, before, after, event, graph=None, site=None) -> None:
        try:
            site = site or self.site_of(event.frame)
            moved = {n: v - before.get(n, 0) for n, v in after.items() if v > before.get(n, 0)}
            if event.backward:
                site = self._with_forward(site, moved)
            occurrences = [self._occur("fallback", n, site, count) for n, count in moved.items()]
            # Running on the CPU materialises the op's inputs: a value-access compile.
            compiled = (self._counter("UncachedCompile") or 0) - (event.compiles_before or 0)
            if compiled > 0 and event.backward and occurrences:
                occurrences[0].compiles += compiled
            if compiled > 0:
                self._anchor("fallback", site, compiled, graph)
            self._notice_new_fallbacks()
        except Exception:
            self._failed()

    def _note_forward(self, event) -> None:
        """A call of an op whose backward falls back (F.interpolate): the library frame that
        called it, for the backward's fallback, which autograd runs from C++ with no frame."""
        try:
            if any(getattr(a, "is_xla", False) and a.requires_grad for a in event.args[:1]):
                self._forwards[event.op] = self.site_of(event.frame).library
        except Exception:
            self._failed()

    def _with_forward(self, site: Site, moved: dict[str, int]) -> Site:
        """`site` (the backward() line) with the library frame whose forward call made the
        op that fell back inside it, when one op's did and a library called it."""
        frames = {
            self._forwards.get(_FORWARDS_OF.get(backward_base(name), ""))
            for name in moved
            if backward_base(name)
        } - {None}
        if len(frames) != 1 or site.library is not None or site.user is not None:
            return site
        return replace(site, library=frames.pop())

    def _fallback_counts(self) -> dict[str, int]:
        names = self._fallback_ops()
        return {n: self._counter(n) or 0 for n in names if n != HOST_READ}

    def _notice_new_fallbacks(self) -> None:
        """An op seen falling back for the first time: wrap its Python entry points, so its
        next calls in this run are placed on a line (the first ones are counted, unplaced)."""
        names = tuple(self._fallback_ops())
        if len(names) == len(self._fallback_names):
            return
        for name in set(names) - set(self._fallback_names):
            for namespace, attr in _entry_points_for(name):
                probe().watch_fallback(namespace, attr)
        self._fallback_names = names

    def _occur(
        self, kind: str, what: str, site: Site, count: int, in_sync: bool = False
    ) -> Occurrence:
        key = (kind, what, site, in_sync)
        occ = self.recording.occurrences.get(key)
        step = self.recording.syncs
        if occ is None:
            if len(self.recording.occurrences) >= 10_000:  # bounded: one run, many sites
                key = (kind, what, Site(None), in_sync)
                occ = self.recording.occurrences.get(key)
            if occ is None:
                self._order += 1
                occ = self.recording.occurrences[key] = Occurrence(
                    kind, what, key[2], order=self._order, in_sync=in_sync, first_step=step
                )
        occ.calls += 1
        occ.count += count
        if occ.last_step != step:
            occ.steps += 1
            occ.last_step = step
        return occ

    def _anchor(
        self, kind: str, site: Site, compiles: int, graph, same: bool = False, step_end=False
    ) -> None:
        """A compile at `site`: anchored in the log, and its line watched (see _maybe_capture)."""
        if site.line is not None:
            self._capture_next.add(site.key)
            self._compiled_at.add(_key(site.line))
        log_end = self._log.size() if self._log is not None else 0
        anchors = self.recording.anchors
        if len(anchors) < 100_000:
            recording = self.recording
            # The call was counted as it began (_maybe_capture) and a sync is counted once
            # its anchor is made: `step` is the step it ends or happened in.
            call = recording.site_calls.get(site.key, 1) - 1 if site.line else 0
            anchors.append(
                CompileAnchor(kind, site, log_end, compiles, recording.syncs, call, same, step_end)
            )
        if graph is not None and compiles == 1 and self._log is not None:
            # The block this compile wrote is the last one in the log: key the graph by its
            # hash now, so a guard or the report can diff it against the line's previous one.
            events = self._log.events_since(self._log_read)
            self._log_read = log_end
            if events:
                cost.note_compiled(graph.hash, events[-1])
                store.keep_capture(events[-1].graph_hash, graph)

    def _failed(self) -> None:
        self.recording.hook_errors += 1
        log.debug("tpu_nb: a recording hook failed", exc_info=True)

    # -- sites ---------------------------------------------------------------------------------

    def site_of(self, frame) -> Site:
        """The Site of the code running in `frame` (the hook's caller), by sources' rule."""
        line, user, library, entry = call_site(frame, self._code_ids, self.root_frame, _plumbing)
        placed = frame_of(line)
        if placed is None and threading.get_ident() != getattr(self, "_thread", None):
            placed = self._waiting_in_backward()
        entry = entry if line is not None else None
        return Site(placed, frame_of(user), frame_of(library), entry=frame_of(entry))

    def _waiting_in_backward(self) -> Frame | None:
        """The tracked code's line, when the tracked thread is waiting in an autograd
        backward call: autograd runs a backward on a thread of its own (where a compiled
        function's backward graph compiles), for the line that called backward."""
        code_ids, root = self._code_ids, self.root_frame

        def in_backward(frame) -> bool:
            code = frame.f_code
            return code.co_name in _BACKWARD_CALLS and code.co_filename.endswith(_AUTOGRAD_FILES)

        def line_of_backward(frame):
            called = innermost_frame(frame, in_backward)
            line = call_site(called, code_ids, root)[0] if called is not None else None
            return frame_of(line)

        try:
            return walk_stack(self._thread, line_of_backward, None)
        except StackWalkError:
            return None

    def _compiled_inputs(self, frame, site: Site, log_start: int) -> None:
        """torch_xla.compile(fn) compiled at its sync after fn: name the input whose shape or
        dtype differs from the call that compiled fn's graph before (see `_call_inputs`)."""
        caller = self.caller_frame(frame) if site.line is not None else None
        found = _call_inputs(frame, caller)
        if found is None:
            return
        key, inputs, function = found
        before = store.swap_inputs(key, inputs)
        if before is None or self._log is None or len(before) != len(inputs):
            return
        facts = tuple(f for f in map(_describe_change, before, inputs) if f)
        if not facts:
            return
        events = [e for e in self._log.events_since(log_start) if not dynamo.inputs_sync(e)]
        if events:
            text = f"torch_xla.compile traced {function} again: " + "; ".join(facts)
            dynamo.note_changed(events[-1].graph_hash, (text,))

    def caller_frame(self, frame):
        """The tracked code's frame at or outside `frame` (None: not reached from it)."""
        return tracked_frame(frame, self._code_ids, self.root_frame)

    # -- graph capture -------------------------------------------------------------------------

    def _maybe_capture(self, frame, tensor=None):
        """Before a sync (or a read of `tensor`): the pending graph, when this line is due a
        capture; else (None, None) after a walk that allocates nothing (the steady state)."""
        try:
            root, key, site = site_key(
                frame, self._code_ids, self.root_frame, _plumbing, self._passing
            )
            if root is None:
                return None, None
            by_site = self.recording.site_calls
            by_site[site] = by_site.get(site, 0) + 1
            forced = key in self.force_capture
            # A site's first sync in each run is captured, and any line whose graph is not
            # known yet; and its third, a steady step's (a step's cost is that of the graph its
            # lines run: a loader's first sync runs only what the loop set up before it).
            due = (
                forced
                or site in self._capture_next
                or self._empty_at.get(site) == 1
                or site not in self._captured_here
                or by_site[site] == _STEADY_CALL
                or store.line_captures.get(key) is None
            )
            changed_now = False  # the shapes were compared (and kept) at this call
            if not due and key in self._compiled_at:  # a new shape: capture, to name it
                changed = self._shapes_changed(root, key)  # None: nothing to compare yet
                if changed is False:
                    self._same_shapes[key] = self.recording.syncs
                due = changed_now = bool(changed)
            if not due:
                self._ran_again(site)
                return None, None
            taken = self._captured_here.get(site, 0)
            # A capture after a compile at this site is what names the next recompile's
            # change; each follows a compile (far costlier), so only the others are held to
            # the time budget (under load, the first capture alone could use it all up).
            # Per site: a library's loop syncs at one site and reads at others, each of
            # which compiles graphs of its own.
            after_compile = site in self._capture_next
            if (not forced and taken >= 16) or not (after_compile or self._within_budget()):
                self._ran_again(site)
                return None, None
            self._capture_next.discard(site)
            self._captured_here[site] = taken + 1
            if key in self._compiled_at and not changed_now:
                # the shapes this capture's graph has: what the next call's are compared with
                # (a call captured for another reason is no baseline otherwise, and the next
                # new shape would go unnamed)
                self._shapes_changed(root, key)
            start = time.perf_counter()
            graph = (
                _capture_tensor(tensor)
                if tensor is not None
                else _capture_pending(root, self._names, frame)
            )
            self.recording.capture_seconds += time.perf_counter() - start
            self.recording.captures += 1
            if graph is None and tensor is None:
                # Nothing pending (a device loader's sync before its first batch): the
                # site's first graph is its next sync's, which is then due as well. Found
                # twice in a row, the site's tensors are out of reach (a step function's
                # closure): not looked for again at every sync.
                self._empty_at[site] = self._empty_at.get(site, 0) + 1
            else:
                self._empty_at.pop(site, None)
            store.note_line_capture(key, graph)
            if graph is not None and graph.hash:
                self.recording.line_graphs[site] = graph.hash
                self.recording.graphs.add(graph.hash)
                self._ran_again(site)
            return graph, self.site_of(frame)
        except Exception:
            self._failed()
            return None, None

    def _ran_again(self, site) -> None:
        """A call at `site` ran its last captured graph (see Recording.graph_calls)."""
        last = self.recording.line_graphs.get(site)
        if last is not None:
            calls = self.recording.graph_calls.setdefault(site, {})
            calls[last] = calls.get(last, 0) + 1

    def _note_live_tensors(self) -> None:
        names = current_backend().counters.facts
        live = (self._counter(names.tensors_created) or 0) - (
            self._counter(names.tensors_destroyed) or 0
        )
        samples = self.recording.live_tensors
        samples.append((self.recording.syncs, live))
        if len(samples) >= _LIVE_SAMPLES:  # bounded: every other one kept, spaced twice as far
            samples[:] = samples[1::2]
            self._live_every *= 2

    def _shapes_changed(self, root, key) -> bool | None:
        values: Any = frame_variables(root)
        watched = self._watched
        if watched is None:
            watched = self._watched = names_watched(self._named, values)
        kinds = self._kinds
        shapes: list[Any] = []
        for value in map(values.get, watched):
            kind = kinds.get(type(value), kinds)  # the dict itself: a type not seen yet
            if kind is kinds:
                kind = kinds[type(value)] = _watch_kind(value)
            if kind is _TENSOR:
                shapes.append((value.shape, value.dtype))
            elif kind is not None:  # a batch in a dict, list or tuple: the storage read as is
                items = kind(value)
                shapes.append(tuple((v.shape, v.dtype) for v in items if type(v) in _TENSOR_TYPES))
        before = self._shapes_at.get(key)
        self._shapes_at[key] = shapes
        return None if before is None else before != shapes

    def _within_budget(self) -> bool:
        spent = self.recording.capture_seconds
        elapsed = time.perf_counter() - self._started
        return spent < max(0.5, 0.05 * elapsed)


_HELD = 16  # a dict, list or tuple holding more is no batch: not looked into at each sync
_TENSOR = object()  # _watch_kind of a tensor


def _items(size, values):
    """A reader of the values a container of one built-in type holds, from its storage;
    () when it holds more than _HELD."""
    return lambda held: tuple(values(held)) if size(held) <= _HELD else ()


_dict_values = _items(dict.__len__, dict.values)


def _user_dict_values(held) -> tuple:
    data = vars(held).get("data")  # the instance's own attribute: no property of a subclass
    return _dict_values(data) if type(data) is dict else ()


_BATCHES = (
    (dict, _dict_values),
    (UserDict, _user_dict_values),
    (list, _items(list.__len__, list.__iter__)),
    (tuple, _items(tuple.__len__, tuple.__iter__)),
)


def _watch_kind(value):
    """What the shape watch reads of a value of this type: _TENSOR (its shape and dtype), or
    the function that gives the values a dict, UserDict (a BatchEncoding), list or tuple
    holds (a batch), read from their storage, so that no method of a user's subclass runs;
    None for anything else."""
    if type(value) in _TENSOR_TYPES:
        return _TENSOR
    return next((values for kind, values in _BATCHES if isinstance(value, kind)), None)


def _capture_pending(frame, names: tuple = (), caller=None):
    """The pending graph of the XLA tensors the frame's variables reach (bounded walk): the
    variables the tracked code names first (a notebook's namespace holds much else, which
    could use up the walk's budget before reaching them), then the rest, newest first; and
    the locals of the functions between the tracked frame and the one that synced (`caller`:
    a step function's tensors; a library's loop, such as Trainer's model and loss, which the
    cell's line does not name)."""
    spaces = frame_spaces(frame)
    spaces[:0] = [  # innermost first
        f.f_locals
        for f in frames_between(caller, frame, _CAPTURE_FRAMES)
        if f.f_globals is not f.f_locals
    ]
    tensors = pending_tensors(*search_order(spaces, names), max_items=20_000)
    return _graph_once(tensors, spaces)


_CAPTURE_FRAMES = 16  # functions below the tracked code whose locals a capture looks in


def _capture_tensor(tensor):
    return _graph_once([tensor]) if is_pending(tensor) else None


def _graph_once(tensors: list, spaces: list | None = None):
    if not tensors:
        return None
    own_hash = current_backend().graphs.hash(tensors)
    cost.count_new_graph(own_hash, tensors, spaces)  # once per new graph
    known = store.by_own_hash.get(own_hash)
    if known is None:
        known = graph(*tensors, hlo=False, frames=False)
    store.keep_own(own_hash, known)
    return known


# Autograd's entry points a thread waits in while autograd's own thread runs the backward.
_BACKWARD_CALLS = frozenset({"backward", "grad", "_engine_run_backward"})
_AUTOGRAD_FILES = ("torch/autograd/__init__.py", "torch/_tensor.py", "torch/autograd/graph.py")

_CONTEXTLIB = "contextlib.py"


def _call_inputs(frame, caller):
    """From torch_xla.compile's sync after the function (`frame`, its `_compile`): (a key for
    the function, its tensor inputs as (name, shape, dtype, shown), its name), where `shown`
    is the variable the calling line passed (see dynamo.passed_as); None when not found."""
    outer = innermost_frame(
        frame,
        lambda f: f.f_code.co_name == "inner" and f.f_code.co_filename.endswith(_CONTEXTLIB),
        5,  # the frame and the 4 outside it
    )
    if outer is None:
        return None
    values = outer.f_locals
    func, args, kwds = values.get("func"), values.get("args"), values.get("kwds")
    if func is None or not isinstance(args, tuple) or not isinstance(kwds, dict):
        return None
    target = getattr(func, "forward", func)
    code = getattr(target, "__code__", None)
    names = list(code.co_varnames[: code.co_argcount]) if code is not None else []
    if names and getattr(target, "__self__", None) is not None:
        names = names[1:]  # a bound method (a module's forward): `self` is not passed
    given = {(names[i] if i < len(names) else f"args[{i}]"): a for i, a in enumerate(args)}
    given.update(kwds)
    tensors = {n: v for n, v in given.items() if type(v) in _TENSOR_TYPES}
    shown = dynamo.passed_as(caller, tensors)
    inputs = tuple(
        (n, tuple(v.shape), str(v.dtype).replace("torch.", ""), shown.get(n, ""))
        for n, v in tensors.items()
    )
    name = getattr(func, "__name__", type(func).__name__)
    return (id(func), name), inputs, name


def _describe_change(before: tuple, after: tuple) -> str:
    """What differs between one input's (name, shape, dtype, shown) at two calls."""
    name, shape, dtype, shown = after
    if before[0] != name:
        return ""
    if before[2] != dtype:
        change = dynamo.ChangedInput(name, "dtype", None, before[2], dtype)
    elif len(before[1]) != len(shape):
        change = dynamo.ChangedInput(name, "rank", None, str(len(before[1])), str(len(shape)))
    else:
        dims = [i for i, (a, b) in enumerate(zip(before[1], shape, strict=True)) if a != b]
        if not dims:
            return ""
        dim = dims[0]
        change = dynamo.ChangedInput(name, "size", dim, str(before[1][dim]), str(shape[dim]))
    return change.describe(len(shape), shown)


def _nested(codes):
    """The code objects and, recursively, those of the functions they define."""
    for code in codes:
        yield code
        yield from _nested(c for c in code.co_consts if hasattr(c, "co_names"))


def _ops(codes, opnames) -> set[str]:
    """The names the code objects' instructions of `opnames` take."""
    return {
        op.argval for code in codes for op in dis.get_instructions(code) if op.opname in opnames
    }


def names_in(codes) -> tuple[str, ...]:
    """The variables code objects and the functions they define refer to by name (globals
    and locals), not the attributes they read (`t.view(...)` names no variable `view`),
    sorted. Read once per code objects (a script's module, tracked run after run: ~1 ms)."""
    codes = tuple(codes)
    key = tuple(map(id, codes))
    known = _names_of.get(key)
    if known is not None and all(a is b for a, b in zip(known[0], codes, strict=True)):
        return known[1]
    nested = list(_nested(codes))
    names = {n for code in nested for n in code.co_varnames} | _ops(nested, _WHOLE_NAMES)
    found = tuple(sorted(names))
    if len(_names_of) >= 64:  # bounded: a notebook compiles each cell's code anew
        _names_of.clear()
    _names_of[key] = (codes, found)  # the codes kept: their ids are not reused
    return found


_names_of: dict[tuple[int, ...], tuple] = {}


_BINDS = frozenset(("STORE_NAME", "STORE_GLOBAL", "STORE_DEREF"))
_INNER_BINDS = frozenset(("STORE_GLOBAL", "STORE_DEREF"))  # a defined function's, in its caller
_CO_OPTIMIZED = 0x0001  # a function's code: its variables are its locals


def names_watched(codes, namespace: dict) -> tuple[str, ...]:
    """The names whose tensors' shapes the tracked code's watched lines compare: those it
    binds (see `names_bound`), and those it reads as a whole name (not an attribute) that
    are not bound to a module, function or class in `namespace` (a batch a helper of an
    earlier cell assigns with `global`). Attribute names and the modules and functions a
    cell reads are most of its names, none a tensor: comparing them all cost ~20 us a sync."""
    read = _ops(_nested(c for c in codes if not c.co_flags & _CO_OPTIMIZED), _READS)
    value = lambda n: namespace[n] if n in namespace else getattr(builtins, n, None)  # noqa: E731
    kept = {n for n in read if not isinstance(value(n), _NOT_TENSORS)}
    return tuple(sorted(names_bound(codes) | kept))


def names_bound(codes) -> set[str]:
    """Names a code object binds in the frame that runs it (assignments, loop targets,
    imports; a function's every local), and those the functions it defines bind there
    (`global`, and the closure cells they share)."""
    names: set[str] = set()
    for code in codes:
        if code.co_flags & _CO_OPTIMIZED:
            names.update(code.co_varnames, code.co_cellvars)
        names |= _ops([code], _BINDS)
        names |= _ops(_nested(c for c in code.co_consts if hasattr(c, "co_names")), _INNER_BINDS)
    return names


_READS = frozenset(("LOAD_NAME", "LOAD_GLOBAL"))
_WHOLE_NAMES = _READS | {
    "STORE_NAME",
    "DELETE_NAME",
    "STORE_GLOBAL",
    "LOAD_DEREF",
    "STORE_DEREF",
    "LOAD_CLASSDEREF",
    "LOAD_FROM_DICT_OR_GLOBALS",
    "LOAD_FROM_DICT_OR_DEREF",
}
_NOT_TENSORS = (type(logging), type(names_bound), type(len), type)


def frame_of(frame) -> Frame | None:
    """A Python frame's place as a Frame (None for None)."""
    if frame is None:
        return None
    code = frame.f_code
    return Frame(code.co_filename, frame.f_lineno, code.co_name)


def _key(frame: Frame) -> tuple[str, int]:
    return (frame.file, frame.line)


def _plumbing(path: str, function: str) -> bool:
    return function in _PLUMBING_FUNCTIONS or path.replace("\\", "/").endswith(_PLUMBING_FILES)


def _entry_points_for(counter: str) -> list[tuple[str, str]]:
    """Python callables a fallback counter's op may come from: "aten::_unique2" ->
    torch.unique; "aten::median.dim_values" -> torch.median and Tensor.median."""
    base = counter.split("::", 1)[-1].split(".", 1)[0].strip("_")
    if base.endswith("_backward"):  # autograd calls it from C++, inside backward()
        return [("autograd", "backward")]  # Tensor.backward calls it
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
    "upsample_nearest1d": "F.interpolate",
    "upsample_nearest2d": "F.interpolate",
    "upsample_nearest3d": "F.interpolate",
    "upsample_bilinear2d": "F.interpolate",
    "isin": "torch.isin",
}

# Ops torch_xla lowers on a TPU and runs on the CPU on any other device: their lowering is a
# custom call only the TPU backend has (torch_xla 2.9, torch_xla/csrc/aten_xla_type.cpp:
# XLANativeFunctions::upsample_bilinear2d_backward and upsample_nearest2d_backward fall back
# where the device is not a TPU). Their fallbacks on XLA:CPU say nothing of the chip.
_LOWERED_ON_TPU = frozenset({"upsample_bilinear2d_backward", "upsample_nearest2d_backward"})
ON_TPU_LOWERED = (
    "on a TPU torch_xla lowers this op and it stays on the device: the fallback is XLA:CPU's, "
    "nothing to change for a TPU"
)


def lowered_on_tpu(counter: str) -> bool:
    """Whether a fallback counter's op falls back only off a TPU ("aten::upsample_nearest2d_
    backward"): the judgement for a TPU leaves it out."""
    return counter.split("::", 1)[-1].split(".", 1)[0] in _LOWERED_ON_TPU


# The Python entry point (probe.FALLBACK_ENTRY_POINTS) whose call makes an op whose backward
# falls back, by the op: "upsample_nearest2d" (from "aten::upsample_nearest2d_backward").
_FORWARDS_OF = {
    "upsample_nearest1d": "interpolate",
    "upsample_nearest2d": "interpolate",
    "upsample_nearest3d": "interpolate",
    "upsample_bilinear2d": "interpolate",
}
_FORWARDS = frozenset(_FORWARDS_OF.values())


def backward_base(counter: str) -> str:
    """The forward op of a backward's fallback counter ("aten::upsample_nearest2d_backward"
    -> "upsample_nearest2d"); "" for other counters."""
    base = counter.split("::", 1)[-1].split(".", 1)[0].strip("_")
    return base.removesuffix("_backward") if base.endswith("_backward") else ""


def user_op(counter: str) -> str:
    """The op the user wrote for a fallback counter: "aten::_unique2" -> "torch.unique"."""
    if backward_base(counter) in USER_OPS:
        return f"the backward of {USER_OPS[backward_base(counter)]}"
    base = counter.split("::", 1)[-1].split(".", 1)[0].strip("_")
    return USER_OPS.get(base, f"aten::{counter.split('::', 1)[-1]}")
