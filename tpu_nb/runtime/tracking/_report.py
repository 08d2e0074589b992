"""`track()`: what one piece of work cost on XLA — metrics, compile events, recompilations."""

from __future__ import annotations

import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import FrozenInstanceError, dataclass, field, replace
from typing import Any, Literal

from tpu_nb.runtime.backend import Backend
from tpu_nb.runtime.backend import current as current_backend
from tpu_nb.runtime.frame import frame_variables
from tpu_nb.runtime.metrics._compile_log import CompileEvent, compile_log
from tpu_nb.runtime.metrics._counters import MetricsDelta, on_reset, snapshot
from tpu_nb.runtime.tracking import _anatomy as anatomy
from tpu_nb.runtime.tracking import _cost as cost
from tpu_nb.runtime.tracking import _dynamo as dynamo
from tpu_nb.runtime.tracking import _policy as policy
from tpu_nb.runtime.tracking import _provenance as provenance
from tpu_nb.runtime.tracking._anatomy import Anatomy
from tpu_nb.runtime.tracking._cost import StepCost
from tpu_nb.runtime.tracking._dynamo import DynamoCompile
from tpu_nb.runtime.tracking._oom import OutOfMemory, out_of_memory
from tpu_nb.runtime.tracking._pending import EarlierWork, PendingWork, find_earlier, find_pending
from tpu_nb.runtime.tracking._policy import Judgement, describe_pattern
from tpu_nb.runtime.tracking._probe import own_sync
from tpu_nb.runtime.tracking._probe import probe as run_probe
from tpu_nb.runtime.tracking._provenance import Occurrence
from tpu_nb.runtime.units import format_seconds

# (file, line) of the user code that triggered a compile -> the compile event of each distinct
# graph it compiled, in order, over the life of the process (bounded: the most recently
# active lines, the first graphs and the latest of each).
_graphs_by_line: OrderedDict[tuple[str, int], list[CompileEvent]] = OrderedDict()
_MAX_LINES, _MAX_GRAPHS_PER_LINE = 256, 32
_last: RunReport | None = None


@on_reset
def _forget() -> None:
    """reset_metrics(): tpu_nb's own history goes with the runtime's counters."""
    global _last
    _graphs_by_line.clear()
    provenance.line_graphs.clear()
    _last = None


def captured_graph(event: CompileEvent):
    """The pending graph captured just before `event`'s graph compiled, if tpu_nb captured
    it (a runtime Graph), else None."""
    return provenance.graphs_by_hash.get(event.graph_hash)


@dataclass(frozen=True)
class LineFinding:
    """Something a line did, with what to do about it."""

    line: int  # 1-based line in the source; 0 when not on a line of it
    kind: str  # "compile", "warm-up", "variant", "earlier", "recompile", "growing",
    # "fallback", "host-read"
    what: str  # e.g. "aten::histc ran on the CPU", "graph 3a4b... compiled: ..."
    hint: str = ""  # what to do; findings of one kind on one topic share the same text
    place: str = ""  # where, when not a line: "end of cell" (--sync, work left pending)
    count: int = 1  # how many times it happened (host reads, fallbacks, graphs)
    via: str = ""  # the library function between the line and the event, e.g.
    # "torch/optim/adamw.py:480 _single_tensor_adamw"
    seconds: float | None = None  # time it cost where known (a compile's compile time)
    order: int = 0  # when it first happened in the run (findings sort by it)
    changed: tuple[str, ...] = ()  # recompiles: what differs from the line's earlier graph
    pattern: str = ""  # compiles: the line's compiles over the run, in one sentence
    progression: str = ""  # compiles: one dimension changing across the line's graphs


