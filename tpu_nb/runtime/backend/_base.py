"""`Backend`: everything tpu_nb asks of the library that runs PyTorch on the device.

tpu_nb reads facts (counters, compile causes, the pending graph, device and memory figures)
and asks for a few actions (sync, wait, launch replicas, switch to SPMD), through the small
protocols below; a `Backend` holds one object of each. Every method is typed and documented
by what a user of tpu_nb relies on (with the torch_xla fact behind it where the name alone
does not say); tests/test_backend_contract.py asserts each protocol on the real runtime.

Nothing here imports the backend's library: a backend imports it when a method first needs
it, so `import tpu_nb` stays cheap and `detect()` works when the library is broken.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

# What a tensor is waiting for (Graphs.pending): "" nothing, it is device data.
Pending = Literal["", "new", "in place"]


@dataclass(frozen=True)
class MetricSamples:
    """One time metric as the backend keeps it: how many samples it recorded in all, their
    total (nanoseconds for a time), and the recent (timestamp, value) samples it still holds."""

    count: int
    total: float
    samples: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class DeviceMemory:
    """Bytes of device memory in use, the limit and the peak; None where not reported."""

    used: int | None
    limit: int | None
    peak: int | None = None


@dataclass(frozen=True)
class CounterNames:
    """Which of the backend's counters and metrics stand for each fact a `MetricsDelta`
    reports. Counters count events; time metrics are nanoseconds."""

    compiles: str  # a graph compiled (not found in the in-memory cache)
    cache_hits: str  # a graph found in the in-memory cache
    executions: tuple[str, ...]  # a graph executed (one counter per execution path)
    syncs: str  # a step marker / sync
    host_read: str  # a scalar read back to the host (.item(), print, bool(tensor))
    fallback_prefix: str  # counters of ops run on the CPU instead of the device
    persistent_cache_hits: str
    persistent_cache_misses: str
    compile_time: str
    execute_times: tuple[str, ...]  # in `executions` order
    to_device_time: str
    from_device_time: str
    tensors_created: str  # a device tensor created (every op traced on the device makes one)
    tensors_destroyed: str  # a device tensor freed (created - destroyed: the live ones)
    # A time metric sampled once per run of a compiled function's cached graph: executions
    # that move none of `executions` (torch_xla's Dynamo bridge runs them itself).
    cached_graph_runs: str = ""
    # A counter that counts once, at import, and never again: read as zero after it has been
    # seen, the counters were reset ("" where there is none).
    once_at_import: str = ""


class Process(ABC):
    """The backend in this process: is it imported, has it started, which settings it reads
    (and latches), where it logs why each graph compiled."""

    @abstractmethod
    def is_loaded(self) -> bool:
        """Whether this process has imported the backend's library (never imports it)."""

    @abstractmethod
    def started(self) -> bool:
        """Whether the backend's runtime has started in this process (never starts it).
        torch_xla: `_XLAC._xla_runtime_is_initialized()`."""

    @abstractmethod
    def load(self) -> Any:
        """Import the backend's library (once) and return its module; a broken install
        raises a TpuNbError naming the fix."""

    @abstractmethod
    def compiled_yet(self) -> bool:
        """Whether this process has compiled (or found in a cache) any graph yet; never
        starts the runtime."""

    @abstractmethod
    def compile_log_path(self) -> str | None:
        """The file the backend appends one compile-cause block to per uncached compile, or
        None when compile-cause analysis is off in this process.
        torch_xla: PT_XLA_DEBUG_LEVEL=1 with PT_XLA_DEBUG_FILE."""

    @abstractmethod
    def settings(self) -> dict[str, str]:
        """The environment as the backend reads it: `os.environ` plus the settings
        `hide_latched_settings` took out of it (still in effect in this process)."""

    @abstractmethod
    def hide_latched_settings(self) -> bool:
        """Once the backend has latched its compile-log settings, take them out of
        `os.environ`, so that child processes do not append to this process's log. True once
        they are latched (out of `os.environ` from then on), False before.
        torch_xla: PT_XLA_DEBUG_LEVEL/_FILE are read as the process's first compile starts
        (for its cause) and again as it ends (for its sizes)."""

    @abstractmethod
    def source_lines(self) -> bool:
        """Whether new graph nodes record the Python line that made them.
        torch_xla: `_XLAC._get_ir_debug()` (XLA_IR_DEBUG)."""

    @abstractmethod
    def set_source_lines(self, enabled: bool) -> None:
        """Switch recording graph nodes' Python lines on or off for nodes traced from now on.
        torch_xla: `_XLAC._set_ir_debug`."""


