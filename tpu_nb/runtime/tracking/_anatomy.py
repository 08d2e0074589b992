"""Where each step's time goes: a per-step anatomy of a tracked run, and a verdict with its fix.

A step is one sync. For each step, from the previous sync's return to this sync's return, the
host's time is split into parts that add up to the step's wall time:

- trace: the host running the user's Python, which traces the lazy graph (what is left);
- sync: inside `torch_xla.sync()` — hashing the graph, cache lookup, launching — minus compile;
- compile: `CompileTime` samples that ended in the step;
- input: waiting for the loop's iterator: inside a data loader's `__next__` (DataLoader and
  ParallelLoader/MpDeviceLoader iterators, on the thread that runs the tracked code, timed by a
  wrapper) or inside the iterator of any `for` of the tracked code (a generator, a `datasets`
  iterator: seen by the host sampler, `_sampler.py`); time both see counts once;
- read: inside a value read (`.item()`, `.tolist()`, `print(tensor)`, ...) minus compile.
- tpu_nb: tpu_nb's own recording in the sync and read hooks (graph captures for the
  recompile findings, finding where a call came from), so it is not blamed on the user's code.

On the device side: `device`, the execution time of the graphs this step launched, and `idle`,
the part of the step's window in which the device ran nothing. `to_device`/`from_device` are
the transfer times that ended in the step (they overlap the host parts above).

Sources, no profiler: tpu_nb's own timestamps (the sync and read hooks of
`provenance.Recorder`, a wrapper on the loaders' `__next__` while a run is tracked) and the
runtime's metric samples, each a (wall-clock time it ended, duration) pair. `ExecuteTime`
runs from the launch to the completion of an execution, queueing included; executions on a
device run one after the other, so one's device span is [max(launch, previous completion),
completion]. The sample buffers hold the last XLA_METRICS_SAMPLES samples (128 after
`setup()`): they are read every few dozen syncs, and a run that outran them says so
(`Anatomy.complete`).

What happens after the last sync (the final wait for the device) is the run's `tail`: its
host time is split into reads, input, the device's work it waited for (`wait`) and the rest.

Where on the tracked code's lines the host's time went (`Anatomy.host_lines`) comes from the
host sampler (`_sampler.Sampler`), started and joined with the run: the host-bound and
input-bound verdicts name the lines that took the time.
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any

from tpu_nb.runtime.backend import Backend
from tpu_nb.runtime.backend import current as current_backend
from tpu_nb.runtime.graph import gc_paused
from tpu_nb.runtime.probe import ReadEvent, Subscription, SyncEvent, probe
from tpu_nb.runtime.tracking._cost import Busy, judged_chip, union
from tpu_nb.runtime.tracking._libraries import sync_role
from tpu_nb.runtime.tracking._sampler import INTERVAL, HostLine, Sampler
from tpu_nb.runtime.units import format_seconds, percentile

if TYPE_CHECKING:
    from tpu_nb.runtime.tracking._provenance import Recorder

log = logging.getLogger("tpu_nb")

_clock = time.time  # the clock of torch_xla's metric samples (wall-clock seconds)
_SAMPLED = (
    "ExecuteTime",
    "ExecuteReplicatedTime",
    "CompileTime",
    "TransferToDeviceTime",
    "TransferFromDeviceTime",
    "TensorsGraphSize",
)
_HARVEST_EVERY = 48  # syncs and reads between two looks at the sample buffers
# Counters that move whenever a metric gets a sample. A read copies the metric's whole buffer
# (tpu_nb asks torch_xla for 128 samples; torch's lazy metrics, such as TensorsGraphSize, keep
# 1,024: a ~0.2 ms read). A metric whose counters stayed put is not read, nor one whose buffer
# would still hold what is new if the next look brought as many samples as the most any look
# has brought so far; a burst larger than any before can overwrite samples, as one larger than
# the buffer could when every look read (the anatomy is then marked incomplete). Transfers
# have no such counter: read at every look.
_GATES = {
    "ExecuteTime": ("ExecuteComputation",),
    "ExecuteReplicatedTime": ("ExecuteReplicated",),
    "CompileTime": ("UncachedCompile",),
    "TensorsGraphSize": ("UncachedCompile", "CachedCompile"),
}
# Steps kept: the most recent; older ones leave the summary (building the records costs
# ~40 us a step once, when the run ends: 4,096 steps ~0.2 s, after a run of >= 4 s).
_MAX_STEPS = 4096
_MAX_EVENTS = 65_536  # reads, loader calls and samples kept
HOST_PARTS = ("trace", "sync", "compile", "input", "read", "wait", "tpu_nb")
PARTS = HOST_PARTS + ("device", "idle", "to_device", "from_device")


@dataclass(frozen=True)
class StepRecord:
    """One step (one sync): seconds spent on each part; spans on the wall clock (time.time())."""

    index: int
    start: float  # the previous sync's return (the run's start for the first)
    end: float  # this sync's return
    trace: float = 0.0
    sync: float = 0.0
    compile: float = 0.0
    input: float = 0.0
    read: float = 0.0
    wait: float = 0.0  # the tail only: waiting for the device's remaining work
    tpu_nb: float = 0.0  # tpu_nb's own recording in the sync and read hooks
    device: float = 0.0  # executions this step launched
    idle: float = 0.0  # time in [start, end] the device ran nothing
    to_device: float = 0.0
    from_device: float = 0.0
    executions: int = 0
    compiles: int = 0
    reads: int = 0
    host_spans: tuple = ()  # (kind, start, end): "input", "read", "sync", "compile",
    # "tpu_nb"
    device_spans: tuple = ()  # (start, end) of the executions this step launched
    tail: bool = False  # after the last sync: not a step, part of the run's wall

    @property
    def wall(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Part:
    """One part over a run's steps: median and p90 per step, total, share of the wall time."""

    name: str
    median: float
    p90: float
    total: float
    share: float


