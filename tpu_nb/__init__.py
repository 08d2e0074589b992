"""tpu_nb: PyTorch on XLA devices (Cloud TPU, XLA:CPU), made visible in Jupyter and Colab.

    import tpu_nb
    tpu_nb.setup()                 # device, compile-cause analysis: before the first compile
    with tpu_nb.track("step") as report:
        ...                        # XLA work
    print(report)                  # what compiled, why, from which line; what ran; the cost

In a notebook: `%load_ext tpu_nb`, then `%tpu_setup` and `%%on_tpu` cells.
Importing tpu_nb imports neither torch_xla nor IPython: both load when first needed, and the
live dashboard (`tpu_nb.dashboard`, `tpu_nb.Dashboard`: ipywidgets, matplotlib) loads on first
use.
"""

from tpu_nb.runtime import (
    Accelerator,
    CompileEvent,
    DeviceTiming,
    Environment,
    Frame,
    Graph,
    MetricsDelta,
    MetricsSnapshot,
    Problem,
    RecompilationError,
    ReplicaError,
    RunReport,
    TpuNbError,
    default_device,
    detect,
    device,
    graph,
    last_report,
    launch,
    max_graphs,
    pending_graph,
    reset_metrics,
    setup,
    snapshot,
    sync,
    time_device,
    track,
)

__version__ = "0.1.0"

__all__ = [
    "Accelerator",
    "CompileEvent",
    "Dashboard",
    "DeviceTiming",
    "Environment",
    "Frame",
    "Graph",
    "MetricsDelta",
    "MetricsSnapshot",
    "Problem",
    "RecompilationError",
    "ReplicaError",
    "RunReport",
    "TpuNbError",
    "__version__",
    "dashboard",
    "default_device",
    "detect",
    "device",
    "graph",
    "last_report",
    "launch",
    "max_graphs",
    "pending_graph",
    "reset_metrics",
    "setup",
    "snapshot",
    "sync",
    "time_device",
    "track",
]

# The display layer's names, imported on first use: `import tpu_nb` stays free of ipywidgets
# and matplotlib.
_LAZY = {"Dashboard": "tpu_nb.display.dashboard", "dashboard": "tpu_nb.display.dashboard"}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tpu_nb' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def load_ipython_extension(ipython):
    """`%load_ext tpu_nb`: imported lazily so `import tpu_nb` never pulls in IPython."""
    from tpu_nb.ipython import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):
    from tpu_nb.ipython import unload_ipython_extension as unload

    unload(ipython)
