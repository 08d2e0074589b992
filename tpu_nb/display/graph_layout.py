"""Layered top-to-bottom layout of a directed graph, in pure Python (no Graphviz binary).

The classic Sugiyama steps, as Graphviz dot does them, each kept simple enough to run on tens
of thousands of nodes in seconds:
  1. cycles: edges that close a cycle (back edges of a depth-first search) are drawn reversed;
  2. layers: longest path from the sources, then nodes with more outputs than inputs (device
     data, constants, weights) slide down next to their first consumer, so edges stay short;
  3. an edge that spans k layers becomes a chain of k-1 virtual nodes;
  4. order within layers: depth-first initial order, then weighted-median sweeps down and up,
     with adjacent swaps on small graphs, keeping the order with the fewest crossings
     (counted exactly with a Fenwick tree: Barth, Juenger and Mutzel);
  5. x: in each layer, the order-preserving positions closest to the mean of the neighbours'
     (isotonic regression with minimum gaps, pool-adjacent-violators), sweeping down and up;
     virtual nodes weigh more, which keeps long edges straight;
  6. y: layer by layer, tall enough for the tallest box.
(benchmarks/graph_fixtures.py counts crossings of any layered drawing the same way, so a
benchmark can compare this layout with dot's output on equal terms.)
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

Point = tuple[float, float]
_MARGIN = 12.0  # around the drawing


@dataclass
class Layout:
    """Node centres, edge routes and the drawing's size, in pixels (y grows downward)."""

    x: list[float]
    y: list[float]
    width: float
    height: float
    layer: list[int]
    routes: list[list[Point]]  # per input edge: from the source's bottom to the target's top
    crossings: int  # crossings between adjacent layers (edges with virtual nodes)
    virtual_nodes: int
    direct_edges: int  # edges too long for virtual nodes: drawn straight


def layered_layout(
    sizes: Sequence[tuple[float, float]],
    edges: Sequence[tuple[int, int]],
    *,
    node_gap: float = 18.0,
    layer_gap: float = 40.0,
) -> Layout:
    """Lay out nodes 0..len(sizes)-1 (width, height each) joined by directed `edges`.

    Long edges get at most 50,000 virtual nodes, or 4 per node; longer edges are drawn
    straight to their target (see _Layered).
    """
    n = len(sizes)
    dag, flipped = _acyclic(n, edges)
    layer = _layers(n, dag)
    net = _Layered(n, layer, dag, max(50_000, 4 * n))
    crossings = _order(net, 8 if net.size < 60_000 else 4)
    widths = [sizes[v][0] for v in range(n)] + [0.0] * (net.size - n)
    x = _x_positions(net, widths, node_gap)
    y, height = _y_positions(net, sizes, layer_gap)
    shift = _MARGIN - min((x[v] - widths[v] / 2 for v in range(net.size)), default=0.0)
    x = [xv + shift for xv in x]
    width = max((x[v] + widths[v] / 2 for v in range(net.size)), default=0.0) + _MARGIN
    routes = _routes(edges, flipped, net, x, y, sizes)
    return Layout(
        x=x[:n],
        y=y[:n],
        width=width,
        height=height,
        layer=layer,
        routes=routes,
        crossings=crossings,
        virtual_nodes=net.size - n,
        direct_edges=len(net.long),
    )


# -- 1. cycles -----------------------------------------------------------------------------