@dataclass(frozen=True)
class Verdict:
    """What bounds the loop, why (with figures) and what to do about it."""

    kind: str  # device-bound, host-bound, input-bound, compile-bound, read-bound, cpu-bound
    # (XLA:CPU busy: the CPU's time; off a TPU, host- and device-bound are about the target),
    # does-not-fit (off a TPU: the step needs more HBM than the target chip has)
    reason: str
    fix: str
    # host-bound or input-bound: the lines that took the time, largest first (HostLine:
    # line, via, seconds, share of the wall time)
    lines: tuple = ()

    @property
    def good(self) -> bool:
        return self.kind == "device-bound"

    @property
    def where(self) -> str:
        """The lines that took the time, in words ("" when none was sampled)."""
        if not self.lines:
            return ""
        input_ = all(h.kind == "input" for h in self.lines)
        head = "in the iterator of " if input_ else "most of it at "
        if len(self.lines) == 1:  # the reason's share already says how much (measured, not
            # sampled: a second figure for the same wait would not match it)
            h = self.lines[0]
            return head + h.where + (f" (in {h.via})" if h.via else "")
        # one line can hold time of two kinds (its tracing, and the sync it calls): named,
        # so that "line 4 (70%), line 4 (30%)" does not read as the same time twice
        kinds = len({h.kind for h in self.lines}) > 1
        return head + ", ".join(
            f"{h.where} ({h.share:.0%}{', ' + _DOING.get(h.kind, h.kind) if kinds else ''}"
            f"{', in ' + h.via if h.via else ''})"
            for h in self.lines
        )

    def __str__(self) -> str:
        where = f"; {self.where}" if self.where else ""
        return f"{self.kind}: {self.reason}{where}. Fix: {self.fix}"


_DOING = {"host": "tracing", "sync": "syncing", "input": "waiting for data", "read": "reading"}

FIXES = {
    "device-bound": "nothing on the host side: the device is busy. To go faster, do less device "
    "work per step (bf16 weights and activations, a smaller model) or shard the step over "
    "more chips",
    # XLA:CPU busy: the CPU's own speed, which says nothing about a TPU
    "cpu-bound": "nothing to fix for a TPU from this: XLA:CPU's execution time is the CPU's. "
    "tpu_nb judges the step for the target chip when it has counted the step's FLOPs "
    "(track the loop from its first step)",
    "host-bound": "the host's Python tracing takes longer than the device's work: do more "
    "work per trace (a larger batch, fewer and larger ops), or skip tracing with "
    "torch.compile(step_fn, backend='openxla') "
    "(torch_xla.compile still traces every call)",
    "input-bound": "the device waits for data: raise the DataLoader's num_workers (with "
    "persistent_workers), wrap it in "
    "torch_xla.distributed.parallel_loader.MpDeviceLoader (it prefetches batches "
    "to the device), or prepare the data ahead of time",
    # input-bound, the wait in a device loader (MpDeviceLoader): it prefetches already
    "input-device-loader": "the device waits for data: the device loader already prefetches "
    "batches to the device, but it hands them out only as fast as its DataLoader makes them: "
    "raise the DataLoader's num_workers (with persistent_workers), or prepare the data ahead "
    "of time",
    # input-bound, the wait not in a DataLoader: the loop's own iterator makes the batches
    "input-iterator": "the device waits while the loop's iterator makes the next batch: make "
    "batches ahead of time or in background workers (a torch.utils.data.DataLoader "
    "with num_workers over the data), and wrap the loader in "
    "torch_xla.distributed.parallel_loader.MpDeviceLoader to prefetch them to the "
    "device",
    "compile-bound": "the steady steps still compile: see the compile findings "
    "for the lines that do, and what changed between their graphs",
    "read-bound": "value reads (.item(), print(tensor), bool(tensor)) make the host wait for "
    "the device every step, so tracing and execution no longer overlap: accumulate values "
    "on the device and read them after the loop, every N steps or in a step closure "
    "(xm.add_step_closure); then each step is one graph the host does not wait for",
    # read-bound by CPU fallbacks (an op XLA does not lower runs on the CPU, its inputs read),
    # and by both
    "fallback-bound": "CPU fallbacks make the host wait for the device every step, so "
    "tracing and execution no longer overlap: replace the ops that fall back to the CPU "
    "with ones XLA lowers (what to do, above, names them); then each step is one graph the "
    "host does not wait for",
    "read-and-fallback-bound": "value reads (.item(), print(tensor), bool(tensor)) and CPU "
    "fallbacks make the host wait for the device every step, so tracing and execution no "
    "longer overlap: accumulate values on the device and read them after the loop, every N "
    "steps or in a step closure (xm.add_step_closure), and replace the ops that fall back "
    "to the CPU with ones XLA lowers (what to do, above, names them); then each step is one "
    "graph the host does not wait for",
}


