"""Reading the pending graph from torch_xla: `graph()` for given tensors, `pending_graph()` for
whatever is waiting, and `record_locations()` to have new IR nodes carry their Python line."""

from __future__ import annotations

import gc
import itertools
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from tpu_nb.runtime.backend import current as backend
from tpu_nb.runtime.errors import TpuNbUsageError
from tpu_nb.runtime.frame import frame_variables
from tpu_nb.runtime.graph._frames import with_frames
from tpu_nb.runtime.graph._graph import Graph
from tpu_nb.runtime.graph._scopes import module_scopes

# torch.device(...).type of the backend's lazy tensors ("xla").
_DEVICE_TYPE = backend().device_type


def graph(*tensors: Any, hlo: bool = True, frames: bool | None = None) -> Graph:
    """The pending graph that computes `tensors` (XLA tensors, or modules, optimizers, and
    lists/tuples/dicts of them), as torch_xla would compile it at the next sync.

    Capture before the sync: after it the tensors are plain device data. `hlo=False` skips
    lowering to HLO (about as costly as reading the IR: ~45 us per node on XLA:CPU).
    `frames`: give each node its whole Python stack (Node.frames, Node.user_frame), read
    from the HLO's stack-frame index; the default does it when locations were recorded and
    the graph has at most 50,000 nodes (it lowers the graph once more).
    """
    found = xla_tensors(tensors)
    runtime = backend()
    g = Graph.from_ir_text(
        runtime.graphs.text(found),
        hash=runtime.graphs.hash(found),
        hlo_text=runtime.graphs.hlo(found) if hlo else None,
        ir_debug=True if runtime.process.source_lines() else None,
        fallback_ops=_fallback_counts(),
    )
    located = any(n.location for n in g.nodes)
    if frames or (frames is None and located and len(g.nodes) <= 50_000):
        with record_locations():  # lowering writes source metadata only in IR debug
            proto = runtime.graphs.hlo_proto(found)
        g = with_frames(g, proto)
    return g


def _fallback_counts() -> tuple[tuple[str, int], ...]:
    """CPU fallback ops run so far (`.item()`/print reads excluded: those are host reads)."""
    runtime = backend()
    host_read = runtime.counters.facts.host_read
    names = sorted(n for n in runtime.counters.fallbacks() if n != host_read)
    counts = runtime.counters.read(names)
    return tuple((n, counts[n]) for n in names)


def xla_tensors(objects: Sequence[Any]) -> list:
    import torch

    found: dict[int, Any] = {}
    for obj in objects:
        if isinstance(obj, torch.Tensor):
            if obj.device.type != _DEVICE_TYPE:
                raise TpuNbUsageError(
                    f"graph() got a tensor on {obj.device}, which is not lazy: only XLA "
                    "tensors have a pending graph. Fix: leave it out, or move it first with "
                    ".to(tpu_nb.device())."
                )
            found.setdefault(id(obj), obj)
        elif _is_container(obj, torch):
            # any depth and size: the caller named these objects (-1 levels: no limit)
            for t in walk_limited(obj, torch, -1, set(), [sys.maxsize], grads=False):
                found.setdefault(id(t), t)
        else:
            raise TpuNbUsageError(
                f"graph() takes XLA tensors, modules, optimizers or lists/dicts of them; got "
                f"{type(obj).__name__}. Fix: pass the tensors whose computation you want to "
                "see, e.g. tpu_nb.graph(loss) or tpu_nb.graph(loss, model)."
            )
    if not found:
        raise TpuNbUsageError(
            "graph() found no XLA tensor in its arguments. Fix: pass tensors "
            "on the XLA device, e.g. tpu_nb.graph(loss)."
        )
    return list(found.values())


def _is_container(obj: Any, torch) -> bool:
    return isinstance(
        obj, (list, tuple, dict, set, frozenset, torch.nn.Module, torch.optim.Optimizer)
    )


def _children(obj: Any, torch) -> Iterable[Any]:
    """What a container holds: a module's parameters and buffers, an optimizer's parameters
    and state, a dict's values, a sequence's or set's items."""
    if isinstance(obj, torch.nn.Module):
        return [*obj.parameters(), *obj.buffers()]
    if isinstance(obj, torch.optim.Optimizer):
        return [g["params"] for g in obj.param_groups] + list(obj.state.values())
    return obj.values() if isinstance(obj, dict) else obj


def is_pending(tensor: Any) -> bool:
    """Whether an XLA tensor has operations waiting for a sync (not just device data).
    ~2 us: reads torch_xla's debug line for the tensor's IR value."""
    return backend().graphs.pending(tensor) != ""


