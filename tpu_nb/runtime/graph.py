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
`graph()` recovers each located node's whole stack from the HLO (graph_frames), so
`Node.user_frame` names the user's line even then. Nodes made by autograd's backward pass have
no location: that thread runs no Python frames.
CPU fallbacks run eagerly when traced, so they are not IR nodes: their results enter the graph
as `xla::device_data`. A Graph records which fallback ops the process had run when captured.
"""

from __future__ import annotations

import gc
import json
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from tpu_nb.runtime._xla import xlac
from tpu_nb.runtime.compile_log import Frame, _is_library
from tpu_nb.runtime.errors import TpuNbUsageError

if TYPE_CHECKING:  # both import this module: at run time Graph.diff/groups import them late
    from tpu_nb.runtime.graph_diff import GraphDiff
    from tpu_nb.runtime.graph_groups import GroupedGraph

KINDS = ("data", "constant", "view", "compute", "reduction", "collective", "random", "fallback")
# Above this many nodes a view shows groups (by source line or scope) instead of single nodes.
NODE_BUDGET = 500

_LINE = re.compile(r"\s*%(\d+) = (.*?) ([^\s(]+::[^\s(]*)\(([^)]*)\)(.*)")
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\](\{[^}]*\})?")
_TAG_NAME = re.compile(r"[A-Za-z0-9_]+\Z")
_LAYOUT = re.compile(r"\{[^}]*\}")

# Word lists, split once at import: easier to read and extend than dozens of quoted names.
_VIEW_OPS = frozenset(
    """permute view expand reshape transpose t squeeze unsqueeze select slice
    generic_slice as_strided as_strided_view_update cast clone copy diagonal unfold flip
    alias update_slice unselect unbind split narrow contiguous resize cat stack pad
    expand_copy view_copy permute_copy""".split()  # noqa: SIM905
)
_REDUCTION_OPS = frozenset(
    """sum mean prod max min amax amin argmax argmin all any norm
    logsumexp var std var_mean std_mean count_nonzero nll_loss mse_loss l1_loss
    binary_cross_entropy kl_div cumsum cumprod cummax cummin softmax log_softmax
    native_layer_norm native_batch_norm topk sort median mode""".split()  # noqa: SIM905
)
_COLLECTIVE_WORDS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "collective_permute",
    "cross_replica",
    "send",
    "recv",
    "replica_id",
)
_RANDOM_OPS = frozenset(
    """bernoulli normal uniform random randperm multinomial exponential
    geometric cauchy log_normal rrelu_with_noise native_dropout dropout""".split()  # noqa: SIM905
)


def node_kind(op: str) -> str:
    """What an op is, for colouring: data, constant, view, compute, reduction, collective,
    random (fallback is never inferred from an op name; see the module docstring)."""
    kind = _KIND_CACHE.get(op)
    if kind is None:
        kind = _KIND_CACHE[op] = _classify(op)
    return kind


_KIND_CACHE: dict[str, str] = {}


def _classify(op: str) -> str:
    if op == "xla::device_data":
        return "data"
    if op == "prim::Constant" or op == "xla::scalar":
        return "constant"
    name = op.split("::", 1)[-1]
    base = name.rstrip("_")
    if any(word in base for word in _COLLECTIVE_WORDS):
        return "collective"
    if base in _VIEW_OPS:
        return "view"
    if base in _REDUCTION_OPS:
        return "reduction"
    if base in _RANDOM_OPS:
        return "random"
    return "compute"


@dataclass(frozen=True)
class Node:
    """One IR node: an op, its output shape and where in Python it was recorded."""

    id: int  # torch_xla's %id in this dump (post-order position)
    op: str  # "aten::addmm", "xla::device_data", "prim::Constant"
    shape: str  # "f32[32,16]"; several outputs: "(f32[6], s64[6])"
    dtype: str  # "f32"; several outputs: "f32,s64"
    kind: str  # one of KINDS
    inputs: tuple[int, ...] = ()  # operand node ids, in operand order
    location: Frame | None = None  # innermost Python frame (IR debug only), file basename
    scope: str = ""  # torch_xla scope path, e.g. "block1.6/aten::mul.1"
    root: int | None = None  # index among the graph's outputs, if it is one
    num_outputs: int = 1
    layout: str = ""  # XLA layout(s), e.g. "{1,0}"
    attrs: tuple[tuple[str, str], ...] = ()  # any other `name=value` tags, verbatim
    frames: tuple[Frame, ...] = ()  # the whole Python stack, innermost first, full paths
    # (from the HLO's stack-frame index; see graph())

    @property
    def name(self) -> str:
        """The op without its namespace: "addmm", "device_data"."""
        return self.op.split("::", 1)[-1]

    @property
    def where(self) -> str:
        """ "function@file:line", or "" without a location."""
        loc = self.location
        return f"{loc.function}@{loc.file}:{loc.line}" if loc else ""

    @property
    def user_frame(self) -> Frame | None:
        """The innermost frame in user code (a notebook cell, a script), not in torch,
        torch_xla or tpu_nb: the line that made this node, even inside `model(x)`."""
        for frame in self.frames:
            if not _is_library(frame.file):
                return frame
        return None

    def output_shape(self, index: int = 0) -> str:
        """The shape of one output (the whole shape for single-output nodes)."""
        if self.num_outputs <= 1:
            return self.shape
        parts = _split_tuple(self.shape)
        return parts[index] if index < len(parts) else self.shape

    def describe(self) -> str:
        at = f" at {self.where}" if self.location else ""
        return f"%{self.id} {self.op} {self.shape}{at}"


@dataclass(frozen=True)
class Edge:
    """A value flowing from one node's output into another node's operand."""

    src: int
    dst: int
    operand: int  # position among dst's operands
    output: int = 0  # which output of src (multi-output nodes)
    shape: str = ""  # the shape of that value


def _split_tuple(shape: str) -> list[str]:
    """ "(f32[6], s64[6])" -> ["f32[6]", "s64[6]"]."""
    return [m.group(0) for m in _ARRAY.finditer(shape)]


def _parse_shape(text: str) -> tuple[str, str, str]:
    """XLA shape text -> (shape without layout, dtype(s), layout(s))."""
    if text[0] != "(":  # one array: the common case, no regex
        open_at, close_at = text.find("["), text.find("]")
        if 0 < open_at < close_at:
            return text[: close_at + 1], text[:open_at], text[close_at + 1 :]
    arrays = _ARRAY.findall(text)
    layout = "".join(a[2] for a in arrays)
    shape = _LAYOUT.sub("", text) if layout else text
    dtype = ",".join(a[0] for a in arrays) if arrays else text
    return shape, dtype, layout


def _parse_tags(rest: str) -> list[tuple[str, str]]:
    """ ", a=1, b=(x, y), c=z" -> [(a, 1), (b, (x, y)), (c, z)], splitting at ", " outside
    brackets as torch_xla's own ParseAttrTag does."""
    if not rest.startswith(", "):
        return []
    tags: list[tuple[str, str]] = []
    for part in rest[2:].split(", "):
        name, eq, value = part.partition("=")
        if tags and (not eq or not _TAG_NAME.match(name) or _unbalanced(tags[-1][1])):
            tags[-1] = (tags[-1][0], f"{tags[-1][1]}, {part}")
        else:
            tags.append((name, value))
    return tags