@dataclass(frozen=True)
class Anatomy:
    """A run's steps and where their time went (`RunReport.anatomy`)."""

    steps: tuple[StepRecord, ...]
    tail: StepRecord | None
    parts: dict
    wall_seconds: float  # the steps' wall time plus the tail's
    device_busy: float  # seconds some execution ran within that time
    verdict: Verdict | None
    complete: bool = True  # False: sample buffers overflowed between reads
    dropped_steps: int = 0  # earlier steps beyond the last _MAX_STEPS, not in `steps`
    # Syncs a data loader made with nothing to run (MpDeviceLoader's before its first batch,
    # after a step the user synced, at the end of the data): counted by torch_xla, no steps.
    loader_syncs: int = 0
    # Other syncs that are no steps: those with nothing to run (a library's after its loop), a
    # library's logging syncs inside a step, a loader's before a loop's first batch.
    other_syncs: int = 0
    # Host time on the tracked code's lines over the whole run, largest first (the host
    # sampler's; () without it): HostLine(line, via, seconds, share, kind)
    host_lines: tuple[HostLine, ...] = ()
    # The host sampler itself, for the policy's steady-state lines (None without it).
    sampler: Any = field(default=None, repr=False, compare=False)

    @property
    def device_share(self) -> float:
        return self.device_busy / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def share(self, name: str) -> float:
        part = self.parts.get(name)
        return part.share if part is not None else 0.0

    def summary(self) -> str:
        """One line: the verdict and the largest parts."""
        if not self.steps:
            return "no steps (no sync ran)"
        top = sorted(
            (p for p in self.parts.values() if p.name in HOST_PARTS), key=lambda p: -p.share
        )[:3]
        shares = ", ".join(f"{p.name} {p.share:.0%}" for p in top if p.share >= 0.005)
        kept = (
            f" (the last of {len(self.steps) + self.dropped_steps})" if self.dropped_steps else ""
        )
        loader = (
            f" (and {self.loader_syncs} syncs of the data loader with nothing to run)"
            if self.loader_syncs
            else ""
        )
        line = (
            f"{len(self.steps)} steps{kept}{loader}, median "
            f"{format_seconds(self.step_median)}: {shares}; device busy {self.device_share:.0%}"
        )
        return f"{line}; {self.verdict.kind}" if self.verdict else line

    @property
    def step_median(self) -> float:
        return _quantile(sorted(s.wall for s in self.steps), 0.5)

    def __str__(self) -> str:
        lines = [self.summary()]
        for p in self.parts.values():
            lines.append(
                f"  {p.name:12} median {format_seconds(p.median):>9}  p90 "
                f"{format_seconds(p.p90):>9}  total {format_seconds(p.total):>9}"
                f"  {p.share:5.1%}"
            )
        shown = [h for h in self.host_lines if h.share >= 0.01][:5]
        if shown:
            lines.append("  host time by line:")
            lines += [f"    {h}" for h in shown]
        if self.verdict:
            lines.append(f"  verdict: {self.verdict}")
        if not self.complete:
            lines.append(
                "  incomplete: some runtime samples were overwritten before tpu_nb "
                "read them (figures are lower bounds)"
            )
        return "\n".join(lines)


# -- collection while a run is tracked ---------------------------------------------------------


