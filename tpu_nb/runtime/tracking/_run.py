"""`track()` and its `Run`: one tracked run, recorded, judged and reported in one direction.

    with tpu_nb.track("epoch") as report:
        train_one_epoch()
    print(report)

A `Run` holds everything one tracked run installs and records: the recorder of syncs, reads
and fallbacks (tracking._provenance), the step anatomy's collector (tracking._anatomy), the
Dynamo watch (tracking._dynamo), the sync watch that tells whether work is left pending, and
the graph store the process keeps across runs (tracking._store). `max_graphs` and the live
monitor follow the run they are in through `current_run()`. When the block exits, the report
is built once, in one direction:

    facts (metrics, compile events placed on lines, recordings, steps)
      -> policy.judge(facts)                          (tracking._policy)
      -> findings(facts, judgement, source)           (tracking._attribution)
      -> the frozen RunReport the block was given, now complete.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field, fields, replace
from types import FrameType, MappingProxyType
from typing import Any, Literal

from tpu_nb.runtime.backend import Backend
from tpu_nb.runtime.backend import current as current_backend
from tpu_nb.runtime.frame import frame_variables
from tpu_nb.runtime.metrics._compile_log import CompileEvent, compile_log
from tpu_nb.runtime.metrics._counters import on_reset, snapshot
from tpu_nb.runtime.probe import Subscription, own_sync
from tpu_nb.runtime.probe import probe as run_probe
from tpu_nb.runtime.sources import caller
from tpu_nb.runtime.tracking import _anatomy as anatomy
from tpu_nb.runtime.tracking import _attribution as attribution
from tpu_nb.runtime.tracking import _cost as cost
from tpu_nb.runtime.tracking import _dynamo as dynamo
from tpu_nb.runtime.tracking import _policy as policy
from tpu_nb.runtime.tracking import _provenance as provenance
from tpu_nb.runtime.tracking._cost import StepCost
from tpu_nb.runtime.tracking._device_data import DeviceDataWatch
from tpu_nb.runtime.tracking._fused import FusedOptimizer, fused_optimizer
from tpu_nb.runtime.tracking._oom import out_of_memory
from tpu_nb.runtime.tracking._pending import (
    VALUE,
    EarlierWork,
    PendingWork,
    find_earlier,
    find_pending,
)
from tpu_nb.runtime.tracking._policy import Judgement
from tpu_nb.runtime.tracking._report import RunReport
from tpu_nb.runtime.tracking._store import store

log = logging.getLogger("tpu_nb")


@on_reset
def _forget_last() -> None:
    """reset_metrics(): the last report goes with the runtime's counters."""
    run_probe().last_run = None


def current_run() -> Run | None:
    """The tracked run now running (the innermost, when one runs inside another), if any."""
    runs = run_probe().active_runs
    return runs[-1] if runs else None


def last_report() -> RunReport | None:
    """The most recently completed tracked run's report (the last `%%on_tpu` cell's)."""
    run = run_probe().last_run
    return run.report if run is not None and run.report.complete else None


class _SyncWatch:
    """Tells whether XLA work is pending at the end of a block, without a sync.

    Any sync — even one with nothing to run — waits for the execution in flight, which on a
    training loop ends the overlap of device work with the next step's tracing (~40 % of a
    1.3 ms step). Every lazy op creates an XLA tensor (CreateXlaTensor, in-place ops too); the
    probe's sync event records that counter as each sync of the run returns (two counter reads,
    where a step closure renewed at each sync cost ~0.2 ms). Nothing pending means no tensor
    was created since the last sync. A sync the probe did not see (the step-marker counter
    moved: a reference to the unhooked function) leaves it unknown, counted as pending.
    """

    priority = 3  # after max_graphs' check: a sync it stopped never returned
    before = None

    def __init__(self, runtime: Backend, earlier: list | None = None):
        self._value = runtime.counters.reader()
        # weak references to the tensors earlier cells left pending: whether any is still
        # alive at the run's first sync, which then runs their work (None once looked)
        self._earlier = earlier or None
        self.earlier_joined: bool | None = None
        names = runtime.counters.facts
        self._created, self._syncs = names.tensors_created, names.syncs
        self.active = True
        self.seen = self._now()  # entry: as if just synced
        self._subscription: Subscription | None = run_probe().subscribe(self, ("sync",))

    def _now(self) -> tuple:
        return self._value(self._created), self._value(self._syncs)

    def after(self, event, state) -> None:
        if self.active:  # _now(), inlined: every sync passes here
            self.seen = self._value(self._created), self._value(self._syncs)
            if self._earlier is not None:  # the run's first sync
                self.earlier_joined = any(ref() is not None for ref in self._earlier)
                self._earlier = None

    def close(self) -> None:
        self.active = False
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            subscription.close()

    def pending(self) -> bool | None:
        """Whether the block created XLA work after its last sync (or at all, if none); None
        when a sync the probe did not see ran since (then the tensors themselves tell)."""
        self.close()
        created, syncs = self._now()
        return None if syncs != self.seen[1] else created != self.seen[0]


