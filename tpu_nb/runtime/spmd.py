"""SPMD data parallel in one process: a mesh over all devices and a helper to shard batches."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from tpu_nb.runtime.environment import runtime_initialized
from tpu_nb.runtime.errors import TpuNbError


@dataclass(frozen=True)
class Spmd:
    """What an SPMD function gets: the mesh and how to shard a batch across it."""

    mesh: Any                  # torch_xla.distributed.spmd.Mesh, axes ("data", "model")
    devices: int

    def shard_batch(self, tensor):
        """Shard `tensor` along its first (batch) dimension across all devices; returns it."""
        import torch_xla.distributed.spmd as xs

        spec = ("data",) + (None,) * (tensor.dim() - 1)
        xs.mark_sharding(tensor, self.mesh, spec)
        return tensor


def _parse_shape(mesh: str | None, n: int) -> tuple[int, int]:
    if mesh in (None, "", "all"):
        return n, 1
    try:
        dims = tuple(int(d) for d in str(mesh).lower().split("x"))
    except ValueError:
        dims = ()
    if len(dims) not in (1, 2) or any(d < 1 for d in dims):
        raise TpuNbError(f"mesh {mesh!r} is not a shape like 4 or 2x2. Fix: e.g. --spmd 4.")
    shape = dims if len(dims) == 2 else (dims[0], 1)
    if shape[0] * shape[1] != n:
        raise TpuNbError(f"a {shape[0]}x{shape[1]} mesh needs {shape[0] * shape[1]} devices; "
                         f"this runtime has {n}. Fix: --spmd {n}.")
    return shape


def spmd_context(devices: int | str = "all", mesh: str | None = None) -> Spmd:
    """Switch this process to SPMD (before the first XLA tensor) and build the mesh."""
    import numpy as np

    from tpu_nb.runtime.configure import setup

    cpu = os.environ.get("PJRT_DEVICE", "CPU").upper() == "CPU"
    wanted = None if devices == "all" else devices
    if cpu and wanted is not None and not runtime_initialized():
        setup("cpu", num_devices=wanted)
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    n = xr.global_runtime_device_count()
    if wanted is not None and wanted != n:
        raise TpuNbError(
            f"SPMD over {wanted} devices, but the runtime started with {n}. Fix: restart the "
            f"kernel and run %tpu_setup --devices {wanted} (tpu_nb.setup('cpu', num_devices="
            f"{wanted})) before the first XLA computation.")
    shape = _parse_shape(mesh, n)
    return Spmd(xs.Mesh(np.arange(n), shape, ("data", "model")), n)


def run_spmd(fn: Callable, args: tuple, devices: int | str = "all", mesh: str | None = None):
    """`launch(..., mode="spmd")`: fn(spmd, *args) once, over every device."""
    from tpu_nb.runtime.launch import LaunchResult, ReplicaResult
    from tpu_nb.runtime.tracking import track

    spmd = spmd_context(devices, mesh)
    start = time.perf_counter()
    with track("spmd") as report:
        value = fn(spmd, *args)
    result = ReplicaResult(ordinal=0, value=value, wall_seconds=report.wall_seconds,
                           metrics=report.metrics, pid=os.getpid())
    return LaunchResult("spmd", "in-process", spmd.devices, (result,),
                        time.perf_counter() - start)