def pending_graph(*objects: Any, hlo: bool = True, max_items: int = 100_000) -> Graph | None:
    """The pending graph of every XLA tensor found in `objects` that has work waiting, or None
    when nothing is pending.

    With objects, e.g. `pending_graph(user_namespace, result)`: the tensors found there (also
    inside lists, dicts, modules, optimizers, a few levels deep, up to `max_items` objects).
    Without: every live XLA tensor in the process (found through the garbage collector's
    list of objects, ~0.1 s per million objects), which is what the next sync would run, even
    tensors only a function's local variables hold: call it just before the sync.
    """
    import torch

    if objects:
        found = pending_tensors(*objects, max_items=max_items)
    else:
        # type(), not isinstance(): isinstance reads __class__, which some objects in a big
        # process answer with a deprecation warning (torch.distributed.reduce_op)
        found = _pending(
            o
            for o in gc.get_objects()
            if issubclass(type(o), torch.Tensor) and o.device.type == _DEVICE_TYPE
        )
    return graph(*found, hlo=hlo) if found else None


def pending_tensors(*objects: Any, max_items: int = 100_000) -> list:
    """The XLA tensors with work waiting found in `objects`, each once, in the order found
    (inside containers as `pending_graph` looks, up to `max_items` objects in all)."""
    import torch

    budget = [max_items]
    return _pending(
        t for obj in objects for t in walk_limited(obj, torch, depth=4, seen=set(), budget=budget)
    )


def _pending(candidates: Iterable[Any]) -> list:
    found: dict[int, Any] = {}
    for t in candidates:
        if id(t) not in found and is_pending(t):
            found[id(t)] = t
    return list(found.values())


def frame_spaces(frame) -> list[dict]:
    """The namespaces a frame's code reads: its variables, then its globals (one namespace
    for a module's frame, whose variables are its globals)."""
    variables = frame_variables(frame)
    return [variables] if variables is frame.f_globals else [variables, frame.f_globals]


def search_order(spaces: list[dict], names: Iterable[str]) -> list[dict]:
    """Where to look for the tensors of a pending graph, in `spaces` (innermost first): the
    variables the code names (`names`) first, then every space's variables, newest first. A
    notebook's namespace holds much else, which could use up the walk's budget before it
    reaches the tensors the code uses."""
    names = tuple(names)
    named = {n: space[n] for space in spaces for n in names if n in space}
    return [named, *(dict(reversed(list(space.items()))) for space in spaces)]


def walk_limited(
    obj: Any, torch, depth: int, seen: set, budget: list, *, grads: bool = True
) -> Iterator:
    """XLA tensors inside containers, modules and optimizers, and with `grads` their
    gradients: at most `depth` levels deep and `budget[0]` objects, each container once.
    Tensors elsewhere (e.g. AdamW's CPU step counters) are skipped."""
    budget[0] -= 1
    if budget[0] < 0 or id(obj) in seen:
        return
    if isinstance(obj, torch.Tensor):
        if obj.device.type == _DEVICE_TYPE:
            yield obj
            grad = obj.grad if grads and obj.is_leaf and obj.requires_grad else None
            if grad is not None:  # a backward's gradients: pending until a sync runs them
                yield grad
        return
    if depth == 0 or not _is_container(obj, torch):
        return
    seen.add(id(obj))
    # no copy of a big container: at most what the budget still allows is looked at
    for child in itertools.islice(_children(obj, torch), max(budget[0], 0) + 1):
        yield from walk_limited(child, torch, depth - 1, seen, budget, grads=grads)


@contextmanager
def record_locations(enabled: bool = True, *, modules: bool = True) -> Iterator[None]:
    """Record where each new IR node came from, inside the block: its Python line
    (`location=` in the IR) and, with `modules`, the module, module backward or optimizer
    step that made it (`scope=`; see _scopes).

    The same as XLA_IR_DEBUG=1 but switchable at run time (torch_xla's `_set_ir_debug`), so
    a notebook can turn it on for one cell: lines cost ~0.6 us per traced op on XLA:CPU,
    module scopes about double the tracing time. The graph, its hash and its compiles stay
    the same. Nodes traced before the block keep having neither.
    """
    runtime = backend()
    before = runtime.process.source_lines()
    runtime.process.set_source_lines(enabled)
    try:
        with module_scopes(enabled and modules):
            yield
    finally:
        runtime.process.set_source_lines(before)
