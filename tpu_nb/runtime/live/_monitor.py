"""Live monitoring while code runs: what the dashboard polls, as plain data.

`LiveMonitor.poll()` is called from a polling thread a couple of times a second. It reads the
runtime's counters and metric sample buffers directly (never the `metrics_report()` text),
the compile-cause log from where it stood when the monitor started, host memory from /proc and
the device's memory where the device reports it, and returns a `LiveState`: frozen data the
display layer draws. Nothing here imports IPython, ipywidgets or matplotlib.

Step times come from the runtime's own samples. `ExecuteTime` records, for each execution,
its duration and the wall-clock time it completed; the interval between the completions of
two consecutive steps is the step time as the device delivers it (device-synced: tracing,
compiling and executing all count, whichever bounds the loop). A step is one sync
(`MarkStep`); with k executions per sync (an `.item()` inside the loop adds one) a step spans
k completions. The sample buffer holds the last XLA_METRICS_SAMPLES executions (128 after
`setup()`), so between two polls of a fast loop only the most recent steps are measured: the
figures are a sample of each refresh window, never a stale or made-up value.

Recompilation alert: when one line of user code has compiled more than `alert_graphs`
distinct graphs, the alert says what differs between its last two graphs. Inside a tracked
run (%%on_tpu) the recorder has usually read the pending graph just before each of those
compiles (tracking._provenance keys them by the compile log's hash), and `Graph.diff` of the
two names the op, shape or dtype that changed. Otherwise, when that line is
a `torch_xla.sync()`, a `SyncProbe` (armed when the line reaches `alert_graphs` graphs)
captures the pending graph at the line's next syncs (`pending_graph` of what the calling
frame's variables reach) and `Graph.diff` names the op, shape or dtype that changed. The
compile log itself has no ops or shapes: otherwise (an `.item()` line, nothing capturable, or
a burst of compiles over before the poller saw it) the difference is derived from the two
compile-log blocks: input/output counts, sizes and causes, and the alert says so.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
import time
from collections import deque
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from tpu_nb.runtime.backend import current as current_backend
from tpu_nb.runtime.environment._device import device
from tpu_nb.runtime.errors import check_whole_number
from tpu_nb.runtime.graph._capture import frame_spaces, pending_graph, search_order
from tpu_nb.runtime.metrics._compile_log import (
    CompileEvent,
    CompileLog,
    Frame,
    compile_log,
    describe_difference,
)
from tpu_nb.runtime.metrics._counters import MetricsDelta, snapshot
from tpu_nb.runtime.probe import SyncEvent
from tpu_nb.runtime.sources import place_text, user_frame
from tpu_nb.runtime.tracking import (
    Anatomy,
    StepCost,
    current_run,
    graph_facts,
    last_report,
    line_growth,
    live_reads_cost_little,
    probe,
    progression,
    store,
)
from tpu_nb.runtime.tracking._dynamo import (
    frame_graph,
    function_of,
    guard_facts,
    inputs_sync,
)
from tpu_nb.runtime.tracking._libraries import NO_STEP_ROLES
from tpu_nb.runtime.tracking._store import add_graph
from tpu_nb.runtime.units import percentile

log = logging.getLogger("tpu_nb")
_EXECUTE_METRICS = ("ExecuteTime", "ExecuteReplicatedTime")
_RECENT_STEPS = 1024  # step intervals the median and p90 are taken over
_SERIES_POINTS = 1200  # chart points kept; older ones are merged pairwise beyond that
_SHOWN_COMPILES = 200  # compile events kept for the panel and the chart
# The step anatomy of a tracked run in progress costs a few ms to build (it grows with the
# steps kept, not the run): rebuilt only when a step ended since, and at most this share of
# the wall time (a 5 ms build: every 2.5 s), at least every _ANATOMY_MAX_GAP seconds.
_ANATOMY_DUTY = 0.002
_ANATOMY_MAX_GAP = 5.0


# -- memory -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryInfo:
    """Host memory of this process, and the device's where it reports it (bytes)."""

    host_rss: int | None
    host_peak: int | None
    device_used: int | None = None
    device_limit: int | None = None
    device_peak: int | None = None
    device_note: str = ""  # why there are no device figures, when there are none


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def host_rss() -> int | None:
    """Resident memory of this process in bytes (/proc on Linux; None where unknown)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def host_peak_rss() -> int | None:
    """Peak resident memory of this process in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class DeviceMemory:
    """The device's memory figures: `xm.get_memory_info` (TPU HBM), else tpu-info's metrics on
    a TPU VM (`TPU_RUNTIME_METRICS_PORTS`), else a note saying the device does not report
    memory (XLA:CPU). A device that said no is not asked again; figures are read at most once
    per `interval` seconds (tpu-info asks a gRPC server)."""

    def __init__(self, device: str, interval: float = 1.0):
        self.device, self.interval = device, interval
        self.note = ""
        self._via_tpu_info = False
        self._last: tuple[int | None, int | None, int | None] = (None, None, None)
        self._read_at = -float("inf")

    def read(self) -> tuple[int | None, int | None, int | None, str]:
        """(used, limit, peak) in bytes, each None where unknown, and the note."""
        if self.note:
            return None, None, None, self.note
        now = time.monotonic()
        if now - self._read_at < self.interval:
            return (*self._last, "")
        self._read_at = now
        failure = None
        if not self._via_tpu_info:
            try:
                memory = current_backend().devices.memory(self.device)
                self._last = (memory.used, memory.limit, memory.peak)
                return (*self._last, "")
            except Exception as exc:  # XLA:CPU: "UNIMPLEMENTED: GetAllocatorStats ..."
                failure = exc
            self._via_tpu_info = True
        # tpu-info's figures; when it does not answer, the last ones (a hiccup) if any
        self._last = _tpu_info_memory() or self._last
        if self._last != (None, None, None):
            return (*self._last, "")
        cpu = "CPU" in self.device.upper() or _pjrt() == "CPU"
        if cpu or failure is None or "UNIMPLEMENTED" in str(failure):
            self.note = f"the device does not report memory ({'XLA:CPU' if cpu else self.device})"
        else:
            self.note = f"device memory unavailable: {str(failure).splitlines()[0][:120]}"
        return None, None, None, self.note