def _unbalanced(value: str) -> bool:
    opened = value.count("(") + value.count("[") + value.count("{")
    return opened > value.count(")") + value.count("]") + value.count("}")


def parse_location(value: str) -> Frame | None:
    """ "fn@file.py:12" -> Frame(file="file.py", line=12, function="fn")."""
    head, _, line = value.rpartition(":")
    function, at, file = head.partition("@")
    if not at or not line.isdigit():
        return None
    return Frame(file=file, line=int(line), function=function)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building many small acyclic objects: its
    repeated passes over them doubled the time to parse or lay out a 100,000-node graph."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _new(cls, values: dict) -> Any:
    """Build a frozen dataclass instance without its __init__: 100,000 nodes parse ~3x faster.
    Only for values already validated by the parser."""
    obj = object.__new__(cls)
    obj.__dict__.update(values)
    return obj


_NODE_DEFAULTS = {
    "location": None,
    "scope": "",
    "root": None,
    "num_outputs": 1,
    "attrs": (),
    "frames": (),
}


def _parse_line(line: str, frames: dict[str, Frame | None]) -> dict | None:
    match = _LINE.match(line)
    if match is None:
        return None
    nid, shape_text, op, operands, rest = match.groups()
    shape, dtype, layout = _parse_shape(shape_text)
    values = dict(
        _NODE_DEFAULTS,
        id=int(nid),
        op=op,
        shape=shape,
        dtype=dtype,
        kind=node_kind(op),
        layout=layout,
    )
    values["_operands"] = operands.split(", ") if operands else []
    attrs = []
    for name, value in _parse_tags(rest):
        if name == "location":
            if value not in frames:
                frames[value] = parse_location(value)
            values["location"] = frames[value]
        elif name == "scope":
            values["scope"] = value
        elif name == "ROOT":
            values["root"] = int(value)
        elif name == "num_outputs":
            values["num_outputs"] = int(value)
        elif name != "xla_shape":
            attrs.append((name, value))
    values["attrs"] = tuple(attrs)
    return values


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
        with gc_paused():
            return cls._from_ir_text(
                text, hash=hash, hlo_text=hlo_text, ir_debug=ir_debug, fallback_ops=fallback_ops
            )

    @classmethod
    def _from_ir_text(
        cls, text: str, *, hash: str, hlo_text: str | None, ir_debug: bool | None, fallback_ops
    ) -> Graph:
        frames: dict[str, Frame | None] = {}
        parsed = [p for p in (_parse_line(line, frames) for line in text.splitlines()) if p]
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
                src = int(src_id)
                output = int(out) if out else 0
                inputs.append(src)
                producer = index.get(src)
                shape = _output_shape(producer, output) if producer else ""
                edges.append(
                    _new(
                        Edge,
                        {
                            "src": src,
                            "dst": values["id"],
                            "operand": position,
                            "output": output,
                            "shape": shape,
                        },
                    )
                )
            values["inputs"] = tuple(inputs)
            nodes.append(_new(Node, values))
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
            loc = raw.get("location")
            nodes.append(
                Node(
                    id=raw["id"],
                    op=raw["op"],
                    shape=raw["shape"],
                    dtype=raw["dtype"],
                    kind=raw["kind"],
                    inputs=tuple(raw.get("inputs", ())),
                    location=Frame(loc["file"], loc["line"], loc["function"]) if loc else None,
                    scope=raw.get("scope", ""),
                    root=raw.get("root"),
                    num_outputs=raw.get("num_outputs", 1),
                    layout=raw.get("layout", ""),
                    attrs=tuple(tuple(a) for a in raw.get("attrs", ())),
                    frames=tuple(Frame(*f) for f in raw.get("frames", ())),
                )
            )
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

    def by_location(self) -> dict[Frame, tuple[int, ...]]:
        """Source location -> the ids of the nodes recorded there (IR debug graphs only)."""
        found: dict[Frame, list[int]] = defaultdict(list)
        for n in self.nodes:
            if n.location is not None:
                found[n.location].append(n.id)
        return {k: tuple(v) for k, v in found.items()}

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
            loc = n.location
            return {
                "id": n.id,
                "op": n.op,
                "kind": n.kind,
                "shape": n.shape,
                "dtype": n.dtype,
                "layout": n.layout,
                "inputs": list(n.inputs),
                "scope": n.scope,
                "location": {"file": loc.file, "line": loc.line, "function": loc.function}
                if loc
                else None,
                "root": n.root,
                "num_outputs": n.num_outputs,
                "attrs": [list(a) for a in n.attrs],
                "frames": [[f.file, f.line, f.function] for f in n.frames],
            }

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

    def diff(self, other: Graph) -> GraphDiff:
        """What changed from `other` (the earlier graph) to this one: nodes whose op, shape or
        dtype differ, and nodes only one of them has. `graph_b.diff(graph_a)`."""
        from tpu_nb.runtime.graph_diff import diff_graphs  # same layer; avoids an import cycle

        return diff_graphs(before=other, after=self)

    def groups(
        self,
        by: str = "auto",
        *,
        budget: int = NODE_BUDGET,
        target: int | None = None,
        expand: Iterable[str] = (),
    ) -> GroupedGraph:
        """Above `budget` nodes, about `target` groups of consecutive nodes by source line
        (or "function", "file", "scope", "range"); `expand` names groups to open. See
        tpu_nb.runtime.graph_groups."""
        from tpu_nb.runtime.graph_groups import group_graph  # same layer; avoids a cycle

        return group_graph(self, by=by, budget=budget, target=target, expand=expand)


