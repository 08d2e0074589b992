"""Big graphs as at most ~500 boxes: nodes grouped by where they came from, then merged.

A training step is tens of thousands of IR nodes; nobody reads that as a picture. Grouping:
  1. every node gets a key: its source line (or function, file, scope); nodes without a
     location (autograd's backward pass) inherit "backward of <line>" from an operand; device
     data and constants join the group of their first consumer;
  2. nodes with the same key that are connected form one piece ("relu@functional.py:1697 #3"
     is the third separate place that line ran), so the summary keeps the graph's shape;
  3. while there are more pieces than the budget, each piece merges with its neighbour that
     shares its function (else the heaviest edge), a round at a time so pieces grow evenly.
Without locations or scopes, pieces are runs of consecutive node ids (post-order: operands
first, so a run is a connected stretch of the computation).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable

from tpu_nb.runtime.compile_log import Frame
from tpu_nb.runtime.errors import TpuNbError
from tpu_nb.runtime.graph import NODE_BUDGET, Graph, Node, gc_paused

GROUP_BY = ("auto", "line", "function", "file", "scope", "range")


@dataclass(frozen=True)
class Group:
    """Nodes shown as one box. A single node is a group of one, keyed "%<id>"."""

    key: str                     # unique in its GroupedGraph, e.g. "relu@functional.py:1697 #2"
    label: str                   # what the box says
    members: tuple[int, ...]     # node ids
    kind: str                    # the kind most members have (data/constants aside)
    ops: tuple[tuple[str, int], ...]      # op -> count, most frequent first
    sources: tuple[tuple[str, int], ...]  # source key -> count, most frequent first
    location: Frame | None = None

    @property
    def size(self) -> int:
        return len(self.members)


@dataclass(frozen=True)
class GroupEdge:
    """The node edges between two boxes."""

    src: int                     # index into GroupedGraph.groups
    dst: int
    count: int                   # how many node edges it stands for
    shapes: tuple[str, ...]      # distinct value shapes, at most 3 (then "…")


@dataclass(frozen=True)
class GroupedGraph:
    """A graph as a view shows it: about `budget` boxes at most (groups or single nodes)."""

    graph: Graph = field(repr=False)
    groups: tuple[Group, ...]
    edges: tuple[GroupEdge, ...]
    by: str                      # "node" (nothing collapsed), "line", "scope", "range", ...
    expanded: tuple[str, ...] = ()
    budget: int = NODE_BUDGET

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
            raise TpuNbError(f"no group named {key!r}. Fix: use a key from "
                             f"[g.key for g in grouped.groups], e.g. {self.groups[0].key!r}.")
        return self.groups[self._by_key[key]]

    def group_of(self, node_id: int) -> Group:
        return self.groups[self._of_node[node_id]]

    def expand(self, *keys: str) -> "GroupedGraph":
        """The same grouping with the named groups shown node by node."""
        return group_graph(self.graph, by=self.by if self.by in GROUP_BY else "auto",
                           budget=self.budget, expand=self.expanded + keys)

    def __repr__(self) -> str:
        return (f"GroupedGraph({len(self.groups)} boxes for {len(self.graph.nodes)} nodes, "
                f"by {self.by})")


def group_graph(graph: Graph, by: str = "auto", *, budget: int = NODE_BUDGET,
                expand: Iterable[str] = ()) -> GroupedGraph:
    """Collapse `graph` into at most `budget` boxes; `expand` names groups (keys, or a source
    key such as "forward@linear.py:134" for all its pieces) to show node by node."""
    with gc_paused():
        return _group_graph(graph, by, budget, tuple(expand))


def _group_graph(graph: Graph, by: str, budget: int, expand: tuple[str, ...]) -> GroupedGraph:
    level = _level(graph, by)
    if len(graph.nodes) <= budget:
        keys = [f"%{n.id}" for n in graph.nodes]
        piece, level = list(range(len(graph.nodes))), "node"
    elif level == "range":
        keys, piece = _range_pieces(graph, budget)
    else:
        keys = _base_keys(graph, level)
        piece = _components(graph, keys)
        piece = _coarsen(graph, piece, keys, budget)
    grouped = _build(graph, piece, keys, level, budget)
    return _expanded(grouped, expand, keys, piece) if expand else grouped


def _level(graph: Graph, by: str) -> str:
    if by not in GROUP_BY:
        raise TpuNbError(f"unknown grouping {by!r}. Fix: use one of "
                         f"{', '.join(map(repr, GROUP_BY))}.")
    if by != "auto":
        return by
    if any(_user_scope(n) for n in graph.nodes):
        return "scope"
    return "line" if any(n.location for n in graph.nodes) else "range"


def _user_scope(n: Node) -> str:
    """The outermost scope a user opened (torch_xla.debug.profiler.Trace), minus torch_xla's
    own per-op scopes such as "aten::add.1"."""
    top = n.scope.split("/", 1)[0] if n.scope else ""
    return "" if not top or top.startswith(("aten::", "xla::", "prim::")) else top


def _leaf(n: Node) -> bool:
    return not n.inputs and n.kind in ("data", "constant")


def _location_key(n: Node, level: str) -> str:
    if level == "scope" and _user_scope(n):
        return "scope " + _user_scope(n)
    loc = n.location
    if loc is None:
        return ""
    if level in ("line", "scope"):
        return f"{loc.function}@{loc.file}:{loc.line}"
    if level == "function":
        return f"{loc.function}@{loc.file}"
    return loc.file


def _base_keys(graph: Graph, level: str) -> list[str]:
    """A source key per node (graph.nodes order); see the module docstring."""
    own = [_location_key(n, level) for n in graph.nodes]
    pos = graph._position
    keys = list(own)
    for i, n in enumerate(graph.nodes):
        if not keys[i] and not _leaf(n):
            keys[i] = _inherited_key(graph, n, own, keys, pos)
    consumers = graph.consumers
    for i, n in enumerate(graph.nodes):
        if _leaf(n) and n.id in consumers:
            keys[i] = keys[pos[consumers[n.id][0]]] or keys[i]
        if not keys[i]:
            keys[i] = "(no source)"
    return keys


def _inherited_key(graph: Graph, n: Node, own: list[str], keys: list[str], pos) -> str:
    """Prefer an operand with a location of its own (a forward value the backward op reads)."""
    fallback = ""
    for src in n.inputs:
        k = pos.get(src)
        if k is None or _leaf(graph.nodes[k]):
            continue
        if own[k]:
            return "backward of " + own[k]
        fallback = fallback or keys[k]
    return fallback


def _range_pieces(graph: Graph, budget: int) -> tuple[list[str], list[int]]:
    size = -(-len(graph.nodes) // budget)
    piece = [i // size for i in range(len(graph.nodes))]
    keys = []
    for i in range(len(graph.nodes)):
        first = graph.nodes[piece[i] * size].id
        last = graph.nodes[min(len(graph.nodes), (piece[i] + 1) * size) - 1].id
        keys.append(f"%{first}-%{last}")
    return keys, piece


class _UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        parent = self.parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, a: int, b: int) -> int:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)
        return min(ra, rb)


def _node_pairs(graph: Graph) -> list[tuple[int, int]]:
    """Edges as (position of src, position of dst)."""
    pos = graph._position
    return [(pos[e.src], pos[e.dst]) for e in graph.edges if e.src in pos and e.dst in pos]


def _components(graph: Graph, keys: list[str]) -> list[int]:
    """Pieces: connected nodes with the same key. A piece id per node position."""
    uf = _UnionFind(len(graph.nodes))
    for a, b in _node_pairs(graph):
        if keys[a] == keys[b]:
            uf.union(a, b)
    return [uf.find(i) for i in range(len(graph.nodes))]


def _family(key: str) -> str:
    """"forward@linear.py:134" -> "forward@linear.py": pieces of one function merge first."""
    head, _, line = key.rpartition(":")
    return head if line.isdigit() else key


def _coarsen(graph: Graph, piece: list[int], keys: list[str], budget: int) -> list[int]:
    """Merge neighbouring pieces, a round at a time, until at most `budget` remain."""
    uf = _UnionFind(len(piece))
    size: dict[int, int] = Counter(piece)
    top: dict[int, tuple[int, str]] = {}          # piece -> (count, its most common key)
    counts = Counter(zip(piece, keys))
    for (p, key), c in counts.items():
        if c > top.get(p, (0, ""))[0]:
            top[p] = (c, key)
    state = _Pieces(uf, set(size), size, top)
    weights = Counter((piece[a], piece[b]) for a, b in _node_pairs(graph)
                      if piece[a] != piece[b])
    while len(state.alive) > budget:
        weights = _shrink(uf, weights)
        if not _merge_round(state, weights, budget):
            _merge_unconnected(state, budget)
    return [uf.find(p) for p in piece]


@dataclass
class _Pieces:
    """Pieces while they merge. `top` approximates each piece's most common source key (the
    larger of the two merged tops), which is all a merge decision needs."""

    uf: _UnionFind
    alive: set[int]
    size: dict[int, int]
    top: dict[int, tuple[int, str]]

    def family(self, p: int) -> str:
        return _family(self.top[p][1])

    def merge(self, p: int, q: int) -> None:
        root = self.uf.union(p, q)
        other = q if root == p else p
        self.size[root] = self.size[p] + self.size[q]
        self.top[root] = max(self.top[p], self.top[q])
        self.alive.discard(other)


def _shrink(uf: _UnionFind, weights: Counter) -> Counter:
    """Edge weights between current pieces (merged pieces' edges added up)."""
    out: Counter = Counter()
    find = uf.find
    for (a, b), w in weights.items():
        ra, rb = find(a), find(b)
        if ra != rb:
            out[(ra, rb) if ra < rb else (rb, ra)] += w
    return out


def _merge_round(state: _Pieces, weights: Counter, budget: int) -> int:
    """Each piece merges at most once per round: with an unmatched neighbour of the same
    function if it has one, else along its heaviest edge; smaller neighbours first."""
    adj: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for (a, b), w in weights.items():
        adj[a].append((b, w))
        adj[b].append((a, w))
    family = {p: state.family(p) for p in state.alive}
    size, matched, merged = state.size, set(), 0
    for p in sorted(state.alive, key=lambda p: (size[p], p)):
        if p in matched:
            continue
        best, best_score = None, None
        for q, w in adj.get(p, ()):
            if q not in matched:
                score = (family[p] == family[q], w, -size[q], -q)
                if best_score is None or score > best_score:
                    best, best_score = q, score
        if best is not None:
            matched.update((p, best))
            state.merge(p, best)
            merged += 1
            if len(state.alive) <= budget:
                break
    return merged


def _merge_unconnected(state: _Pieces, budget: int) -> None:
    """Pieces with no edges left between them: pair them up, same function first."""
    order = sorted(state.alive, key=lambda p: (state.family(p), p))
    for p, q in zip(order[::2], order[1::2]):
        state.merge(p, q)
        if len(state.alive) <= budget:
            return


def _build(graph: Graph, piece: list[int], keys: list[str], by: str,
           budget: int, expanded: tuple[str, ...] = ()) -> GroupedGraph:
    members: dict[int, list[int]] = {}
    for i, p in enumerate(piece):
        members.setdefault(p, []).append(i)
    order = list(members)                    # by first member: post-order of the graph
    index = {p: k for k, p in enumerate(order)}
    labels = [_label(graph, members[p], keys) for p in order]
    names = _unique_names(labels, [members[p] for p in order], graph)
    groups = tuple(_make_group(graph, names[k], labels[k], members[p], keys)
                   for k, p in enumerate(order))
    node_group = [index[p] for p in piece]
    return GroupedGraph(graph=graph, groups=groups, edges=_group_edges(graph, node_group),
                        by=by, expanded=expanded, budget=budget)


def _label(graph: Graph, positions: list[int], keys: list[str]) -> str:
    if len(positions) == 1:
        return graph.nodes[positions[0]].name
    counts = Counter(keys[i] for i in positions)
    top = counts.most_common(1)[0][0]
    return top if len(counts) == 1 else f"{top} (+{len(counts) - 1} more)"


def _unique_names(labels: list[str], members: list[list[int]], graph: Graph) -> list[str]:
    seen = Counter(label for label, m in zip(labels, members) if len(m) > 1)
    number: Counter = Counter()
    names = []
    for label, m in zip(labels, members):
        if len(m) == 1:
            names.append(f"%{graph.nodes[m[0]].id}")
        elif seen[label] == 1:
            names.append(label)
        else:
            number[label] += 1
            names.append(f"{label} #{number[label]}")
    return names


def _make_group(graph: Graph, name: str, label: str, positions: list[int],
                keys: list[str]) -> Group:
    nodes = [graph.nodes[i] for i in positions]
    if len(nodes) == 1:
        n = nodes[0]
        return Group(key=name, label=label, members=(n.id,), kind=n.kind, ops=((n.op, 1),),
                     sources=((keys[positions[0]], 1),), location=n.location)
    kinds = Counter(n.kind for n in nodes if n.kind not in ("data", "constant")) \
        or Counter(n.kind for n in nodes)
    kind = "fallback" if "fallback" in kinds else kinds.most_common(1)[0][0]
    return Group(key=name, label=label, members=tuple(n.id for n in nodes), kind=kind,
                 ops=tuple(Counter(n.op for n in nodes).most_common()),
                 sources=tuple(Counter(keys[i] for i in positions).most_common()),
                 location=next((n.location for n in nodes if n.location), None))


def _group_edges(graph: Graph, node_group: list[int]) -> tuple[GroupEdge, ...]:
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
    return tuple(GroupEdge(a, b, c, tuple(s[:3]) + (("…",) if len(s) > 3 else ()))
                 for (a, b), (c, s) in agg.items())


def _expanded(grouped: GroupedGraph, expand: tuple[str, ...], keys: list[str],
              piece: list[int]) -> GroupedGraph:
    """Split the named groups into single nodes; every other group stays as it was."""
    targets = set()
    for name in expand:
        hits = [g for g in grouped.groups
                if name in (g.key, g.label) or (g.sources and g.sources[0][0] == name)]
        if not hits:
            sample = next((g.key for g in grouped.groups if g.size > 1), grouped.groups[0].key)
            raise TpuNbError(f"no group named {name!r} to expand. Fix: use a key from "
                             f"[g.key for g in grouped.groups], e.g. {sample!r}.")
        targets.update(m for g in hits for m in g.members)
    graph = grouped.graph
    fresh = len(piece)
    split = [fresh + i if n.id in targets else piece[i] for i, n in enumerate(graph.nodes)]
    return _build(graph, split, keys, grouped.by, grouped.budget, expand)