def _pjrt() -> str:
    return os.environ.get("PJRT_DEVICE", "").upper()


def _tpu_info_memory() -> tuple[int, int, None] | None:
    """HBM used/total summed over this host's chips, from tpu-info (TPU VMs), if installed."""
    if _pjrt() != "TPU":
        return None
    try:
        from tpu_info import device as tpu_device
        from tpu_info import metrics as tpu_metrics

        chip_type, count = tpu_device.get_local_chips()
        if not chip_type or not count:
            return None
        usages = tpu_metrics.get_chip_usage(chip_type)
        return (sum(u.memory_usage for u in usages), sum(u.total_memory for u in usages), None)
    except Exception:
        log.debug("tpu-info could not read the chips' memory", exc_info=True)
        return None


# -- step times -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepPoint:
    """Step times measured in one refresh window, plotted at the step count it ended on."""

    step: int
    median: float  # seconds
    p90: float
    count: int  # intervals measured in the window


class StepClock:
    """Step intervals from execution completion times (see the module docstring)."""

    def __init__(self, start_wall: float):
        self._after = start_wall  # only executions that completed after this count
        self._totals = {name: None for name in _EXECUTE_METRICS}  # samples recorded so far
        self._tail: deque[float] = deque(maxlen=64)  # completion times of the last executions

    def new_intervals(self, per_step: int) -> list[float]:
        """Intervals (seconds) between step completions recorded since the last call."""
        metric = current_backend().counters.metric
        found = {name: metric(name) for name in _EXECUTE_METRICS}
        return self.feed(
            per_step, {n: (d.count, d.samples) for n, d in found.items() if d is not None}
        )

    def feed(self, per_step: int, readings: dict) -> list[float]:
        """The intervals in metric readings: name -> (samples recorded in total, the buffer's
        (completion time, duration) samples)."""
        fresh: list[float] = []
        gap = False
        for name, (total, samples) in readings.items():
            known = self._totals.get(name)
            if known is None or total < known:  # first read, or metrics were reset
                known = 0
            new = [ts for ts, _ in samples if ts > self._after]
            # The buffer keeps only the last samples: more completions than it shows means
            # executions in between were not seen, so no interval may span them.
            if known and total - known > len(new):
                gap = True
            self._totals[name] = total
            fresh += new
        if not fresh:
            return []
        fresh.sort()
        if gap:
            self._tail.clear()
        self._after = fresh[-1]
        out = []
        for ts in fresh:
            if len(self._tail) >= per_step:
                out.append(ts - self._tail[-per_step])
            self._tail.append(ts)
        return out


