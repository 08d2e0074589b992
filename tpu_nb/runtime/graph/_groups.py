"""Big graphs as about 160 boxes: runs of nodes grouped by where they came from.

A training step is tens of thousands of IR nodes; nobody reads that as a picture. Node ids are
a post-order (every operand comes before its users; the forward pass, then the backward pass,
then the optimizer's updates), so a stretch of consecutive ids is a connected piece of the
computation, and boxes made of such stretches only have edges pointing forward: the summary
keeps the graph's depth and never has cycles. Grouping:
  1. every node gets a key: its source line (or function, file, scope); nodes without a
     location (autograd's backward pass) inherit "backward of <line>" from an operand, else
     take their first consumer's key, as device data and constants do;
  2. consecutive nodes with the same key form a run ("relu@functional.py:1697 #3" is the
     third separate place that line ran);
  3. while there are more runs than the target, the cheapest neighbouring pair merges: the
     smallest combined size, much cheaper when both come from the same function.
Without locations or scopes, groups are even stretches of ids.
Expanding a group shows its nodes, or, when it is itself too big, its own sub-groups.
"""

from __future__ import annotations

import heapq
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from itertools import pairwise
from typing import Any, Generic

from tpu_nb.runtime.errors import TpuNbUsageError
from tpu_nb.runtime.graph._export import node_costs
from tpu_nb.runtime.graph._modules import ModuleBoxes, has_modules
from tpu_nb.runtime.graph._modules import label as module_label
from tpu_nb.runtime.graph._nodes import (
    NODE_BUDGET,
    Frame,
    G,
    Node,
    NodeGraph,
    gc_paused,
    is_leaf,
)

GROUP_BY = ("auto", "module", "line", "function", "file", "scope", "range")
# Boxes in a big graph's overview: about what a reader takes in at once, at readable size.
OVERVIEW_GROUPS = 40


@dataclass(frozen=True)
class Group:
    """Nodes shown as one box. A single node is a group of one, keyed "%<id>"."""

    key: str  # unique in its GroupedGraph, e.g. "relu@functional.py:1697 #2"
    label: str  # what the box says
    members: tuple[int, ...]  # node ids
    kind: str  # the kind most members have (data/constants aside)
    ops: tuple[tuple[str, int], ...]  # op -> count, most frequent first
    sources: tuple[tuple[str, int], ...]  # source key -> count, most frequent first
    phase: str = ""  # by module: "forward", "backward", "optimizer"
    flops: int = 0  # matmul and convolution FLOPs of its nodes (see _cost.node_flops)
    bytes: int = 0  # bytes its nodes output

    @property
    def size(self) -> int:
        return len(self.members)


@dataclass(frozen=True)
class GroupEdge:
    """The node edges between two boxes."""

    src: int  # index into GroupedGraph.groups
    dst: int
    count: int  # how many node edges it stands for
    shapes: tuple[str, ...]  # distinct value shapes, at most 3 (then "…")


@dataclass(frozen=True)
class GroupedGraph(Generic[G]):
    """A graph as a view shows it: every node when there are at most `budget`, else about
    `target` groups (plus whatever was expanded)."""

    graph: G = field(repr=False)
    groups: tuple[Group, ...]
    edges: tuple[GroupEdge, ...]
    by: str  # "node" (nothing collapsed), "line", "scope", "range", ...
    expanded: tuple[str, ...] = ()
    budget: int = NODE_BUDGET
    target: int = OVERVIEW_GROUPS

    @property
    def collapsed(self) -> bool:
        return any(g.size > 1 for g in self.groups)

    @cached_property
    def _by_key(self) -> dict[str, int]:
        return {g.key: i for i, g in enumerate(self.groups)}

    @cached_property
    def _of_node(self) -> dict[int, int]:
        return {m: i for i, g in enumerate(self.groups) for m in g.members}

    def group(self, key: str) -> Group:
        """The group with this key (see `[g.key for g in grouped.groups]`)."""
        if key not in self._by_key:
            raise _no_group(key, self.groups[0].key)
        return self.groups[self._by_key[key]]

    def group_of(self, node_id: int) -> Group:
        return self.groups[self._of_node[node_id]]

    def expand(self, *keys: str) -> GroupedGraph[G]:
        """The same grouping with the named groups shown node by node."""
        return group_graph(
            self.graph,
            by=self.by if self.by in GROUP_BY else "auto",
            budget=self.budget,
            target=self.target,
            expand=self.expanded + keys,
        )

    def __repr__(self) -> str:
        return (
            f"GroupedGraph({len(self.groups)} boxes for {len(self.graph.nodes)} nodes, "
            f"by {self.by})"
        )


