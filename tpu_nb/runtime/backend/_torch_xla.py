"""The Backend on torch_xla 2.9, and the one place tpu_nb imports it.

torch_xla is imported lazily, at the first method that needs it, and an import that fails is
explained (a torch that does not match fails inside the import with an undefined `_XLAC`
symbol; XLA:GPU requests fail later with a PJRT plugin error): both become a TpuNbError that
names the fix. Methods that must answer without importing it (`is_loaded`, `started`,
`compiled_yet`, `spmd_active`, `spmd_locked`) look only at `sys.modules`.

Counters and metrics are read straight from `torch_xla._XLAC` (what `torch_xla.debug.metrics`
wraps): all of them cost ~13 µs, while `metrics_report()` text costs ~100 µs.
"""

from __future__ import annotations

import functools
import importlib
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from importlib import metadata
from typing import Any

from tpu_nb.runtime.backend import _base as base
from tpu_nb.runtime.errors import EnvironmentProblem
from tpu_nb.runtime.sources import caller, innermost_frame

log = logging.getLogger("tpu_nb.runtime.backend")  # the package, not its private module

#: The torch/torch_xla pair this release of tpu_nb is built and tested on.
TORCH_PAIR = "2.9.0"

# torch_xla 2.9's Dynamo bridge (UnsupportedNodesCollector.run_node) clears every counter
# through torch_xla.debug.metrics.clear_counters, then puts these two back.
_BRIDGE = "torch_xla._dynamo.dynamo_bridge"
_METRICS = "torch_xla.debug.metrics"
# Read by torch_xla at its first compile, then fixed for the life of the process.
_LATCHED_AT_COMPILE = ("PT_XLA_DEBUG_LEVEL", "PT_XLA_DEBUG_FILE")
# The first compile's sizes block follows its cause block; a log longer than this holds it.
_POST_BLOCK, _LATCH_SCAN = b"Post Compilation Analysis: ", 1 << 16
_RESTORED_BY_BRIDGE = frozenset({"UncachedCompile", "DynamoExtractCompiledGraph"})


