"""The XLA device and the sync point, with `setup()` applied first if nothing chose a device."""

from __future__ import annotations

from tpu_nb.runtime._xla import wait_device_ops, xla
from tpu_nb.runtime.configure import ensure_setup


def device(index: int | None = None):
    """The XLA device (`torch_xla.device()`), after `setup()` defaults if none was chosen."""
    ensure_setup()
    return xla().device(index)


def sync(wait: bool = False) -> None:
    """Compile and run the pending graph (`torch_xla.sync()`); `wait=True` also waits for it
    to finish on the device, so timings and ExecuteTime are complete."""
    xla().sync()
    if wait:
        wait_device_ops()
