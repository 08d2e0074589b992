"""`default_device()`: the block's own tensor factories and new modules land on the XLA device.

`with torch.device(dev):` (and torch.set_default_device) install a TorchFunctionMode that
intercepts every torch call (4-8 % on a 1.3 ms training step), and it reaches every library
the block calls. Here the factories of the `torch` namespace are swapped for wrappers that
fill in `device=` when the caller gave none — but only for calls that come from the block's
own code, so that the block does the same work as the same code written with `device=`:

- a factory called on a line of the block (or in a function defined in the same cell or
  file, called from the block) gets the device;
- a module constructed from the block (`nn.Linear(5, 2)`, `resnet18()`, a Hugging Face
  model from its config — an `nn.Module.__init__` between the block and the factory) gets
  it too, as `device=` on its construction would;
- everything else keeps torch's default, the CPU: torch.optim (AdamW's step counters),
  torch.utils.data (samplers, collation, a `collate_fn` even if the block defined it), any
  other library, functions defined in other cells or files, other threads. A factory given
  a `generator` keeps the CPU too (a CPU generator cannot drive XLA sampling).

Deciding costs a walk up the caller's frames (~1-3 us per factory call without `device=`);
every other op runs untouched. Code holding its own reference to a factory (`from torch
import randn` before the block) keeps the original.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tpu_nb.runtime.errors import TpuNbUsageError
from tpu_nb.runtime.frame import frame_variables
from tpu_nb.runtime.sources import MAX_DEPTH, as_caller

# Functions of the torch namespace that create a tensor from nothing (the *_like factories
# and tensor methods follow their input's device already). torch.from_numpy shares memory
# with a NumPy array, so it stays on the CPU.
FACTORIES = (
    "empty",
    "empty_strided",
    "zeros",
    "ones",
    "full",
    "rand",
    "randn",
    "randint",
    "randperm",
    "arange",
    "range",
    "linspace",
    "logspace",
    "eye",
    "tensor",
    "as_tensor",
    "scalar_tensor",
    "normal",
    "tril_indices",
    "triu_indices",
    "bartlett_window",
    "blackman_window",
    "hamming_window",
    "hann_window",
    "kaiser_window",
)

_lock = threading.Lock()


class _Scope:
    """Which factory calls get the default device: those reached from the block's own code
    (see the module docstring). `codes`: the block's code objects (a cell); else `root`: the
    frame that entered the block."""

    def __init__(self, codes: tuple = (), root=None):
        self.codes = tuple(c for c in codes if c is not None)
        self.code_ids = frozenset(id(c) for c in self.codes)  # identity: no hashing of code
        self.root = root
        self.files = frozenset(c.co_filename for c in self.codes) or (
            frozenset((root.f_code.co_filename,)) if root is not None else frozenset()
        )

    def covers(self, frame) -> bool:
        # The walk of sources.tracked_frame (the block's frame: one of its code objects, or
        # the frame that entered it; at most MAX_DEPTH frames out), inlined: a factory call
        # without device= pays for it. What lies between decides: the block's own files, or
        # an nn.Module being built from it.
        own, built, depth = True, False, 0
        while frame is not None and depth < MAX_DEPTH:
            code = frame.f_code
            if id(code) in self.code_ids or frame is self.root:
                return own or built
            if code.co_filename not in self.files:
                if code.co_name == "__init__" and _is_module(frame_variables(frame).get("self")):
                    built = True
                else:
                    own = False
            frame = frame.f_back
            depth += 1
        return False


def _is_module(obj) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


# Blocks open in each thread, innermost last: (scope, device). Replicas on XLA:CPU are
# threads of one process, each with its own device, so the wrappers (installed once while any
# block is open) look up the calling thread's block.
_open = threading.local()
_users = 0
_originals: dict[str, object] = {}


def _wrap(fn):
    @functools.wraps(fn)
    def factory(*args, **kwargs):
        __tracebackhide__ = True  # noqa: F841
        if kwargs.get("device") is None:
            blocks = getattr(_open, "blocks", None)
            if blocks and _defaults_here(fn, args, kwargs):
                scope, device = blocks[-1]
                if scope.covers(sys._getframe(1)):
                    kwargs["device"] = device
        # warnings (torch.tensor(a_tensor)'s) name the caller's line, not this wrapper
        return as_caller(sys._getframe(1))(fn, args, kwargs)

    factory.__tpu_nb_original__ = fn
    return factory


def _defaults_here(fn, args, kwargs) -> bool:
    if kwargs.get("generator") is not None:
        return False
    return fn.__name__ != "normal" or _normal_needs_device(args, kwargs)


def _normal_needs_device(args, kwargs) -> bool:
    # torch.normal(mean_tensor, std_tensor) follows its inputs; only normal(float, float, size)
    # creates a tensor from nothing.
    return "size" in kwargs or len(args) >= 3


@contextmanager
def default_device(device=None, *, code: tuple = ()) -> Iterator[object]:
    """Within the block, `torch.randn(3, 3)` and `nn.Linear(5, 2)` on the block's own lines
    land on `device`; libraries and code from elsewhere keep torch's default (see the module
    docstring).

    device: a torch.device or a device string; default: the XLA device (`tpu_nb.device()`).
    code: the code objects that are the block's own code (a cell's compiled code); default:
        the function that entered the block, and functions defined in its file.
    Yields the device. Explicit `device=` arguments are respected.
    """
    import torch

    if device is None:
        from tpu_nb.runtime.environment._device import device as xla_device

        device = xla_device()
    else:
        device = _as_device(torch, device)
    scope = _Scope(code, None if code else sys._getframe(2))
    _install(torch)
    blocks = _open.__dict__.setdefault("blocks", [])
    blocks.append((scope, device))
    try:
        yield device
    finally:
        blocks.remove((scope, device))
        _uninstall(torch)


def _install(torch) -> None:
    global _users
    with _lock:
        if _users == 0:
            for name in FACTORIES:
                fn = getattr(torch, name, None)
                if fn is not None:
                    original = getattr(fn, "__tpu_nb_original__", fn)
                    _originals[name] = original
                    setattr(torch, name, _wrap(original))
        _users += 1


def _uninstall(torch) -> None:
    global _users
    with _lock:
        _users -= 1
        if _users == 0:
            for name, original in _originals.items():
                current = getattr(torch, name, None)
                if getattr(current, "__tpu_nb_original__", None) is original:
                    setattr(torch, name, original)  # unless something replaced ours since
            _originals.clear()


def _as_device(torch, device):
    if isinstance(device, torch.device):
        return device
    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise TpuNbUsageError(
            f"default_device() takes a torch.device or a device string; got "
            f"{device!r}. Fix: default_device() for the XLA device, or e.g. "
            "default_device(torch_xla.device())."
        ) from None
