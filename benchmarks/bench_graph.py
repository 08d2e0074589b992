"""Graph viewer layout + SVG time and edge crossings, side by side with Graphviz dot.

On the same graphs, in one run:
  - a 2-layer MLP training step and a transformer-block training step (real IR graphs traced
    on XLA:CPU, source locations on), and a synthetic 20,000-node training-step graph
    (`graph_fixtures.synthetic_ir`); `--deep` adds real 2- and 40-block transformer
    steps (about 1,000 and 21,000 nodes);
  - first, the parse and summary of a synthetic 100,000-node graph, against its target of
    5 CPU seconds (the notebook's page: `Graph.from_ir_text` then `render_html`);
  - ours, every node drawn (`render_svg` with no grouping): what dot does;
  - ours, the summary a notebook shows (`render_html`: groups above 500 nodes, panels);
  - `dot -Tsvg` on the DOT text of the same graph: torch_xla's `_get_xla_tensors_dot` for the
    real graphs, `Graph.to_dot()` (the same form) for the synthetic one; with a timeout.
Times are CPU seconds (ours: this process; dot: its child process), so other load on the
machine does not skew the ratio; dot's timeout is wall time, and its memory is capped.
Crossings of both drawings are counted by one function (graph_fixtures.count_crossings): each
edge is cut at every rank; two edges cross where their left-to-right order flips between
adjacent ranks. dot's edges are its SVG splines, sampled; both sides' edges start and end at
node centres.

    PYTHONPATH=. PJRT_DEVICE=CPU python benchmarks/bench_graph.py [--dot-timeout 300] [--deep]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"


# -- the graphs ----------------------------------------------------------------------------


def _capture(tensors_fn):
    """Trace a step with locations on; return (Graph, torch_xla's DOT of the same tensors)."""
    import torch_xla

    from tpu_nb.runtime.graph import graph, record_locations
    from tpu_nb.runtime.graph._capture import xla_tensors

    with record_locations():
        parts = tensors_fn()
    tensors = xla_tensors(parts)
    return graph(*tensors, hlo=False), torch_xla._XLAC._get_xla_tensors_dot(tensors)


def mlp_step():
    import torch
    import torch_xla

    import tpu_nb

    dev = tpu_nb.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256).to(dev), torch.randint(0, 10, (64,)).to(dev)
    torch_xla.sync()

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return [loss, model]

    return _capture(step)


def transformer_step(blocks: int = 1):
    import torch
    import torch_xla

    import tpu_nb

    dev = tpu_nb.device()
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        d_model=128, nhead=4, dim_feedforward=256, batch_first=True
    )
    model = (layer if blocks == 1 else torch.nn.TransformerEncoder(layer, blocks)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 32, 128).to(dev)
    torch_xla.sync()

    def step():
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return [loss, model, opt]

    return _capture(step)


def synthetic(nodes: int = 20_000):
    from graph_fixtures import synthetic_ir

    from tpu_nb.runtime.graph import Graph

    g = Graph.from_ir_text(synthetic_ir(nodes))
    return g, g.to_dot()


# -- ours ----------------------------------------------------------------------------------


def ours_full(graph):
    """Layout + SVG of every node (no grouping), and the crossings of that drawing."""
    from graph_fixtures import count_crossings

    from tpu_nb.display.graph_view import layout, render_svg

    budget = len(graph.nodes) + 1
    start = time.process_time()
    svg = render_svg(graph, budget=budget)
    seconds = time.process_time() - start
    grouped, lay = layout(graph, budget=budget)
    routes = [
        [(lay.x[e.src], lay.y[e.src])] + r[1:-1] + [(lay.x[e.dst], lay.y[e.dst])]
        for e, r in zip(grouped.edges, lay.routes, strict=True)
        if r
    ]
    return seconds, count_crossings(routes, lay.y), len(svg), lay


def ours_summary(graph):
    from tpu_nb.display.graph_view import render_html

    start = time.process_time()
    page = render_html(graph)
    return time.process_time() - start, len(page)


# -- dot -----------------------------------------------------------------------------------


def _memory_cap() -> int:
    """Bytes of address space dot may use: half the machine's memory, at most 8 GB. Without
    a cap dot grew past 20 GB on the 20,000-node graph and the kernel's OOM killer ended it
    (and could have ended anything else running)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 16 << 30
    return min(8 << 30, total // 2)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_dot(dot_text: str, timeout: float):
    """(seconds, svg text) or (None, what happened instead)."""
    cap = _memory_cap()

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    before = _children_cpu()
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            ["dot", "-Tsvg"],
            input=dot_text,
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=limit,
        )
    except subprocess.TimeoutExpired:
        return None, f"did not finish in {timeout:.0f} s (wall time)"
    seconds = _children_cpu() - before
    if seconds <= 0:  # no rusage (unusual platforms): fall back to wall
        seconds = time.perf_counter() - start
    if proc.returncode != 0:
        why = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        return None, (
            f"failed after {seconds:.0f} s (memory capped at {cap >> 30} GB): {why[0][:160]}"
        )
    return seconds, proc.stdout


_NUM = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?")


def _bezier(points, steps: int = 8):
    """Sample dot's path: a start point, then cubic segments of three points each."""
    out = [points[0]]
    for k in range(1, len(points) - 2, 3):
        p0, p1, p2, p3 = points[k - 1], points[k], points[k + 1], points[k + 2]
        for s in range(1, steps + 1):
            t = s / steps
            a, b, c, d = (1 - t) ** 3, 3 * t * (1 - t) ** 2, 3 * t * t * (1 - t), t**3
            out.append(
                (
                    a * p0[0] + b * p1[0] + c * p2[0] + d * p3[0],
                    a * p0[1] + b * p1[1] + c * p2[1] + d * p3[1],
                )
            )
    return out


