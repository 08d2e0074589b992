"""Module scopes: every IR node named after the part of the model that made it.

While `module_scopes()` is open, a global forward pre-hook opens a backend scope named after
the module being called (`ResNet.layer1.0.conv1`; the outermost module called is named by its
class) and the forward hook closes it, so each forward node carries its module in the IR's
`scope=` tag and in the HLO's op_name. Autograd runs the backward pass on its own thread,
outside any forward call: the forward hook marks each autograd node the module's forward made
(from its outputs back to its inputs) with hooks that open `<module>:backward` on that thread
while the node runs, so a backward node says which module's gradient it computes; a
parameter's gradient accumulation belongs to the module that first used it. An optimizer's
step opens `<Optimizer>:step`.

Scopes only name nodes: torch_xla's graph hash and compile count stay the same (checked on
resnet18 and GPT-2 training steps), and tracing costs about twice as much while they are on.
Everything is removed on exit; autograd nodes marked earlier and run later open nothing.
The scope tags show only while IR debug records source lines: `record_locations()`, the one
way in, turns that on.

`module_of(scope)` reads a node's scope back as (phase, module path).
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tpu_nb.runtime.backend import current as backend

BACKWARD = ":backward"
STEP = ":step"
PHASES = ("forward", "backward", "optimizer", "other")
_COUNTER = re.compile(r"\.\d+\Z")
_TORCH_XLA_OWN = ("aten::", "xla::", "prim::")
_MARK = "tpu_nb_scope"  # key in an autograd node's metadata dict


def module_of(scope: str) -> tuple[str, str]:
    """A node's scope tag -> (phase, module path): ("forward", "ResNet.layer1.0.conv1"),
    ("backward", "GPT2LMHeadModel.lm_head"), ("optimizer", "AdamW"), or ("other", "") for a
    node no module, backward or optimizer made. The innermost named scope wins, with
    torch_xla's counter suffix (".3") stripped."""
    for part in reversed(scope.split("/")) if scope else ():
        name = _COUNTER.sub("", part)
        if not name or name.startswith(_TORCH_XLA_OWN):
            continue
        if name.endswith(BACKWARD):
            return "backward", name[: -len(BACKWARD)]
        if name.endswith(STEP):
            return "optimizer", name[: -len(STEP)]
        return "forward", name
    return "other", ""


class _Tracer:
    """The hooks' state for one `module_scopes()` block."""

    def __init__(self, open_scope) -> None:
        self.open_scope = open_scope
        self.active = True
        self.names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.forward: list[tuple[Any, Any, dict]] = []  # (module, scope, input grad_fns)
        self.steps: list[Any] = []
        self.local = threading.local()  # the backward thread's open scopes

    def name(self, module) -> str:
        found = self.names.get(module)
        if found is None:  # called from outside any known model: a root, named by its class
            found = type(module).__name__
            for path, sub in module.named_modules():
                self.names[sub] = f"{found}.{path}" if path else found
        return found

    def enter(self, module, args) -> None:
        import torch

        if torch.compiler.is_compiling():
            return
        # the objects, not only their ids: a freed wrapper's id can come back for another
        inputs = {id(t.grad_fn): t.grad_fn for t in _tensors(args) if t.grad_fn is not None}
        self.forward.append((module, self.open_scope(self.name(module)), inputs))

    def leave(self, module, args, output) -> None:
        if not self.forward or self.forward[-1][0] is not module:
            return
        _, scope, inputs = self.forward.pop()
        try:
            self._mark_backward(self.name(module) + BACKWARD, output, inputs)
        finally:
            del scope  # closes it

    def _mark_backward(self, name: str, output, inputs: dict) -> None:
        """Mark the autograd nodes this call's forward made, from its outputs back to its
        inputs. Nodes an inner module marked are walked through, not renamed."""
        todo = [t.grad_fn for t in _tensors(output) if t.grad_fn is not None]
        seen: dict[int, Any] = {}
        while todo:
            fn = todo.pop()
            if fn is None or id(fn) in seen or id(fn) in inputs:
                continue
            seen[id(fn)] = fn
            meta = fn.metadata
            if _MARK not in meta:
                meta[_MARK] = name
                fn.register_prehook(self._backward_enter(name))
                fn.register_hook(self._backward_leave)
            todo.extend(next_fn for next_fn, _ in fn.next_functions)

    def _backward_enter(self, name: str):
        def enter(grad_outputs):
            stack = self.local.__dict__.setdefault("stack", [])
            stack.append(self.open_scope(name) if self.active else None)

        return enter

    def _backward_leave(self, grad_inputs, grad_outputs) -> None:
        stack = self.local.__dict__.get("stack")
        if stack:
            stack.pop()

    def step_enter(self, optimizer, args, kwargs) -> None:
        self.steps.append(self.open_scope(type(optimizer).__name__ + STEP))

    def step_leave(self, optimizer, args, kwargs) -> None:
        if self.steps:
            self.steps.pop()

    def close(self) -> None:
        self.active = False
        self.forward.clear()
        self.steps.clear()


def _tensors(value: Any, depth: int = 3) -> Iterator[Any]:
    """The tensors in a module's arguments or output (tuples, lists, dicts, and
    transformers' ModelOutput, which is a dict)."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif depth and isinstance(value, (tuple, list, dict)):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _tensors(item, depth - 1)


_open_blocks = [0]  # nested module_scopes() blocks share the outermost one's hooks


@contextmanager
def module_scopes(enabled: bool = True) -> Iterator[None]:
    """Name the IR nodes traced inside the block after the module, module backward or
    optimizer step that made them (see the module docstring)."""
    if not enabled or _open_blocks[0]:
        yield
        return
    import torch
    import torch.optim.optimizer as optimizer

    tracer = _Tracer(backend().graphs.open_scope)
    handles = [
        torch.nn.modules.module.register_module_forward_pre_hook(tracer.enter),
        torch.nn.modules.module.register_module_forward_hook(tracer.leave, always_call=True),
        optimizer.register_optimizer_step_pre_hook(tracer.step_enter),
        optimizer.register_optimizer_step_post_hook(tracer.step_leave),
    ]
    _open_blocks[0] += 1
    try:
        yield
    finally:
        _open_blocks[0] -= 1
        for handle in handles:
            handle.remove()
        tracer.close()
