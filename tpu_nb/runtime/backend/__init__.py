"""The backend seam: everything tpu_nb asks of the library that runs PyTorch on the device.

A `Backend` (in _base) is a few small protocols, one object each, named by what tpu_nb does
with them: `current().process`, `.counters`, `.graphs`, `.syncs`, `.devices`, `.launch`,
`.profiler`. _torch_xla registers the one implementation, torch_xla 2.9's, and is the only
module of tpu_nb that imports torch_xla. `current()` is the backend in use. docs/backends.md
maps each method to torch_xla and to TorchTPU; tests/test_backend_contract.py asserts what
every registered backend must deliver, protocol by protocol.

Lowest runtime package above the foundations (errors, units, sources, frame): imports nothing
else of tpu_nb.
"""

from tpu_nb.runtime.backend._base import (
    Backend,
    CounterNames,
    Counters,
    DeviceMemory,
    Devices,
    Graphs,
    Launch,
    MetricSamples,
    Process,
    Profiler,
    Syncs,
    backends,
    current,
    register,
)
from tpu_nb.runtime.backend._torch_xla import TORCH_PAIR, hash_hex, installed_version, normal_hash

__all__ = [
    "TORCH_PAIR",
    "Backend",
    "CounterNames",
    "Counters",
    "DeviceMemory",
    "Devices",
    "Graphs",
    "Launch",
    "MetricSamples",
    "Process",
    "Profiler",
    "Syncs",
    "backends",
    "current",
    "hash_hex",
    "normal_hash",
    "installed_version",
    "register",
]
