"""XLA counters and metrics as plain data: `snapshot()` now, `later.since(earlier)` for a delta.

Read straight from `torch_xla._XLAC`, never by parsing `metrics_report()` (~100 µs of text).
Reading a metric copies its sample buffer (up to 1,024 samples: ~38 µs a read once full), so a
snapshot reads only the handful of metrics a delta needs, and `setup()` bounds the buffer
(XLA_METRICS_SAMPLES: ~2 µs a read).

Counters here only move forward, also across torch_xla's own resets: its Dynamo bridge clears
every counter for each FX node it checks while `torch.compile(backend="openxla")` compiles
(see _reset_watch.py). What was counted before such a reset is carried into every later
snapshot, so a delta across it stays whole. `reset_metrics()` is the one reset that counts.
Time metrics are never reset by those: a delta across a reset tpu_nb did not see takes
executions and compiles from their samples and names what it cannot recover (`unknown`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tpu_nb.runtime.backend import current as backend
from tpu_nb.runtime.metrics import _reset_watch as reset_watch
from tpu_nb.runtime.units import format_seconds

# The backend's names for what a delta reports (torch_xla: UncachedCompile, MarkStep, ...).
_NAMES = backend().counters.facts
HOST_READ = _NAMES.host_read  # .item(), printing, bool(tensor): a device->host read
_FALLBACK = _NAMES.fallback_prefix  # torch_xla: aten::<op>, one counter per CPU fallback op

# Counters a delta is made of (besides every fallback counter).
_COUNTERS = (
    _NAMES.compiles,
    _NAMES.cache_hits,
    *_NAMES.executions,
    _NAMES.syncs,
    _NAMES.persistent_cache_hits,
    _NAMES.persistent_cache_misses,
)
# Gone after any reset: its drop tells one tpu_nb did not see, until the first reset.
_SENTINEL = (_NAMES.once_at_import,) if _NAMES.once_at_import else ()
# Time metrics (nanoseconds) a delta needs.
_METRICS = (
    _NAMES.compile_time,
    # runs of compiled functions' cached graphs: executions that move no execution counter
    *((_NAMES.cached_graph_runs,) if _NAMES.cached_graph_runs else ()),
    *_NAMES.execute_times,
    _NAMES.to_device_time,
    _NAMES.from_device_time,
)
# What a reset tpu_nb did not see loses for good (no time metric counts them).
_UNRECOVERABLE = ("compile cache hits", "syncs", "scalar reads", "CPU fallbacks")
# Counter names only grow (until a reset): the names a snapshot reads, computed once per list.
_wanted_names: tuple[int, tuple[str, ...]] = (-1, ())
# Whether the backend's compile-log settings are latched and kept from child processes.
_settings_hidden = False
# Bumped by reset_metrics(): a delta across a reset counts from zero (counters alone cannot
# tell a reset that landed on the same value).
_generation = 0
# What else reset_metrics() clears: tpu_nb's own state kept alongside torch_xla's counters
# (compile events read so far, per-line graph histories), registered by the modules keeping it.
_reset_callbacks: list[Callable[[], None]] = []


def on_reset(callback: Callable[[], None]) -> Callable[[], None]:
    """Have `reset_metrics()` call `callback()` too (usable as a decorator)."""
    if callback not in _reset_callbacks:
        _reset_callbacks.append(callback)
    return callback


@dataclass(frozen=True)
class MetricsSnapshot:
    """The runtime's counters and time metrics at one moment (`snapshot()`)."""

    counters: Mapping[str, int]
    metrics: Mapping[str, tuple[int, float]]  # name -> (samples, accumulated value)
    taken_at: float  # time.perf_counter()
    generation: int = 0  # reset_metrics() calls before this snapshot
    unseen_resets: int = 0  # counter resets tpu_nb noticed only afterwards (_reset_watch)
    seen_resets: int = 0  # and those it carried as they happened

    def counter(self, name: str) -> int:
        return self.counters.get(name, 0)

    def since(self, earlier: MetricsSnapshot) -> MetricsDelta:
        """What happened between `earlier` and this snapshot."""
        return _delta(earlier, self)


