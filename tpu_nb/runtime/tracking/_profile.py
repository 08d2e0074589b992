"""A torch_xla profiler trace of a block, or of its first N steps, as plain data.

    with tpu_nb.track():
        with tpu_nb.runtime.tracking.profile(steps=3) as capture:
            for batch in loader:
                train_step(batch)          # the trace stops after the third sync
    TraceView(capture.trace)               # tpu_nb.display.profile_view: the timeline

torch_xla's profiler (`torch_xla.debug.profiler.start_trace/stop_trace`) writes, next to its
XPlane protobuf, the same trace as Chrome trace events (`<host>.trace.json.gz`, converted by
the profiler itself). That file is what is read here: a documented JSON format, no protobuf
parser of our own, no TensorBoard. Times are seconds from the trace's start.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpu_nb.runtime.backend import current as current_backend
from tpu_nb.runtime.errors import RuntimeStateError, TpuNbUsageError, check_whole_number
from tpu_nb.runtime.probe import Subscription, probe
from tpu_nb.runtime.tracking._run import current_run

if TYPE_CHECKING:
    from tpu_nb.runtime.tracking._provenance import Recorder

MAX_EVENTS = 50_000  # events kept from a trace (the longest, when there are more)


@dataclass(frozen=True)
class TraceEvent:
    thread: str
    name: str
    start: float  # seconds from the trace's first event
    duration: float


@dataclass(frozen=True)
class ProfileTrace:
    events: tuple[TraceEvent, ...]
    threads: tuple[str, ...]  # in the profiler's display order
    steps: int = 0  # syncs traced (StepMarker events)
    dropped: int = 0  # short events left out beyond MAX_EVENTS

    @property
    def seconds(self) -> float:
        return max((e.start + e.duration for e in self.events), default=0.0)

    def named(self, name: str) -> list[TraceEvent]:
        return [e for e in self.events if e.name == name]


def read_trace(logdir: str) -> ProfileTrace:
    """The newest `*.trace.json.gz` under `logdir` (what `stop_trace()` wrote)."""
    paths = sorted(
        glob.glob(os.path.join(logdir, "**", "*.trace.json.gz"), recursive=True),
        key=os.path.getmtime,
    )
    if not paths:
        raise TpuNbUsageError(
            f"no profiler trace (*.trace.json.gz) under {logdir}. Fix: capture one "
            "with tpu_nb.runtime.tracking.profile() around the steps."
        )
    with gzip.open(paths[-1], "rt") as f:
        raw = json.load(f).get("traceEvents", [])
    names, order = {}, {}
    for e in (e for e in raw if e.get("ph") == "M"):
        if e.get("name") == "thread_name":
            names[e.get("tid")] = str(e.get("args", {}).get("name", e.get("tid")))
        if e.get("name") == "thread_sort_index":
            order[e.get("tid")] = e.get("args", {}).get("sort_index", 0)
    complete = [e for e in raw if e.get("ph") == "X" and "ts" in e]
    dropped = max(0, len(complete) - MAX_EVENTS)
    if dropped:
        complete = sorted(complete, key=lambda e: -e.get("dur", 0))[:MAX_EVENTS]
    t0 = min((e["ts"] for e in complete), default=0.0)
    events = sorted(
        (
            TraceEvent(
                names.get(e.get("tid"), str(e.get("tid"))),
                str(e.get("name", "")),
                (e["ts"] - t0) * 1e-6,
                e.get("dur", 0) * 1e-6,
            )
            for e in complete
        ),
        key=lambda e: e.start,
    )

    def place(thread: str) -> tuple:  # the profiler's display order, then the name
        ranks = (order[k] for k, v in names.items() if v == thread and k in order)
        return min(ranks, default=99), thread

    threads = tuple(sorted({e.thread for e in events}, key=place))
    steps = sum(1 for e in events if e.name == "StepMarker")
    return ProfileTrace(tuple(events), threads, steps, dropped)


class profile:
    """Capture a profiler trace of the block; `steps=N`: stop after the block's N-th sync
    (needs a tracked run: inside `%%on_tpu` or `tpu_nb.track()`). The trace is in
    `.trace` after the block (or as soon as the N-th sync returns)."""

    def __init__(self, steps: int | None = None, *, logdir: str | None = None):
        if steps is not None:
            check_whole_number(steps, "steps", alternative="None", fix="e.g. steps=3")
        self.steps = steps
        self._own_dir = logdir is None
        self.logdir = logdir or tempfile.mkdtemp(prefix="tpu_nb-profile-")
        self.trace: ProfileTrace | None = None
        self._seen = 0
        self._tracing = False
        self._recorder: Recorder | None = None
        self._subscription: Subscription | None = None

    def __enter__(self) -> profile:
        if self.steps is not None:
            run = current_run()
            if run is None or run.recorder is None:
                raise TpuNbUsageError(
                    "profile(steps=N) counts the syncs of a tracked run. Fix: "
                    "use it inside %%on_tpu or `with tpu_nb.track():`, or drop "
                    "steps= to trace the whole block."
                )
            self._recorder = run.recorder
            self._subscription = probe().subscribe(self, ("sync",))
        try:
            current_backend().profiler.start(self.logdir)
        except Exception as exc:  # a trace already running, a profiler that cannot start
            self._unhook()
            if self._own_dir:
                shutil.rmtree(self.logdir, ignore_errors=True)
            raise RuntimeStateError(
                f"the torch_xla profiler did not start: {exc}. Fix: stop the "
                "other trace first (torch_xla.debug.profiler.stop_trace())."
            ) from None
        self._tracing = True
        return self

    # the probe's sync events: the block's syncs (the docstring's N-th sync), less the
    # runtime's own around a compiled function and the run's own end
    before = None

    def after(self, event, state) -> None:
        recorder = self._recorder
        if recorder is None or not recorder.active or event.plumbing or event.owner is recorder:
            return
        self._seen += 1
        if self._seen >= (self.steps or 0):
            self._stop()

    def _stop(self) -> None:
        self._unhook()
        if not self._tracing:
            return
        self._tracing = False
        current_backend().profiler.stop()
        self.trace = read_trace(self.logdir)
        if self._own_dir:
            shutil.rmtree(self.logdir, ignore_errors=True)

    def _unhook(self) -> None:
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            subscription.close()

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop()