def installed_version(dist: str) -> str | None:
    """The installed version of a distribution, from its metadata (nothing imported)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _import_torch_xla() -> Any:
    """torch_xla, imported on first use; a failed import is explained (EnvironmentProblem)."""
    module = sys.modules.get("torch_xla")
    if module is not None and hasattr(module, "_XLAC"):
        return module
    _refuse_gpu()
    try:
        import torch_xla
    except ImportError as exc:  # undefined symbol, missing package, broken install
        raise EnvironmentProblem(_explain_import_error(exc)) from None
    return torch_xla


_xlac: Any = None  # torch_xla._XLAC once imported: hooks reach it at every sync


def _extension() -> Any:
    """`torch_xla._XLAC`, the C++ extension (counters, metrics, graph dumps)."""
    global _xlac
    if _xlac is None:
        _xlac = _import_torch_xla()._XLAC
    return _xlac


def _module(name: str) -> Any:
    """A module of torch_xla, imported after torch_xla itself (whose failure is explained)."""
    _import_torch_xla()
    return importlib.import_module(name)


_xla_model = functools.partial(_module, "torch_xla.core.xla_model")
_xr = functools.partial(_module, "torch_xla.runtime")
_spmd = functools.partial(_module, "torch_xla.distributed.spmd")
_profiler = functools.partial(_module, "torch_xla.debug.profiler")


class _Process(base.Process):
    def __init__(self) -> None:
        self._logging_to: set[str] = set()  # compile-cause files answered so far
        # PT_XLA_DEBUG_* taken out of os.environ after torch_xla latched them (still in effect).
        self._hidden: dict[str, str] = {}

    def is_loaded(self) -> bool:
        return "torch_xla" in sys.modules

    def started(self) -> bool:
        xlac = getattr(sys.modules.get("torch_xla"), "_XLAC", None)
        probe = getattr(xlac, "_xla_runtime_is_initialized", None)
        try:
            return bool(probe()) if probe else False
        except Exception as exc:  # a half-imported torch_xla: "not started", leave a trace
            log.debug("torch_xla's runtime probe failed: %r", exc)
            return False

    def load(self) -> Any:
        return _import_torch_xla()

    def compiled_yet(self) -> bool:
        if not self.started():
            return False
        value = sys.modules["torch_xla"]._XLAC._xla_counter_value
        return bool(value("UncachedCompile") or value("CachedCompile"))

    def compile_log_path(self) -> str | None:
        # A file once answered stays the answer while PT_XLA_DEBUG_FILE names it: torch_xla
        # latched the level at its first compile. Once hidden from child processes, the
        # latched values are the ones in effect.
        hidden = self._hidden
        path = hidden.get("PT_XLA_DEBUG_FILE") or os.environ.get("PT_XLA_DEBUG_FILE")
        if not path:
            return None
        if path not in self._logging_to:
            level = hidden.get("PT_XLA_DEBUG_LEVEL") or os.environ.get("PT_XLA_DEBUG_LEVEL")
            if (level or "0").strip() in ("", "0"):
                return None
            self._logging_to.add(path)
        return path

    def settings(self) -> dict[str, str]:
        return {**os.environ, **self._hidden}

    def hide_latched_settings(self) -> bool:
        # Until the first compile has ended they must stay in the environment (torch_xla has
        # no call that reads them sooner). A child process inherits them until then; the log
        # is given as /proc/self/task/<our pid>/fd/N, which no other process can open, so the
        # child's compile analysis goes nowhere. After it, children are not handed them.
        if not self.compiled_yet() or not self._sizes_latched():
            return False
        for name in _LATCHED_AT_COMPILE:
            if name in os.environ:
                self._hidden[name] = os.environ.pop(name)
        return True

    def _sizes_latched(self) -> bool:
        """Whether torch_xla has read PT_XLA_DEBUG_FILE for its post-compilation analysis
        (the sizes): it latches the file apart from the compile analysis, at the first
        compile's end. The counters move as that compile starts: a thread hiding the file
        then (the live dashboard's, polling while the first compile runs) sent every
        compile's sizes of the process to stderr. Latched once the log holds the block."""
        path = self.compile_log_path()
        if path is None:
            return True  # no log asked for: nothing to send elsewhere
        try:
            with open(path, "rb") as f:
                head = f.read(_LATCH_SCAN)
        except OSError:
            return True  # the log is gone: torch_xla writes nowhere we read either way
        return _POST_BLOCK in head or len(head) == _LATCH_SCAN

    def source_lines(self) -> bool:
        return bool(_extension()._get_ir_debug())

    def set_source_lines(self, enabled: bool) -> None:
        _extension()._set_ir_debug(enabled)


class _Counters(base.Counters):
    facts = base.CounterNames(
        compiles="UncachedCompile",
        cache_hits="CachedCompile",
        executions=("ExecuteComputation", "ExecuteReplicated"),
        syncs="MarkStep",
        host_read="aten::_local_scalar_dense",
        fallback_prefix="aten::",
        persistent_cache_hits="PersistentCacheHit",
        persistent_cache_misses="PersistentCacheMiss",
        compile_time="CompileTime",
        execute_times=("ExecuteTime", "ExecuteReplicatedTime"),
        to_device_time="TransferToDeviceTime",
        from_device_time="TransferFromDeviceTime",
        tensors_created="CreateXlaTensor",
        cached_graph_runs="RunCachedGraphOutputData",
        once_at_import="RegisterXLAFunctions",
        tensors_destroyed="DestroyXlaTensor",
    )

    def names(self) -> Sequence[str]:
        return _extension()._xla_counter_names()

    def read(self, names: Iterable[str]) -> dict[str, int]:
        value = _extension()._xla_counter_value
        return {n: value(n) or 0 for n in names}

    def reader(self) -> Callable[[str], int | None]:
        return _extension()._xla_counter_value

    def metric_names(self) -> Sequence[str]:
        return _extension()._xla_metric_names()

    def metric(self, name: str) -> base.MetricSamples | None:
        data = _extension()._xla_metric_data(name)
        if data is None:
            return None
        # torch_xla hands out a tuple of (timestamp, value) float pairs: kept as they are (the
        # step anatomy reads the buffers during a run)
        samples = data[2] if type(data[2]) is tuple else tuple(map(tuple, data[2]))
        return base.MetricSamples(int(data[0]), float(data[1]), samples)

    def fallbacks_reader(self) -> Callable[[], list[str]]:
        return _extension()._get_executed_fallback_ops  # a new list at each call

    def clear(self) -> None:
        clear = _extension()._clear_xla_counters
        getattr(clear, "__wrapped__", clear)()  # tpu_nb's own reset: not routed to the hook

    def clear_metrics(self) -> None:
        _extension()._clear_xla_metrics()

    def watch_clears(self, hook: Callable[[frozenset[str], Callable[[], None]], None]) -> bool:
        # The C++ entry point itself is wrapped, not `torch_xla.debug.metrics.clear_counters`:
        # that function looks `_XLAC._clear_xla_counters` up at each call, so a reset through
        # it (also one imported by name before tpu_nb loaded) or straight through `_XLAC`
        # reaches the hook either way.
        xlac = _extension()
        original = xlac._clear_xla_counters
        if getattr(original, "_carries_counts", False):
            return True

        @functools.wraps(original)
        def _clear_xla_counters():
            # the caller, through torch_xla.debug.metrics.clear_counters if it came that way
            frame = innermost_frame(caller(), lambda f: f.f_globals.get("__name__") != _METRICS, 2)
            bridge = frame is not None and frame.f_globals.get("__name__") == _BRIDGE
            if bridge:
                # torch_xla counts an execution on its execution thread once it has run: one
                # still running (an earlier step) would count after the hook's read and be
                # cleared with the rest. Waiting for launched work first makes the carry
                # exact; it adds no sync or execution, and the bridge is compiling meanwhile.
                _SYNCS.wait()
            hook(_RESTORED_BY_BRIDGE if bridge else frozenset(), original)

        _clear_xla_counters._carries_counts = True  # type: ignore[attr-defined]
        xlac._clear_xla_counters = _clear_xla_counters
        return True

    def unwatch_clears(self) -> None:
        xlac = _extension()
        wrapped = getattr(xlac._clear_xla_counters, "__wrapped__", None)
        if wrapped is not None:
            xlac._clear_xla_counters = wrapped


class _Graphs(base.Graphs):
    def text(self, tensors: Sequence[Any]) -> str:
        return _extension()._get_xla_tensors_text(list(tensors))

    def hash(self, tensors: Sequence[Any]) -> str:
        return hash_hex(_extension()._get_graph_hash(list(tensors)))

    def hlo(self, tensors: Sequence[Any]) -> str:
        return _extension()._get_xla_tensors_hlo(list(tensors))

    def hlo_proto(self, tensors: Sequence[Any]) -> bytes:
        return _extension()._get_xla_tensors_hlo_proto(list(tensors))

    def pending(self, tensor: Any) -> base.Pending:
        # ~2 µs: torch_xla's debug lines for the tensor: its IR value, and its alias id,
        # which differs from its own id when the tensor was updated in place (the id of the
        # tensor whose buffer the graph's output then takes: torch_xla's input/output alias).
        fields = dict(
            line.split(": ", 1)
            for line in _extension()._get_xla_tensor_debug_info(tensor).splitlines()
            if ": " in line
        )
        ir = fields.get("IR", "None")
        if ir == "None" or "xla::device_data" in ir:
            return ""
        return "new" if fields.get("AliasID") == fields.get("TensorID") else "in place"

    def open_scope(self, name: str) -> Any:
        # What torch_xla.debug.profiler.Trace holds: the scope closes when it is freed.
        return _extension().profiler.scope_pusher(name)

    # The dynamic-shape detector (torch_xla.compile(max_different_graphs=)): a session per name.

    def limit(self) -> int:
        return int(_extension()._dynamic_shape_detector_get_max_different_graphs())

    def set_limit(self, limit: int) -> None:
        _extension()._dynamic_shape_detector_set_max_different_graphs(limit)

    def start_counting(self, name: str) -> None:
        _extension()._dynamic_shape_detector_start_session(name)

    def stop_counting(self) -> None:
        _extension()._dynamic_shape_detector_end_session()

    def forget_counted(self, name: str) -> None:
        _extension()._dynamic_shape_detector_remove_session(name)


class _Syncs(base.Syncs):
    # torch_xla's Dynamo bridge syncing a graph's inputs, and torch_xla.compile running the
    # work pending before the function.
    plumbing_callers = (
        ("torch_xla/_dynamo/dynamo_bridge.py", ""),
        ("torch_xla/torch_xla.py", "_clear_pending_ops_before_compile"),
    )
    compiler_paths = ("torch_xla/_dynamo/",)
    loader_paths = ("torch_xla/distributed/parallel_loader",)

    def __init__(self) -> None:
        self._add_step_closure: Any = None  # looked up once: hooks call it at every sync

    def sync(self) -> None:
        _import_torch_xla().sync()

    def wait(self) -> None:
        _xla_model().wait_device_ops()

    def after_next(self, callback: Callable[[], None]) -> None:
        add = self._add_step_closure
        if add is None:
            add = self._add_step_closure = _xla_model().add_step_closure
        add(callback)

    def function(self) -> Callable[[], None]:
        return _import_torch_xla().sync

    def entry_points(self) -> tuple[tuple[Any, str, bool], ...]:
        torch_xla = _import_torch_xla()
        # torch_xla.compile(fn) syncs through its own module's global (before fn: the inputs'
        # pending work; after: fn's graph), the same function as torch_xla.sync.
        inner = sys.modules["torch_xla.torch_xla"]
        return ((torch_xla, "sync", False), (inner, "sync", True))

    def host_copies(self) -> tuple[tuple[Any, str, str], ...]:
        # xm.mesh_reduce (Trainer's logging, evaluation metrics) syncs its tensors and copies
        # them to the host through _XLAC, moving no read counter: a module global it looks up
        # at each call, so wrapping the attribute reaches it
        xla_model = sys.modules.get("torch_xla.core.xla_model")  # never imports it
        name = "_maybe_convert_to_cpu"
        if callable(getattr(xla_model, name, None)):
            return ((xla_model, name, "xm.mesh_reduce's copy to the host"),)
        return ()

    def loader_iterators(self) -> tuple[type, ...]:
        parallel = sys.modules.get("torch_xla.distributed.parallel_loader")  # never imports it
        found = getattr(parallel, "PerDeviceLoader", None)
        return (found,) if isinstance(found, type) else ()


class _Devices(base.Devices):
    def device(self, index: int | None = None) -> Any:
        return _import_torch_xla().device(index)

    def count(self) -> int:
        xr = _xr()
        return 1 if xr.is_spmd() else xr.addressable_runtime_device_count()

    def global_count(self) -> int:
        return int(_xr().global_runtime_device_count())

    def names(self) -> list[str]:
        return list(_xla_model().get_xla_supported_devices())

    _kind = ""  # the runtime's device kind, kept once it has started (it cannot change then)

    def kind(self) -> str:
        if self._kind:
            return self._kind
        kind = str(_xr().device_type())
        if _Process().started():
            self._kind = kind
        return kind

    def memory(self, device: str) -> base.DeviceMemory:
        return memory_from_info(_extension()._xla_memory_info(device))

    def shards(self, tensor: Any) -> int:
        # "{devices=[2,2]0,1,2,3}": tiles per dimension; "last_tile_dim_replicate": the last
        # is copies, not parts; "{replicated}" or "" (no sharding): whole on every device.
        try:
            spec = _extension()._get_xla_sharding_spec(tensor)
        except Exception:
            return 1
        tiles = re.search(r"devices=\[([\d,]+)\]", spec or "")
        if tiles is None:
            return 1
        dims = [int(d) for d in tiles.group(1).split(",")]
        if "last_tile_dim_replicate" in spec:
            dims = dims[:-1]
        return max(1, math.prod(dims))


class _Launch(base.Launch):
    # torch_xla.core.xla_model functions that communicate between replicas.
    collectives = (
        "all_reduce",
        "all_gather",
        "all_gather_bucketized",
        "all_to_all",
        "collective_permute",
        "collective_broadcast",
        "send",
        "recv",
        "reduce_scatter",
        "reduce_scatter_bucketized",
        "all_reduce_bucketized_gradients",
        "xla_rendezvous",
    )

    def spawn(self, fn: Callable[..., None], args: tuple) -> None:
        # spawn cannot re-import a notebook's __main__: fork.
        _import_torch_xla().launch(fn, args=args, start_method="fork")

    def ordinal(self) -> int:
        return int(_xr().global_ordinal())

    def collective_functions(self) -> tuple[tuple[Any, str], ...]:
        xla_model = _xla_model()
        return tuple((xla_model, name) for name in self.collectives if hasattr(xla_model, name))

    def spmd_active(self) -> bool:
        # never imports torch_xla
        return hasattr(sys.modules.get("torch_xla"), "_XLAC") and bool(_xr().is_spmd())

    def spmd_locked(self) -> bool:
        xlac = getattr(sys.modules.get("torch_xla"), "_XLAC", None)
        return xlac is not None and bool(xlac._xla_get_spmd_config_is_locked())

    def use_spmd(self) -> None:
        _xr().use_spmd()

    def mesh(self, devices: int, shape: tuple[int, int], axes: tuple[str, str]) -> Any:
        import numpy as np

        return _spmd().Mesh(np.arange(devices), shape, axes)

    def shard(self, tensor: Any, mesh: Any, spec: tuple[str | None, ...]) -> Any:
        _spmd().mark_sharding(tensor, mesh, spec)
        return tensor


class _Profiler(base.Profiler):
    def start(self, logdir: str) -> None:
        _profiler().start_trace(logdir)

    def stop(self) -> None:
        _profiler().stop_trace()


def memory_from_info(info: dict) -> base.DeviceMemory:
    """DeviceMemory from torch_xla's memory info dict (older releases: kb_total, kb_free)."""
    if "bytes_used" in info or "bytes_limit" in info:
        get = lambda key: int(info[key]) if key in info else None  # noqa: E731
        return base.DeviceMemory(get("bytes_used"), get("bytes_limit"), get("peak_bytes_used"))
    if "kb_total" in info:  # older releases
        total = int(info["kb_total"]) * 1024
        return base.DeviceMemory(total - int(info.get("kb_free", 0)) * 1024, total)
    return base.DeviceMemory(None, None)


def hash_hex(raw: bytes) -> str:
    """The 128-bit hash as 32 hex digits: the high 64 bits, then the low 64 bits.

    torch's own HashToString (what torch_xla's compile log prints) drops the high half's
    leading zeros; every hash tpu_nb shows or compares is the padded form (see
    `normal_hash`), so one graph has one spelling.
    """
    low, high = int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:16], "little")
    return f"{high:016x}{low:016x}"