@dataclass(eq=False, repr=False, kw_only=True)
class Run:
    """One tracked run (see the module docstring), entered as a context manager: its options
    are its fields, which `track` (its public name) describes.

    report: the RunReport the block was given; empty until the run ends, then complete.
    recorder, collector, dynamo: what records the run (None when not recording).
    """

    name: str | None = field(default=None, kw_only=False)
    sync: bool = False
    wait: bool = True
    record: bool = True
    code: tuple = ()
    namespace: Any = None
    assigned_in: Any = None
    source: str | None = None
    filename: str | None = None
    allowed_graphs: int = 1

    def __post_init__(self) -> None:
        self.report = RunReport(name=self.name)
        self.code = tuple(self.code)
        self.recorder: provenance.Recorder | None = None
        self.collector: anatomy.Collector | None = None
        self.datasets: DeviceDataWatch | None = None
        self.dynamo: dynamo.Watch | None = None
        self._frame: Any = None
        self._log: Any = None
        self._offset = 0
        self._watch: _SyncWatch | None = None
        self._before: Any = None
        self._start = 0.0
        self._earlier: EarlierWork | None = None
        self._held: cost.Residency | None = None  # what the tracked code held at its end
        self.value: Any = None  # the block's value (a cell's last expression), set by its runner

    def __enter__(self) -> RunReport:
        self.begin(None if self.code else caller())
        return self.report

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        self.end(exc)
        return False

    # -- begin and end -------------------------------------------------------------------------

    def begin(self, caller) -> None:
        earlier_tensors: list = []
        if isinstance(self.namespace, dict):  # a notebook's: what earlier cells left pending
            self._earlier = find_earlier(self.namespace, self.assigned_in, earlier_tensors)
        self._log = compile_log()
        self._offset = self._log.size() if self._log is not None else 0
        if isinstance(self.namespace, FrameType):  # held only while the block runs
            self._frame, self.namespace = self.namespace, None
        else:
            self._frame = caller if self.namespace is None else None
        run_probe().begin_run(self)
        try:
            self._watch = _SyncWatch(current_backend(), earlier_tensors)
            if self.record:
                recorder = self.recorder = provenance.Recorder(
                    root_codes=self.code, root_frame=caller, log=self._log
                )
                recorder.start()
                self.collector = anatomy.Collector().start(recorder)
                self.datasets = DeviceDataWatch().start()
            self.dynamo = dynamo.Watch(self.recorder, self._log).start()
            self._before = snapshot()
        except BaseException:  # never leave the hooks installed
            self.release()
            raise
        self._start = time.perf_counter()

    def end(self, exc: BaseException | None) -> None:
        """The block ended (with `exc`, or None): finish its work as asked, and complete the
        report. Re-raises a failure of tpu_nb's own end sync or wait (the run failed)."""
        synced, pending, waited = False, None, False
        sampler = self.collector.sampler if self.collector is not None else None
        if sampler is not None:  # the tracked code has ended: tpu_nb's end sync and wait below
            sampler.stop()  # are no line's host time (a `with track():` line's, in a script)
        self._held = self._held_at_end()
        try:
            if exc is None:
                try:
                    synced, pending, waited = self._finish_work()
                except BaseException as failure:  # the end sync or wait failed: the run failed
                    self._complete(failure, synced, pending, waited)
                    with contextlib.suppress(AttributeError, TypeError):  # a C type's instance
                        failure.tpu_nb_at_end = True  # type: ignore[attr-defined]
                    raise
            elif self.wait and not isinstance(exc, KeyboardInterrupt):
                try:
                    current_backend().syncs.wait()
                    waited = True
                except Exception:  # the run already failed; its own error is the one to show
                    log.debug("waiting for the device after a failed run", exc_info=True)
            self._complete(exc, synced, pending, waited)
        finally:
            # Whatever happened above (an interrupt while the report was built), the hooks go.
            self.release()

    def release(self) -> None:
        """Remove everything the run installed; safe to call at any point, and again."""
        with contextlib.ExitStack() as each:  # each step runs, whatever the ones before raised
            each.callback(run_probe().end_run, self)
            if self.dynamo is not None:
                each.callback(self.dynamo.stop)
            if self.recorder is not None:
                each.callback(self.recorder.stop)
            if self._watch is not None:
                self._watch.close()
            if self.collector is not None:
                self.collector._unhook()
            if self.datasets is not None:
                self.datasets.stop()

    def _finish_work(self) -> tuple[bool, PendingWork | None, bool]:
        synced, pending = False, None
        left = self._watch.pending() if self._watch is not None else False
        if left is None:  # the counters cannot tell: the block's variables can
            pending = self._left_pending()
            left = pending is not None
        if left:
            if self.sync:
                synced, pending = True, None
                # tpu_nb's own sync: not a step of the user's
                with own_sync("end", self.recorder):
                    current_backend().syncs.function()()
            elif pending is None:
                pending = self._left_pending()
        if self.wait:
            current_backend().syncs.wait()
        return synced, pending, self.wait

    def _spaces(self) -> list[dict]:
        """The tracked code's variables: the notebook's namespace, or the frame's locals
        and then its globals (none once the frame is let go)."""
        where = self.namespace if self.namespace is not None else self._frame
        if isinstance(where, dict):
            return [where]
        return [frame_variables(where), where.f_globals] if where is not None else []

    def _left_pending(self) -> PendingWork | None:
        """What the block left pending, named by the variables of its code that hold it."""
        try:
            frame = self._frame
            codes = self.code or ((frame.f_code,) if frame is not None else ())
            names = provenance.names_in(c for c in codes if c is not None)
            spaces = self._spaces()
            value = self.value
            if value is not None and not any(s.get(n) is value for s in spaces for n in names):
                # a cell's value no variable holds (`conv1d(signal, edge)` on its last line):
                # its work is left pending too, until IPython shows it after the report
                spaces, names = [{VALUE: value}, *spaces], (VALUE, *names)
            return find_pending(spaces, names) if spaces else None
        except Exception:  # describing it must never fail the run
            log.debug("finding the work left pending", exc_info=True)
            return None
        finally:
            self._frame = None

    def _held_at_end(self) -> cost.Residency | None:
        """The parameters, gradients and optimizer state the tracked code holds as the block
        ends, when the run captured a graph whose step cost the report gives."""
        recording = self.recorder.recording if self.recorder is not None else None
        if recording is None or not recording.line_graphs:
            return None
        try:
            spaces = self._spaces()
            return cost.residency(spaces) if spaces else None
        except Exception:  # the report's memory line must never fail the run
            log.debug("tpu_nb: what the code holds at the end", exc_info=True)
            return None

    # -- while it runs ---------------------------------------------------------------------------

    def compile_events_so_far(self) -> list[CompileEvent]:
        """The run's compile events until now, placed on lines as its report will place
        them: `max_graphs` counts a line's graphs with them, so the error and the report
        name the same line and the same count."""
        if self._log is None:
            return []
        recording = self.recorder.recording if self.recorder is not None else None
        return self._placed(recording, self.dynamo.so_far() if self.dynamo else ())

    def _placed(self, recording, compiled) -> list[CompileEvent]:
        assert self._log is not None
        events = self._log.events_since(self._offset)
        if recording is not None:
            events = _place(events, recording.anchors, self._offset)
            events = _mark_own_end(events, recording.own_end)
        return dynamo.place(events, compiled)

    # -- the report, in one direction --------------------------------------------------------------

    def _complete(self, error, synced: bool, pending, waited: bool) -> None:
        self._frame = None  # no reference to the caller's frame outlives the block
        facts = self._facts(error, synced, pending, waited)
        judgement = _judge(facts)
        report = _judged(facts, judgement)
        if self.source is not None:
            found = attribution.findings(
                report, judgement, self.source, self.filename or "", self.allowed_graphs
            )
            report = replace(report, findings=found, source=self.source)
        _become(self.report, replace(report, complete=True))

    def _facts(self, error, synced: bool, pending, waited: bool) -> RunReport:
        """What the run did, as recorded: no judgement yet."""
        wall = time.perf_counter() - self._start
        steps = self.collector.finish() if self.collector is not None else None
        recording = self.recorder.stop() if self.recorder is not None else None
        compiled = self.dynamo.stop() if self.dynamo is not None else ()
        datasets = self.datasets.stop() if self.datasets is not None else ()
        metrics = snapshot().since(self._before)
        facts = RunReport(
            name=self.report.name,
            allowed_graphs=self.allowed_graphs,
            wall_seconds=wall,
            metrics=metrics,
            error=error,
            waited=waited,
            synced_at_end=synced,
            pending=pending,
            # rebound before the run's first sync: that work was dropped, not run here
            earlier=None
            if self._watch is not None and self._watch.earlier_joined is False
            else self._earlier,
            compile_analysis=self._log is not None,
            compiled=compiled,
            anatomy=steps,
            device_datasets=datasets,
            out_of_memory=out_of_memory(error) if error is not None else None,
            fused_optimizer=_fused(error),
        )
        if self._log is not None and metrics.compiles:
            # Compiles the run's CPU fallbacks forced inside autograd's backward: torch_xla
            # writes no cause for them, and the report names them as the fallback's.
            unlogged = (
                0 if recording is None else sum(o.compiles for o in recording.occurrences.values())
            )
            events = self._placed(recording, compiled)
            lines = store.note_compiles(dynamo.functions_graphs(events))
            lines.update(dynamo.recompilations(events, compiled))
            facts = replace(
                facts,
                compiled=dynamo.own_compiles(compiled, events),
                compile_events=tuple(events),
                recompilations=MappingProxyType(lines),
                compile_log_problem=self._log.problem_since(
                    self._offset, metrics.compiles - unlogged
                )
                or "",
            )
        if recording is not None:
            facts = replace(
                facts,
                occurrences=_occurrences(recording),
                capture_seconds=recording.capture_seconds,
                captures=recording.captures,
                record_errors=recording.hook_errors,
                syncs=recording.syncs,
                line_calls=MappingProxyType(_per_line(recording.site_calls)),
                site_calls=MappingProxyType(dict(recording.site_calls)),
                cost=_step_cost(recording, metrics, self._held, facts.compile_events),
            )
        return facts


