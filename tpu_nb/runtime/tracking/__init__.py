"""What one tracked run did and why: `track()`, its `Run` and its `RunReport`; the recorder of
syncs, reads and fallbacks with their lines (provenance); findings per line (attribution); the
recompilation guard (`max_graphs`); the step anatomy and its verdict; a profiler trace of a few
steps; what a steady step costs on the chip it is judged for (FLOPs, bytes, memory); an
out-of-memory error read into facts; and `on_tpu()`, which composes them the way `%%on_tpu`
does.
Above runtime.graph, runtime.metrics and runtime.environment."""

from tpu_nb.runtime.probe import probe
from tpu_nb.runtime.tracking._anatomy import HOST_PARTS, Anatomy, StepRecord, Verdict
from tpu_nb.runtime.tracking._attribution import (
    HOST_READ_HINT,
    HOST_READ_NO_SYNC_HINT,
    LineFinding,
    fallback_hint,
    graph_facts,
)
from tpu_nb.runtime.tracking._cost import (
    GraphCost,
    MemoryFit,
    Residency,
    StepCost,
    format_bytes,
    format_flops,
)
from tpu_nb.runtime.tracking._fused import FusedOptimizer
from tpu_nb.runtime.tracking._guard import RecompilationError, max_graphs
from tpu_nb.runtime.tracking._oom import Allocation, OutOfMemory, out_of_memory
from tpu_nb.runtime.tracking._pending import EarlierWork, assigned_lines
from tpu_nb.runtime.tracking._policy import (
    Judgement,
    LinePattern,
    line_growth,
    live_reads_cost_little,
    progression,
    reads_repeat,
)
from tpu_nb.runtime.tracking._profile import ProfileTrace, TraceEvent, profile, read_trace
from tpu_nb.runtime.tracking._report import RunReport
from tpu_nb.runtime.tracking._run import Run, current_run, last_report, track
from tpu_nb.runtime.tracking._session import on_tpu
from tpu_nb.runtime.tracking._store import GraphStore, store

__all__ = [
    "Allocation",
    "GraphCost",
    "MemoryFit",
    "FusedOptimizer",
    "OutOfMemory",
    "Residency",
    "StepCost",
    "format_bytes",
    "format_flops",
    "out_of_memory",
    "HOST_PARTS",
    "HOST_READ_HINT",
    "HOST_READ_NO_SYNC_HINT",
    "Anatomy",
    "EarlierWork",
    "Judgement",
    "LinePattern",
    "LineFinding",
    "ProfileTrace",
    "RecompilationError",
    "RunReport",
    "StepRecord",
    "TraceEvent",
    "Verdict",
    "current_run",
    "GraphStore",
    "Run",
    "store",
    "assigned_lines",
    "fallback_hint",
    "graph_facts",
    "last_report",
    "line_growth",
    "live_reads_cost_little",
    "max_graphs",
    "on_tpu",
    "probe",
    "profile",
    "progression",
    "read_trace",
    "reads_repeat",
    "track",
]
