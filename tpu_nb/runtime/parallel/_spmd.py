"""SPMD data parallel in one process: a mesh over all devices and a helper to shard batches."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpu_nb.runtime.backend import current as backend
from tpu_nb.runtime.environment._configure import MAX_CPU_DEVICES
from tpu_nb.runtime.environment._detect import runtime_initialized
from tpu_nb.runtime.errors import RuntimeStateError, TpuNbUsageError, check_whole_number
from tpu_nb.runtime.parallel._results import LaunchResult, ReplicaResult
from tpu_nb.runtime.tracking._run import track


@dataclass(frozen=True)
class Spmd:
    """What an SPMD function gets: the mesh and how to shard a batch across it."""

    mesh: Any  # torch_xla.distributed.spmd.Mesh, axes ("data", "model")
    devices: int

    def shard_batch(self, tensor):
        """Shard `tensor` along its first (batch) dimension across all devices; returns it."""
        spec = ("data",) + (None,) * (tensor.dim() - 1)
        return backend().launch.shard(tensor, self.mesh, spec)


def parse_mesh(mesh: str | None) -> tuple[int, int] | None:
    """(rows, columns) of a mesh like "4" or "2x2"; None for all devices in one row."""
    if mesh in (None, "", "all"):
        return None
    try:
        dims = tuple(int(d) for d in str(mesh).lower().split("x"))
    except ValueError:
        dims = ()
    if len(dims) not in (1, 2) or any(d < 1 for d in dims) or math.prod(dims) > MAX_CPU_DEVICES:
        raise TpuNbUsageError(
            f"mesh {mesh!r} is not a shape like 4 or 2x2 of at most "
            f"{MAX_CPU_DEVICES} devices. Fix: e.g. --spmd 4."
        )
    return dims if len(dims) == 2 else (dims[0], 1)


def _on_cpu() -> bool:
    return os.environ.get("PJRT_DEVICE", "CPU").upper() == "CPU"


def _expected_devices(wanted: int | None) -> int | None:
    """The device count the runtime will start with, when it can be known without starting
    it (XLA:CPU: `wanted`, which spmd_context sets up, else CPU_NUM_DEVICES); None otherwise."""
    if runtime_initialized():
        return backend().devices.global_count()
    if _on_cpu():
        if wanted is not None:
            return wanted
        try:
            return int(os.environ.get("CPU_NUM_DEVICES") or 1)
        except ValueError:
            return None
    return None


def _check_count(wanted: int | None, shape: tuple[int, int] | None, count: int) -> None:
    """Refuse `count` devices when the request or the mesh wants another number."""
    if wanted is not None and wanted != count:
        raise RuntimeStateError(
            f"SPMD over {wanted} devices, but the runtime started with {count}. Fix: restart "
            f"the kernel and run %tpu_setup --devices {wanted} (tpu_nb.setup('cpu', "
            f"num_devices={wanted})) before the first XLA computation."
        )
    if shape and shape[0] * shape[1] != count:
        raise TpuNbUsageError(
            f"a {shape[0]}x{shape[1]} mesh needs {shape[0] * shape[1]} devices; "
            f"this runtime has {count}. Fix: --spmd {count}."
        )


def check_spmd(devices: int | str = "all", mesh: str | None = None) -> int | None:
    """Everything that can refuse an SPMD request, checked before the process switches to SPMD
    (a switch that cannot be undone). Returns the device count asked for (None: all)."""
    wanted = None
    if devices != "all":
        wanted = check_whole_number(
            devices,
            "devices",
            high=MAX_CPU_DEVICES,
            alternative="'all'",
            fix="e.g. devices=4, or devices='all'",
        )
    shape = parse_mesh(mesh)
    if shape and wanted is not None and shape[0] * shape[1] != wanted:
        raise TpuNbUsageError(
            f"a {shape[0]}x{shape[1]} mesh has {shape[0] * shape[1]} devices, "
            f"not {wanted}. Fix: a mesh of {wanted} devices, e.g. --spmd {wanted}."
        )
    # torch_xla locks its SPMD configuration when the runtime starts (the first device use).
    # `use_spmd()` after that forces SPMD onto the running runtime, and later XLA work, even on
    # new tensors, can crash the process (SIGSEGV inside torch_xla 2.9, seen on XLA:CPU with 4
    # devices after a notebook's first cells). The lock is the signal: it never unlocks,
    # whatever is freed.
    launcher = backend().launch
    if not launcher.spmd_active() and launcher.spmd_locked():
        raise RuntimeStateError(
            "cannot switch to SPMD: this process already used the XLA device without it, and "
            "torch_xla 2.9 crashes the process (SIGSEGV) at the next XLA work when SPMD is "
            "switched on after that. Fix: restart the kernel and run the SPMD cell (%%on_tpu "
            "--spmd, or launch(..., mode='spmd')) before any other XLA work, right after "
            "%tpu_setup."
        )
    count = _expected_devices(wanted)
    if count is not None:
        _check_count(wanted, shape, count)
    return wanted


def spmd_context(devices: int | str = "all", mesh: str | None = None) -> Spmd:
    """Switch this process to SPMD (before the first XLA tensor) and build the mesh."""
    from tpu_nb.runtime.environment._configure import setup

    wanted = check_spmd(devices, mesh)
    if _on_cpu() and wanted is not None and not runtime_initialized():
        setup("cpu", num_devices=wanted)
    runtime = backend()
    runtime.launch.use_spmd()
    n = runtime.devices.global_count()
    shape = parse_mesh(mesh)
    _check_count(wanted, shape, n)  # fails only where the count was not knowable before
    return Spmd(runtime.launch.mesh(n, shape or (n, 1), ("data", "model")), n)


def run_spmd(fn: Callable, args: tuple, devices: int | str):
    """`launch(..., mode="spmd")`: fn(spmd, *args) once, over every device."""
    spmd = spmd_context(devices)
    start = time.perf_counter()
    with track("spmd") as report:
        value = fn(spmd, *args)
    result = ReplicaResult(
        ordinal=0,
        value=value,
        wall_seconds=report.wall_seconds,
        step_seconds=tuple(step.wall for step in report.steps if not step.tail),
        metrics=report.metrics,
        pid=os.getpid(),
    )
    return LaunchResult("spmd", "in-process", spmd.devices, (result,), time.perf_counter() - start)