@dataclass
class RunReport:
    """What a tracked run did on XLA. Filled in when the `track()` block exits, also on error;
    from then on frozen (assigning a field raises dataclasses.FrozenInstanceError). While the
    run is tracked, `anatomy` is the live collector of its steps."""

    name: str | None = None
    wall_seconds: float = 0.0  # includes the device wait (and tpu_nb's sync, if asked for)
    metrics: MetricsDelta = field(default_factory=MetricsDelta)
    compile_events: list[CompileEvent] = field(default_factory=list)
    error: BaseException | None = None
    waited: bool = False  # device ops waited for: execute_seconds is complete
    # tpu_nb ran a sync of its own at the end (track(sync=True), %%on_tpu --sync), and it
    # had work to run; its compiles and executions are counted in this report.
    synced_at_end: bool = False
    # Work left pending at the end (not run, not counted here: the next sync or value read
    # runs it and is charged with it); None when nothing was left (see _pending.py).
    pending: PendingWork | None = None
    # Work earlier code left pending, found as the run started: the run's first sync runs it
    # with the run's own first step (see _pending.py: EarlierWork).
    earlier: EarlierWork | None = None
    compile_analysis: bool = False  # False: compile causes unknown (setup() not called)
    # Lines that compiled more than one distinct graph (in this run or before): graph hashes.
    recompilations: dict[tuple[str, int], tuple[str, ...]] = field(default_factory=dict)
    # Value reads and CPU fallbacks, each placed on the line that led to it (with the library
    # function in between), aggregated per line, in time order.
    occurrences: tuple[Occurrence, ...] = ()
    capture_seconds: float = 0.0  # spent capturing pending graphs (recompile diffs)
    record_errors: int = 0  # recording hooks that failed (logged by "tpu_nb")
    # Why some compile causes of this run are unknown (the compile log was deleted, replaced,
    # truncated or could not be written), or "" when the log holds them all.
    compile_log_problem: str = ""
    # Set by %%on_tpu: the findings placed on the cell's lines, its source and --max-graphs,
    # so the report shows the same whether displayed by the magic or returned by -o.
    findings: tuple[LineFinding, ...] = ()
    source: str = ""
    allowed_graphs: int = 1
    complete: bool = False
    # Where each step's time went, and the verdict (tpu_nb.runtime.tracking._anatomy), once
    # complete (needs record=True). While the run is tracked, the live Collector stands in.
    anatomy: Anatomy | None = None
    syncs: int = 0  # torch_xla.sync calls the tracked code made (recorded runs)
    # (file, line) of the tracked code -> the syncs and device reads it made (recorded runs)
    line_calls: dict[tuple[str, int], int] = field(default_factory=dict)
    # What the facts call for: each compile's kind, each line's pattern, which reads repeat
    # per step, the steady state's verdict (tracking._policy.Judgement).
    judgement: Judgement | None = None
    # What Dynamo compiled (torch.compile): tracking._dynamo.DynamoCompile, in order.
    compiled: tuple[DynamoCompile, ...] = ()
    # What a steady step costs on the chip the run is judged for (a TPU, or the target
    # elsewhere): FLOPs, bytes, memory fit, and MFU or the projected device time
    cost: StepCost | None = None
    # A RESOURCE_EXHAUSTED the run failed with, read into its facts (the out-of-memory card)
    out_of_memory: OutOfMemory | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_sealed"):
            raise FrozenInstanceError(
                f"cannot assign to field {name!r}: a RunReport is frozen once its run has "
                "ended. Fix: dataclasses.replace(report, ...) makes a changed copy."
            )
        object.__setattr__(self, name, value)

    def _seal(self) -> None:
        self.__dict__["_sealed"] = True

    @property
    def steps(self) -> tuple:
        """The run's steps (anatomy.StepRecord, one per sync); () without an anatomy."""
        return getattr(self.anatomy, "steps", ())

    @property
    def recompiled(self) -> bool:
        """Whether a line kept compiling new graphs after its warm-up (or its graph grows)."""
        return bool(self.recompiled_lines())

    def recompiled_lines(self, allowed: int = 1) -> dict[tuple[str, int], int]:
        """Lines that kept compiling new graphs in this run (beyond their warm-up, not a
        bounded set then cached), with the graphs they compiled; `allowed` > 1 accepts that
        many graphs per line (deliberate bucketing, --max-graphs)."""
        judgement = self.judgement
        if judgement is None:
            return {}
        return {
            key: p.graphs
            for key, p in judgement.lines.items()
            if p.flagged and (p.kind == "growing" or p.graphs > allowed)
        }

    def summary(self) -> str:
        """One line: wall time and the XLA figures that matter."""
        head = f"{self.name}: " if self.name else ""
        line = f"{head}{format_seconds(self.wall_seconds)} wall, {self.metrics.summary()}"
        if self.recompiled:
            line += f", RECOMPILED at {len(self.recompiled_lines())} line(s)"
        if self.error is not None:
            line += f", failed: {type(self.error).__name__}"
        return line

    def __str__(self) -> str:
        lines = [self.summary(), str(self.metrics)]
        if self.compile_events:
            lines.append("  compiles:")
            lines += [f"    {e.describe()}" for e in self.compile_events]
        elif self.metrics.compiles and not self.compile_analysis:
            lines.append(
                "  compile causes unknown: call tpu_nb.setup() before the first "
                "compile to record them"
            )
        if self.compile_log_problem:
            lines.append(f"  compile causes unknown: {self.compile_log_problem}")
        lines += dynamo.report_lines(self.compiled)
        if self.synced_at_end:
            lines.append("  tpu_nb synced at the end (sync=True): that work is counted here")
        if self.pending is not None:
            lines.append(f"  {self.pending.summary()}")
        judgement = self.judgement
        for (file, line), pattern in judgement.lines.items() if judgement else ():
            if pattern.graphs > 1 or pattern.flagged:
                lines.append(f"  {file}:{line}: {describe_pattern(pattern)}")
        verdict = getattr(self.anatomy, "verdict", None)
        if verdict is not None:
            if judgement is not None and judgement.note:  # what the verdict leaves out
                lines.append(f"  {judgement.note}")
            lines.append(f"  verdict: {verdict}")
        elif judgement is not None and judgement.note:
            lines.append(f"  no verdict: {judgement.note}")
        if self.cost is not None and self.steps:
            lines.append("  cost per step:")
            lines += [f"    {line}" for line in self.cost.lines()]
        if self.out_of_memory is not None:
            lines += [f"  {line}" for line in self.out_of_memory.lines()]
        return "\n".join(lines)


