"""Multi-device runs from a notebook: `launch()` in replicas (forked or a fresh worker) or SPMD
mode on this host, `launch_hosts()` once per host of a TPU pod slice through Ray, a notebook
cell as a replica's (or a host's) function, and what a launch returns and raises.
Above runtime.tracking."""

from tpu_nb.runtime.parallel._cell import CellFunction
from tpu_nb.runtime.parallel._hosts import launch_hosts
from tpu_nb.runtime.parallel._pod import Divergence, HostError, HostLost, HostResult, PodResult
from tpu_nb.runtime.parallel._replicas import launch
from tpu_nb.runtime.parallel._results import (
    CollectiveRefused,
    LaunchResult,
    ReplicaCrash,
    ReplicaError,
    ReplicaResult,
    ReplicasTimedOut,
)
from tpu_nb.runtime.parallel._spmd import Spmd, check_spmd, parse_mesh, spmd_context

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
    "ReplicasTimedOut",
    "Spmd",
    "check_spmd",
    "launch",
    "launch_hosts",
    "parse_mesh",
    "spmd_context",
]
