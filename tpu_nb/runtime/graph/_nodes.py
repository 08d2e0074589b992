"""Nodes and edges of a pending graph, parsed line by line from torch_xla's IR text (its format:
the package docstring)."""

from __future__ import annotations

import gc
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import MISSING, dataclass, fields
from functools import cache, lru_cache
from typing import Any, Protocol, TypeVar

from tpu_nb.runtime.frame import Frame
from tpu_nb.runtime.sources import is_library

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
_COLLECTIVE_WORDS = tuple(
    """all_reduce all_gather reduce_scatter all_to_all collective_permute
    cross_replica send recv replica_id""".split()  # noqa: SIM905
)
_RANDOM_OPS = frozenset(
    """bernoulli normal uniform random randperm multinomial exponential
    geometric cauchy log_normal rrelu_with_noise native_dropout dropout""".split()  # noqa: SIM905
)


@cache
def node_kind(op: str) -> str:
    """What an op is, for colouring: data, constant, view, compute, reduction, collective,
    random (fallback is never inferred from an op name; see the module docstring)."""
    if op == "xla::device_data":
        return "data"
    if op in ("prim::Constant", "xla::scalar"):
        return "constant"
    base = op.split("::", 1)[-1].rstrip("_")
    if any(word in base for word in _COLLECTIVE_WORDS):
        return "collective"
    if base in _VIEW_OPS:
        return "view"
    if base in _REDUCTION_OPS:
        return "reduction"
    return "random" if base in _RANDOM_OPS else "compute"


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
        return next((frame for frame in self.frames if not is_library(frame.file)), None)

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


def is_leaf(n: Node) -> bool:
    """Device data or a constant: a node with no operands, nothing to compute."""
    return not n.inputs and n.kind in ("data", "constant")


class NodeGraph(Protocol):
    """What the diff and the grouping read of a graph. `Graph` is one; they take it through
    this shape so that they never import the module defining it (which imports them)."""

    @property
    def nodes(self) -> tuple[Node, ...]: ...

    @property
    def edges(self) -> tuple[Edge, ...]: ...

    @property
    def hash(self) -> str: ...

    @property
    def consumers(self) -> dict[int, tuple[int, ...]]: ...  # node id -> its users' ids

    @property
    def _position(self) -> dict[int, int]: ...  # node id -> its index in `nodes`


# A diff or a grouping hands back the very graph type it was given (a `Graph`, for users).
G = TypeVar("G", bound=NodeGraph)


def split_tuple(shape: str) -> list[str]:
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
    return sum(map(value.count, "([{")) > sum(map(value.count, ")]}"))


@lru_cache(maxsize=1 << 16)  # a graph names each line many times
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


def new_frozen(cls, values: dict | None = None, **more: Any) -> Any:
    """Build a frozen dataclass instance without its __init__: 100,000 nodes parse ~3x faster.
    Only for values already validated by the parser."""
    obj = object.__new__(cls)
    obj.__dict__.update(values or (), **more)
    return obj


_NODE_DEFAULTS = {f.name: f.default for f in fields(Node) if f.default is not MISSING}


def parse_line(line: str) -> dict | None:
    match = _LINE.match(line)
    if match is None:
        return None
    nid, shape_text, op, operands, rest = match.groups()
    shape, dtype, layout = _parse_shape(shape_text)
    values = dict(_NODE_DEFAULTS, id=int(nid), op=op, shape=shape, dtype=dtype, layout=layout)
    values["kind"] = node_kind(op)
    values["_operands"] = operands.split(", ") if operands else []
    attrs = []
    for name, value in _parse_tags(rest):
        if name == "location":
            values["location"] = parse_location(value)
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