@gc_paused()
def group_graph(
    graph: G,
    by: str = "auto",
    *,
    budget: int = NODE_BUDGET,
    target: int | None = None,
    expand: Iterable[str] = (),
) -> GroupedGraph[G]:
    """Collapse a graph of more than `budget` nodes into about `target` boxes (default
    OVERVIEW_GROUPS, fewer for a smaller budget); `expand` names groups (keys, or a source
    key such as "forward@linear.py:134" for all its runs) to show node by node."""
    target = target or max(2, min(OVERVIEW_GROUPS, budget // 3))
    opened = tuple(expand)
    level = _level(graph, by)
    if level == "module" and len(graph.nodes) > budget:
        return _group_modules(graph, budget, target, opened)
    if len(graph.nodes) <= budget:
        keys = [f"%{n.id}" for n in graph.nodes]
        piece, level = list(range(len(graph.nodes))), "node"
    elif level == "range":
        keys = [""] * len(graph.nodes)
        piece = _even_runs(0, len(keys), target)
    else:
        keys = _base_keys(graph, level)
        piece = _merge_runs(keys, 0, len(keys), target)
    grouped = _build(graph, piece, keys, level, budget, target)
    for step, name in enumerate(opened):
        piece = _expand_one(grouped, name, keys, piece, step)
        grouped = _build(graph, piece, keys, level, budget, target, opened[: step + 1])
    return grouped


def _level(graph: NodeGraph, by: str) -> str:
    if by not in GROUP_BY:
        raise TpuNbUsageError(
            f"unknown grouping {by!r}. Fix: use one of {', '.join(map(repr, GROUP_BY))}."
        )
    if by != "auto":
        return by
    if has_modules(graph):
        return "module"
    if any(_user_scope(n) for n in graph.nodes):
        return "scope"
    return "line" if any(n.location for n in graph.nodes) else "range"


def _user_scope(n: Node) -> str:
    """The outermost scope a user opened (torch_xla.debug.profiler.Trace), minus torch_xla's
    own per-op scopes such as "aten::add.1"."""
    top = n.scope.split("/", 1)[0] if n.scope else ""
    return "" if not top or top.startswith(("aten::", "xla::", "prim::")) else top


def _location_key(n: Node, level: str) -> str:
    """ "fn@file:line", prefixed with the user's line when the node came from inside a
    library call made there: "train.py:12 › forward@linear.py:134"."""
    if level == "scope" and _user_scope(n):
        return "scope " + _user_scope(n)
    loc = shown_location(n)
    if loc is None:
        return ""
    if level == "function":
        return f"{loc.function}@{loc.file}"
    if level == "file":
        return loc.file
    key = f"{loc.function}@{loc.file}:{loc.line}"
    user = n.user_frame
    if user is None or (user.line == loc.line and user.function == loc.function):
        return key
    return f"{os.path.basename(user.file)}:{user.line} › {key}"


_TPU_NB_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), ""
)


def shown_location(n: Node) -> Frame | None:
    """The node's location as a reader wants it: when tpu_nb's own code made the node (a
    tensor factory that %%on_tpu puts on the device), the user's line that called it."""
    if n.location and n.frames and os.path.abspath(n.frames[0].file).startswith(_TPU_NB_DIR):
        user = n.user_frame
        if user is not None:
            return Frame(os.path.basename(user.file), user.line, user.function)
    return n.location


def _base_keys(graph: NodeGraph, level: str) -> list[str]:
    """A source key per node (graph.nodes order); see the module docstring."""
    own = [_location_key(n, level) for n in graph.nodes]
    pos = graph._position
    keys = list(own)
    for i, n in enumerate(graph.nodes):
        if not keys[i] and not is_leaf(n):
            keys[i] = _inherited_key(graph, n, own, keys, pos)
    consumers = graph.consumers
    for i in range(len(graph.nodes) - 1, -1, -1):  # consumers come later: walk backward
        n = graph.nodes[i]
        if (is_leaf(n) or not keys[i]) and n.id in consumers:
            keys[i] = keys[pos[consumers[n.id][0]]] or keys[i]
    return [k or "(no source)" for k in keys]


