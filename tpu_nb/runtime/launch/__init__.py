"""Multi-device runs from a notebook: `launch()` in replicas (forked or a fresh worker) or SPMD
mode, a notebook cell as a replica's function, and what a launch returns and raises.
Above runtime.tracking."""

from tpu_nb.runtime.launch._cell import CellFunction
from tpu_nb.runtime.launch._replicas import launch
from tpu_nb.runtime.launch._results import (
    CollectiveRefused,
    LaunchResult,
    ReplicaCrash,
    ReplicaError,
    ReplicaResult,
)
from tpu_nb.runtime.launch._spmd import Spmd, check_spmd, parse_mesh, spmd_context

__all__ = [
    "CellFunction",
    "CollectiveRefused",
    "LaunchResult",
    "ReplicaCrash",
    "ReplicaError",
    "ReplicaResult",
    "Spmd",
    "check_spmd",
    "launch",
    "parse_mesh",
    "spmd_context",
]