# -- compile events and the recompilation alert -----------------------------------------------


@dataclass(frozen=True)
class LiveCompile:
    """One graph compiled while the monitor ran."""

    index: int  # 1, 2, ... in this session
    step: float  # about when: the step count it happened at
    seconds: float | None  # its compile time (CompileTime), when matched
    event: CompileEvent | None  # cause, graph hash, frames; None without compile analysis

    @property
    def place(self) -> Frame | None:
        return self.event.user_frame if self.event is not None else None


@dataclass(frozen=True)
class RecompilationAlert:
    """One line compiled more distinct graphs than allowed."""

    place: Frame
    graphs: tuple[str, ...]  # the line's distinct graph hashes, in order
    limit: int
    differs: tuple[str, ...]  # what differs between the last two graphs, line by line
    # "recorded" (the tracked run's graphs of these two compiles, diffed), "graphs" (the sync
    # probe's captures at the line's next syncs, diffed), "Dynamo" (the guard Dynamo saw
    # fail) or "compile log"
    source: str
    # The line has run at least two steps since its last new graph: a bounded set of graphs,
    # each compiled once, then cached (buckets), not a recompilation going on.
    settled: bool = False
    growing: bool = False  # each graph adds the same ops: no sync cuts the step's graph

    def describe(self) -> str:
        compiled = f"{place_text(self.place)} compiled {len(self.graphs)}"
        if self.settled:
            return f"{compiled} distinct graphs, each once, then ran cached"
        if self.growing:
            return f"{compiled} graphs, each bigger than the last: the graph grows every step"
        return f"{compiled} distinct graphs (more than {self.limit})"


class SyncProbe:
    """Captures the pending graph just before `torch_xla.sync()` runs at chosen lines.

    A subscriber of tracking's probe (its hook on `torch_xla.sync`, which `xm.mark_step` also
    calls) only while a line is armed, until `close()`. A capture is the graph module's
    `pending_graph` of what the calling frame's variables reach (~ms): a line is disarmed
    once two different graphs were captured there, or after `max_captures` tries or `budget`
    seconds. Arming it again (the line compiled yet another graph) captures one more, so the
    last two captured follow the latest graphs.
    """

    def __init__(self, *, max_captures: int = 32, budget: float = 0.5):
        self.max_captures, self.budget = max_captures, budget
        self._graphs: dict[tuple[str, int], list] = {}
        self._tries: dict[tuple[str, int], int] = {}
        self._armed: set[tuple[str, int]] = set()
        self._wanted: dict[tuple[str, int], int] = {}  # new graphs still to capture
        self._spent = 0.0
        self._subscription: Any = None

    def arm(self, site: tuple[str, int]) -> None:
        if self._spent >= self.budget:
            return
        self._wanted[site] = 1 if site in self._graphs else 2
        self._graphs.setdefault(site, [])
        self._tries[site] = 0
        self._armed.add(site)
        if self._subscription is None or self._subscription.closed:
            self._subscription = probe().subscribe(self, ("sync",))

    def graphs(self, site: tuple[str, int]) -> list:
        return list(self._graphs.get(site, ()))

    # the probe's sync events (tracking's interception layer)
    def before(self, event) -> None:
        if self._armed and not event.inner:
            self._capture(event.frame)

    after = None

    def close(self) -> None:
        """Leave the probe (its hooks go when no one else listens)."""
        self._armed.clear()
        if self._subscription is not None:
            self._subscription.close()

    def _capture(self, frame) -> None:
        site = None
        try:
            frame = user_frame(frame)
            if frame is None:
                return
            site = (frame.f_code.co_filename, frame.f_lineno)
            if site not in self._armed:
                return
            start = time.perf_counter()
            self._tries[site] += 1
            # What the sync is about to run, as far as the calling frame's variables reach
            # (bounded walk: modules, optimizers, containers), the names it uses first.
            code = frame.f_code
            names = (*code.co_varnames, *code.co_names)
            where = search_order(frame_spaces(frame), names)
            captured = pending_graph(*where, hlo=False, max_items=20_000)
            if captured is not None:
                kept = self._graphs[site]
                if not kept or kept[-1].hash != captured.hash:
                    kept.append(captured)
                    del kept[:-2]
                    self._wanted[site] -= 1
            self._spent += time.perf_counter() - start
            if (
                self._wanted[site] <= 0
                or self._tries[site] >= self.max_captures
                or self._spent >= self.budget
            ):
                self._armed.discard(site)
        except Exception:  # never break the user's sync
            log.debug("the sync probe could not capture a graph", exc_info=True)
            if site is not None:
                self._armed.discard(site)


