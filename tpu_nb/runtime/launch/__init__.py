"""Multi-device runs from a notebook: `launch()` in replicas (forked or a fresh worker) or SPMD
mode on this host, or once per host of a TPU pod slice through Ray (`hosts=`), a notebook cell
as a replica's (or a host's) function, and what a launch returns and raises.
Above runtime.tracking."""

from tpu_nb.runtime.launch._cell import CellFunction
from tpu_nb.runtime.launch._hosts import launch
from tpu_nb.runtime.launch._pod import Divergence, HostError, HostLost, HostResult, PodResult
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
    "Divergence",
    "HostError",
    "HostLost",
    "HostResult",
    "LaunchResult",
    "PodResult",
    "ReplicaCrash",
    "ReplicaError",
    "ReplicaResult",
    "Spmd",
    "check_spmd",
    "launch",
    "parse_mesh",
    "spmd_context",
]