def earlier_graph(event: CompileEvent) -> CompileEvent | None:
    """The compile event of the graph the same line compiled before `event`'s, if any."""
    frame = event.user_frame
    graphs = _graphs_by_line.get((frame.file, frame.line), []) if frame else []
    hashes = [g.graph_hash for g in graphs]
    if event.graph_hash in hashes and hashes.index(event.graph_hash) > 0:
        return graphs[hashes.index(event.graph_hash) - 1]
    return None


def _note_recompilations(events: list[CompileEvent]) -> dict[tuple[str, int], tuple[str, ...]]:
    """Record the graphs of `events` by line (the process's history, for what changed since
    a line's previous graph); return the lines with more than one, and their hashes."""
    out = {}
    for event in events:
        frame = event.user_frame
        if frame is None or not event.graph_hash:
            continue
        key = (frame.file, frame.line)
        graphs = _graphs_by_line.setdefault(key, [])
        _graphs_by_line.move_to_end(key)
        if all(event.graph_hash != g.graph_hash for g in graphs):
            graphs.append(event)
            if len(graphs) > _MAX_GRAPHS_PER_LINE:  # keep the first two and the latest
                del graphs[2]
        while len(_graphs_by_line) > _MAX_LINES:
            _graphs_by_line.popitem(last=False)
        if len(graphs) > 1:
            out[key] = tuple(g.graph_hash for g in graphs)
    return out