# -- the monitor ------------------------------------------------------------------------------


class ClosureReads:
    """Counts the scalar reads made inside a sync: a step closure's (`xm.add_step_closure`),
    which run after the step's graph and are the fix for per-step reads, not the problem.
    A subscriber of the probe's read events until `close()` (and of its syncs: the probe
    marks a read made inside a sync only while someone listens to syncs). It counts the
    syncs that are no steps too: tpu_nb's own (a tracked run's last, with --sync) and those
    that had nothing to run (a device loader's after the loop's own sync)."""

    # after a tracked run's step collector (priority 0), which tells what each sync is to it
    priority = 2

    def __init__(self) -> None:
        self.count = 0
        self.own_syncs = 0
        self.empty_syncs = 0
        # syncs that are no steps: outside tracked runs those that ran nothing; inside one,
        # those its step collector counts apart (a loader's, a library's logging), of every
        # run since the monitor began, also one that began and ended between two polls
        self.no_steps = 0
        self._subscription: Any = probe().subscribe(self, ("sync", "read"))

    before = None

    def after(self, event, state) -> None:
        if getattr(event, "own", None):  # a SyncEvent of tpu_nb's own
            self.own_syncs += 1
        elif type(event) is SyncEvent:
            empty = event.launched == 0
            self.empty_syncs += empty
            if event.role_of is not None:  # a tracked run's collector placed it
                self.no_steps += event.role in NO_STEP_ROLES
            else:  # no run, or one without a step collector: it ran nothing
                self.no_steps += empty
        elif getattr(event, "in_sync", False):  # a ReadEvent in a step closure
            self.count += event.counters_after[0] - event.counters_before[0]

    def close(self) -> None:
        self._subscription.close()


