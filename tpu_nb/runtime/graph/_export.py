"""A graph in Model Explorer's JSON graph format (google-ai-edge/model-explorer), so that a
big step can be browsed there: nested layers from each node's namespace, expanded on click,
and a node-data overlay that colours nodes by a number.

The graph file is one graph collection, `{"label", "graphs": [{"id", "nodes": [...]}]}`; each
node has `id`, `label` (the op), `namespace` (phase, then the module path, "/"-separated, the
node's own label not included), `attrs` as key/value strings, `incomingEdges` (source node,
its output, this node's input) and `outputsMetadata` (each output's shape). A node-data file
is `{graph id: {"name", "results": {node id: {"value": n}}}}`, one number per node: its
FLOPs or its output bytes.

    model-explorer step.json --node_data_paths=step.flops.json,step.bytes.json
"""

from __future__ import annotations

from typing import Any

from tpu_nb.runtime.graph._cost import node_flops, shape_bytes
from tpu_nb.runtime.graph._modules import module_keys
from tpu_nb.runtime.graph._nodes import NodeGraph, split_tuple

GRAPH_ID = "xla_step"


def model_explorer_graph(graph: NodeGraph, label: str = "XLA graph") -> dict[str, Any]:
    """The graph collection Model Explorer opens (see the module docstring)."""
    keys = module_keys(graph)
    incoming: dict[int, list[dict[str, str]]] = {}
    for e in graph.edges:
        incoming.setdefault(e.dst, []).append(
            {
                "sourceNodeId": str(e.src),
                "sourceNodeOutputId": str(e.output),
                "targetNodeInputId": str(e.operand),
            }
        )
    flops, sizes = node_costs(graph)
    nodes = []
    for i, n in enumerate(graph.nodes):
        phase, path = keys[i]
        attrs = {"op": n.op, "shape": n.shape, "kind": n.kind, "phase": phase}
        attrs["module"] = ".".join(path)
        if n.location is not None:
            attrs["line"] = n.where
        attrs["flops"], attrs["bytes"] = str(flops[i]), str(sizes[i])
        nodes.append(
            {
                "id": str(n.id),
                "label": n.name,
                "namespace": "/".join((phase, *path)),
                "attrs": [{"key": k, "value": v} for k, v in attrs.items()],
                "incomingEdges": incoming.get(n.id, []),
                "outputsMetadata": [
                    {"id": str(k), "attrs": [{"key": "shape", "value": s}]}
                    for k, s in enumerate(split_tuple(n.shape) or [n.shape])
                ],
            }
        )
    return {"label": label, "graphs": [{"id": GRAPH_ID, "nodes": nodes}]}


def model_explorer_node_data(graph: NodeGraph, what: str = "flops") -> dict[str, Any]:
    """A node-data file for the graph: each node's "flops" or output "bytes"."""
    flops, sizes = node_costs(graph)
    values = {"flops": flops, "bytes": sizes}[what]
    results = {str(n.id): {"value": v} for n, v in zip(graph.nodes, values, strict=True)}
    name = {"flops": "FLOPs (matmuls, convolutions)", "bytes": "output bytes"}[what]
    return {GRAPH_ID: {"name": name, "results": results}}


def node_costs(graph: NodeGraph) -> tuple[list[int], list[int]]:
    """FLOPs and output bytes of each node (graph.nodes order), from the IR's shapes."""
    operands: dict[int, list[str]] = {}
    for e in graph.edges:
        operands.setdefault(e.dst, []).append(e.shape)
    flops = [node_flops(n.op, n.shape, operands.get(n.id, [])) for n in graph.nodes]
    sizes = [0 if n.kind in ("data", "constant") else shape_bytes(n.shape) for n in graph.nodes]
    return flops, sizes