def _inherited_key(graph: NodeGraph, n: Node, own: list[str], keys: list[str], pos) -> str:
    """Prefer an operand with a location of its own (a forward value the backward op reads)."""
    fallback = ""
    for src in n.inputs:
        k = pos.get(src)
        if k is None or is_leaf(graph.nodes[k]):
            continue
        if own[k]:
            return "backward of " + own[k]
        fallback = fallback or keys[k]
    return fallback


def _family(key: str) -> str:
    """ "forward@linear.py:134" -> "forward@linear.py": runs of one function merge first
    (and "train.py:12 › forward@linear.py:134" -> "train.py:12": of one user line)."""
    if " › " in key:
        return key.split(" › ", 1)[0]
    head, _, line = key.rpartition(":")
    return head if line.isdigit() else key


def _merge_runs(keys: list[str], lo: int, hi: int, target: int) -> list[int]:
    """A run id (its start position) for each position in [lo, hi), at most `target` runs:
    the runs of equal keys, the cheapest neighbours merged (see the module docstring)."""
    starts = [i for i in range(lo, hi) if i == lo or keys[i] != keys[i - 1]]
    ends = starts[1:] + [hi]
    run_of = {s: s for s in starts}
    nxt = dict(pairwise(starts))
    prv = {b: a for a, b in nxt.items()}
    end = dict(zip(starts, ends, strict=True))
    top = {s: (e - s, keys[s]) for s, e in zip(starts, ends, strict=True)}  # (count, key)

    def cost(a: int, b: int) -> tuple[float, int, int]:
        same = _family(top[a][1]) == _family(top[b][1])
        return ((end[a] - a) + (end[b] - b)) * (0.35 if same else 1.0), a, b

    heap = [cost(a, b) for a, b in nxt.items()]
    heapq.heapify(heap)
    alive = len(starts)
    while alive > target and heap:
        _, a, b = heapq.heappop(heap)
        if nxt.get(a) != b or run_of[a] != a or run_of[b] != b:
            continue  # stale: one of them merged meanwhile
        run_of[b] = a
        end[a] = end[b]
        top[a] = max(top[a], top[b])
        alive -= 1
        nxt.pop(a)
        if b in nxt:
            c = nxt.pop(b)
            nxt[a], prv[c] = c, a
            heapq.heappush(heap, cost(a, c))
        if a in prv:
            heapq.heappush(heap, cost(prv[a], a))
    out: list[int] = []
    for s, e in zip(starts, ends, strict=True):  # starts ascend: a run's root is resolved first
        run_of[s] = run_of[run_of[s]]
        out += [run_of[s]] * (e - s)
    return out