class _SyncWatch:
    """Tells whether XLA work is pending at the end of a block, without a sync.

    Any sync — even one with nothing to run — waits for the execution in flight, which on a
    training loop ends the overlap of device work with the next step's tracing (~40 % of a
    1.3 ms step). Every lazy op creates an XLA tensor (CreateXlaTensor, in-place ops too); a
    step closure, renewed at each sync while the block runs, records that counter at the sync.
    Nothing pending means no tensor was created since the last sync.
    """

    def __init__(self, runtime: Backend):
        self._runtime = runtime
        self._value = runtime.counters.reader()
        self._created = runtime.counters.facts.tensors_created
        self.active = True
        self.at_last_sync = self._value(self._created)  # entry: as if just synced
        self._arm()

    def _arm(self) -> None:
        self._runtime.syncs.after_next(self._on_sync)

    def _on_sync(self) -> None:
        if self.active:
            self.at_last_sync = self._value(self._created)
            self._arm()

    def pending(self) -> bool:
        """Whether the block created XLA work after its last sync (or at all, if none)."""
        self.active = False
        return self._value(self._created) != self.at_last_sync


class track:
    """Measure what the block does on XLA; the yielded RunReport is complete on exit.

        with tpu_nb.track("epoch") as report:
            ...
        print(report)

    sync: False (the default) leaves work the block did not run pending, as the same code
        without tpu_nb does: the report says what is left (`report.pending`) and the next
        sync or value read runs it and counts it. True runs it at the end with a sync of
        tpu_nb's own (skipped when the block's own last sync left nothing pending), counted
        in this report and named as tpu_nb's.
    wait: wait for the device to finish, so wall and execute times are complete. Waiting
        ends the overlap of device execution with the next step's tracing; around every step
        of a loop use wait=False (executions still in flight are counted by the next report).
    record: record where each compile, value read and CPU fallback came from (the block's own
        line, and the library function in between; see tpu_nb.runtime.tracking._provenance).
        Costs one or two counter reads per sync and per read; off, findings fall back to
        torch_xla's compile log (8 frames).
    code: code objects that are the tracked code (a notebook cell's compiled code); by
        default the code of the function that entered the block.
    namespace: where the tracked code's variables live, to name what is left pending: a
        dict (a notebook's user namespace) or a frame (its locals, then its globals); by
        default the frame of the function that entered the block.
    then: called with the complete report just before it is frozen (`on_tpu()` adds its
        findings there).
    assigned_in: names where a variable was last assigned ("In [12]"), for the work earlier
        cells left pending (found when `namespace` is a dict).
    """

    __slots__ = (
        "_report",
        "_sync",
        "_wait",
        "_log",
        "_offset",
        "_watch",
        "_before",
        "_start",
        "_record",
        "_code",
        "_recorder",
        "_namespace",
        "_frame",
        "_dynamo",
        "_then",
        "_assigned_in",
    )

    def __init__(
        self,
        name: str | None = None,
        *,
        sync: bool = False,
        wait: bool = True,
        record: bool = True,
        code: tuple = (),
        namespace: Any = None,
        then: Callable[[RunReport], None] | None = None,
        assigned_in: Callable[[str], str | None] | None = None,
    ):
        self._report = RunReport(name=name)
        self._assigned_in = assigned_in
        self._then = then
        self._sync, self._wait, self._record, self._code = sync, wait, record, tuple(code)
        self._namespace = namespace
        self._recorder: provenance.Recorder | None = None
        self._frame: Any = None

    def __enter__(self) -> RunReport:
        if isinstance(self._namespace, dict):  # a notebook's: what earlier cells left pending
            self._report.earlier = find_earlier(self._namespace, self._assigned_in)
        self._log = compile_log()
        self._offset = self._log.size() if self._log is not None else 0
        self._report.compile_analysis = self._log is not None
        self._watch = _SyncWatch(current_backend())
        caller = None if self._code else sys._getframe(1)
        self._frame = caller if self._namespace is None else None
        self._dynamo = None
        run_probe().begin_run(self)
        try:
            if self._record:
                recorder = self._recorder = provenance.Recorder(
                    root_codes=self._code, root_frame=caller, log=self._log
                )
                recorder.start()
                # the live collector, until _complete() puts the run's Anatomy in its place
                object.__setattr__(self._report, "anatomy", anatomy.Collector().start(recorder))
            self._dynamo = dynamo.Watch(self._recorder, self._log).start()
            self._before = snapshot()
        except BaseException:  # never leave the hooks installed
            self._release()
            raise
        self._start = time.perf_counter()
        return self._report

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        report = self._report
        try:
            try:
                if exc is None:
                    self._finish_work(report)
            except BaseException as failure:  # the end sync or wait failed: the run failed
                report.error = failure
                self._complete(report)
                raise
            if exc is not None:
                report.error = exc
                if self._watch is not None:
                    self._watch.active = False
                if self._wait and not isinstance(exc, KeyboardInterrupt):
                    _quiet_wait(report)
            self._complete(report)
        finally:
            # Whatever happened above (an interrupt while the report was built), the hooks go.
            self._release()
        return False

    def _release(self) -> None:
        """Remove everything the run installed; safe to call at any point, and again."""
        collector = self._report.anatomy
        try:
            if isinstance(collector, anatomy.Collector):
                collector._unhook()
        finally:
            try:
                if self._recorder is not None:
                    self._recorder.stop()
            finally:
                try:
                    if self._dynamo is not None:
                        self._dynamo.stop()
                finally:
                    run_probe().end_run(self)

    def _finish_work(self, report: RunReport) -> None:
        if self._watch is not None and self._watch.pending():
            if self._sync:
                report.synced_at_end = True
                # tpu_nb's own sync: not a step of the user's
                with own_sync("end", self._recorder):
                    current_backend().syncs.function()()
            else:
                report.pending = self._left_pending()
        if self._wait:
            current_backend().syncs.wait()
            report.waited = True

    def _left_pending(self) -> PendingWork | None:
        """What the block left pending, named by the variables of its code that hold it."""
        frame, self._frame = self._frame, None
        try:
            codes = self._code or ((frame.f_code,) if frame is not None else ())
            names = tuple(sorted(provenance.names_in(c for c in codes if c is not None)))
            where = self._namespace if self._namespace is not None else frame
            if isinstance(where, dict):
                return find_pending([where], names)
            if where is not None:  # a frame
                return find_pending([frame_variables(where), where.f_globals], names)
        except Exception:  # describing it must never fail the run
            logging.getLogger("tpu_nb").debug("finding the work left pending", exc_info=True)
        return None

    def compile_events_so_far(self) -> list[CompileEvent]:
        """The run's compile events until now, placed on lines as its report will place
        them: `max_graphs` counts a line's graphs with them, so the error and the report
        name the same line and the same count."""
        if self._log is None:
            return []
        recording = self._recorder.recording if self._recorder is not None else None
        return self._placed(recording, self._dynamo.so_far() if self._dynamo else ())

    def _placed(self, recording, compiled) -> list[CompileEvent]:
        assert self._log is not None
        events = self._log.events_since(self._offset)
        if recording is not None:
            events = _place(events, recording.anchors, self._offset)
            events = _mark_own_end(events, recording.own_end)
        return dynamo.place(events, compiled)

    def _complete(self, report: RunReport) -> None:
        self._frame = None  # no reference to the caller's frame outlives the block
        global _last
        report.wall_seconds = time.perf_counter() - self._start
        if isinstance(report.anatomy, anatomy.Collector):
            report.anatomy = report.anatomy.finish()
        recording = self._recorder.stop() if self._recorder is not None else None
        report.compiled = self._dynamo.stop() if self._dynamo is not None else ()
        report.metrics = snapshot().since(self._before)
        if self._log is not None and report.metrics.compiles:
            report.compile_log_problem = (
                self._log.problem_since(self._offset, report.metrics.compiles) or ""
            )
            events = self._placed(recording, report.compiled)
            report.compile_events = events
            report.recompilations = _note_recompilations(dynamo.functions_graphs(events))
            report.recompilations.update(dynamo.recompilations(events, report.compiled))
        if recording is not None:
            report.occurrences = tuple(
                sorted(recording.occurrences.values(), key=lambda o: o.order)
            )
            report.capture_seconds = recording.capture_seconds
            report.record_errors = recording.hook_errors
            report.syncs, report.line_calls = recording.syncs, dict(recording.line_calls)
            report.cost = _step_cost(recording)
        if report.error is not None:
            report.out_of_memory = out_of_memory(report.error)
        _judge(report)
        report.complete = True
        _last = report
        try:
            if self._then is not None:
                self._then(report)
        finally:
            report._seal()