def dot_crossings(svg_text: str) -> int:
    """Crossings of dot's drawing: node centres from its SVG, edges from its splines."""
    from graph_fixtures import count_crossings

    root = ET.fromstring(svg_text)
    centres, routes, seen = {}, [], set()
    for g in root.iter(f"{SVG}g"):
        kind, title = g.get("class"), g.find(f"{SVG}title")
        if kind == "node":
            shape = g.find(f"{SVG}ellipse")
            if shape is not None:
                centres[title.text] = (float(shape.get("cx")), float(shape.get("cy")))
            else:
                xy = [float(v) for v in _NUM.findall(g.find(f"{SVG}polygon").get("points"))]
                centres[title.text] = (sum(xy[0::2]) / len(xy[0::2]), sum(xy[1::2]) / len(xy[1::2]))
    for g in root.iter(f"{SVG}g"):
        if g.get("class") != "edge":
            continue
        src, dst = g.find(f"{SVG}title").text.split("->")
        if (src, dst) in seen or src == dst:
            continue
        seen.add((src, dst))
        nums = [float(v) for v in _NUM.findall(g.find(f"{SVG}path").get("d"))]
        route = _bezier(list(zip(nums[0::2], nums[1::2], strict=False)))
        routes.append([centres[src]] + route[1:-1] + [centres[dst]])
    return count_crossings(routes, [y for _, y in centres.values()])


# -- report --------------------------------------------------------------------------------


def measure(name: str, graph, dot_text: str, dot_timeout: float, have_dot: bool) -> None:
    full_s, full_x, full_bytes, lay = ours_full(graph)
    summary_s, summary_bytes = ours_summary(graph)
    print(f"\n{name}: {len(graph.nodes):,} nodes, {len(graph.edges):,} edges")
    extra = f", {lay.direct_edges:,} very long edges drawn straight" if lay.direct_edges else ""
    print(
        f"  ours, every node     {full_s:8.2f} s   {full_x:>9,} crossings   "
        f"SVG {full_bytes / 1e6:6.2f} MB   ({lay.virtual_nodes:,} virtual nodes{extra})"
    )
    print(
        f"  ours, notebook view  {summary_s:8.2f} s   HTML {summary_bytes / 1e6:.2f} MB "
        f"(groups above 500 nodes, IR text panel)"
    )
    if not have_dot:
        print(
            "  dot                  skipped: Graphviz `dot` is not installed "
            "(apt-get install graphviz)"
        )
        return
    dot_s, out = run_dot(dot_text, dot_timeout)
    if dot_s is None:
        print(f"  dot -Tsvg            {out}")
        print("  ours / dot           faster (dot gave no drawing); crossings not comparable")
        return
    dot_x = dot_crossings(out)
    ratio = f"{full_x / dot_x:.2f}x" if dot_x else ("1.00x" if full_x == 0 else "inf")
    print(
        f"  dot -Tsvg            {dot_s:8.2f} s   {dot_x:>9,} crossings   "
        f"SVG {len(out) / 1e6:6.2f} MB"
    )
    print(f"  ours / dot           CPU time {full_s / dot_s:.3f}x, crossings {ratio}")


def big_parse_and_summary(nodes: int = 100_000, target_s: float = 5.0) -> None:
    from graph_fixtures import synthetic_ir

    from tpu_nb.display.graph_view import render_html
    from tpu_nb.runtime.graph import Graph

    text = synthetic_ir(nodes)
    start = time.process_time()
    g = Graph.from_ir_text(text)
    page = render_html(g)
    took = time.process_time() - start
    print(
        f"\nsynthetic {len(g.nodes):,}-node graph, parse + summary: {took:.2f} s CPU "
        f"(target {target_s:.0f} s: {took / target_s:.2f} of it), page {len(page.encode()):,} bytes"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dot-timeout", type=float, default=300.0)
    parser.add_argument(
        "--deep",
        action="store_true",
        help="also a real 40-block transformer training step (~21,000 nodes)",
    )
    args = parser.parse_args()

    import tpu_nb

    tpu_nb.setup("cpu")
    have_dot = shutil.which("dot") is not None
    version = (
        subprocess.run(["dot", "-V"], capture_output=True, text=True).stderr.strip()
        if have_dot
        else "not installed"
    )
    print(
        f"graph viewer vs Graphviz ({version}); dot timeout {args.dot_timeout:.0f} s; "
        "times are CPU seconds"
    )
    big_parse_and_summary()
    cases = [
        ("2-layer MLP training step (SGD)", mlp_step),
        ("transformer-block training step (AdamW)", transformer_step),
        ("synthetic 20,000-node training step", synthetic),
    ]
    if args.deep:
        cases.insert(2, ("2-block transformer training step (AdamW)", lambda: transformer_step(2)))
        cases.append(("40-block transformer training step (AdamW)", lambda: transformer_step(40)))
    for name, make in cases:
        graph, dot_text = make()
        measure(name, graph, dot_text, args.dot_timeout, have_dot)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