def _acyclic(n: int, edges: Sequence[tuple[int, int]]) -> tuple[list[tuple[int, int]], set]:
    """Distinct edges with back edges reversed, and the set of reversed (u, v) pairs."""
    succ: list[list[int]] = [[] for _ in range(n)]
    seen_pairs = set()
    for u, v in edges:
        if u != v and (u, v) not in seen_pairs:
            seen_pairs.add((u, v))
            succ[u].append(v)
    state = [0] * n  # 0 new, 1 on the DFS stack, 2 done
    flipped = set()
    for start in range(n):
        if state[start]:
            continue
        state[start] = 1
        stack = [(start, 0)]
        while stack:
            u, i = stack[-1]
            if i < len(succ[u]):
                stack[-1] = (u, i + 1)
                v = succ[u][i]
                if state[v] == 1:
                    flipped.add((u, v))
                elif state[v] == 0:
                    state[v] = 1
                    stack.append((v, 0))
            else:
                state[u] = 2
                stack.pop()
    dag = {(v, u) if (u, v) in flipped else (u, v) for u, v in seen_pairs}
    return sorted(dag), flipped


# -- 2. layers -----------------------------------------------------------------------------


def _topological(n: int, succ: list[list[int]], indeg: list[int]) -> list[int]:
    remaining = list(indeg)
    order = [v for v in range(n) if remaining[v] == 0]
    for u in order:  # the list grows while we walk it
        for v in succ[u]:
            remaining[v] -= 1
            if remaining[v] == 0:
                order.append(v)
    return order


def _layers(n: int, dag: list[tuple[int, int]]) -> list[int]:
    """Two cheap layerings, keeping the one with shorter edges in total (fewer virtual nodes).

    As early as possible, then nodes with more out-edges than in-edges (device data,
    constants, weights) slide down next to their first consumer; or as late as possible, which
    also brings down chains that only feed a late consumer (an optimizer's bias correction),
    then nodes with more in-edges than out-edges (results, updated weights) rise to their
    last input instead of all sinking to the bottom layer.
    """
    succ: list[list[int]] = [[] for _ in range(n)]
    pred: list[list[int]] = [[] for _ in range(n)]
    for u, v in dag:
        succ[u].append(v)
        pred[v].append(u)
    order = _topological(n, succ, [len(p) for p in pred])
    early = [0] * n
    for v in order:
        if pred[v]:
            early[v] = max(early[u] for u in pred[v]) + 1
    for v in reversed(order):
        if succ[v] and len(succ[v]) > len(pred[v]):
            early[v] = min(early[w] for w in succ[v]) - 1
    late = [0] * n
    for v in reversed(order):
        if succ[v]:
            late[v] = min(late[w] for w in succ[v]) - 1
    for v in order:  # and the mirror image: results rise to their inputs
        if pred[v] and len(pred[v]) > len(succ[v]):
            late[v] = max(late[u] for u in pred[v]) + 1
    lowest = min(late, default=0)
    late = [v - lowest for v in late]
    length = lambda layer: sum(layer[v] - layer[u] for u, v in dag)  # noqa: E731
    return late if length(late) < length(early) else early


# -- 3. virtual nodes ----------------------------------------------------------------------


class _Layered:
    """Nodes (real, then virtual) on layers, with every edge between adjacent layers, except
    edges longer than `span_limit` layers: those are drawn directly and left out of ordering.

    In a training step, activations saved in the forward pass are read in the backward pass
    thousands of layers later: virtual nodes for every such edge grow with the square of the
    depth (8.9 million for a 21,000-node, 40-layer transformer step). Up to `max_virtual`
    virtual nodes are spent on the shortest edges; the rest go straight to their target.
    """

    def __init__(
        self, n: int, layer: list[int], dag: list[tuple[int, int]], max_virtual: int
    ) -> None:
        self.n = n
        self.layer = list(layer)
        self.up: list[list[int]] = [[] for _ in range(n)]
        self.down: list[list[int]] = [[] for _ in range(n)]
        self.chains: dict[tuple[int, int], list[int]] = {}
        self.span_limit = _span_limit([layer[v] - layer[u] for u, v in dag], max_virtual)
        self.long: set[tuple[int, int]] = set()
        for u, v in dag:
            if layer[v] - layer[u] > self.span_limit:
                self.long.add((u, v))
            else:
                self._connect(u, v)
        depth = max(self.layer, default=-1) + 1
        self.layers: list[list[int]] = [[] for _ in range(depth)]
        self.pos = [0] * len(self.layer)

    @property
    def size(self) -> int:
        return len(self.layer)

    def _connect(self, u: int, v: int) -> None:
        """Join u to v through one virtual node per layer in between."""
        prev, chain = u, []
        for level in range(self.layer[u] + 1, self.layer[v]):
            d = len(self.layer)
            self.layer.append(level)
            self.up.append([prev])
            self.down.append([])
            self.down[prev].append(d)
            chain.append(d)
            prev = d
        self.down[prev].append(v)
        self.up[v].append(prev)
        self.chains[(u, v)] = chain

    def place(self, layers: list[list[int]]) -> None:
        self.layers = layers
        pos = self.pos
        for row in layers:
            for i, v in enumerate(row):
                pos[v] = i


