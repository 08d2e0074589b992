"""Work a tracked run left pending: what the next sync or value read will run, found without
running anything.

tpu_nb never syncs at the end of a run unless asked (`track(sync=True)`, `%%on_tpu --sync`):
a plain cell does not, and a sync of tpu_nb's own would compile and run graphs the plain cell
never runs (torch_xla leaves a tensor pending after `.item()` read its value, so a sync runs
its graph again). What is left pending is described instead, from facts: the block's
variables that hold XLA tensors with pending work (the names its code uses, walked a few
levels into lists, dicts, modules and optimizers), and the pending graph of those tensors,
read from torch_xla's IR (reading a graph runs nothing). The work runs later, at the next
sync or read, and the runtime's counters count it there.
"""

from __future__ import annotations

import ast
import logging
import time
import weakref
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tpu_nb.runtime.graph._capture import graph, is_pending, walk_limited

log = logging.getLogger("tpu_nb")

_WALK_BUDGET = 20_000  # objects looked at, at most, when looking for pending tensors
_MAX_HOLDERS = 8


def counted_ops(ops: Sequence[tuple[str, int]], shown: int = 4) -> str:
    """ "aten::mul ×1, aten::mean ×1 and 3 more": (op, count) pairs, the most common first."""
    top = ", ".join(f"{op} \u00d7{n}" for op, n in ops[:shown])
    more = len(ops) - shown
    return top + (f" and {more} more" if more > 0 else "")


@dataclass(frozen=True)
class PendingWork:
    """What a tracked run left pending at its end (not run, not counted in its report)."""

    holders: tuple[str, ...]  # the block's variables holding tensors with pending work
    tensors: int  # pending tensors found
    nodes: int = 0  # IR nodes of their pending graph (0: the graph could not be read)
    ops: tuple[tuple[str, int], ...] = ()  # the graph's ops by count, most common first
    lines: tuple[tuple[str, int], ...] = ()  # (file, line) where its nodes were traced,
    # when IR locations were recorded (--graph, %tpu_setup --ir-debug)
    seconds: float = 0.0  # spent finding and reading it

    def summary(self) -> str:
        """One sentence, for a report's text."""
        who = ", ".join(self.holders) if self.holders else "tensors tpu_nb could not name"
        graph = (
            f" (a graph of {self.nodes} IR nodes ({counted_ops(self.ops)}))" if self.nodes else ""
        )
        return (
            f"work left pending at the end: {who}{graph}; not run here: it runs at the next sync "
            "or value read, and is counted there"
        )


@dataclass(frozen=True)
class EarlierWork:
    """Work earlier cells (or code before the block) left pending, found as the block
    started: the block's first sync runs it together with the block's own first step."""

    holders: tuple[str, ...]  # the variables holding it
    cells: tuple[str, ...]  # where each was last assigned ("In [12]"), "" when not known
    pending: PendingWork

    def names(self) -> str:
        """ "`w` (In [12])", "`w` (In [12]) and `m` (In [3])"."""
        parts = [
            f"`{name}`" + (f" ({cell})" if cell else "")
            for name, cell in zip(self.holders, self.cells, strict=True)
        ] or ["tensors tpu_nb could not name"]
        return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


_NOT_VARIABLES = frozenset(("In", "Out", "exit", "quit", "get_ipython"))
_PER_NAME = 500  # objects looked at from one notebook variable, at most


def _walk_order(value) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return 0
    if isinstance(value, torch.nn.Module | torch.optim.Optimizer):
        return 1
    return 2


def find_earlier(namespace: dict, assigned_in=None, keep: list | None = None) -> EarlierWork | None:
    """The pending work held by `namespace`'s variables as a block starts (None: none).
    `assigned_in(name)` names where a variable was last assigned (a notebook's cell); `keep`
    gets a weak reference to each pending tensor (a block that rebinds every one of them
    before its first sync drops that work: it never runs)."""
    names = tuple(n for n in list(namespace) if not n.startswith("_") and n not in _NOT_VARIABLES)
    # Tensors, modules and optimizers first, each name with a share of the walk: a dataset
    # of a million examples costs its share, and hides nothing behind it.
    names = tuple(sorted(names, key=lambda n: _walk_order(namespace[n])))
    found = find_pending([namespace], names, per_name=_PER_NAME, keep=keep)
    if found is None:
        return None
    cells = []
    for name in found.holders:
        try:
            cells.append((assigned_in(name) if assigned_in is not None else None) or "")
        except Exception:
            cells.append("")
    return EarlierWork(found.holders, tuple(cells), found)


VALUE = "the cell's value"  # the holder name of a block's value no variable holds


def find_pending(
    namespaces: list[dict],
    names: tuple[str, ...],
    per_name: int = _WALK_BUDGET,
    keep: list | None = None,
) -> PendingWork | None:
    """The pending work reachable from `names` in `namespaces` (first match per name wins);
    None when none of them holds any. `per_name`: objects looked at, at most, from one name
    (a big dataset list must not use up what the other names need); `keep` gets a weak
    reference to each pending tensor. Never runs anything; never raises."""
    start = time.perf_counter()
    try:
        import torch

        holders: list[str] = []
        found: dict[int, Any] = {}
        budget = _WALK_BUDGET
        for name in names:
            space = next((s for s in namespaces if name in s), None)
            if space is None or name.startswith("__"):
                continue
            held = False
            mine = [min(per_name, budget)]  # walk_limited counts it down
            for t in walk_limited(space[name], torch, depth=4, seen=set(), budget=mine):
                if is_pending(t):
                    held = True
                    found.setdefault(id(t), t)
            budget -= min(per_name, budget) - max(mine[0], 0)
            if held and len(holders) < _MAX_HOLDERS:
                holders.append(name)
        if not found:
            return None
        if keep is not None:
            keep.extend(weakref.ref(t) for t in found.values())
        return _described(tuple(holders), list(found.values()), start)
    except Exception:
        log.debug("tpu_nb: describing the work left pending", exc_info=True)
        return None


def _described(holders: tuple[str, ...], tensors: list, start: float) -> PendingWork:
    nodes = 0
    ops: tuple[tuple[str, int], ...] = ()
    lines: tuple[tuple[str, int], ...] = ()
    try:
        g = graph(*tensors, hlo=False)  # frames when IR locations were recorded
        counted = Counter(n.op for n in g.nodes if n.kind not in ("data", "constant"))
        nodes, ops = len(g.nodes), tuple(counted.most_common())
        frames = [n.user_frame for n in g.nodes]
        lines = tuple(dict.fromkeys((f.file, f.line) for f in frames if f is not None and f.file))
    except Exception:
        log.debug("tpu_nb: reading the pending graph", exc_info=True)
    return PendingWork(
        holders, len(tensors), nodes, ops, lines, seconds=time.perf_counter() - start
    )


def assigned_lines(source: str, name: str) -> list[int]:
    """The 1-based lines of `source` that bind `name` (assignments, for targets, with, ...);
    [] when the source does not parse or never binds it."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    names = (node for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id == name)
    return sorted({node.lineno for node in names if isinstance(node.ctx, ast.Store)})
