"""Live monitoring while code runs (what the dashboard polls), as plain data: step times from
the runtime's samples, compiles, memory, and the recompilation alert with what differs.
Above runtime.tracking."""

from tpu_nb.runtime.live._monitor import (
    LiveCompile,
    LiveMonitor,
    LiveState,
    MemoryInfo,
    RecompilationAlert,
    StepPoint,
)

__all__ = [
    "LiveCompile",
    "LiveMonitor",
    "LiveState",
    "MemoryInfo",
    "RecompilationAlert",
    "StepPoint",
]