def _span_limit(spans: list[int], max_virtual: int) -> int:
    """The longest span whose edges (with all shorter ones) fit in `max_virtual` nodes."""
    used, limit = 0, 1
    for span, count in sorted(Counter(spans).items()):
        used += (span - 1) * count
        if used > max_virtual:
            return limit
        limit = span
    return limit


# -- 4. order within layers ----------------------------------------------------------------

_SMALL = 4000  # layered nodes (real + virtual) up to which ordering tries harder
_SIFT = 1500  # ... and up to which it also sifts


def _depth_first(net: _Layered, follow: list[list[int]], back: list[list[int]]) -> list[list[int]]:
    """Layers filled in depth-first order along `follow`, from the nodes with no `back`."""
    layers: list[list[int]] = [[] for _ in net.layers]
    seen = [False] * net.size
    for start in range(net.size):
        if seen[start] or back[start]:
            continue
        stack = [start]
        while stack:
            v = stack.pop()
            if seen[v]:
                continue
            seen[v] = True
            layers[net.layer[v]].append(v)
            stack.extend(reversed(follow[v]))
    return layers


def _median(values: list[int]) -> float:
    """Graphviz's weighted median of neighbour positions."""
    k = len(values)
    m = k // 2
    if k % 2:
        return values[m]
    if k == 2:
        return (values[0] + values[1]) / 2
    left, right = values[m - 1] - values[0], values[-1] - values[m]
    if left + right == 0:
        return (values[m - 1] + values[m]) / 2
    return (values[m - 1] * right + values[m] * left) / (left + right)


def _sweep(net: _Layered, downward: bool) -> None:
    pos = net.pos
    rows = range(1, len(net.layers)) if downward else range(len(net.layers) - 2, -1, -1)
    neighbours = net.up if downward else net.down
    for r in rows:
        row = net.layers[r]
        keys = {  # a node nothing pulls keeps its place
            v: _median(sorted(pos[u] for u in neighbours[v])) if neighbours[v] else pos[v]
            for v in row
        }
        row.sort(key=keys.__getitem__)
        for i, v in enumerate(row):
            pos[v] = i


def _order(net: _Layered, sweeps: int) -> int:
    """Order every layer to reduce crossings; the best order found is left in `net`."""
    # Depth-first orders, so chains and subtrees start out side by side: from the sources,
    # and on small graphs also from the sinks.
    net.place(_depth_first(net, net.down, net.up))
    others = [_depth_first(net, net.up, net.down)] if net.size <= _SIFT else []
    best, best_rows = _improve(net, sweeps)
    for start in others:
        if best == 0:
            break
        net.place(start)
        crossings, rows = _improve(net, sweeps)
        if crossings < best:
            best, best_rows = crossings, rows
    net.place(best_rows)
    return best


