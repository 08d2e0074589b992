"""`time_device()`: timing that waits for the device.

`%time`/`%timeit` on XLA time only the tracing: the work runs later, asynchronously. Here
every run is synced and waited for, the first run (tracing + compile + execute) is reported
apart from the steady state, and compiles during the steady state are called out.

A compiled step (torch_xla.compile, torch.compile) often compiles on its second run too:
the optimizer's state (momentum, Adam's moments) appears after the first step, and the step
with it is another graph. Runs after the first that still compile are its warm-up, reported
apart (at most `WARM_UP_RUNS` of them): a one-time cost, not recompilation.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from tpu_nb.runtime.backend import current as backend
from tpu_nb.runtime.errors import TpuNbUsageError, check_whole_number
from tpu_nb.runtime.metrics._counters import snapshot
from tpu_nb.runtime.units import format_seconds


@dataclass(frozen=True)
class DeviceTiming:
    """First run apart from the steady state; seconds per run, device work included."""

    first_seconds: float
    first_compiles: int
    per_run: tuple[float, ...]  # one figure per repeat: mean seconds of its `number` runs
    number: int
    steady_compiles: int  # graphs compiled during the steady state (should be 0)
    # Runs after the first that still compiled (a warm-up graph), their compiles and time.
    warmup_runs: int = 0
    warmup_compiles: int = 0
    warmup_seconds: float = 0.0

    @property
    def median(self) -> float:
        return statistics.median(self.per_run)

    @property
    def best(self) -> float:
        return min(self.per_run)

    @property
    def worst(self) -> float:
        return max(self.per_run)

    @property
    def recompiles(self) -> bool:
        return self.steady_compiles > 0

    def summary(self) -> str:
        first = (
            f"first run {format_seconds(self.first_seconds)} ({_graphs(self.first_compiles)} "
            "compiled)"
        )
        if self.warmup_runs:
            runs = "run" if self.warmup_runs == 1 else "runs"
            first += (
                f"; warm-up: {self.warmup_runs} more {runs} compiled "
                f"{_graphs(self.warmup_compiles)} ({format_seconds(self.warmup_seconds)})"
            )
        steady = (
            f"steady state {format_seconds(self.median)} per run (median of {len(self.per_run)} "
            f"repeats \u00d7 {self.number} runs; range {format_seconds(self.best)}\u2013"
            f"{format_seconds(self.worst)})"
        )
        tail = "; no recompilation"
        if self.recompiles:
            tail = (
                f"; STILL RECOMPILING: {_graphs(self.steady_compiles)} compiled in the "
                "steady state (shapes or Python values change between runs)"
            )
        return f"{first}; {steady}{tail}"

    __str__ = summary


def _graphs(n: int) -> str:
    return f"{n} graph{'s' if n != 1 else ''}"


def _run_once(fn, runtime) -> float:
    start = time.perf_counter()
    result = fn()  # kept alive over the sync, so a returned tensor is computed too
    runtime.syncs.sync()
    runtime.syncs.wait()
    del result
    return time.perf_counter() - start


# Bounds of number and repeat: beyond them a timing runs for days (and a huge `number` is
# almost always a typo); the automatic `number` stays at most 10,000 too.
MAX_NUMBER = 1_000_000
MAX_REPEAT = 1_000
WARM_UP_RUNS = 3  # runs after the first that may still compile as the warm-up


def time_device(
    fn: Callable[[], object], *, number: int | None = None, repeat: int = 7
) -> DeviceTiming:
    """Time `fn()` on the XLA device: each run synced and waited for.

    number: runs per repeat; default: enough for a repeat to take about 0.2 s.
    repeat: repeats of the steady state; the median of their per-run means is reported.
    """
    if not callable(fn):
        raise TpuNbUsageError(
            f"time_device times a function called with no arguments; got "
            f"{fn!r:.60}. Fix: e.g. time_device(lambda: step(x)) or time_device(step)."
        )
    if number is not None:
        check_whole_number(number, "number", high=MAX_NUMBER, fix="e.g. number=10")
    check_whole_number(repeat, "repeat", high=MAX_REPEAT, fix="e.g. repeat=7")
    runtime = backend()
    runtime.syncs.sync()  # work pending from before is not part of the timing
    runtime.syncs.wait()
    before = snapshot()
    first = _run_once(fn, runtime)
    after = snapshot()
    first_compiles = after.since(before).compiles
    # The warm-up: runs that still compile after the first (see the module docstring). The
    # first run that compiles nothing sizes `number`.
    warmup_runs = warmup_compiles = 0
    warmup_seconds = 0.0
    probe = None
    while first_compiles and warmup_runs < WARM_UP_RUNS:
        seconds = _run_once(fn, runtime)
        later = snapshot()
        compiled = later.since(after).compiles
        after = later
        if not compiled:
            probe = seconds
            break
        warmup_runs, warmup_compiles = warmup_runs + 1, warmup_compiles + compiled
        warmup_seconds += seconds
    if number is None:
        probe = _run_once(fn, runtime) if probe is None else probe
        number = max(1, min(10_000, int(0.2 / max(probe, 1e-6))))
    steady_start = snapshot()
    per_run = [sum(_run_once(fn, runtime) for _ in range(number)) / number for _ in range(repeat)]
    steady = snapshot().since(steady_start)
    return DeviceTiming(
        first,
        first_compiles,
        tuple(per_run),
        number,
        steady.compiles,
        warmup_runs,
        warmup_compiles,
        warmup_seconds,
    )