def normal_hash(text: str) -> str:
    """A hash as torch_xla printed it, padded to 32 hex digits ("" stays "")."""
    return text.zfill(32) if text and all(c in "0123456789abcdef" for c in text) else text


def _refuse_gpu() -> None:
    pjrt = os.environ.get("PJRT_DEVICE", "")
    if pjrt.lower() in ("gpu", "cuda", "rocm"):
        raise EnvironmentProblem(
            f"PJRT_DEVICE={pjrt} asks for XLA:GPU, which torch_xla 2.9 no longer includes. "
            "Fix: tpu_nb.setup('cpu') (or 'tpu' on a TPU host); for an NVIDIA GPU use plain "
            "PyTorch with device='cuda'."
        )


def _explain_import_error(exc: ImportError) -> str:
    text = str(exc)
    pair = f"pip install torch=={TORCH_PAIR} torch-xla=={TORCH_PAIR}"
    if "undefined symbol" in text:
        return (
            f"torch_xla {installed_version('torch_xla')} cannot load with torch "
            f"{installed_version('torch')}: they were built for different releases. "
            f"Fix: {pair}, then restart the runtime."
        )
    if installed_version("torch_xla") is None:
        return f"torch_xla is not installed. Fix: {pair}"
    return f"import torch_xla failed ({text}). Fix: reinstall the pair: {pair}"


_SYNCS = _Syncs()
base.register(
    base.Backend(
        name="torch_xla",
        device_type="xla",
        packages=("torch_xla", "torch"),
        process=_Process(),
        counters=_Counters(),
        graphs=_Graphs(),
        syncs=_SYNCS,
        devices=_Devices(),
        launch=_Launch(),
        profiler=_Profiler(),
    )
)
