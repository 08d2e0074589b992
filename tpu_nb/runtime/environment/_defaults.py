"""`default_device()`: what the block builds without placing it lands on the XLA device, with
the numbers torch gives it on the host.

The block's tensors and modules are built as torch builds them — on the host, from the
generator the user seeded — then moved to the device once, as `.to(dev)` would move them. So
`torch.manual_seed(0); m = nn.Linear(4, 3)` has the same initial weights under the block as
`nn.Linear(4, 3).to(dev)` in a plain cell, a user's own `.to(dev)` is a no-op on the same
numbers, and a model whose `__init__` reads values (`x.item()`) reads them on the host, as the
`.to(dev)` model does. Explicit `device=` arguments are untouched.

- A tensor factory called without `device=` on a line of the block (or in a function defined
  in the same cell or file, called from the block) runs as torch runs it, and its result is
  moved to the device.
- A module constructed from the block (`nn.Linear(5, 2)`, `resnet18()`, a Hugging Face model
  from its config) is built by torch as usual; when its outermost `__init__` returns, the
  module is moved (`module.to(device)`), as a whole. The construction is seen through
  torch's global parameter and buffer registration hooks; its end through a profile function
  that this thread has only while such a construction runs (construction only: a step runs
  without it). A module holding meta tensors (built for lazy loading) is left as it is.
- Everything else keeps torch's default, the CPU: torch.optim (AdamW's step counters),
  torch.utils.data (samplers, collation, a `collate_fn` even if the block defined it), any
  other library, functions defined in other cells or files, other threads.

`with torch.device(dev):` would do otherwise: it draws random values on the device, from the
device's own generator, and installs a TorchFunctionMode that intercepts every torch call
(4-8 % on a 1.3 ms training step). Here the factories of the `torch` namespace are swapped for
wrappers; deciding costs a walk up the caller's frames (~1-3 us per factory call without
`device=`), and every other op runs untouched. Code holding its own reference to a factory
(`from torch import randn` before the block) keeps the original.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from tpu_nb.runtime import frame as frames
from tpu_nb.runtime.errors import TpuNbUsageError
from tpu_nb.runtime.probe import Hooks, close_surely, probe
from tpu_nb.runtime.sources import as_caller, caller, frames_to_tracked, tracked_frame

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


class _Scope:
    """Which calls are the block's own (see the module docstring). `codes`: the block's code
    objects (a cell); else `root`: the frame that entered the block."""

    def __init__(self, codes: tuple = (), root=None):
        self.codes = tuple(c for c in codes if c is not None)
        self.code_ids = frozenset(id(c) for c in self.codes)  # identity: no hashing of code
        self.root = root
        self.files = frozenset(c.co_filename for c in self.codes) or (
            frozenset((root.f_code.co_filename,)) if root is not None else frozenset()
        )

    def own(self, frame) -> bool:
        """Whether `frame` is the block's own code: the block's frame, reached through frames
        of the block's files only, none of them a module's `__init__` (a module is moved
        whole once built)."""
        return tracked_frame(frame, self.code_ids, self.root, self._inside) is not None

    def _inside(self, frame) -> bool:
        code = frame.f_code
        return code.co_filename in self.files and not (
            code.co_name == "__init__" and _is_module(_self_of(frame))
        )

    def outermost_init(self, frame):
        """The frame of the outermost `nn.Module.__init__` between `frame` and the block, if
        the block is reached (None otherwise): the construction the block asked for."""
        path = frames_to_tracked(frame, self.code_ids, self.root) or [None]
        inits = [f for f in path[:-1] if f.f_code.co_name == "__init__" and _is_module(_self_of(f))]
        return inits[-1] if inits else None


def _self_of(frame):
    # Not frame_variables(): emptying the snapshot of a frame a profile function is watching
    # would delete its variables, and the class's `__class__` cell with them (CPython writes
    # the snapshot back after each event). An __init__'s snapshot lives as long as it runs.
    return frame.f_locals.get("self")


def _is_module(obj) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


# Blocks open in each thread, innermost last: (scope, device). Replicas on XLA:CPU are
# threads of one process, each with its own device, so the wrappers (the probe's "factories"
# hooks, in place while any block is open) look up the calling thread's block.
_open = threading.local()


def _wrap(fn):
    @functools.wraps(fn)
    def factory(*args, **kwargs):
        __tracebackhide__ = True  # noqa: F841
        frame = caller()
        blocks = getattr(_open, "blocks", None)
        if blocks and kwargs.get("device") is None and "out" not in kwargs:
            scope, device = blocks[-1]
            if _creates(fn, args, kwargs) and scope.own(frame):
                if fn.__name__ in ("tensor", "as_tensor") and _is_device_tensor(args):
                    kwargs["device"] = device  # from device data: no round trip via the host
                else:
                    moved = _on_host_then_moved(as_caller(frame), fn, args, kwargs, device)
                    _note_built(moved, frame)
                    return moved
        # warnings (torch.tensor(a_tensor)'s) name the caller's line, not this wrapper
        return as_caller(frame)(fn, args, kwargs)

    return factory


def _on_host_then_moved(call, fn, args, kwargs, device):
    """`fn` as torch runs it, then moved: `torch.randn(3, requires_grad=True)` gives a leaf on
    the device holding the numbers of the CPU's generator."""
    grad = kwargs.pop("requires_grad", False)
    built = call(fn, args, kwargs)
    # moved from the caller's line too: torch_xla names the line that made a tensor in its IR
    # (the graph view's `location=`), and that line is the user's, not this function's
    moved = call(type(built).to, (built, device), {})
    return moved.requires_grad_() if grad else moved


