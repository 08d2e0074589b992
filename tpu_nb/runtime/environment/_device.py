"""The XLA device and the sync point, with `setup()` applied first if nothing chose a device."""

from __future__ import annotations

from tpu_nb.runtime.backend import current as backend
from tpu_nb.runtime.environment._configure import ensure_setup
from tpu_nb.runtime.errors import TpuNbUsageError, check_whole_number


def device(index: int | None = None):
    """The XLA device (`torch_xla.device()`), after `setup()` defaults if none was chosen."""
    if index is not None:
        check_whole_number(
            index,
            "index",
            low=0,
            alternative="None",
            fix="tpu_nb.device() for the default device, or e.g. tpu_nb.device(0)",
        )
    ensure_setup()
    runtime = backend()
    runtime.process.load()  # a broken install is explained before anything else
    # Under SPMD one virtual device (xla:0) stands for all of them.
    if index is not None and index >= (count := runtime.devices.count()):
        raise TpuNbUsageError(
            f"there is no XLA device {index}: this process has {count} "
            f"(xla:0{f' to xla:{count - 1}' if count > 1 else ''}). Fix: "
            f"tpu_nb.device({count - 1 if count > 1 else 0}) or tpu_nb.device()."
        )
    return runtime.devices.device(index)


def sync(wait: bool = False) -> None:
    """Compile and run the pending graph (`torch_xla.sync()`); `wait=True` also waits for it
    to finish on the device, so timings and ExecuteTime are complete."""
    runtime = backend()
    runtime.syncs.sync()
    if wait:
        runtime.syncs.wait()


def wait_device_ops() -> None:
    """Block until every launched execution has finished (so ExecuteTime is recorded)."""
    backend().syncs.wait()