def _even_runs(lo: int, hi: int, target: int) -> list[int]:
    """[lo, hi) cut into about `target` runs of equal length (a run id: its start)."""
    size = max(1, -(-(hi - lo) // target))
    return [lo + (p - lo) // size * size for p in range(lo, hi)]


def _members(piece: list[int]) -> dict[int, list[int]]:
    """Each piece id's positions, pieces in order of their first member (the graph's)."""
    members: dict[int, list[int]] = {}
    for i, p in enumerate(piece):
        members.setdefault(p, []).append(i)
    return members


def _build(
    graph: G,
    piece: list[int],
    keys: list[str],
    by: str,
    budget: int,
    target: int,
    expanded: tuple[str, ...] = (),
) -> GroupedGraph[G]:
    members = list(_members(piece).values())
    labels = [_label(graph, m, keys) for m in members]
    # A label several groups share is numbered: "relu@functional.py:1697 #2".
    shared = Counter(label for label, m in zip(labels, members, strict=True) if len(m) > 1)
    number: Counter = Counter()
    groups = []
    for label, m in zip(labels, members, strict=True):
        if len(m) == 1:
            name = f"%{graph.nodes[m[0]].id}"
        elif shared[label] == 1:
            name = label
        else:
            number[label] += 1
            name = f"{label} #{number[label]}"
        groups.append(_make_group(graph, name, label, m, keys))
    return _grouped(graph, piece, groups, by, budget, target, expanded)


def _grouped(
    graph: G,
    piece: list[int],
    groups: list[Group],
    by: str,
    budget: int,
    target: int,
    expanded: tuple[str, ...],
) -> GroupedGraph[G]:
    """The GroupedGraph of these groups (one per piece id, in `_members` order), with the
    node edges between two groups aggregated."""
    index = {p: k for k, p in enumerate(dict.fromkeys(piece))}
    node_group = [index[p] for p in piece]
    pos = graph._position
    agg: dict[tuple[int, int], list] = {}
    for e in graph.edges:
        a, b = pos.get(e.src), pos.get(e.dst)
        if a is None or b is None or node_group[a] == node_group[b]:
            continue
        entry = agg.setdefault((node_group[a], node_group[b]), [0, []])
        entry[0] += 1
        if e.shape not in entry[1] and len(entry[1]) < 4:
            entry[1].append(e.shape)
    edges = tuple(
        GroupEdge(a, b, c, tuple(s[:3]) + (("…",) if len(s) > 3 else ()))
        for (a, b), (c, s) in agg.items()
    )
    return GroupedGraph(graph, tuple(groups), edges, by, expanded, budget, target)


def _label(graph: NodeGraph, positions: list[int], keys: list[str]) -> str:
    if len(positions) == 1:
        return graph.nodes[positions[0]].name
    counts = Counter(keys[i] for i in positions)
    top = counts.most_common(1)[0][0]
    if not top:  # no sources: name the id range
        return f"%{graph.nodes[positions[0]].id}-%{graph.nodes[positions[-1]].id}"
    return top if len(counts) == 1 else f"{top} (+{len(counts) - 1} more)"


def _make_group(
    graph: NodeGraph, name: str, label: str, positions: list[int], keys: list[str], **costs: Any
) -> Group:
    nodes = [graph.nodes[i] for i in positions]
    kinds = Counter(n.kind for n in nodes if n.kind not in ("data", "constant")) or Counter(
        n.kind for n in nodes
    )
    # A single node keeps its key even when empty (a node of a range).
    sources = Counter(keys[i] for i in positions if keys[i] or len(nodes) == 1)
    return Group(
        key=name,
        label=label,
        members=tuple(n.id for n in nodes),
        kind="fallback" if "fallback" in kinds else kinds.most_common(1)[0][0],
        ops=tuple(Counter(n.op for n in nodes).most_common()),
        sources=tuple(sources.most_common()),
        **costs,
    )


def _expand_one(
    grouped: GroupedGraph, name: str, keys: list[str], piece: list[int], step: int
) -> list[int]:
    """New run ids: the named group(s) split into single nodes, or into sub-groups when a
    group is bigger than the budget. Every other group stays as it was."""
    hits = [
        g
        for g in grouped.groups
        if g.size > 1 and (name in (g.key, g.label) or (g.sources and g.sources[0][0] == name))
    ]
    if not hits:
        sample = next((g.key for g in grouped.groups if g.size > 1), grouped.groups[0].key)
        raise _no_group(name, sample, " to expand")
    n, pos = len(piece), grouped.graph._position
    fresh = (step + 1) * 2 * n  # ids no earlier step has used
    piece = list(piece)
    for g in hits:
        positions = sorted(pos[m] for m in g.members)  # a run: consecutive positions
        lo, hi = positions[0], positions[-1] + 1
        if g.size <= grouped.budget:
            sub = list(range(lo, hi))
        else:
            sub = _merge_runs(keys, lo, hi, grouped.target)
            if len(set(sub)) == 1:  # one key throughout: cut it evenly
                sub = _even_runs(lo, hi, grouped.target)
        for p, r in zip(range(lo, hi), sub, strict=True):
            piece[p] = fresh + r
    return piece


def _group_modules(graph: G, budget: int, target: int, expand: tuple[str, ...]) -> GroupedGraph[G]:
    """Boxes by phase and module (see _modules)."""
    boxes = ModuleBoxes(graph, target)
    for name in expand:
        if not boxes.expand(name, budget):
            sample = next(iter(boxes.boxes), "forward:Model.layer1")
            raise _no_group(name, sample, " to expand", ", or a module path")
    piece, names = boxes.pieces()
    flops, sizes = node_costs(graph)
    keys = [f"{phase}:{'.'.join(path)}" for phase, path in boxes.keys]
    groups = []
    for p, positions in _members(piece).items():
        if p in names:
            name, label = names[p], module_label(names[p])
        else:
            name, label = f"%{graph.nodes[p].id}", graph.nodes[p].name
        costs = {
            "phase": boxes.keys[p][0],
            "flops": sum(flops[i] for i in positions),
            "bytes": sum(sizes[i] for i in positions),
        }
        groups.append(_make_group(graph, name, label, positions, keys, **costs))
    return _grouped(graph, piece, groups, "module", budget, target, expand)


def _no_group(name: str, sample: str, to: str = "", more: str = "") -> TpuNbUsageError:
    return TpuNbUsageError(
        f"no group named {name!r}{to}. Fix: use a key from "
        f"[g.key for g in grouped.groups], e.g. {sample!r}{more}."
    )