@dataclass(frozen=True)
class MetricsDelta:
    """What the XLA runtime did between two snapshots. Seconds are wall seconds."""

    compiles: int = 0  # graphs compiled (not found in the in-memory cache)
    cache_hits: int = 0  # graphs found in the compile cache (in memory, or on disk: below)
    compile_seconds: float = 0.0
    executions: int = 0  # graph executions (single-device and SPMD, compiled code's too)
    # Of those, runs of compiled functions' cached graphs (torch.compile, torch_xla.compile):
    # torch_xla's Dynamo bridge runs them without its execution counter.
    compiled_code_executions: int = 0
    execute_seconds: float = 0.0  # complete once device ops were waited for
    # executions timed but not counted: the runtime times one that fails (out of memory as
    # it allocates) and counts only those that complete
    unfinished_executions: int = 0
    to_device_transfers: int = 0
    to_device_seconds: float = 0.0
    from_device_transfers: int = 0
    from_device_seconds: float = 0.0
    syncs: int = 0  # torch_xla.sync() / step markers
    # Scalar reads: torch_xla's aten::_local_scalar_dense counter, and nothing else. It moves
    # for .item(), bool()/float()/int() of a tensor, a tensor used as an index and
    # formatting a one-element tensor with a format spec (f"{loss:.3f}"). Printing a tensor,
    # .tolist(), .cpu() and .numpy() copy it with xla::_to_copy instead: those are counted in
    # from_device_transfers (as every read is), not here.
    host_reads: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)  # op -> calls run on the CPU
    # of the cache hits, executables the persistent compile cache loaded from disk (a TPU's,
    # after a restart; XLA:CPU writes them but cannot load them)
    persistent_cache_hits: int = 0
    wall_seconds: float = 0.0  # time between the two snapshots
    counters: dict[str, int] = field(default_factory=dict)  # every counter that moved
    # Figures that may be short: the counters were reset where tpu_nb could not see it (a
    # reference to torch_xla's reset taken before tpu_nb loaded). Compiles and executions are
    # recovered from their time samples; these are not.
    unknown: tuple[str, ...] = ()

    @property
    def did_xla_work(self) -> bool:
        return bool(
            self.compiles
            or self.cache_hits
            or self.executions
            or self.to_device_transfers
            or self.from_device_transfers
            or self.host_reads
            or self.fallbacks
        )

    def summary(self) -> str:
        """One line: the figures a user checks first."""

        def count(n: int, noun: str) -> str:
            return f"{n} {noun}{'' if n == 1 else 's'}"

        parts = []
        if self.compiles:
            parts.append(f"{self.compiles} compiled ({format_seconds(self.compile_seconds)})")
        if self.executions:
            parts.append(f"{self.executions} executed ({format_seconds(self.execute_seconds)})")
        if not parts:
            parts.append("nothing compiled or executed")
        if self.cache_hits:
            parts.append(count(self.cache_hits, "cache hit") + self.from_disk())
        parts.append(f"{self.to_device_transfers}\u2192dev {self.from_device_transfers}\u2192host")
        if self.host_reads:
            parts.append(count(self.host_reads, "host read"))
        if self.fallbacks:
            parts.append(
                f"{count(sum(self.fallbacks.values()), 'CPU fallback')} "
                f"({', '.join(sorted(self.fallbacks))})"
            )
        if self.unknown:
            parts.append(self.unknown_note())
        return ", ".join(parts)

    def from_disk(self) -> str:
        """ " (2 from disk)": of the cache hits, the executables the persistent compile cache
        loaded (a TPU's, after a restart: XLA:CPU cannot load them); "" when none."""
        n = self.persistent_cache_hits
        return f" ({n} from disk)" if n else ""

    def unknown_note(self) -> str:
        """What a reset tpu_nb did not see left uncertain, in words ('' when nothing)."""
        if not self.unknown:
            return ""
        return (
            "XLA counters were reset where tpu_nb could not see it: "
            f"{', '.join(self.unknown)} may be undercounted (compiles and executions are "
            "recovered from their time samples)"
        )

    def rows(self) -> list[tuple[str, int, float | None]]:
        """(what, count, seconds if timed) of the counts a report lists, fallbacks apart."""
        return [
            ("graphs compiled", self.compiles, self.compile_seconds),
            ("compile cache hits", self.cache_hits, None),
            ("executions", self.executions, self.execute_seconds),
            ("transfers to device", self.to_device_transfers, self.to_device_seconds),
            ("transfers to host", self.from_device_transfers, self.from_device_seconds),
            ("syncs", self.syncs, None),
            ("scalar reads (.item())", self.host_reads, None),
        ]

    def __str__(self) -> str:
        rows = self.rows()
        if self.persistent_cache_hits:
            rows.insert(2, ("  from disk", self.persistent_cache_hits, None))
        if self.compiled_code_executions:
            rows.insert(
                rows.index(next(r for r in rows if r[0] == "executions")) + 1,
                ("  compiled functions'", self.compiled_code_executions, None),
            )
        lines = [
            f"  {name:22}{count:>8}  {'' if secs is None else format_seconds(secs)}".rstrip()
            for name, count, secs in rows
        ]
        for op, n in sorted(self.fallbacks.items()):
            lines.append(f"  CPU fallback {op:22}{n:>8}")
        if self.unknown:
            lines.append(f"  {self.unknown_note()}")
        return "\n".join(lines)