class Collector:
    """Timestamps of one tracked run's syncs, reads and loader calls, and the runtime's samples.

    `start(recorder)` hooks the recorder's sync and read wrappers and the loaders and starts
    the host sampler on the tracked code (the recorder's); `finish()` removes everything
    (the sampler's thread joined) and returns the Anatomy. Hooks never raise into the user's
    code.
    """

    sample_interval: float | None = INTERVAL  # the host sampler's; None: no sampler

    def __init__(self) -> None:
        self.started = _clock()
        self.origin = self.started  # start of the first kept step's window
        self.syncs: deque = deque(maxlen=_MAX_STEPS)  # (hook entry, call, return)
        self.reads: deque = deque(maxlen=_MAX_EVENTS)  # (hook entry, call, return)
        self.inputs: deque = deque(maxlen=_MAX_EVENTS)  # (start, end)
        self.samples: dict[str, deque] = {name: deque(maxlen=_MAX_EVENTS) for name in _SAMPLED}
        self._seen = {name: (0, 0.0) for name in _SAMPLED}  # total samples, last timestamp
        self._gate_values: dict[str, tuple] = {}
        self._held: dict[str, int] = {}  # samples each buffer held at its last read
        self._looked: dict[str, tuple[int, int]] = {}  # counters' sum at the last look, most
        # they moved between two looks
        self._base: dict[str, int] = {}  # samples each metric had when the run began
        self.lost_samples = False
        self.dropped_steps = 0
        self.loader_syncs = 0
        # Other syncs that are no steps: those with nothing to run (a library's after its
        # loop) and the inner ones below
        self.other_syncs = 0
        # A library's logging syncs (Trainer's log, xm.mesh_reduce's rendezvous): work of the
        # step they are in, not steps (entry, call, return)
        self.inner_syncs: deque = deque(maxlen=_MAX_EVENTS)
        self._until_harvest = _HARVEST_EVERY
        self._lock = threading.Lock()
        self._thread = threading.get_ident()
        self._subscription: Subscription | None = None
        self.ended = False
        self._recorder: Recorder | None = None
        self._backend: Backend = current_backend()
        self.sampler: Sampler | None = None

    def start(self, recorder) -> Collector:
        """Hook `recorder` and the loaders; on failure (logged) record nothing, so the run
        still runs and reports, without an anatomy's steps."""
        try:
            return self._start(recorder)
        except Exception:
            log.debug("tpu_nb: the step anatomy could not start", exc_info=True)
            self._unhook()
            return self

    def _start(self, recorder) -> Collector:
        self._harvest()  # samples before the run are not the run's
        self.samples = {name: deque(maxlen=_MAX_EVENTS) for name in _SAMPLED}
        self._base = {name: total for name, (total, _) in self._seen.items()}
        self.lost_samples = False
        self._recorder = recorder
        self._subscription = probe().subscribe(self, ("sync", "read", "input"))
        self.started = self.origin = _clock()
        if self.sample_interval:
            self.sampler = Sampler(
                self._thread,
                root_codes=recorder.root_codes,
                root_frame=recorder.root_frame,
                interval=self.sample_interval,
            ).start()
        return self

    def finish(self) -> Anatomy | None:
        """Unhook and build the run's Anatomy; None if that failed (logged: a bug in tpu_nb
        must not cost the user the run's report)."""
        end = _clock()
        self._unhook()
        try:
            with self._lock:
                self._harvest()
            return build(self, end)
        except Exception:
            log.debug("tpu_nb: the step anatomy failed", exc_info=True)
            return None

    def snapshot(self, last: int = 64) -> Anatomy:
        """The anatomy of the last `last` complete steps so far (for a polling thread: its
        cost does not grow with the run)."""
        if self._lock.acquire(blocking=False):
            try:
                self._harvest()
            finally:
                self._lock.release()
        return build(self, None, last=last)

    # the probe's events (runtime/probe.py): the hot path (a deque append, a decrement)
    priority = 0  # first: the recorder's anchors and max_graphs' check come after

    before = None

    def after(self, event, state) -> None:
        recorder = self._recorder
        if recorder is None or not recorder.active:
            return
        kind = type(event)
        if kind is SyncEvent:
            role = "own" if event.owner is recorder else sync_role(event, recorder.loaders)
            if role == "loader":
                self.loader_syncs += 1
            elif role == "empty":
                self.other_syncs += 1
            elif role == "inner":
                self.inner_syncs.append((event.entry, event.start, event.end))
                self.other_syncs += 1
            elif role == "step":
                sampler = self.sampler
                if sampler is not None and sampler.check:  # rare: a new loop's first sync
                    self._check_loop(sampler, event)
                syncs = self.syncs
                if len(syncs) == _MAX_STEPS:
                    self.origin = syncs[0][2]
                    self.dropped_steps += 1
                syncs.append((event.entry, event.start, event.end))
                self._until_harvest -= 1  # _count_down(), inlined: every sync passes here
                if self._until_harvest <= 0:
                    self._harvest_if_free()
        elif kind is ReadEvent:
            self.reads.append((event.entry, event.start, event.end))
            self._count_down()
        elif event.thread == self._thread:  # an InputEvent; not a worker's
            self.inputs.append((event.start, event.end))

    def _check_loop(self, sampler, event: SyncEvent) -> None:
        if threading.get_ident() == self._thread:  # on the tracked thread
            try:
                sampler.check_at_sync(event.frame)
            except Exception:
                log.debug("tpu_nb: the sampler's loop check failed", exc_info=True)

    def sampled_inputs(self, events: int | None) -> list[tuple[float, float]]:
        """The host sampler's input spans (inside a `for`'s iterator), less the syncs and
        reads they overlap (a sample's interval can straddle a sync's start or end)."""
        sampler = self.sampler
        if sampler is None or not sampler.input_spans:
            return []
        stepping = set(sampler.stepping)  # loops whose iterator runs the steps: not input
        spans = [
            (s, e) for s, e, loop in _tail(sampler.input_spans, events) if loop not in stepping
        ]
        cuts = union(
            [(e, r) for e, _, r in _tail(self.syncs, events)]
            + [(e, r) for e, _, r in _tail(self.inner_syncs, events)]
            + [(e, r) for e, _, r in _tail(self.reads, events)]
        )
        return _cut(spans, cuts)

    def host_lines(self, end: float | None) -> tuple[HostLine, ...]:
        """The host sampler's time per line since the run began; shares of the run's wall."""
        sampler = self.sampler
        if sampler is None:
            return ()
        return sampler.lines((end if end is not None else _clock()) - self.started)

    def _count_down(self) -> None:
        self._until_harvest -= 1
        if self._until_harvest <= 0:
            self._harvest_if_free()

    def _harvest_if_free(self) -> None:
        if self._lock.acquire(blocking=False):
            try:
                self._harvest(look=True)
            finally:
                self._lock.release()

    def _harvest(self, *, look: bool = False) -> None:
        """Read the runtime's sample buffers; keep what is new since the last read. `look`:
        the run's look every _HARVEST_EVERY syncs, which leaves a buffer to the next look
        while it can hold what that look may bring (see _GATES)."""
        self._until_harvest = _HARVEST_EVERY
        runtime = self._backend
        data, counter = runtime.counters.metric, runtime.counters.reader()
        for name in _SAMPLED:
            gate = _GATES.get(name)
            if gate is not None:
                moved = tuple(counter(c) or 0 for c in gate)
                last = self._gate_values.get(name)
                if moved == last:
                    continue
                if look and last is not None:
                    now = sum(moved)
                    before, most = self._looked.get(name, (sum(last), 0))
                    most = max(most, now - before)
                    self._looked[name] = (now, most)
                    new = now - sum(last)  # negative: the counters were reset
                    if new > 0 and new + most < self._held.get(name, 0):
                        continue
                self._gate_values[name] = moved
            got = data(name)
            if got is None:
                continue
            total, samples = got.count, got.samples
            seen_total, last_ts = self._seen[name]
            fresh = [(ts, ns) for ts, ns in samples if ts > last_ts]
            if total - seen_total > len(fresh) and seen_total:
                self.lost_samples = True
            if total < seen_total:  # reset_metrics() in between
                fresh = list(samples)
                self._base[name] = total - len(fresh)
            # Each sample's ordinal since the run began: the k-th graph built is the k-th
            # executed, whatever samples were dropped or cut off around them.
            first = total - len(fresh) - self._base.get(name, 0)
            self.samples[name].extend(
                (ts, ns * 1e-9, first + i) for i, (ts, ns) in enumerate(fresh)
            )
            self._seen[name] = (total, samples[-1][0] if samples else last_ts)
            self._held[name] = len(samples)
            if name in self._looked:
                self._looked[name] = (sum(self._gate_values[name]), self._looked[name][1])

    def _unhook(self) -> None:
        subscription, self._subscription = self._subscription, None
        self.ended = True
        try:
            if subscription is not None:
                subscription.close()
        finally:
            if self.sampler is not None:
                self.sampler.stop()  # joined: no thread outlives the run


