"""What changed between two lazy graphs: the nodes whose op, shape or dtype differ.

Two compiles of "the same" step differ because something in the traced program changed: an
input's shape (batch, sequence length), a Python value baked in as a constant, a branch.
`GraphDiff.causes` lists where the difference starts: changed nodes none of whose inputs
changed (an input whose shape changed, a view with a new size); everything downstream of them
differs too and is listed after. Graphs with the same ops in the same order pair node by node;
otherwise nodes are aligned on (op, location, arity) like a text diff.
"""

from __future__ import annotations

import bisect
import difflib
from collections import Counter
from dataclasses import dataclass, field
from typing import Generic

from tpu_nb.runtime.graph._nodes import G, Node, NodeGraph, gc_paused


@dataclass(frozen=True)
class NodeChange:
    """One node that differs: changed (op/shape/dtype), added, or removed."""

    before: Node | None
    after: Node | None
    fields: tuple[str, ...]  # some of ("op", "shape", "dtype"), or ("added",) / ("removed",)

    @property
    def status(self) -> str:
        return self.fields[0] if self.fields[0] in ("added", "removed") else "changed"

    def __str__(self) -> str:
        a, b = self.before, self.after
        if a is None:
            assert b is not None  # a change has at least one side
            return f"added   {b.describe()}"
        if b is None:
            return f"removed {a.describe()}"
        parts = []
        if "op" in self.fields:
            parts.append(f"{a.op} -> {b.op}")
        if "shape" in self.fields or "dtype" in self.fields:
            parts.append(f"{a.shape} -> {b.shape}")
        at = f" at {b.where}" if b.location else ""
        return f"changed %{a.id}->%{b.id} {b.op}: {', '.join(parts)}{at}"


@dataclass(frozen=True)
class GraphDiff(Generic[G]):
    """How graph `after` differs from graph `before` (say, two compiles of the same line)."""

    before: G = field(repr=False)
    after: G = field(repr=False)
    changes: tuple[NodeChange, ...]
    causes: tuple[NodeChange, ...]  # changed nodes whose inputs did not change: the origins
    aligned: bool  # same ops in the same order (only shapes/dtypes differ)

    def __bool__(self) -> bool:
        return bool(self.changes)

    @property
    def changed(self) -> tuple[NodeChange, ...]:
        return tuple(c for c in self.changes if c.status == "changed")

    @property
    def added(self) -> tuple[NodeChange, ...]:
        return tuple(c for c in self.changes if c.status == "added")

    @property
    def removed(self) -> tuple[NodeChange, ...]:
        return tuple(c for c in self.changes if c.status == "removed")

    @property
    def changed_ids(self) -> frozenset[int]:
        """Ids (in `after`) of the nodes that changed or were added."""
        return frozenset(c.after.id for c in self.changes if c.after is not None)

    def summary(self) -> str:
        if not self.changes:
            same = (
                "same hash"
                if self.before.hash and self.before.hash == self.after.hash
                else "same ops, shapes and dtypes"
            )
            return f"no difference ({same})"
        return (
            f"{len(self.changed)} changed, {len(self.added)} added, "
            f"{len(self.removed)} removed nodes "
            f"({len(self.before.nodes)} -> {len(self.after.nodes)})"
        )

    def __str__(self) -> str:
        lines = [self.summary()]
        if self.causes:
            lines.append("  where it starts:")
            lines += [f"    {c}" for c in self.causes[:20]]
        shown = [c for c in self.changes if c not in self.causes][:40]
        if shown:
            lines.append("  then:")
            lines += [f"    {c}" for c in shown]
        hidden = len(self.changes) - len(shown) - min(len(self.causes), 20)
        if hidden > 0:
            lines.append(f"    ... {hidden} more")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"GraphDiff({self.summary()})"


def _diff_keys(graph: NodeGraph) -> list[tuple]:
    """(op, location, operand ops): enough context that a diff pairs the right nodes."""
    op_of = {n.id: n.op for n in graph.nodes}
    return [(n.op, n.where, tuple(op_of.get(i, "") for i in n.inputs)) for n in graph.nodes]


def _align(a: list, b: list) -> list[tuple[int | None, int | None]]:
    """Pair positions of two key sequences: common prefix/suffix first, then difflib on the
    middle (anchored by keys unique to both when it is large, as patience diff does)."""
    start = 0
    while start < len(a) and start < len(b) and a[start] == b[start]:
        start += 1
    end_a, end_b = len(a), len(b)
    while end_a > start and end_b > start and a[end_a - 1] == b[end_b - 1]:
        end_a, end_b = end_a - 1, end_b - 1
    pairs: list[tuple[int | None, int | None]] = [(i, i) for i in range(start)]
    pairs += _align_middle(a, b, start, end_a, start, end_b)
    pairs += [(end_a + k, end_b + k) for k in range(len(a) - end_a)]
    return pairs


