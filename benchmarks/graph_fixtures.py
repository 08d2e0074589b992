"""For benchmarks and tests of big graphs, not shipped: synthetic IR shaped like a training step
(without tracing a big model), and a crossing count that treats every layered drawing alike."""

from __future__ import annotations

import random
from collections.abc import Sequence
from itertools import pairwise

Point = tuple[float, float]


def synthetic_ir(nodes: int = 20_000, *, seed: int = 0) -> str:
    """IR text shaped like an N-layer training step (forward blocks, a backward pass that
    reads the forward activations, per-parameter optimizer updates), about `nodes` long.
    For benchmarks and tests of big graphs without tracing a big model."""
    rng = random.Random(seed)
    out: list[str] = []

    def add(
        shape: str, op: str, operands: Sequence[int] = (), loc: str = "", root: int | None = None
    ) -> int:
        nid = len(out)
        args = ", ".join(f"%{o}" for o in operands)
        tags = f", location={loc}" if loc else ""
        tags += f", xla_shape={shape}" + (f", ROOT={root}" if root is not None else "")
        out.append(f"  %{nid} = {shape} {op}({args}){tags}")
        return nid

    act, per_layer = "f32[32,256]{1,0}", 21
    layers = max(1, nodes // per_layer)
    x = add(act, "xla::device_data", loc="<module>@train.py:10")
    saved, params = [], []
    for layer in range(layers):
        line = 20 + (layer % 4)
        w = add("f32[256,256]{1,0}", "xla::device_data", loc=f"forward@model.py:{line}")
        b = add("f32[256]{0}", "xla::device_data", loc=f"forward@model.py:{line}")
        params.append((w, b))
        wt = add("f32[256,256]{0,1}", "aten::permute", [w], f"forward@model.py:{line}")
        h = add(act, "aten::addmm", [x, wt, b], f"forward@model.py:{line}")
        c = add("f32[]", "prim::Constant", loc=f"forward@model.py:{line + 1}")
        h2 = add(
            act,
            rng.choice(["aten::gelu", "aten::relu", "aten::silu"]),
            [h],
            f"forward@model.py:{line + 1}",
        )
        x = add(act, "aten::add", [h2, x, c], f"forward@model.py:{line + 2}")
        saved.append((h, h2, x))
    add("f32[]", "aten::mean", [x], "<module>@train.py:12", root=0)  # the loss
    grad = add("f32[]", "prim::Constant")
    g = add(act, "aten::expand", [grad])
    root = 1
    for layer in reversed(range(layers)):
        h, h2, _ = saved[layer]
        w, b = params[layer]
        d = add(act, "aten::gelu_backward", [g, h])
        d = add(act, "aten::mul", [d, h2])
        gw = add(
            "f32[256,256]{1,0}", "aten::mm", [add("f32[256,32]{0,1}", "aten::permute", [d]), h]
        )
        gb = add("f32[1,256]{1,0}", "aten::sum", [d])
        gb = add("f32[256]{0}", "aten::view", [gb])
        g = add(act, "aten::mm", [d, add("f32[256,256]{1,0}", "aten::permute", [w])])
        for p, gp, shape in ((w, gw, "f32[256,256]{1,0}"), (b, gb, "f32[256]{0}")):
            lr = add("f32[]", "xla::device_data", loc="_single_tensor_sgd@sgd.py:375")
            step = add(shape, "aten::mul", [gp, lr], "_single_tensor_sgd@sgd.py:375")
            add(shape, "aten::sub", [p, step], "_single_tensor_sgd@sgd.py:375", root=root)
            root += 1
    return "IR {\n" + "\n".join(out) + "\n}\n"


def count_crossings(routes: Sequence[Sequence[Point]], levels: Sequence[float]) -> int:
    """Edge crossings of any top-to-bottom drawing, counted the same way for every layout.

    `routes` are polylines from the centre of an edge's source node to the centre of its
    target (splines: sampled points); `levels` are the y of the node ranks. Between two
    adjacent levels, two routes cross when their left-to-right order at the upper level is the
    reverse of their order at the lower one. Routes that meet at a point there (the edges of
    one node) do not count. Uses numpy: a 20,000-node drawing has millions of route pieces.
    """
    import numpy as np

    lv = np.unique(np.asarray(levels, dtype=float))
    segments = [seg for route in routes for seg in _level_segments(route, lv)]
    if not segments:
        return 0
    seg = np.asarray(segments, dtype=float)
    x0, y0, x1, y1 = seg.T
    first = np.searchsorted(lv, y0 - 1e-6)  # first level at or below the top
    last = np.searchsorted(lv, y1 + 1e-6, side="right") - 1
    total = 0
    for i in range(len(lv) - 1):
        active = np.flatnonzero((first <= i) & (last >= i + 1))
        if len(active) < 2:
            continue
        slope = (x1[active] - x0[active]) / (y1[active] - y0[active])
        top = np.round(x0[active] + slope * (lv[i] - y0[active]), 3)
        bottom = np.round(x0[active] + slope * (lv[i + 1] - y0[active]), 3)
        order = np.lexsort((bottom, top))
        total += _strict_inversions(np.unique(bottom, return_inverse=True)[1][order])
    return int(total)


def _level_segments(route: Sequence[Point], lv) -> list[tuple[float, float, float, float]]:
    """The route as (x0, y0, x1, y1) pieces, top to bottom, whose ends lie on levels: as is
    when its points do (a layout's virtual nodes); else x at every level it spans (a spline
    sampled between levels), since only the order at the levels counts."""
    import numpy as np

    pts = sorted(route, key=lambda p: p[1]) if route[0][1] > route[-1][1] else list(route)
    ys = np.array([p[1] for p in pts])
    on_level = np.abs(lv[np.clip(np.searchsorted(lv, ys), 0, len(lv) - 1)] - ys) < 1e-6
    if on_level.all():
        return [(x0, y0, x1, y1) for (x0, y0), (x1, y1) in pairwise(pts) if y1 > y0]
    inside = lv[(lv >= ys[0] - 1e-6) & (lv <= ys[-1] + 1e-6)]
    xs = np.interp(inside, ys, [p[0] for p in pts])
    return [(xs[i], inside[i], xs[i + 1], inside[i + 1]) for i in range(len(inside) - 1)]


def _strict_inversions(values) -> int:
    """Pairs i < j with values[i] > values[j] (integers), by bottom-up merge counting."""
    import numpy as np

    a = np.asarray(values, dtype=np.int64).ravel()
    n, span, total = len(a), 1, 0
    scale = int(a.max()) + 1 if n else 1
    while span < n:
        block = np.arange(n) // (2 * span)
        right = (np.arange(n) // span) % 2 == 1
        keys = block * scale + a  # each block pair sorted in isolation
        left_keys = np.where(right, -1, keys)
        left_sorted = np.sort(left_keys[left_keys >= 0])
        r_keys = keys[right]
        # left elements in the same block pair that are greater than each right element
        greater = np.searchsorted(
            left_sorted, block[right] * scale + scale - 1, side="right"
        ) - np.searchsorted(left_sorted, r_keys, side="right")
        total += int(greater.sum())
        order = np.argsort(keys, kind="stable")
        a = a[order]
        span *= 2
    return total


# -- 5. x positions ------------------------------------------------------------------------