def _step_cost(recording) -> StepCost | None:
    try:
        return cost.step_cost(
            recording.line_graphs, recording.line_calls, recording.syncs, recording.live_tensors
        )
    except Exception:  # a bug in the cost must not cost the user the run's report
        logging.getLogger("tpu_nb").debug("tpu_nb: the step's cost failed", exc_info=True)
        return None


def _judge(report: RunReport) -> None:
    """The policy's judgement; the anatomy's verdict becomes the steady state's."""
    try:
        report.judgement = policy.judge_run(report)
    except Exception:  # a bug in the policy must not cost the user the run's report
        logging.getLogger("tpu_nb").debug("tpu_nb: judging the run failed", exc_info=True)
        return
    if report.judgement.cost is not None:
        report.cost = report.judgement.cost
    if isinstance(report.anatomy, anatomy.Anatomy):
        judged = report.judgement
        # the host lines shown are those of the steps the verdict is about
        # (when the verdict left the warm-up out, never the whole run's: too few samples
        # of the steady steps name no line)
        left_out = 0 < judged.steady_steps < len(report.anatomy.steps)
        lines = judged.steady_lines if left_out else report.anatomy.host_lines
        report.anatomy = replace(report.anatomy, verdict=judged.verdict, host_lines=lines)


def _place(events: list[CompileEvent], anchors, offset: int) -> list[CompileEvent]:
    """Give each compile event the site of the sync or read it happened in.

    An anchor's blocks are those written between the previous anchor and it; of those, the
    last `compiles` of a matching cause (a sync's compiles, or a value read's) are its own.
    A compile with no anchor (torch_xla.compile, dynamo, a thread) keeps the log's frames.
    """
    placed = list(events)
    start = offset
    for anchor in anchors:
        window = [
            i
            for i, e in enumerate(placed)
            if start <= e.offset < anchor.log_end
            and e.site is None
            and (e.kind == "value-access") == (anchor.kind != "sync")
        ]
        for i in window[-anchor.compiles :]:
            placed[i] = replace(
                placed[i],
                site=anchor.site,
                trigger=anchor.kind,
                step=anchor.step,
                call=anchor.call,
            )
        start = max(start, anchor.log_end)
    return placed


def _mark_own_end(events: list[CompileEvent], spans) -> list[CompileEvent]:
    """Compiles of the run's own end-of-run sync (the probe marked it tpu_nb's): trigger
    "end", so the findings name it as tpu_nb's, not the user's."""
    if not spans:
        return events
    return [
        replace(e, trigger="end")
        if e.site is None and any(start <= e.offset < end for start, end in spans)
        else e
        for e in events
    ]


def _quiet_wait(report: RunReport) -> None:
    try:
        current_backend().syncs.wait()
        report.waited = True
    except Exception:  # the run already failed; its own error is the one to show
        logging.getLogger("tpu_nb").debug(
            "waiting for the device after a failed run", exc_info=True
        )


def last_report() -> RunReport | None:
    """The most recently completed tracked run (the last `%%on_tpu` cell's report)."""
    return _last