# -- from timestamps to steps ------------------------------------------------------------------


def _spans(samples: Iterable[tuple]) -> list[tuple[float, float]]:
    """(end, duration, ordinal) samples -> (start, end) spans, in order of end."""
    return sorted(((end - dur, end) for end, dur, _ in samples), key=lambda s: s[1])


def _in_launch_order(samples: list) -> list:
    """The runtime numbers execution samples as they complete; graphs run in the order they
    were built, but on XLA:CPU one can complete after those launched after it: the k-th
    launched is the k-th graph's."""
    if any(ordinal is None for _, _, ordinal in samples):
        return samples
    ordinals = sorted(ordinal for _, _, ordinal in samples)
    launched = sorted(samples, key=lambda s: s[0] - s[1])
    return [(end, dur, k) for (end, dur, _), k in zip(launched, ordinals, strict=True)]


def _device_spans(samples) -> list[tuple[float, float, float, int | None]]:
    """Executions as (launch, device start, end, ordinal): one device runs them one after
    another, so an execution starts at its launch or at the previous one's completion,
    whichever is later."""
    out, previous_end = [], float("-inf")
    for end, dur, ordinal in sorted(samples, key=lambda s: s[0]):
        launch = end - dur
        begin = min(max(launch, previous_end), end)
        out.append((launch, begin, end, ordinal))
        previous_end = max(previous_end, end)
    return out


def _overlap(spans, lo: float, hi: float) -> float:
    return sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in spans)


def _cut(spans, cuts) -> list[tuple[float, float]]:
    """`spans` (sorted) less the time they share with `cuts` (sorted, disjoint)."""
    out = []
    j = 0
    for s, e in spans:
        while j < len(cuts) and cuts[j][1] <= s:
            j += 1
        k, at = j, s
        while k < len(cuts) and cuts[k][0] < e:
            lo, hi = cuts[k]
            if lo > at:
                out.append((at, lo))
            at = max(at, hi)
            k += 1
        if at < e:
            out.append((at, e))
    return out


def _assign(items, key, bounds) -> dict[int, list]:
    """Items by window: bounds[i] is window i's end; past the last end: the tail (index n).
    Only windows with items get a list (a run has many steps, most with no read or input)."""
    out: dict[int, list] = {}
    for item in items:
        at = bisect_left(bounds, key(item))
        group = out.get(at)
        if group is None:
            out[at] = [item]
        else:
            group.append(item)
    return out


@dataclass
class _Window:
    start: float
    end: float
    sync: tuple[float, float] | None
    # Empty tuples until something lands in the window: no allocation per step.
    inner_syncs: Sequence = ()  # a library's logging syncs within the step: (call, return)
    reads: Sequence = ()
    inputs: Sequence = ()
    compiles: Sequence = ()
    executions: Sequence = ()
    overhead: Sequence = ()  # tpu_nb's hooks: (entry, call)
    to_device: Sequence = ()
    from_device: Sequence = ()


def _owners(executions, graphs: dict, origin: float, bounds, windows) -> list[int | None]:
    """The window that launched each execution (None: one before the kept steps). Each graph
    a sync or read builds is recorded (`TensorsGraphSize`, during the call) and executes once,
    in order: the k-th execution is the k-th graph's, when that graph came before its launch.
    Otherwise (its graph not seen): the last sync or read called before the launch."""
    times, points = _launch_points(windows)
    owners: list[int | None] = []
    shift = _in_flight(executions, graphs)
    for launch, _, _, ordinal in executions:
        built = graphs.get(ordinal - shift) if ordinal is not None else None
        if built is not None and built <= launch + 1e-3:
            owners.append(
                min(bisect_left(bounds, built), len(windows) - 1) if built > origin else None
            )
            continue
        at = bisect_left(times, launch + 1e-9) - 1
        owners.append(points[at] if at >= 0 and launch >= origin else None)
    return owners