class Counters(ABC):
    """Event counters and time metrics: what a `MetricsDelta` is made of."""

    #: Which counter or metric stands for each fact a MetricsDelta reports.
    facts: CounterNames

    @abstractmethod
    def names(self) -> Sequence[str]:
        """Names of every counter that has counted at least once (the list only grows until
        `clear`)."""

    @abstractmethod
    def read(self, names: Iterable[str]) -> dict[str, int]:
        """The current value of each named counter; 0 for one that never counted."""

    @abstractmethod
    def reader(self) -> Callable[[str], int | None]:
        """A function reading one counter (0 or None before it first counted), cheap enough
        for a hook that runs at every sync and device read; imports the backend.
        torch_xla: `_XLAC._xla_counter_value` itself."""

    @abstractmethod
    def metric_names(self) -> Sequence[str]:
        """Names of every time metric that has a sample."""

    @abstractmethod
    def metric(self, name: str) -> MetricSamples | None:
        """One time metric with the recent samples the backend keeps; None before its
        first. torch_xla: `_XLAC._xla_metric_data`."""

    def fallbacks(self) -> list[str]:
        """Ops this process has run on the CPU instead of the device so far."""
        return self.fallbacks_reader()()

    @abstractmethod
    def fallbacks_reader(self) -> Callable[[], list[str]]:
        """A function listing what `fallbacks()` lists, cheap enough for a hook that runs at
        every sync; imports the backend. torch_xla: `_XLAC._get_executed_fallback_ops`."""

    @abstractmethod
    def clear(self) -> None:
        """Set every counter back to zero (not routed to a `watch_clears` hook)."""

    @abstractmethod
    def clear_metrics(self) -> None:
        """Drop every time metric's samples."""

    @abstractmethod
    def watch_clears(self, hook: Callable[[frozenset[str], Callable[[], None]], None]) -> bool:
        """Route the backend's own counter resets through `hook(restored, clear)`: `restored`
        names counters the backend puts back after clearing, `clear()` does the reset. Once
        per process; False when the backend's resets cannot be intercepted.
        torch_xla: its Dynamo bridge calls `debug.metrics.clear_counters()` mid-compile."""

    @abstractmethod
    def unwatch_clears(self) -> None:
        """Undo `watch_clears`: the backend's resets are its own again."""


