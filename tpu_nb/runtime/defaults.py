"""`default_device()`: tensor factories and new modules land on the XLA device, cheaply.

`with torch.device(dev):` (and torch.set_default_device) install a TorchFunctionMode that
intercepts every torch call: 4-8 % on a 1.3 ms training step. Only factory functions need a
default device — modules build their parameters with them (nn.Linear calls torch.empty) — so
this swaps the factories in the `torch` namespace for wrappers that fill in `device=` when the
caller gave none, and restores them on exit. Every other op runs untouched. Code holding its
own reference to a factory (`from torch import randn` before the block) keeps the original.

Two kinds of call keep the CPU, where `torch.set_default_device` breaks them: a factory given
a `generator` (a CPU generator cannot drive XLA sampling: DataLoader's shuffling does this),
and factories called by torch.utils.data (samplers and collation build index tensors on the
host; on the device they would cost a compile and a host read per epoch).
"""

from __future__ import annotations

import functools
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

# Functions of the torch namespace that create a tensor from nothing (the *_like factories
# and tensor methods follow their input's device already). torch.from_numpy shares memory
# with a NumPy array, so it stays on the CPU.
FACTORIES = ("empty", "empty_strided", "zeros", "ones", "full", "rand", "randn", "randint",
             "randperm", "arange", "range", "linspace", "logspace", "eye", "tensor",
             "as_tensor", "scalar_tensor", "normal", "tril_indices", "triu_indices",
             "bartlett_window", "blackman_window", "hamming_window", "hann_window",
             "kaiser_window")

_lock = threading.Lock()


def _wrap(fn, device):
    @functools.wraps(fn)
    def factory(*args, **kwargs):
        if kwargs.get("device") is None and _defaults_here(fn, args, kwargs):
            kwargs["device"] = device
        return fn(*args, **kwargs)

    factory.__tpu_nb_original__ = fn
    return factory


def _defaults_here(fn, args, kwargs) -> bool:
    if kwargs.get("generator") is not None:
        return False
    caller = sys._getframe(2).f_globals.get("__name__", "")
    if caller.startswith("torch.utils.data"):
        return False
    return fn.__name__ != "normal" or _normal_needs_device(args, kwargs)


def _normal_needs_device(args, kwargs) -> bool:
    # torch.normal(mean_tensor, std_tensor) follows its inputs; only normal(float, float, size)
    # creates a tensor from nothing.
    return "size" in kwargs or len(args) >= 3


@contextmanager
def default_device(device=None) -> Iterator[object]:
    """Within the block, `torch.randn(3, 3)` and `nn.Linear(5, 2)` land on `device`.

    device: a torch.device; default: the XLA device (`tpu_nb.device()`).
    Yields the device. Explicit `device=` arguments are respected.
    """
    import torch

    if device is None:
        from tpu_nb.runtime.device import device as xla_device

        device = xla_device()
    with _lock:
        previous = {name: getattr(torch, name) for name in FACTORIES if hasattr(torch, name)}
        for name, fn in previous.items():
            original = getattr(fn, "__tpu_nb_original__", fn)
            setattr(torch, name, _wrap(original, device))
    try:
        yield device
    finally:
        with _lock:
            for name, fn in previous.items():   # a nested block restores the outer one's
                setattr(torch, name, fn)