# Where the block built each tensor it moved: id -> (weak reference, file, line), bounded. A
# dataset made of them, indexed per sample by a DataLoader, is named by the line that built it
# (tracking._device_data).
_built: dict[int, tuple] = {}
_MAX_BUILT = 4096


def _note_built(tensor, frame) -> None:
    try:
        ref = weakref.ref(tensor)
    except TypeError:
        return
    if len(_built) >= _MAX_BUILT:
        for key in [k for k, v in _built.items() if v[0]() is None] or list(_built)[:1024]:
            _built.pop(key, None)
    _built[id(tensor)] = (ref, frame.f_code.co_filename, frame.f_lineno)


def built_at(tensor) -> tuple[str, int] | None:
    """(file, line) where a default-device block built `tensor` and moved it to the device;
    None when it did not."""
    entry = _built.get(id(tensor))
    if entry is None or entry[0]() is not tensor:
        return None
    return entry[1], entry[2]


def _creates(fn, args, kwargs) -> bool:
    # torch.normal(mean_tensor, std_tensor) follows its inputs; only normal(float, float, size)
    # creates a tensor from nothing.
    return fn.__name__ != "normal" or "size" in kwargs or len(args) >= 3


def _is_device_tensor(args) -> bool:
    torch = sys.modules["torch"]
    return bool(args) and isinstance(args[0], torch.Tensor) and args[0].device.type != "cpu"


# -- modules: moved as a whole when their outermost __init__ returns --------------------------


def _registered(module, name, value):
    """torch's registration hook (parameters and buffers, every thread): a construction that
    the calling thread's block asked for is moved when its outermost __init__ returns."""
    blocks = getattr(_open, "blocks", None)
    if not blocks or value is None:
        return None
    scope, device = blocks[-1]
    init = scope.outermost_init(caller())
    if init is not None:
        _move_on_return(init, device)
    return None


def _move_on_return(frame, device) -> None:
    pending = _open.__dict__.setdefault("pending", {})
    if id(frame) in pending:
        return
    if not pending:
        previous = sys.getprofile()
        if previous is not None and not callable(previous):  # a profiler in C: leave it be
            return
        _open.previous = previous
        frames.tracing(+1)
        sys.setprofile(_watch)
    pending[id(frame)] = (frame, device)


def _watch(frame, event, arg):
    previous = _open.previous
    if previous is not None:
        previous(frame, event, arg)
    if event != "return":
        return
    pending = _open.pending
    entry = pending.pop(id(frame), None)
    if entry is None or entry[0] is not frame:
        if entry is not None:  # another frame reusing the id: not ours
            pending[id(frame)] = entry
        return
    module = _self_of(frame)
    if not pending:
        sys.setprofile(previous)
        frames.tracing(-1)
    if _movable(module):
        with suppress(Exception):  # a construction that raised: the error is the user's
            module.to(entry[1])


def _movable(module) -> bool:
    tensors = [*module.parameters(), *module.buffers()] if _is_module(module) else []
    return bool(tensors) and not any(t.is_meta for t in tensors)


@contextmanager
def default_device(device=None, *, code: tuple = ()) -> Iterator[object]:
    """Within the block, `torch.randn(3, 3)` and `nn.Linear(5, 2)` on the block's own lines
    are built as torch builds them and moved to `device`; libraries and code from elsewhere
    keep torch's default (see the module docstring).

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
    scope = _Scope(code, None if code else caller(1))
    subscription = probe().subscribe(scope, ("factories",), of_run=False)
    blocks = _open.__dict__.setdefault("blocks", [])
    blocks.append((scope, device))
    try:
        yield device
    finally:
        blocks.remove((scope, device))
        if not blocks and getattr(_open, "pending", None):  # a construction never returned
            _open.pending.clear()
            sys.setprofile(_open.previous)
            frames.tracing(-1)
        close_surely(subscription)


def _install(hooks: Hooks) -> None:
    """The probe's "factories" kind: the torch namespace's factories, and torch's global
    parameter and buffer registration hooks."""
    import torch

    for name in FACTORIES:
        hooks.patch(torch, name, _wrap)
    modules = torch.nn.modules.module
    for register in (
        modules.register_module_parameter_registration_hook,
        modules.register_module_buffer_registration_hook,
    ):
        hooks.undo(register(_registered).remove, register.__name__)


probe().define("factories", _install)


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