def _output_shape(values: dict, output: int) -> str:
    if values["num_outputs"] <= 1:
        return values["shape"]
    parts = _split_tuple(values["shape"])
    return parts[output] if output < len(parts) else values["shape"]


# -- capture -------------------------------------------------------------------------------


def _hash_hex(raw: bytes) -> str:
    """torch::lazy::HashToString form: high 64 bits, then the low 64 bits zero-padded."""
    low, high = int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:16], "little")
    return f"{high:x}{low:016x}"


def graph(*tensors: Any, hlo: bool = True, frames: bool | None = None) -> Graph:
    """The pending graph that computes `tensors` (XLA tensors, or modules, optimizers, and
    lists/tuples/dicts of them), as torch_xla would compile it at the next sync.

    Capture before the sync: after it the tensors are plain device data. `hlo=False` skips
    lowering to HLO (about as costly as reading the IR: ~45 us per node on XLA:CPU).
    `frames`: give each node its whole Python stack (Node.frames, Node.user_frame), read
    from the HLO's stack-frame index; the default does it when locations were recorded and
    the graph has at most 50,000 nodes (it lowers the graph once more).
    """
    found = _xla_tensors(tensors)
    X = xlac()
    text = X._get_xla_tensors_text(found)
    g = Graph.from_ir_text(
        text,
        hash=_hash_hex(X._get_graph_hash(found)),
        hlo_text=X._get_xla_tensors_hlo(found) if hlo else None,
        ir_debug=None if not X._get_ir_debug() else True,
        fallback_ops=_fallback_counts(),
    )
    located = any(n.location for n in g.nodes)
    if frames or (frames is None and located and len(g.nodes) <= 50_000):
        from tpu_nb.runtime.graph_frames import with_frames  # same layer

        with record_locations():  # lowering writes source metadata only in IR debug
            proto = X._get_xla_tensors_hlo_proto(found)
        g = with_frames(g, proto)
    return g


