"""`Graph`: a pending lazy graph as frozen data, parsed from torch_xla's IR text (see _nodes),
with its edges, text/DOT/JSON forms, and what changed from another graph (`diff`) or how it
reads in groups (`groups`)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

from tpu_nb.runtime.errors import TpuNbUsageError
from tpu_nb.runtime.graph._diff import GraphDiff, diff_graphs
from tpu_nb.runtime.graph._export import model_explorer_graph, model_explorer_node_data
from tpu_nb.runtime.graph._groups import GroupedGraph, group_graph
from tpu_nb.runtime.graph._nodes import (
    KINDS,
    NODE_BUDGET,
    Edge,
    Frame,
    Node,
    gc_paused,
    new_frozen,
    parse_line,
    split_tuple,
)

# A node's fields in the order to_dict() writes them.
_NODE_FIELDS = (
    "id",
    "op",
    "kind",
    "shape",
    "dtype",
    "layout",
    "inputs",
    "scope",
    "location",
    "root",
    "num_outputs",
    "attrs",
    "frames",
)


@dataclass(frozen=True)
class Graph:
    """The IR graph that computes some XLA tensors, as torch_xla would compile it."""

    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    roots: tuple[int, ...] = ()  # node id of each output, in output order
    # torch_xla's hash of the graph of these tensors (_get_graph_hash, hex); "" if parsed.
    # Same graph, same hash; not the compile log's "Graph Hash" (a sync hashes differently).
    hash: str = ""
    ir_debug: bool = False  # IR debug was on, or some node has a location
    fallback_ops: tuple[tuple[str, int], ...] = ()  # CPU fallbacks run so far in the process
    text: str = field(default="", repr=False)  # the IR text this was parsed from
    hlo_text: str | None = field(default=None, repr=False)

    # -- construction -----------------------------------------------------------------------

    @classmethod
    @gc_paused()
    def from_ir_text(
        cls,
        text: str,
        *,
        hash: str = "",
        hlo_text: str | None = None,
        ir_debug: bool | None = None,
        fallback_ops: Iterable[tuple[str, int]] = (),
    ) -> Graph:
        """Parse torch_xla's IR text (`_get_xla_tensors_text`) into a Graph."""
        parsed = [p for p in map(parse_line, text.splitlines()) if p]
        if not parsed and "IR {" not in text:
            raise TpuNbUsageError(
                "this text is not torch_xla IR (no `IR {` block). Fix: pass "
                "the output of torch_xla._XLAC._get_xla_tensors_text([...])."
            )
        index = {p["id"]: p for p in parsed}
        nodes, edges = [], []
        for values in parsed:
            inputs = []
            for position, ref in enumerate(values.pop("_operands")):
                src_id, _, out = ref[1:].partition(".")
                src, output = int(src_id), int(out) if out else 0
                inputs.append(src)
                producer = index.get(src)
                shape = _output_shape(producer, output) if producer else ""
                edge = dict(src=src, dst=values["id"], operand=position, output=output, shape=shape)
                edges.append(new_frozen(Edge, edge))
            values["inputs"] = tuple(inputs)
            nodes.append(new_frozen(Node, values))
        roots = tuple(
            n.id for n in sorted((n for n in nodes if n.root is not None), key=lambda n: n.root)
        )
        if ir_debug is None:
            ir_debug = any(n.location for n in nodes)
        return cls(
            nodes=tuple(nodes),
            edges=tuple(edges),
            roots=roots,
            hash=hash,
            ir_debug=ir_debug,
            fallback_ops=tuple(fallback_ops),
            text=text,
            hlo_text=hlo_text,
        )

    @classmethod
    def from_dict(cls, data: dict) -> Graph:
        """The inverse of `to_dict()`."""
        nodes = []
        for raw in data["nodes"]:
            values = {k: v for k, v in raw.items() if k in _NODE_FIELDS}
            loc = raw.get("location")
            values["location"] = Frame(loc["file"], loc["line"], loc["function"]) if loc else None
            values["inputs"] = tuple(raw.get("inputs", ()))
            values["attrs"] = tuple(tuple(a) for a in raw.get("attrs", ()))
            values["frames"] = tuple(Frame(*f) for f in raw.get("frames", ()))
            nodes.append(Node(**values))
        edges = tuple(Edge(*e) for e in data["edges"])
        return cls(
            nodes=tuple(nodes),
            edges=edges,
            roots=tuple(data.get("roots", ())),
            hash=data.get("hash", ""),
            ir_debug=data.get("ir_debug", False),
            fallback_ops=tuple(tuple(f) for f in data.get("fallback_ops", ())),
            text=data.get("ir_text", ""),
            hlo_text=data.get("hlo_text"),
        )

    @classmethod
    def from_json(cls, text: str) -> Graph:
        return cls.from_dict(json.loads(text))

    # -- reading ----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.nodes)

    def __repr__(self) -> str:
        short = f", hash={self.hash[:12]!r}" if self.hash else ""
        return (
            f"Graph({len(self.nodes)} nodes, {len(self.edges)} edges, "
            f"{len(self.roots)} outputs{short})"
        )

    def node(self, node_id: int) -> Node:
        return self.nodes[self._position[node_id]]

    @cached_property
    def _position(self) -> dict[int, int]:
        return {n.id: i for i, n in enumerate(self.nodes)}

    @cached_property
    def consumers(self) -> dict[int, tuple[int, ...]]:
        """node id -> ids of the nodes that use its outputs (each once, in id order)."""
        users: dict[int, list[int]] = defaultdict(list)
        for e in self.edges:  # edges come grouped by dst in id order: no sort needed
            lst = users[e.src]
            if not lst or lst[-1] != e.dst:
                lst.append(e.dst)
        return {k: tuple(v) for k, v in users.items()}

    @property
    def pending(self) -> bool:
        """Whether anything is left to compute (not just device data and constants)."""
        return any(n.kind not in ("data", "constant") for n in self.nodes)

    def kinds(self) -> dict[str, int]:
        """How many nodes of each kind, in KINDS order."""
        counts = Counter(n.kind for n in self.nodes)
        return {k: counts[k] for k in KINDS if counts[k]}

    def ops(self) -> Counter:
        return Counter(n.op for n in self.nodes)

    def ir_text(self) -> str:
        """torch_xla's IR text for this graph (what it was parsed from)."""
        return self.text

    def hlo(self) -> str:
        """The HLO module text torch_xla lowers this graph to."""
        if self.hlo_text is None:
            raise TpuNbUsageError(
                "this Graph has no HLO: it was parsed from IR text or "
                "captured with hlo=False. Fix: capture it with "
                "tpu_nb.graph(*tensors), before the sync that runs it."
            )
        return self.hlo_text

    def summary(self) -> str:
        """One line: size, outputs and what the nodes are."""
        kinds = ", ".join(f"{v} {k}" for k, v in self.kinds().items())
        return (
            f"{len(self.nodes)} nodes ({kinds}), {len(self.edges)} edges, {len(self.roots)} outputs"
        )

    # -- export -----------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """Plain JSON-ready data (lists, dicts, strings, numbers)."""

        def node(n: Node) -> dict:
            values = {k: getattr(n, k) for k in _NODE_FIELDS}
            values["inputs"] = list(n.inputs)
            loc = n.location  # a dict literal: asdict() costs ~7 us a node
            values["location"] = (
                {"file": loc.file, "line": loc.line, "function": loc.function} if loc else None
            )
            values["attrs"] = [list(a) for a in n.attrs]
            values["frames"] = [[f.file, f.line, f.function] for f in n.frames]
            return values

        return {
            "hash": self.hash,
            "ir_debug": self.ir_debug,
            "roots": list(self.roots),
            "fallback_ops": [list(f) for f in self.fallback_ops],
            "nodes": [node(n) for n in self.nodes],
            "edges": [[e.src, e.dst, e.operand, e.output, e.shape] for e in self.edges],
            "ir_text": self.text,
            "hlo_text": self.hlo_text,
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def to_model_explorer(self, label: str = "XLA graph") -> dict:
        """The graph in Model Explorer's JSON graph format: layers by phase and module,
        each node's op, shape, line, FLOPs and bytes (see _export). Save it with
        `json.dump` and open it with `model-explorer FILE`."""
        return model_explorer_graph(self, label)

    def model_explorer_data(self, what: str = "flops") -> dict:
        """A Model Explorer node-data file colouring each node by its "flops" or "bytes"
        (`model-explorer FILE --node_data_paths=DATA`)."""
        if what not in ("flops", "bytes"):
            raise TpuNbUsageError(f"no node data {what!r}. Fix: use 'flops' or 'bytes'.")
        return model_explorer_node_data(self, what)

    def to_dot(self) -> str:
        """Graphviz DOT text in torch_xla's own `_get_xla_tensors_dot` form."""
        lines = ["digraph G {"]
        for n in self.nodes:
            label = [n.op, n.shape + n.layout]
            label += [f"scope={n.scope}"] if n.scope else []
            label += [f"location={n.where}"] if n.location else []
            label += [f"ROOT={n.root}"] if n.root is not None else []
            text = "\\n".join(part.replace("\\", "\\\\").replace('"', '\\"') for part in label)
            lines.append(f'  node{n.id} [label="{text}"]')
        for e in self.edges:
            lines.append(
                f'  node{e.src} -> node{e.dst} [label="i={e.operand}"]'
                if len(self.node(e.dst).inputs) > 1
                else f"  node{e.src} -> node{e.dst}"
            )
        lines.append("}")
        return "\n".join(lines) + "\n"

    # -- comparing and summarizing ---------------------------------------------------------

    def diff(self, other: Graph) -> GraphDiff[Graph]:
        """What changed from `other` (the earlier graph) to this one: nodes whose op, shape or
        dtype differ, and nodes only one of them has. `graph_b.diff(graph_a)`."""
        return diff_graphs(before=other, after=self)

    def groups(
        self,
        by: str = "auto",
        *,
        budget: int = NODE_BUDGET,
        target: int | None = None,
        expand: Iterable[str] = (),
    ) -> GroupedGraph[Graph]:
        """Above `budget` nodes, about `target` groups of consecutive nodes by source line
        (or "function", "file", "scope", "range"); `expand` names groups to open. See
        tpu_nb.runtime.graph._groups."""
        return group_graph(self, by=by, budget=budget, target=target, expand=expand)


def _output_shape(values: dict, output: int) -> str:
    if values["num_outputs"] <= 1:
        return values["shape"]
    parts = split_tuple(values["shape"])
    return parts[output] if output < len(parts) else values["shape"]
