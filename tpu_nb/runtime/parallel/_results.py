"""What `launch()` returns and raises: each replica's result, the launch's, and the errors."""

from __future__ import annotations

import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, fields
from itertools import pairwise
from typing import Any

from tpu_nb.runtime.errors import RuntimeStateError, TpuNbError
from tpu_nb.runtime.metrics._counters import MetricsDelta
from tpu_nb.runtime.parallel import _cell
from tpu_nb.runtime.sources import traceback_from
from tpu_nb.runtime.units import format_seconds, percentile


class CollectiveRefused(TpuNbError):
    """A collective between XLA:CPU replicas, which torch_xla 2.9 would hang on."""


class ReplicasTimedOut(RuntimeStateError):
    """Replicas still running after the launch's timeout, stopped. The message names the
    option as `launch()` spells it; `said_as(option)` as another caller does (`--timeout`)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        super().__init__(self.said_as("timeout="))

    def said_as(self, option: str) -> str:
        gap = "" if option.endswith("=") else " "
        within = f"{option}{gap}{self.seconds:g}"
        return (
            f"the replicas did not finish within {within} s and were stopped. Fix: a larger "
            f"{option}, or look for a replica that waits forever (a collective, a queue, input())."
        )


class ReplicaCrash(TpuNbError):
    """A replica process died without a Python error: a signal in native code (SIGSEGV), a
    SIGKILL (the out-of-memory killer) or an exit before returning. `signal` is the signal's
    name (or 'exit status N'), `where` the innermost Python frame running then when known,
    `stack` what the launcher wrote (every thread's Python stack, for a native crash)."""

    def __init__(self, signal_name: str, where: str, stack: str, *, message: str | None = None):
        self.signal, self.where, self.stack = signal_name, where, stack
        at = f" while running {where}" if where else ""
        super().__init__(
            message
            or f"a replica process crashed in native code ({signal_name}){at}; the "
            "other replicas were stopped. Fix: run the launch again; if it "
            "crashes again, the stacks are in this error's .stack attribute."
        )


class ReplicaError(TpuNbError):
    """A replica raised; `traceback` is its traceback, `ordinal` which replica it was."""

    unit = "replica"  # what ran it: a host, for HostError

    def __init__(self, ordinal: int, world: int, summary: str, trace: str):
        self.ordinal, self.world, self.traceback = ordinal, world, trace
        super().__init__(
            f"{self.unit} {ordinal} of {world} failed: {summary} (the other {self.unit}s were "
            "stopped)"
        )


# The counters LaunchResult.merged sums over processes (besides the fallbacks).
_SUMMED = (
    "compiles",
    "cache_hits",
    "compile_seconds",
    "executions",
    "execute_seconds",
    "to_device_transfers",
    "from_device_transfers",
    "syncs",
    "host_reads",
)


@dataclass(frozen=True)
class ReplicaResult:
    """What one replica did. Only replicas that returned have one: a replica that raised
    makes the launch raise ReplicaError (its traceback there), and what a replica prints is
    streamed as it runs (launch's `stream`), not kept."""

    ordinal: int
    value: Any = None  # fn's return value (None when it could not be pickled)
    wall_seconds: float = 0.0
    step_seconds: tuple[float, ...] = ()  # time between its syncs
    metrics: MetricsDelta | None = None  # its process's counters (see LaunchResult.merged)
    pid: int = 0


@dataclass(frozen=True)
class LaunchResult:
    """All replicas of one launch, and how it was launched."""

    mode: str  # "replicas" or "spmd"
    path: str  # "fork", "worker" or "in-process"
    devices: int
    replicas: tuple[ReplicaResult, ...]
    wall_seconds: float
    notes: tuple[str, ...] = ()

    @property
    def values(self) -> list:
        return [r.value for r in self.replicas]

    def merged(self) -> MetricsDelta:
        """Counters summed over processes (on XLA:CPU the replicas share one process)."""
        by_pid: dict[int, MetricsDelta] = {}
        for r in self.replicas:  # a process's replicas count from one start: the last to end
            kept = by_pid.get(r.pid)
            if r.metrics is not None and (
                kept is None or r.metrics.wall_seconds > kept.wall_seconds
            ):
                by_pid[r.pid] = r.metrics
        fallbacks = sum((Counter(d.fallbacks) for d in by_pid.values()), Counter())
        empty = MetricsDelta()
        sums = {
            n: sum((getattr(d, n) for d in by_pid.values()), getattr(empty, n)) for n in _SUMMED
        }
        return MetricsDelta(**sums, fallbacks=dict(fallbacks))

    def summary(self) -> str:
        m = self.merged()
        steps = [
            f"[{r.ordinal}] {format_seconds(quantile(r.step_seconds, 0.5))}" for r in self.replicas
        ]
        return (
            f"{self.mode} on {self.devices} device{'s' if self.devices != 1 else ''} "
            f"({self.path}): {format_seconds(self.wall_seconds)}, {m.compiles} compiled, "
            f"{m.executions} executed; median step " + ", ".join(steps)
        )

    def __str__(self) -> str:
        return "\n".join([self.summary(), *self.notes])


def not_sent_back(who: str, error: str) -> str:
    return (
        f"{who}'s return value could not be sent back ({error}), so its value is None. Fix: "
        "return plain data (numbers, lists, tensors moved with .cpu())."
    )


class Lines:
    """Output arriving in pieces, passed on line by line with a prefix ("[2] ", "[host 1] ")."""

    def __init__(self, stream: Callable[[str], None], prefix: str):
        self.stream, self.prefix, self.rest = stream, prefix, ""

    def add(self, text: str) -> None:
        *lines, self.rest = (self.rest + text).split("\n")
        for line in lines:
            self.stream(self.prefix + line)

    def end(self) -> None:
        """Pass on the last line, unfinished."""
        if self.rest:
            self.stream(self.prefix + self.rest)
        self.rest = ""


class SyncTimes:
    """When the work synced: a callback after the runtime's next sync, set again at each one,
    until `counting` is False (a tracked run's own final sync is not the work's)."""

    def __init__(self, runtime):
        self.runtime, self.times, self.counting = runtime, [], True
        runtime.syncs.after_next(self._on_sync)

    def _on_sync(self) -> None:
        if self.counting:
            self.times.append(time.perf_counter())
            self.runtime.syncs.after_next(self._on_sync)

    def steps(self, start: float) -> tuple[float, ...]:
        """The time between syncs, the first from `start`."""
        return tuple(b - a for a, b in pairwise([start, *self.times]))


def quantile(values, q: float) -> float | None:
    """The q-quantile of `values`, interpolated as the step anatomy's (None: no values)."""
    return percentile(sorted(values), q) if values else None


def record_of(cls, data: dict):
    return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def user_traceback(exc: BaseException, module_file: str) -> str:
    """`exc`'s traceback from the first frame outside `module_file` (the module that ran the
    user's code) and CellFunction's module on: the user's code, as the notebook shows it."""
    tpu_nb_files = (module_file, _cell.__file__)
    tb = exc.__traceback__
    tb = traceback_from(tb, lambda frame: frame.f_code.co_filename not in tpu_nb_files) or tb
    return "".join(traceback.format_exception(type(exc), exc, tb))