def _fallback_counts() -> tuple[tuple[str, int], ...]:
    """CPU fallback ops run so far (`.item()`/print reads excluded: those are host reads)."""
    X = xlac()
    names = [n for n in X._get_executed_fallback_ops() if n != "aten::_local_scalar_dense"]
    return tuple((n, int(X._xla_counter_value(n) or 0)) for n in sorted(names))


def _xla_tensors(objects: Sequence[Any]) -> list:
    import torch

    found: dict[int, Any] = {}
    for obj in objects:
        if isinstance(obj, torch.Tensor):
            if obj.device.type != "xla":
                raise TpuNbUsageError(
                    f"graph() got a tensor on {obj.device}, which is not lazy: only XLA "
                    "tensors have a pending graph. Fix: leave it out, or move it first with "
                    ".to(tpu_nb.device())."
                )
            found.setdefault(id(obj), obj)
        elif _is_container(obj, torch):
            for t in _walk(obj, torch):
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


def _walk(obj: Any, torch) -> Iterator:
    """XLA tensors inside containers, modules (parameters, buffers) and optimizers (parameters,
    state). Tensors elsewhere (e.g. AdamW's CPU step counters) are skipped."""
    if isinstance(obj, torch.Tensor):
        if obj.device.type == "xla":
            yield obj
    elif isinstance(obj, torch.nn.Module):
        yield from _walk(list(obj.parameters()) + list(obj.buffers()), torch)
    elif isinstance(obj, torch.optim.Optimizer):
        yield from _walk([g["params"] for g in obj.param_groups], torch)
        yield from _walk(list(obj.state.values()), torch)
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _walk(value, torch)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for value in obj:
            yield from _walk(value, torch)


def is_pending(tensor: Any) -> bool:
    """Whether an XLA tensor has operations waiting for a sync (not just device data).
    ~2 us: reads torch_xla's debug line for the tensor's IR value."""
    info = xlac()._get_xla_tensor_debug_info(tensor)
    ir = next((line[4:] for line in info.splitlines() if line.startswith("IR: ")), "None")
    return ir != "None" and "xla::device_data" not in ir


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
        budget = [max_items]
        candidates = (
            t
            for obj in objects
            for t in _walk_limited(obj, torch, depth=4, seen=set(), budget=budget)
        )
    else:
        # type(), not isinstance(): isinstance reads __class__, which some objects in a big
        # process answer with a deprecation warning (torch.distributed.reduce_op)
        candidates = (
            o
            for o in gc.get_objects()
            if issubclass(type(o), torch.Tensor) and o.device.type == "xla"
        )
    found: dict[int, Any] = {}
    for t in candidates:
        if id(t) not in found and is_pending(t):
            found[id(t)] = t
    return graph(*found.values(), hlo=hlo) if found else None


def _walk_limited(obj: Any, torch, depth: int, seen: set, budget: list) -> Iterator:
    """Like _walk, for arbitrary namespaces: bounded depth and item count, cycle-safe."""
    budget[0] -= 1
    if budget[0] < 0 or id(obj) in seen:
        return
    if isinstance(obj, torch.Tensor):
        if obj.device.type == "xla":
            yield obj
        return
    if depth == 0 or not _is_container(obj, torch):
        return
    seen.add(id(obj))
    if isinstance(obj, torch.nn.Module):
        children = list(obj.parameters()) + list(obj.buffers())
    elif isinstance(obj, torch.optim.Optimizer):
        children = [g["params"] for g in obj.param_groups] + list(obj.state.values())
    elif isinstance(obj, dict):
        children = list(obj.values())
    else:
        children = list(obj)
    for child in children:
        yield from _walk_limited(child, torch, depth - 1, seen, budget)


@contextmanager
def record_locations(enabled: bool = True) -> Iterator[None]:
    """Record each new IR node's Python location (`location=` in the IR) inside the block.

    The same as XLA_IR_DEBUG=1 but switchable at run time (torch_xla's `_set_ir_debug`), so
    a notebook can turn it on for one cell: costs ~0.6 us per traced op on XLA:CPU. Nodes
    traced before the block keep having no location.
    """
    X = xlac()
    before = bool(X._get_ir_debug())
    X._set_ir_debug(enabled)
    try:
        yield
    finally:
        X._set_ir_debug(before)


# -- synthetic graphs for benchmarks and tests ---------------------------------------------


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