class Graphs(ABC):
    """The pending graph (what the next sync compiles and runs), and the backend's own count
    of distinct graphs per step (what `max_graphs` falls back on)."""

    @abstractmethod
    def text(self, tensors: Sequence[Any]) -> str:
        """The IR text of the graph that computes `tensors` at the next sync."""

    @abstractmethod
    def hash(self, tensors: Sequence[Any]) -> str:
        """A hash of that graph, 32 hex digits: the same graph gives the same hash."""

    @abstractmethod
    def hlo(self, tensors: Sequence[Any]) -> str:
        """That graph lowered to HLO module text."""

    @abstractmethod
    def hlo_proto(self, tensors: Sequence[Any]) -> bytes:
        """That graph lowered to a serialized HloModuleProto (with its stack-frame index)."""

    @abstractmethod
    def pending(self, tensor: Any) -> Pending:
        """Whether the tensor has operations waiting for a sync: "" (no: device data),
        "new" (the next graph computes it into a buffer of its own, one of its outputs) or
        "in place" (the next graph writes it over the buffer of the tensor it updates in
        place, e.g. a parameter an optimizer steps)."""

    @abstractmethod
    def open_scope(self, name: str) -> Any:
        """Name the IR nodes the calling thread traces from now on `name` (nested inside the
        scopes already open on this thread), until the returned handle is dropped. The graph
        and its hash stay the same; the names show in the IR text while source lines are
        recorded. torch_xla: `profiler.scope_pusher`, which appends a counter (`name.3`)."""

    @abstractmethod
    def limit(self) -> int:
        """How many different graphs may be counted under one name before the next one
        raises (RuntimeError at that trace). Imports the backend.
        torch_xla: the dynamic-shape detector behind `compile(max_different_graphs=)`."""

    @abstractmethod
    def set_limit(self, limit: int) -> None:
        """Set `limit` (1 to 10 000)."""

    @abstractmethod
    def start_counting(self, name: str) -> None:
        """Count the graphs traced from now on under `name`: one traced under a name that
        already counted `limit` different graphs raises. torch_xla: a detector session."""

    @abstractmethod
    def stop_counting(self) -> None:
        """Stop counting under the open name (the name keeps its graphs)."""

    @abstractmethod
    def forget_counted(self, name: str) -> None:
        """Drop the graphs counted under `name`."""


class Syncs(ABC):
    """Syncs, and where tpu_nb's interception layer (tracking's probe) sees them."""

    #: Callers whose syncs are the backend's plumbing around a compiled function (syncing its
    #: inputs, running the work pending before it), not a step of the user's: (path suffix of
    #: the caller's file, the caller's function name, "" for any function of that file).
    plumbing_callers: tuple[tuple[str, str], ...]
    #: Path fragments ("/"-separated) of the backend's torch.compile bridge: a frame there is
    #: the backend tracing or compiling a function's graph.
    compiler_paths: tuple[str, ...]
    #: Path fragments of the backend's device data loaders: time in them is waiting for input.
    loader_paths: tuple[str, ...]

    @abstractmethod
    def sync(self) -> None:
        """Compile (or find in the cache) and launch the pending graph."""

    @abstractmethod
    def wait(self) -> None:
        """Block until every launched execution has finished (its times are then recorded).
        torch_xla: `xm.wait_device_ops()`."""

    @abstractmethod
    def after_next(self, callback: Callable[[], None]) -> None:
        """Run `callback()` once, after the next sync launches its graph.
        torch_xla: `xm.add_step_closure`."""

    @abstractmethod
    def function(self) -> Callable[[], None]:
        """The function `sync()` calls, as it is now (wrapped while syncs are hooked): tpu_nb's
        own syncs call it themselves, so a hook sees their caller's frame. Imports the
        backend."""

    @abstractmethod
    def entry_points(self) -> tuple[tuple[Any, str, bool], ...]:
        """Every function that syncs, as (namespace, attribute name, inner) for a hook to
        wrap; `inner`: the one the backend's compiled-function wrapper calls (its syncs run
        the function's graph, or the work pending before it). Imports the backend.
        torch_xla: `torch_xla.sync` and `torch_xla.torch_xla`'s global `sync`."""

    def host_copies(self) -> tuple[tuple[Any, str, str], ...]:
        """Library functions that copy device data to the host from C++ (no Tensor method a
        read hook sees), as (namespace, attribute name, how a finding names the copy), among
        the modules already imported. None by default."""
        return ()

    @abstractmethod
    def loader_iterators(self) -> tuple[type, ...]:
        """Iterator classes of the backend's device data loaders, among the modules already
        imported (never imports one): each `__next__` call hands out one batch."""


