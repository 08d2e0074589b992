"""tpu_nb.runtime: the library every notebook feature is built on.

Layer order (imports flow downward only):
    tpu_nb.ipython  ->  tpu_nb.display  ->  tpu_nb.runtime  ->  torch / torch_xla
Sub-packages, each above the ones before it (tests/test_layering.py checks that no module
imports in a cycle): errors, units, frame and sources (foundations); backend (everything asked
of torch_xla, the one package importing it); environment (what is installed,
setup, the device); metrics (counters, timings, the compile log); graph (the lazy graph as
data); tracking (track, provenance, findings, anatomy, on_tpu); live (the dashboard's
monitor); parallel (multi-device runs: launch, launch_hosts); plan (an %%on_tpu cell's options,
checked). Each sub-package's modules are private (`_name.py`); its `__init__` names what the
other packages and layers use. No attribute here hides a sub-package: `graph()` is
`tpu_nb.graph`, and `tpu_nb.runtime.graph` is the package.
This package never imports IPython, ipywidgets or matplotlib, and imports torch_xla lazily
(inside the functions that need it), so it works the same in a plain script and
`import tpu_nb` stays cheap. It hands plain frozen dataclasses to the layers above.
"""

from tpu_nb.runtime.environment import (
    Accelerator,
    Chip,
    Environment,
    Problem,
    default_device,
    detect,
    device,
    setup,
    sync,
)
from tpu_nb.runtime.errors import EnvironmentProblem, RuntimeStateError, TpuNbError, TpuNbUsageError
from tpu_nb.runtime.graph import (
    Edge,
    Graph,
    GraphDiff,
    Group,
    GroupEdge,
    GroupedGraph,
    Node,
    NodeChange,
    pending_graph,
)
from tpu_nb.runtime.live import LiveState
from tpu_nb.runtime.metrics import (
    CompileEvent,
    DeviceTiming,
    Frame,
    MetricsDelta,
    MetricsSnapshot,
    reset_metrics,
    snapshot,
    time_device,
)
from tpu_nb.runtime.parallel import (
    CollectiveRefused,
    Divergence,
    HostError,
    HostLost,
    HostResult,
    LaunchResult,
    PodResult,
    ReplicaCrash,
    ReplicaError,
    ReplicaResult,
    launch,
    launch_hosts,
)
from tpu_nb.runtime.tracking import (
    Anatomy,
    FusedOptimizer,
    LineFinding,
    OutOfMemory,
    RecompilationError,
    RunReport,
    StepCost,
    StepRecord,
    Verdict,
    last_report,
    max_graphs,
    on_tpu,
    track,
)

# The public API of the library: what its functions take, return and raise. tpu_nb re-exports
# exactly these (tests/test_public_api.py).
__all__ = [
    "Accelerator",
    "Chip",
    "FusedOptimizer",
    "OutOfMemory",
    "StepCost",
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
    "last_report",
    "launch",
    "launch_hosts",
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
    "Divergence",
    "HostError",
    "HostLost",
    "HostResult",
    "PodResult",
]