def _improve(net: _Layered, sweeps: int) -> tuple[int, list[list[int]]]:
    """Median sweeps down and up (and adjacent swaps on small graphs) from the current order,
    until three sweeps in a row find nothing better."""
    best = count_layer_crossings(net)
    best_rows = [list(r) for r in net.layers]
    stale = 0
    small = net.size <= _SMALL
    for i in range(sweeps):
        if best == 0:
            break
        _sweep(net, downward=(i % 2 == 0))
        if small:
            _transpose(net)
        crossings = count_layer_crossings(net)
        if crossings < best:
            best, best_rows, stale = crossings, [list(r) for r in net.layers], 0
        else:
            stale += 1
            if stale >= 3:
                break
    if net.size <= _SIFT and best:
        net.place(best_rows)
        for _ in range(4):  # polish: sifting finds moves sweeps cannot
            _sift(net)
            _transpose(net)
            crossings = count_layer_crossings(net)
            if crossings >= best:
                break
            best, best_rows = crossings, [list(r) for r in net.layers]
    return best, best_rows


def _crossing_counter(net: _Layered, row: list[int]):
    """c(a, b): crossings between the edges of a and of b (both in `row`) when a is left of
    b. Valid while the neighbouring layers keep their order."""
    pos = net.pos
    ups = {u: sorted(pos[w] for w in net.up[u]) for u in row}
    downs = {u: sorted(pos[w] for w in net.down[u]) for u in row}

    def crossings(a: int, b: int) -> int:
        up_b, down_b = ups[b], downs[b]
        return (sum(bisect_left(up_b, p) for p in ups[a]) if up_b else 0) + (
            sum(bisect_left(down_b, p) for p in downs[a]) if down_b else 0
        )

    return crossings


def _transpose(net: _Layered) -> None:
    """Swap neighbours in a layer while that removes crossings (small graphs only)."""
    pos = net.pos
    for _ in range(4):
        improved = False
        for row in net.layers:
            if len(row) < 2:
                continue
            crossings = _crossing_counter(net, row)
            for i in range(len(row) - 1):
                u, v = row[i], row[i + 1]
                if crossings(v, u) < crossings(u, v):
                    row[i], row[i + 1] = v, u
                    pos[u], pos[v] = i + 1, i
                    improved = True
        if not improved:
            return


def _sift(net: _Layered) -> None:
    """Move each real node to the place in its layer with the fewest crossings, the busiest
    first (the neighbouring layers stay fixed meanwhile; sweeps place the virtual nodes)."""
    pos = net.pos
    for row in net.layers:
        if len(row) < 3:
            continue
        crossings = _crossing_counter(net, row)
        real = [v for v in row if v < net.n]
        for v in sorted(real, key=lambda v: -(len(net.up[v]) + len(net.down[v]))):
            others = [u for u in row if u != v]
            left = [crossings(v, u) for u in others]
            right = [crossings(u, v) for u in others]
            cost = best_cost = sum(left)  # v placed first, left of everyone
            best_at = 0
            for k in range(len(others)):  # v moves right, past others[k]
                cost += right[k] - left[k]
                if cost < best_cost:
                    best_cost, best_at = cost, k + 1
            now = row.index(v)  # its cost where it is now:
            if best_cost < sum(right[:now]) + sum(left[now:]):
                row[:] = others[:best_at] + [v] + others[best_at:]
                for i, u in enumerate(row):
                    pos[u] = i


def _inversions(sequence: list[int], size: int) -> int:
    """Pairs i < j with sequence[i] > sequence[j] (Fenwick tree over values 0..size-1)."""
    tree = [0] * (size + 1)
    total = 0
    for seen, value in enumerate(sequence):
        i = value + 1
        below = 0
        while i > 0:
            below += tree[i]
            i -= i & -i
        total += seen - below
        i = value + 1
        while i <= size:
            tree[i] += 1
            i += i & -i
    return total


def count_layer_crossings(net: _Layered) -> int:
    pos, total = net.pos, 0
    for r in range(len(net.layers) - 1):
        sequence = []
        for u in net.layers[r]:
            sequence.extend(sorted(pos[v] for v in net.down[u]))
        total += _inversions(sequence, len(net.layers[r + 1]))
    return total