def _in_flight(executions, graphs: dict, most: int = 16, first: int = 256) -> int:
    """How many executions the run's first samples hold of graphs built before it began.
    Graphs are counted as they are built, executions as they complete: an execution still
    running when the run began (a sync's, which does not wait) is the run's first sample,
    and every later one would pair with the graph after its own. No graph runs before it is
    built: the fewest such executions for which every pairing of the first samples keeps
    that order."""
    pairs = sorted(
        ((ordinal, launch) for launch, _, _, ordinal in executions if ordinal is not None),
    )[:first]
    for shift in range(most + 1):
        if all(
            graphs.get(ordinal - shift, float("-inf")) <= launch + 1e-3 for ordinal, launch in pairs
        ):
            return shift
    return 0


def _launch_points(windows: list[_Window]) -> tuple[list[float], list[int]]:
    """When each sync and read was called, and its window, in time order. An execution
    belongs to the last one called at or before its launch (the runtime starts the clock when
    its execution thread takes the graph, which can be just after the sync returned)."""
    points = sorted(
        [(w.sync[0], i) for i, w in enumerate(windows) if w.sync]
        + [(start, i) for i, w in enumerate(windows) for start, _ in w.reads]
        + [(start, i) for i, w in enumerate(windows) for start, _ in w.inner_syncs]
    )
    return [t for t, _ in points], [i for _, i in points]


def _tail(events: deque, n: int | None) -> list:
    """The last `n` events (all when None); copying a deque holds the GIL: no torn read."""
    if n is None or len(events) <= n:
        return list(events)
    return list(islice(reversed(events), n))[::-1]


def build(collector: Collector, end: float | None, last: int | None = None) -> Anatomy:
    """The Anatomy of what `collector` recorded; `end`: the run's end (None: still running,
    no tail); `last`: only the last steps (and the recent events they can hold).

    Without the garbage collector: building allocates many small objects, and in a process
    holding a model, a collection they trigger walks the whole heap (0.3 s measured)."""
    with gc_paused():
        return _build(collector, end, last)


def _build(collector: Collector, end: float | None, last: int | None) -> Anatomy:
    syncs = _tail(collector.syncs, None if last is None else last + 1)
    origin = collector.origin
    if last is not None and len(syncs) > last:
        origin = syncs.pop(0)[2]
    bounds = [ret for _, _, ret in syncs]
    first = collector.dropped_steps + len(collector.syncs) - len(syncs)  # absolute numbering
    events = None if last is None else 64 * (last + 1)
    samples = {name: _tail(collector.samples[name], events) for name in _SAMPLED}
    single, replicated = samples["ExecuteTime"], samples["ExecuteReplicatedTime"]
    if single and replicated:  # both kinds in one run: ordinals do not pair with graphs
        single = [(e, d, None) for e, d, _ in single + replicated]
    executions = _device_spans(_in_launch_order(single or replicated))
    windows = [
        _Window(bounds[i - 1] if i else origin, bounds[i], syncs[i][1:], overhead=[syncs[i][:2]])
        for i in range(len(syncs))
    ]
    if end is not None:
        windows.append(_Window(bounds[-1] if bounds else origin, max(end, origin), None))
    else:
        windows.append(_Window(0.0, 0.0, None))  # discarded: a running step
    keep = lambda span: span[1] > origin  # noqa: E731
    inputs = _assign(filter(keep, _tail(collector.inputs, events)), lambda s: s[1], bounds)
    # The sampler's spans never cross a sync (cut by them): each lies in one window, where
    # the loaders' wrapper may have seen the same wait: counted once.
    sampled = filter(keep, collector.sampled_inputs(events))
    for i, items in _assign(sampled, lambda s: s[1], bounds).items():
        inputs[i] = union(inputs.get(i, []) + items)
    for i, items in inputs.items():
        windows[i].inputs = items
    for name in ("reads", "inner_syncs"):  # (hook entry, call, return)
        recent = (r for r in _tail(getattr(collector, name), events) if r[2] > origin)
        for i, items in _assign(recent, lambda r: r[2], bounds).items():
            setattr(windows[i], name, [r[1:] for r in items])
            windows[i].overhead = list(windows[i].overhead) + [r[:2] for r in items]
    for name, spans in (
        ("compiles", _spans(samples["CompileTime"])),
        ("to_device", _spans(samples["TransferToDeviceTime"])),
        ("from_device", _spans(samples["TransferFromDeviceTime"])),
    ):
        for i, items in _assign(filter(keep, spans), lambda s: s[1], bounds).items():
            setattr(windows[i], name, items)
    graphs = {ordinal: ts for ts, _, ordinal in samples["TensorsGraphSize"]}
    owned: dict[int, list] = {}
    owners = _owners(executions, graphs, origin, bounds, windows)
    for x, owner in zip(executions, owners, strict=True):
        if owner is not None:
            owned.setdefault(owner, []).append(x[:3])
    for owner, items in owned.items():
        windows[owner].executions = items
    busy = Busy(union((b, e) for _, b, e, _ in executions))
    records = [_record(first + i, w, busy, tail=(w.sync is None)) for i, w in enumerate(windows)]
    steps = tuple(r for r in records if not r.tail)
    tail = records[-1] if end is not None and records[-1].tail else None
    anatomy = _summarise(steps, tail, collector.host_lines(end))
    anatomy = replace(
        anatomy,
        complete=not collector.lost_samples,
        dropped_steps=collector.dropped_steps,
        loader_syncs=collector.loader_syncs,
        other_syncs=collector.other_syncs,
        sampler=collector.sampler,
    )
    # a finished run's one verdict is the policy's (tracking._policy): not judged here too
    return _with_verdict(anatomy) if end is None else anatomy


