"""What torch_xla counts, as plain data: counter/metric snapshots and their deltas, device
timings of a statement (`%tpu_time`), and the compile-cause log (PT_XLA_DEBUG_FILE) parsed
into `CompileEvent`s. Above runtime.environment."""

from tpu_nb.runtime.metrics._compile_log import (
    CompileEvent,
    CompileLog,
    Frame,
    compile_log,
    describe_difference,
)
from tpu_nb.runtime.metrics._counters import (
    MetricsDelta,
    MetricsSnapshot,
    on_reset,
    reset_metrics,
    snapshot,
)
from tpu_nb.runtime.metrics._reset_watch import ensure_installed as watch_counter_resets
from tpu_nb.runtime.metrics._reset_watch import uninstall as stop_watching_counter_resets
from tpu_nb.runtime.metrics._timing import MAX_NUMBER, MAX_REPEAT, DeviceTiming, time_device

__all__ = [
    "MAX_NUMBER",
    "MAX_REPEAT",
    "CompileEvent",
    "CompileLog",
    "DeviceTiming",
    "Frame",
    "MetricsDelta",
    "MetricsSnapshot",
    "compile_log",
    "describe_difference",
    "on_reset",
    "reset_metrics",
    "snapshot",
    "stop_watching_counter_resets",
    "time_device",
    "watch_counter_resets",
]