class track(Run):
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
    assigned_in: names where a variable was last assigned ("In [12]"), for the work earlier
        cells left pending (found when `namespace` is a dict).
    source, filename: the tracked code's source and the file it was compiled as: the report
        then places its findings on the source's lines (`report.findings`).
    allowed_graphs: distinct graphs a line may compile without being flagged (--max-graphs).
    """


def _become(report: RunReport, complete: RunReport) -> None:
    """The report the block was given becomes the complete one: the one place a RunReport's
    fields are set after it was made (it was empty and incomplete until now)."""
    for f in fields(RunReport):
        object.__setattr__(report, f.name, getattr(complete, f.name))


def _per_line(site_calls: dict[tuple, int]) -> dict[tuple[str, int], int]:
    """A line's calls (syncs and device reads: the steps it took part in), summed over the
    sites below it."""
    lines: dict[tuple[str, int], int] = {}
    for site, calls in site_calls.items():
        lines[site[:2]] = lines.get(site[:2], 0) + calls
    return lines


def _occurrences(recording) -> tuple:
    """The run's reads and fallbacks, in order. Steps it happened in: at most the run's, the
    tail after the last step's sync (work a library's logging sync ran, no step's end) being
    no step of its own."""
    steps = recording.syncs
    return tuple(
        replace(o, steps=min(o.steps, steps)) if steps and o.steps > steps else o
        for o in sorted(recording.occurrences.values(), key=lambda o: o.order)
    )


def _step_cost(recording, metrics, held: cost.Residency | None, compiles: tuple) -> StepCost | None:
    try:
        counted = cost.step_cost(
            recording.steady_graphs(),
            recording.site_calls,
            recording.syncs,
            recording.live_tensors,
            held,
            sorted(recording.graphs),
            recording.graph_calls,
            compiles,
        )
        # the Dynamo bridge ran compiled functions' graphs: tpu_nb captured the rest
        return replace(counted, partial=metrics.compiled_code_executions > 0)
    except Exception:  # a bug in the cost must not cost the user the run's report
        log.debug("tpu_nb: the step's cost failed", exc_info=True)
        return None


def _fused(error: BaseException | None) -> FusedOptimizer | None:
    try:
        return fused_optimizer(error)
    except Exception:  # the user's objects it reads must not cost them the report
        log.debug("tpu_nb: reading the fused optimizer's error failed", exc_info=True)
        return None


def _judge(facts: RunReport) -> Judgement | None:
    try:
        return policy.judge(facts)
    except Exception:  # a bug in the policy must not cost the user the run's report
        log.debug("tpu_nb: judging the run failed", exc_info=True)
        return None


def _judged(facts: RunReport, judgement: Judgement | None) -> RunReport:
    """The facts with the policy's judgement: the steady state's verdict on the anatomy (the
    one verdict a report has), the host lines of the steps it is about, the step's cost."""
    if judgement is None:
        return facts
    a = facts.anatomy
    judged = replace(facts, judgement=judgement, cost=judgement.cost or facts.cost)
    if a is None:
        return judged
    # the host lines shown are those of the steps the verdict is about (when the verdict
    # left the warm-up out, never the whole run's: too few samples of the steady steps name
    # no line)
    left_out = 0 < judgement.steady_steps < len(a.steps)
    lines = judgement.steady_lines if left_out else a.host_lines
    if judgement.syncs_left_out:
        lines = tuple(h for h in lines if h.kind != "sync")
    return replace(judged, anatomy=replace(a, verdict=judgement.verdict, host_lines=lines))


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
                same_shapes=anchor.same_shapes,
                step_end=anchor.step_end,
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