def _align_middle(a, b, a0, a1, b0, b1) -> list[tuple[int | None, int | None]]:
    if a0 == a1 or b0 == b1:
        return [(i, None) for i in range(a0, a1)] + [(None, j) for j in range(b0, b1)]
    if (a1 - a0) * (b1 - b0) > 4_000_000:
        anchors = _unique_anchors(a, b, a0, a1, b0, b1)
        if anchors:
            pairs, ia, jb = [], a0, b0
            for i, j in anchors + [(a1, b1)]:
                pairs += _align_middle(a, b, ia, i, jb, j)
                if i < a1:
                    pairs.append((i, j))
                ia, jb = i + 1, j + 1
            return pairs
    pairs = []
    matcher = difflib.SequenceMatcher(None, a[a0:a1], b[b0:b1], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            pairs += [(a0 + i1 + k, b0 + j1 + k) for k in range(i2 - i1)]
        else:
            pairs += _pair_by_op(a, b, a0 + i1, a0 + i2, b0 + j1, b0 + j2)
    return pairs


def _pair_by_op(a, b, a0, a1, b0, b1) -> list[tuple[int | None, int | None]]:
    """Inside a replaced stretch, pair nodes with the same op (their inputs differ); pair
    the rest one to one only where both sides have the same count (an op changed)."""
    pairs = []
    ops = difflib.SequenceMatcher(
        None, [k[0] for k in a[a0:a1]], [k[0] for k in b[b0:b1]], autojunk=False
    )
    for tag, i1, i2, j1, j2 in ops.get_opcodes():
        common = i2 - i1 if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1) else 0
        pairs += [(a0 + i1 + k, b0 + j1 + k) for k in range(common)]
        pairs += [(a0 + i, None) for i in range(i1 + common, i2)]
        pairs += [(None, b0 + j) for j in range(j1 + common, j2)]
    return pairs


def _unique_anchors(a, b, a0, a1, b0, b1) -> list[tuple[int, int]]:
    """Keys occurring exactly once in each range, as a longest increasing chain of pairs."""
    count_a, count_b = Counter(a[a0:a1]), Counter(b[b0:b1])
    pos_b = {b[j]: j for j in range(b0, b1) if count_b[b[j]] == 1}
    cands = [(i, pos_b[a[i]]) for i in range(a0, a1) if count_a[a[i]] == 1 and a[i] in pos_b]
    return _longest_increasing(cands)


def _longest_increasing(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    tails: list[int] = []
    tail_idx: list[int] = []
    prev = [-1] * len(pairs)
    for k, (_, j) in enumerate(pairs):
        pos = bisect.bisect_left(tails, j)
        if pos == len(tails):
            tails.append(j)
            tail_idx.append(k)
        else:
            tails[pos], tail_idx[pos] = j, k
        prev[k] = tail_idx[pos - 1] if pos else -1
    out, k = [], tail_idx[-1] if tail_idx else -1
    while k >= 0:
        out.append(pairs[k])
        k = prev[k]
    return out[::-1]


@gc_paused()
def diff_graphs(before: G, after: G) -> GraphDiff[G]:
    """The node-level difference between two graphs; see `Graph.diff`."""
    a_keys = [n.op for n in before.nodes]
    b_keys = [n.op for n in after.nodes]
    aligned = a_keys == b_keys
    pairs: list[tuple[int | None, int | None]]
    if aligned:
        pairs = [(i, i) for i in range(len(a_keys))]
    else:
        pairs = _align(_diff_keys(before), _diff_keys(after))
    changes, touched = [], set()
    for i, j in pairs:
        old = before.nodes[i] if i is not None else None
        new = after.nodes[j] if j is not None else None
        fields = _changed_fields(old, new)
        if fields:
            changes.append(NodeChange(old, new, fields))
            if new is not None:
                touched.add(new.id)
    # Changed nodes none of whose inputs changed; when nothing changed in place, what was
    # added first is where it starts.
    origins = [c for c in changes if c.after and not any(s in touched for s in c.after.inputs)]
    causes = tuple(c for c in origins if c.status == "changed")
    causes = causes or tuple(c for c in origins if c.status == "added")
    return GraphDiff(
        before=before, after=after, changes=tuple(changes), causes=causes, aligned=aligned
    )


def _changed_fields(old: Node | None, new: Node | None) -> tuple[str, ...]:
    if old is None:
        return ("added",)
    if new is None:
        return ("removed",)
    return tuple(f for f in ("op", "shape", "dtype") if getattr(old, f) != getattr(new, f))