@dataclass(frozen=True)
class LiveState:
    """Everything the dashboard shows, at one refresh: the one snapshot the monitor publishes
    (the display layer reads nothing else of the runtime while it runs).

    The `*_version` counters bump when their part changed, so a view redraws only what did."""

    elapsed: float  # seconds since the monitor started
    metrics: MetricsDelta  # since the monitor started
    steps: int  # syncs since the start
    execution_rate: float  # executions per second over the last second or so
    step_median: float | None  # seconds, over the last measured steps
    step_p90: float | None
    steps_measured: int  # step intervals measured so far
    compiles: tuple[LiveCompile, ...]  # the most recent ones, oldest first
    alerts: tuple[RecompilationAlert, ...]
    memory: MemoryInfo
    series: tuple[StepPoint, ...]  # step time over steps, for the chart
    compile_analysis: bool  # False: compile causes unknown (no setup())
    series_version: int = 0  # bumps when `series` changes
    compile_version: int = 0  # bumps when `compiles` changes
    # Where the steps' time went: the tracked run in progress (rebuilt at a low cadence, see
    # _ANATOMY_DUTY), else that of a tracked run which ended while the monitor ran; None
    # outside tracked runs (a plain cell has no per-step host timings).
    anatomy: Anatomy | None = None
    anatomy_version: int = 0  # bumps when `anatomy` changes
    # The wall time of a tracked run (an %%on_tpu cell) that completed while the monitor ran:
    # its report's figure, so that the report and the dashboard show one.
    run_wall_seconds: float | None = None
    # What a steady step of that run cost on the chip it is judged for (its report's)
    run_cost: StepCost | None = None
    # Of metrics.host_reads, those made in step closures (after the step's graph ran).
    closure_reads: int = 0
    # Of `steps`, syncs that are no steps of the user's: a data loader's with nothing to run
    # (and tracking._anatomy's others: a library's logging, a loader's before its first batch)
    loader_syncs: int = 0
    # Scalar reads the finished run's judgement calls per step (tracking._policy); None while
    # the run is still going (the dashboard's own count stands in)
    per_step_reads: int | None = None
    # While a tracked run goes: why its reads in every step so far cannot limit its loop on
    # the chip judged for (tracking._policy), "" when they might or it cannot tell yet
    reads_cost_little: str = ""

    @property
    def recompiling(self) -> bool:
        """A line is still compiling new graphs (settled lines aside)."""
        return any(not a.settled for a in self.alerts)


