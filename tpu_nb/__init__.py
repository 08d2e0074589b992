"""tpu_nb: PyTorch on XLA devices (Cloud TPU, XLA:CPU), made visible in Jupyter and Colab.

    import tpu_nb
    tpu_nb.setup()                 # device, compile-cause analysis: before the first compile
    with tpu_nb.track("step") as report:
        ...                        # XLA work
    print(report)                  # what compiled, why, from which line; what ran; the cost

In a notebook: `%load_ext tpu_nb`, then `%tpu_setup` and `%%on_tpu` cells.
Importing tpu_nb imports neither torch_xla nor IPython: both load when first needed, and the
display layer's names — the live dashboard (`tpu_nb.dashboard`, `tpu_nb.Dashboard`: ipywidgets)
and the graph view (`tpu_nb.GraphView`) — load on first use.

Errors: every exception tpu_nb raises on purpose is a `TpuNbError` (one line: what is wrong,
then "Fix: ..."); `TpuNbUsageError`, `EnvironmentProblem` and `RuntimeStateError` say which
kind (tpu_nb.runtime.errors).
"""

from typing import TYPE_CHECKING

from tpu_nb._version import __version__

# Everything the library exports (tpu_nb.runtime.__all__, one list kept once), the graph's
# parts included: those are attributes here without being in this __all__.
# ruff: noqa: F405
from tpu_nb.runtime import *  # noqa: F403
from tpu_nb.runtime.graph import graph

if TYPE_CHECKING:  # for type checkers and IDEs; at run time they load on first use (_LAZY)
    from tpu_nb.display.dashboard import Dashboard, dashboard
    from tpu_nb.display.graph_view import GraphView

# What a user reaches for, by task. The graph's parts (Node, Edge, NodeChange, Group,
# GroupEdge, GroupedGraph) are what a Graph is made of, not things to start from: they stay in
# tpu_nb.runtime.__all__ (and tpu_nb.runtime.graph), and are still attributes here.
__all__ = [
    # Set up: what is installed, the device
    "detect",
    "setup",
    "device",
    "default_device",
    "sync",
    "Environment",
    "Accelerator",
    "Problem",
    "Chip",
    # Track a run: what compiled and why, from which line; what ran; what it cost
    "track",
    "on_tpu",
    "last_report",
    "max_graphs",
    "RunReport",
    "CompileEvent",
    "Frame",
    "LineFinding",
    "Anatomy",
    "StepRecord",
    "Verdict",
    "StepCost",
    "OutOfMemory",
    "FusedOptimizer",
    # Measure: the runtime's counters, a function's device time
    "snapshot",
    "reset_metrics",
    "time_device",
    "MetricsSnapshot",
    "MetricsDelta",
    "DeviceTiming",
    # See the lazy graph
    "graph",
    "pending_graph",
    "Graph",
    "GraphDiff",
    "GraphView",
    # Watch a run live
    "dashboard",
    "Dashboard",
    "LiveState",
    # Run on several devices, or on the hosts of a pod slice
    "launch",
    "launch_hosts",
    "LaunchResult",
    "ReplicaResult",
    "PodResult",
    "HostResult",
    "Divergence",
    # Errors: one family (TpuNbError), its three kinds, and what a run itself can raise
    "TpuNbError",
    "TpuNbUsageError",
    "EnvironmentProblem",
    "RuntimeStateError",
    "RecompilationError",
    "ReplicaError",
    "ReplicaCrash",
    "CollectiveRefused",
    "HostError",
    "HostLost",
    "__version__",
]

# The display layer's names, imported on first use: `import tpu_nb` stays free of ipywidgets.
_LAZY = {
    "Dashboard": "tpu_nb.display.dashboard",
    "dashboard": "tpu_nb.display.dashboard",
    "GraphView": "tpu_nb.display.graph_view",
}


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