def _record(index: int, w: _Window, busy, *, tail: bool) -> StepRecord:
    # Clipped to the window: MpDeviceLoader's __next__ starts with the sync that ends the
    # previous step, and only its wait for the next batch is this step's input. A run's
    # steps are many and most hold a sync and nothing else: what is empty is not walked.
    start, end = w.start, w.end
    reads = _overlap(w.reads, start, end) if w.reads else 0.0
    inputs = _overlap(w.inputs, start, end) if w.inputs else 0.0
    ours = _overlap(w.overhead, start, end)
    syncs = [w.sync, *w.inner_syncs] if w.sync else list(w.inner_syncs)
    sync = _overlap(syncs, start, end) if w.inner_syncs else sum(e - s for s, e in syncs)
    in_sync = in_read = in_trace = 0.0
    for s, e in w.compiles:
        if any(ss - 1e-4 <= s and e <= se + 1e-4 for ss, se in syncs):
            in_sync += e - s
        elif any(rs - 1e-4 <= s and e <= re + 1e-4 for rs, re in w.reads):
            in_read += e - s
        else:
            in_trace += e - s
    window = max(0.0, end - start)
    idle = window - busy.overlap(start, end)
    host_rest = max(0.0, window - sync - reads - inputs - ours - in_trace)
    wait = 0.0
    if tail:  # after the last sync: the host waited for the device where it was busy
        waited = _overlap([*w.reads, *w.inputs], start, end)
        wait = min(host_rest, max(0.0, window - idle - waited))
        host_rest -= wait
    spans = [("input", s, e) for s, e in w.inputs] if w.inputs else []
    if w.reads:
        spans += [("read", s, e) for s, e in w.reads]
    spans += [("sync", s, e) for s, e in syncs]
    if w.compiles:
        spans += [("compile", s, e) for s, e in w.compiles]
    spans += [("tpu_nb", s, e) for s, e in w.overhead if e - s > 1e-5]
    spans.sort(key=_span_start)
    executions = w.executions
    return StepRecord(
        index=index,
        start=start,
        end=end,
        trace=host_rest,
        sync=max(0.0, sync - in_sync),
        compile=in_sync + in_read + in_trace,
        input=inputs,
        read=max(0.0, reads - in_read),
        wait=wait,
        tpu_nb=ours,
        device=sum(e - b for _, b, e in executions) if executions else 0.0,
        idle=max(0.0, idle),
        to_device=sum(e - s for s, e in w.to_device) if w.to_device else 0.0,
        from_device=sum(e - s for s, e in w.from_device) if w.from_device else 0.0,
        executions=len(executions),
        compiles=len(w.compiles),
        reads=len(w.reads),
        host_spans=tuple(spans),
        device_spans=tuple((b, e) for _, b, e in executions),
        tail=tail,
    )


_span_start = itemgetter(1)


def _quantile(values: list[float], q: float) -> float:
    return percentile(values, q) if values else 0.0


def _summarise(steps, tail, host_lines: tuple) -> Anatomy:
    every = steps + ((tail,) if tail else ())
    wall = sum(r.end - r.start for r in every)
    device_busy = wall - sum(r.idle for r in every)
    parts = {}
    for name in PARTS:
        value = attrgetter(name)
        values = sorted(map(value, steps))
        total = sum(values) + (value(tail) if tail else 0.0)
        parts[name] = Part(
            name,
            _quantile(values, 0.5),
            _quantile(values, 0.9),
            total,
            total / wall if wall > 0 else 0.0,
        )
    return Anatomy(steps, tail, parts, wall, device_busy, None, host_lines=host_lines)


# -- the verdict -------------------------------------------------------------------------------

_BOUND = 0.25  # a part this large a share of the wall time bounds the loop
_DEVICE_BUSY = 0.6  # the device busy this much of the time: the loop is device-bound
_MIN_STEPS = 3  # fewer syncs are not a loop: no verdict
MIN_STEADY_STEPS = 3  # fewer steps after the warm-up: too few to judge the steady state


def _with_verdict(anatomy: Anatomy) -> Anatomy:
    """The verdict as far as the timeline alone shows (a live view's): the steady state is
    the steps after the run's first compiling steps (the first step and its warm-up). A
    finished run's verdict is the policy's (tracking._policy), from the compile facts."""
    steps = anatomy.steps
    lead = 0
    while lead < min(len(steps), _LIVE_WARM_UP) and steps[lead].compiles:
        lead += 1
    steady = steps[lead:]
    if len(steady) < MIN_STEADY_STEPS:
        return anatomy
    return replace(anatomy, verdict=steady_verdict(steady, anatomy.host_lines, anatomy.tail))