class Devices(ABC):
    """The devices of this process and their memory."""

    @abstractmethod
    def device(self, index: int | None = None) -> Any:
        """The torch.device of the default device, or of device `index`; starts the runtime."""

    @abstractmethod
    def count(self) -> int:
        """Devices this process can address (under SPMD: one virtual device)."""

    @abstractmethod
    def global_count(self) -> int:
        """Devices across every host of the runtime; starts the runtime."""

    @abstractmethod
    def names(self) -> list[str]:
        """Names of this process's devices, e.g. ['xla:0', 'xla:1']."""

    @abstractmethod
    def kind(self) -> str:
        """The hardware kind of the devices: "CPU", "TPU"."""

    @abstractmethod
    def memory(self, device: str) -> DeviceMemory:
        """Device memory figures; raises where the device does not report them (XLA:CPU)."""

    @abstractmethod
    def shards(self, tensor: Any) -> int:
        """Into how many parts `tensor` is split across the devices (SPMD sharding): each
        device holds 1/shards of it; 1 for a tensor each device holds whole."""


class Launch(ABC):
    """More than one device: replicas forked from this process, or one SPMD program."""

    #: Functions of the backend that communicate between replicas (launch may refuse them).
    collectives: tuple[str, ...]

    @abstractmethod
    def spawn(self, fn: Callable[..., None], args: tuple) -> None:
        """Run `fn(index, *args)` once per local device (forked, so a notebook's functions
        work); returns when every replica has ended."""

    @abstractmethod
    def ordinal(self) -> int:
        """This replica's rank among all replicas (0 outside a launch)."""

    @abstractmethod
    def collective_functions(self) -> tuple[tuple[Any, str], ...]:
        """(owner, attribute) of each of `collectives` this backend has (launch may replace
        them: probe hooks); imports the backend."""

    @abstractmethod
    def spmd_active(self) -> bool:
        """Whether this process runs in SPMD mode (one program over every device); False
        while the backend is not imported (never imports it)."""

    @abstractmethod
    def spmd_locked(self) -> bool:
        """Whether the SPMD choice can no longer change (the runtime started without it);
        False while the backend is not imported (never imports it)."""

    @abstractmethod
    def use_spmd(self) -> None:
        """Switch this process to SPMD; call before the first device work."""

    @abstractmethod
    def mesh(self, devices: int, shape: tuple[int, int], axes: tuple[str, str]) -> Any:
        """A logical mesh of `devices` devices in `shape`, axes named `axes` (SPMD)."""

    @abstractmethod
    def shard(self, tensor: Any, mesh: Any, spec: tuple[str | None, ...]) -> Any:
        """Annotate `tensor` to be sharded over `mesh` by `spec`; returns it."""


class Profiler(ABC):
    """The backend's profiler, drawn by `tpu_nb.profile`."""

    @abstractmethod
    def start(self, logdir: str) -> None:
        """Start tracing into `logdir` (imports the backend); raises when it cannot (one
        already tracing)."""

    @abstractmethod
    def stop(self) -> None:
        """Stop tracing: its trace (`*.trace.json.gz`, Chrome trace events) is then under
        the logdir."""


@dataclass(frozen=True)
class Backend:
    """The device runtime under tpu_nb: who it is, and one object per protocol, e.g.
    `current().counters.read(names)`. Methods never import the backend's library unless
    their docstring says they do (`process.load`, and everything that touches a device)."""

    #: Short name, e.g. "torch_xla".
    name: str
    #: `torch.device(...).type` of the backend's tensors, e.g. "xla".
    device_type: str
    #: Top-level Python packages whose frames are the backend working (not the user's code).
    packages: tuple[str, ...]
    process: Process
    counters: Counters
    graphs: Graphs
    syncs: Syncs
    devices: Devices
    launch: Launch
    profiler: Profiler


_registered: list[Backend] = []


def register(backend: Backend) -> Backend:
    """Add a backend; the first registered is the one tpu_nb uses (`current()`)."""
    if all(b.name != backend.name for b in _registered):
        _registered.append(backend)
    return backend


def backends() -> tuple[Backend, ...]:
    """Every registered backend, the current one first."""
    return tuple(_registered)


def current() -> Backend:
    """The backend tpu_nb uses in this process."""
    return _registered[0]