def _x_positions(net: _Layered, widths: list[float], node_gap: float) -> list[float]:
    x = [0.0] * net.size
    for row in net.layers:
        _pack(row, widths, node_gap, x)
    for i in range(6):
        downward = i % 2 == 0
        rows = range(1, len(net.layers)) if downward else range(len(net.layers) - 2, -1, -1)
        for r in rows:
            _place_row(net, net.layers[r], net.up if downward else net.down, widths, node_gap, x)
    for row in net.layers:  # last: balance between both neighbour layers
        _place_row(net, row, None, widths, node_gap, x)
    return x


def _pack(row: list[int], widths: list[float], gap: float, x: list[float]) -> None:
    offset = 0.0
    for i, v in enumerate(row):
        if i:
            offset += _gap(widths, row[i - 1], v, gap)
        x[v] = offset
    shift = offset / 2
    for v in row:
        x[v] -= shift


def _gap(widths: list[float], a: int, b: int, gap: float) -> float:
    space = gap if widths[a] and widths[b] else gap / 3  # virtual nodes pack closer
    return (widths[a] + widths[b]) / 2 + space


def _pull(net: _Layered, v: int, u: int) -> float:
    """How strongly v wants to sit above/below its neighbour u. The inner pieces of a long
    edge stay straight (virtual to virtual); a long edge may bend where it leaves or enters a
    node, rather than push a chain of real nodes sideways into a staircase."""
    v_real, u_real = v < net.n, u < net.n
    if v_real and u_real:
        return 1.0
    if not v_real and not u_real:
        return 8.0
    return 0.3 if v_real else 0.05


def _place_row(net: _Layered, row: list[int], neighbours, widths, gap, x: list[float]) -> None:
    targets, weights = [], []
    for v in row:
        adj = neighbours[v] if neighbours is not None else net.up[v] + net.down[v]
        total = pulled = 0.0
        for u in adj:
            w = _pull(net, v, u)
            total += w
            pulled += w * x[u]
        targets.append(pulled / total if total else x[v])
        weights.append(total or 0.05)
    offsets = [0.0]
    for i in range(1, len(row)):
        offsets.append(offsets[-1] + _gap(widths, row[i - 1], row[i], gap))
    fitted = _isotonic([t - o for t, o in zip(targets, offsets, strict=True)], weights)
    for v, z, o in zip(row, fitted, offsets, strict=True):
        x[v] = z + o


def _isotonic(values: list[float], weights: list[float]) -> list[float]:
    """Weighted least-squares fit of a non-decreasing sequence (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [weighted sum, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v * w, w, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, w2, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += w2
            blocks[-1][2] += c
    out: list[float] = []
    for s, w, c in blocks:
        out.extend([s / w] * int(c))
    return out


# -- 6. y positions and routes -------------------------------------------------------------


def _y_positions(net: _Layered, sizes, layer_gap: float) -> tuple[list[float], float]:
    heights = [0.0] * len(net.layers)
    for v in range(net.n):
        heights[net.layer[v]] = max(heights[net.layer[v]], sizes[v][1])
    centres, top = [], _MARGIN
    for h in heights:
        centres.append(top + h / 2)
        top += h + layer_gap
    y = [centres[net.layer[v]] for v in range(net.size)]
    return y, top - layer_gap + _MARGIN


def _routes(edges, flipped: set, net: _Layered, x, y, sizes) -> list[list[Point]]:
    """Per input edge: source bottom, its virtual nodes, target top (reversed edges too)."""
    routes: list[list[Point]] = []
    for u, v in edges:
        if u == v:
            routes.append([])
            continue
        a, b = (v, u) if (u, v) in flipped else (u, v)
        points = [(x[a], y[a] + sizes[a][1] / 2)]
        points += [(x[d], y[d]) for d in net.chains.get((a, b), [])]
        points.append((x[b], y[b] - sizes[b][1] / 2))
        routes.append(points[::-1] if (a, b) != (u, v) else points)
    return routes
