"""The backend seam: everything tpu_nb asks of the library that runs PyTorch on the device.

`Backend` (in _base) states each fact and action tpu_nb needs; `TorchXlaBackend` (in
_torch_xla) is the one implementation, and the only module of tpu_nb that imports torch_xla.
`current()` is the backend in use. docs/backends.md maps each method to torch_xla and to
TorchTPU; tests/test_backend_contract.py asserts what every registered backend must deliver.

Lowest runtime package above the foundations (errors, units, sources, frame): imports nothing
else of tpu_nb.
"""

from tpu_nb.runtime.backend._base import (
    Backend,
    CounterNames,
    DeviceMemory,
    MetricSamples,
    backends,
    current,
    register,
)
from tpu_nb.runtime.backend._torch_xla import (
    TORCH_PAIR,
    TorchXlaBackend,
    hash_hex,
    installed_version,
    normal_hash,
    wait_device_ops,
)

__all__ = [
    "TORCH_PAIR",
    "Backend",
    "CounterNames",
    "DeviceMemory",
    "MetricSamples",
    "TorchXlaBackend",
    "backends",
    "current",
    "hash_hex",
    "normal_hash",
    "installed_version",
    "register",
    "wait_device_ops",
]