_LIVE_WARM_UP = 3  # leading compiling steps a live view takes for the warm-up


def steady_verdict(
    steps: Sequence[StepRecord], host_lines: tuple = (), tail: StepRecord | None = None
) -> Verdict | None:
    """The verdict of `steps` alone (the steady state: the policy leaves out the steps that
    compiled the warm-up graphs) and the run's `tail` (the wait for the device's work the
    last steps queued: an asynchronous loop's device time is mostly there), naming the
    run's sampled host lines where it is host- or input-bound."""
    tail = waiting_only(tail)
    steady = _summarise(tuple(steps), tail, host_lines)
    return _placed(judge(steady), steady)


def waiting_only(tail: StepRecord | None) -> StepRecord | None:
    """The run's tail as the steady state has it: the host's wait for the work the last
    steps queued, not the code after the loop (a read after it that compiles a graph of its
    own, a print): that is no step's."""
    if tail is None or tail.wait <= 0:
        return None
    return StepRecord(tail.index, tail.start, tail.start + tail.wait, wait=tail.wait, tail=True)


_LOADER_FILES = ("torch/utils/data/",)  # and the backend's device loaders
_SHOWN_LINES = 3  # lines a verdict names at most
_LINE_SHARE = 0.03  # and only those that took at least this share of the wall time
_HOST_KINDS = {"host-bound": ("host", "sync"), "input-bound": ("input",)}  # the lines' kinds


def _placed(verdict: Verdict | None, a: Anatomy) -> Verdict | None:
    """A host-bound or input-bound verdict with the lines that took the time (the host
    sampler's); an input wait outside a DataLoader gets the iterator's fix."""
    if verdict is None or verdict.kind not in _HOST_KINDS or not a.host_lines:
        return verdict
    lines = [h for h in a.host_lines if h.kind in _HOST_KINDS[verdict.kind]]
    named = tuple(h for h in lines[:_SHOWN_LINES] if h.share >= _LINE_SHARE) or tuple(lines[:1])
    if not named:
        return verdict
    if verdict.kind == "input-bound":
        sampled = sum(h.seconds for h in lines)
        device_loaders = current_backend().syncs.loader_paths
        files = (*_LOADER_FILES, *device_loaders)
        loader = sum(h.seconds for h in lines if any(f in h.via for f in files))
        if loader < 0.5 * sampled:
            return replace(
                verdict,
                reason=f"waiting for the loop's iterator took {a.share('input'):.0%} of the time",
                fix=FIXES["input-iterator"],
                lines=named,
            )
        wrapped = sum(h.seconds for h in lines if any(f in h.via for f in device_loaders))
        if wrapped >= 0.5 * sampled:  # not "wrap it in MpDeviceLoader": it is
            return replace(verdict, fix=FIXES["input-device-loader"], lines=named)
    return replace(verdict, lines=named)


def judge(a: Anatomy) -> Verdict | None:
    """What bounds the loop, from the shares of its wall time (None: not a loop of at least
    three steps). Off a TPU the device is XLA:CPU: its busy time is "cpu-bound", the CPU's
    (the policy then judges the step for the target chip)."""
    verdict = _judge_shares(a)
    if verdict is None or verdict.kind != "device-bound" or judged_chip()[1]:
        return verdict
    return Verdict(
        "cpu-bound",
        f"XLA:CPU ran the graphs {a.device_share:.0%} of the time (the CPU's speed, not a TPU's)",
        FIXES["cpu-bound"],
    )


def _judge_shares(a: Anatomy) -> Verdict | None:
    if len(a.steps) < _MIN_STEPS or a.wall_seconds <= 0:
        return None
    share = a.share
    host = share("trace") + share("sync")
    reads_per_step = sum(s.reads for s in a.steps) / len(a.steps)
    pct = lambda x: f"{x:.0%}"  # noqa: E731
    reasons = {
        "host-bound": f"the host's Python tracing and syncs took {pct(host)} of the time; the "
        f"device was busy {pct(a.device_share)}",
        "input-bound": f"waiting for the data loader took {pct(share('input'))} of the time",
        "compile-bound": f"compiling took {pct(share('compile'))} of the steady steps' time",
        "read-bound": f"value reads took {pct(share('read'))} of the time",
        "device-bound": f"the device was busy {pct(a.device_share)} of the time",
    }
    if share("compile") >= _BOUND:
        n = sum(s.compiles for s in a.steps)
        reasons["compile-bound"] += f" ({n} compile{'s' if n != 1 else ''})"
        kind = "compile-bound"
    elif share("input") >= _BOUND:
        kind = "input-bound"
    elif a.device_share >= _DEVICE_BUSY:
        kind = "device-bound"
    elif share("read") >= _BOUND * 0.8 and reads_per_step >= 0.5:
        reasons["read-bound"] += (
            f", {reads_per_step:.1f} per step; the device was idle {pct(1 - a.device_share)}"
        )
        kind = "read-bound"
    else:
        candidates = {
            "host-bound": host,
            "input-bound": share("input"),
            "compile-bound": share("compile"),
            "read-bound": share("read"),
            "device-bound": a.device_share,
        }
        kind = max(candidates, key=lambda k: candidates[k])
    return Verdict(kind, reasons[kind], FIXES[kind])
