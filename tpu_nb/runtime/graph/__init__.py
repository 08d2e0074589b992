"""The pending lazy graph of XLA tensors as plain data: nodes, edges, source lines, diffs, groups.

XLA tensors record operations into an IR graph until something needs their values. `graph()`
reads that graph from torch_xla and parses it into frozen dataclasses; the display layer
(tpu_nb.display.graph_view) draws them, and this module never imports it.

torch_xla 2.9 prints one node per line (`_get_xla_tensors_text`, checked on XLA:CPU):

    %12 = f32[] aten::nll_loss(%11, %0), location=cross_entropy@functional.py:3458, \
          xla_shape=f32[], ROOT=0                             (one line in the dump)
    %17 = (f32[6]{0}, s64[6]{0}) aten::max(%16), num_outputs=2, xla_shape=(f32[6]{0}, s64[6]{0})
    %18 = f32[6]{0} xla::cast(%17.1), xla_shape=f32[6]{0}

Ids are a post-order (operands first). `%17.1` is output 1 of a multi-output node. `location=`
is present only while IR debug is on (XLA_IR_DEBUG=1 at import, or `record_locations()`): it is
the innermost Python frame, file basename only (torch's EmitShortFrameInfo), so a module call
points into torch (`forward@linear.py:134`) and a notebook cell into ipykernel's per-cell file.
`graph()` recovers each located node's whole stack from the HLO (_frames), so
`Node.user_frame` names the user's line even then. Nodes made by autograd's backward pass have
no location: that thread runs no Python frames.
CPU fallbacks run eagerly when traced, so they are not IR nodes: their results enter the graph
as `xla::device_data`. A Graph records which fallback ops the process had run when captured.
"""

from tpu_nb.runtime.graph._capture import (
    graph,
    is_pending,
    pending_graph,
    record_locations,
    walk_limited,
)
from tpu_nb.runtime.graph._cost import HloFlops, hlo_flops
from tpu_nb.runtime.graph._diff import GraphDiff, NodeChange
from tpu_nb.runtime.graph._graph import Graph
from tpu_nb.runtime.graph._groups import Group, GroupEdge, GroupedGraph, group_graph, shown_location
from tpu_nb.runtime.graph._nodes import KINDS, NODE_BUDGET, Edge, Node, gc_paused
from tpu_nb.runtime.graph._scopes import PHASES, module_of, module_scopes

__all__ = [
    "KINDS",
    "NODE_BUDGET",
    "PHASES",
    "Edge",
    "Graph",
    "GraphDiff",
    "Group",
    "GroupEdge",
    "GroupedGraph",
    "HloFlops",
    "Node",
    "NodeChange",
    "gc_paused",
    "graph",
    "group_graph",
    "hlo_flops",
    "is_pending",
    "module_of",
    "module_scopes",
    "pending_graph",
    "record_locations",
    "shown_location",
    "walk_limited",
]
