"""tpu_nb.runtime: the library every notebook feature is built on.

Layer order (imports flow downward only):
    tpu_nb.ipython  ->  tpu_nb.display  ->  tpu_nb.runtime  ->  torch / torch_xla
This package never imports IPython, ipywidgets or matplotlib, and imports torch_xla lazily
(inside the functions that need it), so it works the same in a plain script and
`import tpu_nb` stays cheap. It hands plain frozen dataclasses to the layers above.
"""

from tpu_nb.runtime.errors import (
    EnvironmentProblem,
    RuntimeStateError,
    TpuNbError,
    TpuNbUsageError,
)
from tpu_nb.runtime.environment import Accelerator, Environment, Problem, detect
from tpu_nb.runtime.configure import setup
from tpu_nb.runtime.metrics import MetricsDelta, MetricsSnapshot, reset_metrics, snapshot
from tpu_nb.runtime.compile_log import CompileEvent, Frame
from tpu_nb.runtime.device import device, sync
from tpu_nb.runtime.tracking import RunReport, last_report, track
from tpu_nb.runtime.defaults import default_device
from tpu_nb.runtime.launch import (
    CollectiveRefused,
    LaunchResult,
    ReplicaError,
    ReplicaResult,
    launch,
)
from tpu_nb.runtime.guard import RecompilationError, max_graphs
from tpu_nb.runtime.graph import Edge, Graph, Node, graph, pending_graph
from tpu_nb.runtime.graph_diff import GraphDiff, NodeChange
from tpu_nb.runtime.graph_groups import Group, GroupedGraph, GroupEdge
from tpu_nb.runtime.live import LiveState
from tpu_nb.runtime.timing import DeviceTiming, time_device
from tpu_nb.runtime.attribution import LineFinding
from tpu_nb.runtime.session import on_tpu
from tpu_nb.runtime.anatomy import Anatomy, StepRecord, Verdict
from tpu_nb.runtime.launch import ReplicaCrash

# The public API of the library: what its functions take, return and raise. tpu_nb re-exports
# exactly these (tests/test_public_api.py).
__all__ = [
    "Accelerator",
    "CollectiveRefused",
    "CompileEvent",
    "DeviceTiming",
    "Edge",
    "Environment",
    "EnvironmentProblem",
    "Frame",
    "Graph",
    "GraphDiff",
    "Group",
    "GroupEdge",
    "GroupedGraph",
    "LaunchResult",
    "LiveState",
    "MetricsDelta",
    "MetricsSnapshot",
    "Node",
    "NodeChange",
    "Problem",
    "RecompilationError",
    "ReplicaError",
    "ReplicaResult",
    "RunReport",
    "RuntimeStateError",
    "TpuNbError",
    "TpuNbUsageError",
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
    "on_tpu",
    "LineFinding",
    "Anatomy",
    "StepRecord",
    "Verdict",
    "ReplicaCrash",
]