class LiveMonitor:
    """Polls the runtime; `poll()` returns a LiveState. Not thread-safe: one poller at a time.

    alert_graphs: raise the recompilation alert when one line compiles more than this many
        distinct graphs (3: a training loop's warm-up graph and its steady graph stay quiet).
    probe: capture pending graphs at an alerting sync line to say which op/shape changed.
    """

    def __init__(self, *, alert_graphs: int = 3, probe: bool = True):
        check_whole_number(alert_graphs, "alert_graphs", fix="e.g. alert_graphs=3")
        self.alert_graphs = alert_graphs
        self._device_memory = DeviceMemory(str(device()))
        shared = compile_log()
        self._log = CompileLog.following(shared) if shared else None
        self._probe = SyncProbe() if probe and self._log is not None else None
        self._closure_reads = ClosureReads()
        self._empty_before = 0  # the empty syncs counted at the last poll
        self._start_wall = time.time()
        self._start = snapshot()
        self._previous = self._start
        self._clock = StepClock(self._start_wall)
        self._recent: deque[float] = deque(maxlen=_RECENT_STEPS)
        self._measured = 0
        self._series: list[StepPoint] = []
        self._series_version = 0
        # Compiles, by their 1-based index in this session: [event, seconds, step]. Log blocks
        # are written when a compile starts, CompileTime samples when it ends: whichever comes
        # first creates the record, the other completes it.
        self._records: dict[int, list] = {}
        self._compiles: tuple[LiveCompile, ...] = ()  # the records as published
        self._events_seen = 0
        self._seconds_seen = 0
        self._compile_samples_after = self._start_wall
        self._compile_version = 0
        self._marks: deque[tuple[float, int]] = deque([(self._start_wall, 0)], maxlen=16)
        self._lines: dict[tuple[str, int], list[CompileEvent]] = {}
        self._alerts: dict[tuple[str, int], RecompilationAlert] = {}
        # The sync count at the poll that first saw each line's latest new graph.
        self._new_graph_at: dict[tuple[str, int], int] = {}
        self._counts: deque[tuple[float, int]] = deque([(self._start.taken_at, 0)])
        self._report_at_start = last_report()
        self._run = None  # the tracked run this monitor follows, once it has seen it run
        self._anatomy: Anatomy | None = None
        self._anatomy_key: tuple | None = None
        self._anatomy_version = 0
        self._next_anatomy = 0.0
        self._reads_judged: tuple[int, str] = (-1, "")  # (anatomy version, its reason)
        self.anatomy_builds = 0  # live anatomies built (for the benchmark and the curious)
        self.anatomy_seconds = 0.0

    def poll(self, *, final: bool = False) -> LiveState:
        """The state now. `final`: the last poll (the step anatomy is then rebuilt whatever
        its cadence, so the final view shows every step)."""
        now = snapshot()
        total = now.since(self._start)
        window = now.since(self._previous)
        self._previous = now
        self._marks.append((time.time(), total.syncs))
        self._measure_steps(window, total.syncs)
        if total.compiles > self._seconds_seen or (
            self._log is not None and total.compiles > self._events_seen
        ):
            self._note_compiles()
        self._refresh_alerts()
        recent = sorted(self._recent)
        report = self._finished_report()
        self._refresh_anatomy(report, final)
        per_step_reads = _per_step_reads(report)
        return LiveState(
            elapsed=now.taken_at - self._start.taken_at,
            metrics=total,
            steps=total.syncs,
            execution_rate=self._execution_rate(now.taken_at, total.executions),
            step_median=percentile(recent, 0.5) if recent else None,
            step_p90=percentile(recent, 0.9) if recent else None,
            steps_measured=self._measured,
            compiles=self._compiles,
            alerts=tuple(self._alerts.values()),
            memory=MemoryInfo(host_rss(), host_peak_rss(), *self._device_memory.read()),
            series=tuple(self._series),
            compile_analysis=self._log is not None,
            series_version=self._series_version,
            compile_version=self._compile_version,
            anatomy=self._anatomy,
            anatomy_version=self._anatomy_version,
            run_wall_seconds=report.wall_seconds if report is not None else None,
            run_cost=report.cost if report is not None and report.steps else None,
            closure_reads=self._closure_reads.count,
            loader_syncs=self._loader_syncs(),
            per_step_reads=per_step_reads,
            reads_cost_little=(
                self._reads_cost_little(sum(total.fallbacks.values()))
                if per_step_reads is None
                else ""
            ),
        )

    def _reads_cost_little(self, fallbacks: int) -> str:
        """The judgement's reason for reads in every step not to limit the loop, from the
        live anatomy of the tracked run now going (its steps so far); from its last steps
        once it ended, until its report's judgement is there."""
        anatomy, run = self._anatomy, self._run
        if anatomy is None or run is None:
            return ""
        if self._collecting() is None and run.report is not None and run.report.complete:
            return ""  # (a run whose report has no judgement: the count decides)
        if self._reads_judged[0] != self._anatomy_version:  # once per anatomy built
            try:
                reads = sum(s.reads for s in anatomy.steps)
                why = live_reads_cost_little(anatomy.steps, reads, fallbacks)
            except Exception:  # the view keeps the count's hint
                log.debug("judging the live run's reads failed", exc_info=True)
                why = ""
            self._reads_judged = (self._anatomy_version, why)
        return self._reads_judged[1]

    def _loader_syncs(self) -> int:
        reads = self._closure_reads
        return reads.no_steps + reads.own_syncs  # tpu_nb's own syncs are no steps either

    def close(self) -> None:
        """Restore anything the monitor installed (the sync probe, the read count)."""
        self._closure_reads.close()
        if self._probe is not None:
            self._probe.close()

    def _execution_rate(self, at: float, executions: int) -> float:
        """Executions per second over the last second or more (a poll right after another,
        or at the end, would otherwise say 0)."""
        self._counts.append((at, executions))
        while len(self._counts) > 2 and at - self._counts[1][0] >= 1.0:
            self._counts.popleft()
        then, before = self._counts[0]
        return (executions - before) / (at - then) if at > then else 0.0

    # -- the tracked run's report and step anatomy --

    def _collecting(self):
        """The step collector of the tracked run now running, when it began after the monitor
        (the run is then the one this monitor follows); else None."""
        run = current_run()
        collector = run.collector if run is not None else None
        if collector is None or collector.ended or collector.started < self._start_wall - 1.0:
            return None
        self._run = run
        return collector

    def _finished_report(self):
        """The report of the tracked run the monitor followed, once complete; else of a run
        that completed since the monitor started (one that began and ended between polls)."""
        report = self._run.report if self._run is not None else last_report()
        if report is None or report is self._report_at_start or not report.complete:
            return None
        return report

    def _refresh_anatomy(self, report, final: bool) -> None:
        collector = self._collecting()
        if collector is not None:
            syncs = collector.syncs
            key: tuple = (id(collector), len(syncs), syncs[-1] if syncs else None)
            if key == self._anatomy_key:
                return  # no step ended since the last build
            now = time.perf_counter()
            if not final and now < self._next_anatomy:
                return
            try:
                anatomy = collector.snapshot()
            except Exception:  # the run's own report still gets its anatomy; the view waits
                log.debug("the live step anatomy could not be built", exc_info=True)
                return
            cost = time.perf_counter() - now
            self.anatomy_builds += 1
            self.anatomy_seconds += cost
            if anatomy.steps:  # (until the first step completes, each poll tries again)
                self._next_anatomy = now + min(_ANATOMY_MAX_GAP, cost / _ANATOMY_DUTY)
        else:
            # The run that ended while the monitor ran (with its verdict). Between its
            # collector's end and its report (or with none) the last anatomy stays shown.
            done = getattr(report, "anatomy", None)
            if not isinstance(done, Anatomy) or not done.steps:
                return
            if done.steps[-1].end < self._start_wall or done is self._anatomy:
                return
            key, anatomy = (id(done),), done
        self._anatomy_key = key
        if anatomy is not self._anatomy:
            self._anatomy = anatomy
            self._anatomy_version += 1

    # -- steps --

    def _measure_steps(self, window: MetricsDelta, steps: int) -> None:
        # Executions per step, over the syncs that ran something: a device loader's sync
        # after the loop's own has nothing to run, and counting it would halve the steps.
        empty = self._closure_reads.empty_syncs
        ran = window.syncs - (empty - self._empty_before)
        self._empty_before = empty
        per_step = max(1, round(window.executions / ran)) if ran > 0 else 1
        intervals = self._clock.new_intervals(per_step)
        if not intervals:
            return
        self._recent.extend(intervals)
        self._measured += len(intervals)
        ordered = sorted(intervals)
        self._series.append(
            StepPoint(steps, percentile(ordered, 0.5), percentile(ordered, 0.9), len(ordered))
        )
        if len(self._series) > _SERIES_POINTS:
            self._series = _merge_pairs(self._series)
        self._series_version += 1

    # -- compiles --

    def _record(self, index: int) -> list:
        record = self._records.get(index)
        if record is None:
            record = self._records[index] = [None, None, float(self._marks[-1][1])]
            while len(self._records) > _SHOWN_COMPILES:
                del self._records[next(iter(self._records))]
        return record

    def _note_compiles(self) -> None:
        changed = False
        if self._log is not None:
            for event in self._log.events_from(self._events_seen):
                self._events_seen += 1
                self._record(self._events_seen)[0] = event
                self._note_line(event)
                changed = True
        data = current_backend().counters.metric("CompileTime")
        for ts, ns in data.samples if data is not None else ():
            if ts > self._compile_samples_after:
                self._compile_samples_after = ts
                self._seconds_seen += 1
                record = self._record(self._seconds_seen)
                record[1], record[2] = ns / 1e9, self._step_at(ts)
                changed = True
        if changed:
            self._compile_version += 1
            self._compiles = tuple(
                LiveCompile(index, step, seconds, event)
                for index, (event, seconds, step) in self._records.items()
            )

    def _step_at(self, ts: float) -> float:
        """The step count at wall-clock time `ts`, interpolated between polls."""
        marks = self._marks
        for (t0, s0), (t1, s1) in pairwise(marks):
            if t0 <= ts <= t1:
                return s0 + (s1 - s0) * ((ts - t0) / (t1 - t0) if t1 > t0 else 1.0)
        return float(marks[0][1] if ts < marks[0][0] else marks[-1][1])

    def _note_line(self, event: CompileEvent) -> None:
        frame = event.user_frame or function_of(event)
        # A compiled function's input sync is not its graph (tracking._dynamo.inputs_sync).
        if frame is None or not event.graph_hash or inputs_sync(event):
            return
        site = (frame.file, frame.line)
        if add_graph(self._lines, site, event, frame_graph):
            self._new_graph_at[site] = self._marks[-1][1]  # the syncs now
            # Armed one graph before the alert, so that the graph which raises it is usually
            # captured with the one before (a training loop's warm-up pair stays unprobed).
            # Each later graph arms it again: the alert's diff follows the latest graphs.
            if (
                len(self._lines[site]) >= self.alert_graphs
                and self._probe is not None
                and event.kind == "sync"
            ):
                self._probe.arm(site)

    def _latest(self, event: CompileEvent) -> CompileEvent:
        """The event as the log has it now (its sizes arrive in a later block)."""
        assert self._log is not None  # events are noted from the log only
        for fresh in self._log.events_since(event.offset):
            if fresh.offset == event.offset:
                return fresh
        return event

    def _refresh_alerts(self) -> None:
        for site, events in self._lines.items():
            if len(events) <= self.alert_graphs:
                continue
            hashes = tuple(e.graph_hash for e in events)
            settled = self._marks[-1][1] - self._new_graph_at.get(site, 0) >= 2
            old = self._alerts.get(site)
            if (
                old is not None
                and old.graphs == hashes
                and old.source != "compile log"
                and old.settled == settled
            ):
                continue
            recorded = [store.captured_graph(e) for e in events]
            growth = line_growth(recorded)
            differs: tuple[str, ...] = ()
            if growth:
                source = "recorded"
                differs = (
                    f"each graph adds {growth} to the one before: no torch_xla.sync() cuts "
                    "the graph, so every step compiles a bigger one",
                )
            elif steps := progression(recorded):
                differs, source = (steps,), "recorded"
            else:
                # The tracked run's graphs of these two compiles (the module docstring), else
                # the sync probe's last two captures.
                captured, source = recorded[-2:], "recorded"
                if any(g is None for g in captured):
                    captured = self._probe.graphs(site) if self._probe is not None else []
                    source = "graphs"
                try:
                    if len(captured) >= 2:
                        differs = graph_facts(captured[-2], captured[-1])
                except Exception:  # fall back to the compile log, never fail
                    log.debug("diffing the alert's two graphs failed", exc_info=True)
            if not differs and guard_facts(events[-1]):  # Dynamo compiled a function again
                differs, source = guard_facts(events[-1]), "Dynamo"
            if not differs:
                source = "compile log"
                differs = describe_difference(self._latest(events[-2]), self._latest(events[-1]))
            place = events[-1].user_frame or function_of(events[-1])
            assert place is not None  # _note_line keeps only events with a user frame
            self._alerts[site] = RecompilationAlert(
                place,
                hashes,
                self.alert_graphs,
                differs,
                source,
                settled and not growth,
                bool(growth),
            )


def _merge_pairs(points: list[StepPoint]) -> list[StepPoint]:
    """Halve a long series: each pair of points becomes one (the later step, the larger p90)."""
    merged = [
        StepPoint(
            b.step,
            (a.median * a.count + b.median * b.count) / max(1, a.count + b.count),
            max(a.p90, b.p90),
            a.count + b.count,
        )
        for a, b in zip(points[0::2], points[1::2], strict=False)
    ]
    return merged + points[-1:] if len(points) % 2 else merged


def _per_step_reads(report) -> int | None:
    """The scalar reads of a finished run that its judgement calls per step; None without one."""
    judgement = getattr(report, "judgement", None)
    if judgement is None:
        return None
    return sum(
        occ.count
        for occ in report.occurrences
        if occ.kind == "read" and getattr(judgement.reads.get(occ.order), "advised", False)
    )