def snapshot(*, full: bool = False) -> MetricsSnapshot:
    """Read the XLA runtime's counters and time metrics now (cheap: about 10 µs).

    By default only what a `MetricsDelta` needs is read; `full=True` reads every counter and
    every metric's (samples, accumulator), for complete reports.
    """
    global _wanted_names, _settings_hidden
    runtime = backend()
    if not _settings_hidden:  # snapshots run at every cell's edges: soon after the latch
        _settings_hidden = runtime.process.hide_latched_settings()
    with reset_watch.lock:
        reset_watch.ensure_installed()
        names = runtime.counters.names()
        if not full and _wanted_names[0] != len(names):
            wanted = tuple(n for n in names if n.startswith(_FALLBACK) or n in _COUNTERS)
            # the sentinel is read even once gone: that is the point
            _wanted_names = (len(names), wanted + _SENTINEL)
        raw = runtime.counters.read(names if full else _wanted_names[1])
        counters = reset_watch.carry(raw, len(names))
    metrics = {}
    # Read every time, never reused while a counter stands still: after a reset tpu_nb did
    # not see, the counters can read as before while the samples moved on (and the samples
    # are then the figure to trust).
    for name in dict.fromkeys((*_METRICS, *(runtime.counters.metric_names() if full else ()))):
        data = runtime.counters.metric(name)
        if data is not None:
            metrics[name] = (data.count, data.total)
    return MetricsSnapshot(
        MappingProxyType(counters),
        MappingProxyType(metrics),
        time.perf_counter(),
        _generation,
        reset_watch.unseen_resets,
        reset_watch.seen_resets,
    )


def reset_metrics() -> None:
    """Clear torch_xla's counters and metrics, and the history tpu_nb keeps beside them
    (what `%xla_metrics --reset` does)."""
    global _generation, _wanted_names
    runtime = backend()
    with reset_watch.lock:
        runtime.counters.clear()
        reset_watch.forget()
    runtime.counters.clear_metrics()
    _wanted_names = (-1, ())
    _generation += 1
    for callback in list(_reset_callbacks):
        callback()


def _diff(later: int, earlier: int) -> int:
    # Counters only grow; a smaller value means they were cleared in between.
    return later - earlier if later >= earlier else later


def _metric_delta(earlier, later, name: str) -> tuple[int, float]:
    after = later.metrics.get(name)
    if after is None:
        return 0, 0.0
    before = earlier.metrics.get(name, (0, 0.0))
    if after[0] < before[0]:
        before = (0, 0.0)
    return after[0] - before[0], (after[1] - before[1]) / 1e9


def _delta(earlier: MetricsSnapshot, later: MetricsSnapshot) -> MetricsDelta:
    if earlier.generation != later.generation:
        earlier = MetricsSnapshot({}, {}, earlier.taken_at, later.generation)
    moved = {
        name: d
        for name, value in later.counters.items()
        if (d := _diff(value, earlier.counters.get(name, 0)))
    }
    cut = len(_FALLBACK)
    fallbacks = {n[cut:]: d for n, d in moved.items() if n.startswith(_FALLBACK) and n != HOST_READ}
    n_compile, compile_s = _metric_delta(earlier, later, _NAMES.compile_time)
    timed = [_metric_delta(earlier, later, name) for name in _NAMES.execute_times]
    bridge = _metric_delta(earlier, later, _NAMES.cached_graph_runs)[0]
    n_to, to_s = _metric_delta(earlier, later, _NAMES.to_device_time)
    n_from, from_s = _metric_delta(earlier, later, _NAMES.from_device_time)
    executions = sum(moved.get(name, 0) for name in _NAMES.executions)
    compiles = moved.get(_NAMES.compiles, 0)
    # Time metrics survive counter resets: across one, their samples are the better figure
    # for executions (an execution ending in the runtime's threads between a carried read
    # and the clear moves only its samples; a compiled function's cached graph runs move
    # the samples and no execution counter), and across one tpu_nb did not see, compiles.
    unseen = later.unseen_resets != earlier.unseen_resets
    if unseen or later.seen_resets != earlier.seen_resets:
        executions = max(executions, sum(n for n, _ in timed) - bridge)
    if unseen:
        compiles = max(compiles, n_compile)
    return MetricsDelta(
        compiles=compiles,
        cache_hits=moved.get(_NAMES.cache_hits, 0),
        compile_seconds=compile_s,
        executions=executions + bridge,
        compiled_code_executions=bridge,
        execute_seconds=sum(seconds for _, seconds in timed),
        unfinished_executions=max(0, sum(n for n, _ in timed) - executions - bridge),
        to_device_transfers=n_to,
        to_device_seconds=to_s,
        from_device_transfers=n_from,
        from_device_seconds=from_s,
        syncs=moved.get(_NAMES.syncs, 0),
        host_reads=moved.get(HOST_READ, 0),
        fallbacks=fallbacks,
        persistent_cache_hits=moved.get(_NAMES.persistent_cache_hits, 0),
        wall_seconds=later.taken_at - earlier.taken_at,
        counters=moved,
        unknown=_UNRECOVERABLE if unseen else (),
    )
