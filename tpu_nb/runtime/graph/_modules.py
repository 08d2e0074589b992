"""A graph's nodes grouped as the model is built: forward, backward and optimizer, each by module.

Every node gets a phase and a module path from its scope (see _scopes): forward and backward
nodes the module that made them, the optimizer's nodes the optimizer. Nodes without a scope
are "other", in the latest phase among their operands (a gradient autograd sums is backward
work) or else their first consumer's; device data and constants belong where their first
consumer does, and outputs nothing reads (a buffer passed in) to phase "other". Forward
work of no module before the first module ("input": the batch being made) and after it
("other": a loss computed outside the model) are apart.
Boxes start at the outermost module of each phase and open one level deeper, all at once,
while the picture stays within the target. Submodules numbered 0, 1, 2, ... of one parent
(`h.0` ... `h.11`, a ModuleList or Sequential of three or more) stay one row, `h.0-11`,
until that row is expanded.
"""

from __future__ import annotations

from tpu_nb.runtime.graph._nodes import NodeGraph, is_leaf
from tpu_nb.runtime.graph._scopes import module_of

REPEAT_MIN = 3  # numbered siblings shown as one row from this many on


_ORDER = {"forward": 0, "backward": 1, "optimizer": 2}


def module_keys(graph: NodeGraph) -> list[tuple[str, tuple[str, ...]]]:
    """(phase, module path as parts) for each node, in graph.nodes order."""
    own = [module_of(n.scope) for n in graph.nodes]
    pos = graph._position
    leaf = [is_leaf(n) for n in graph.nodes]
    keys: list[tuple[str, tuple[str, ...]]] = [("", ())] * len(own)
    after_model = [False] * len(own)  # some module's node comes before it
    for i, (phase, path) in enumerate(own):  # operands come first
        operands = [pos[s] for s in graph.nodes[i].inputs if s in pos]
        if phase != "other":
            keys[i] = (phase, tuple(path.split(".")))
            after_model[i] = True
        elif not leaf[i]:
            # made by no module: the latest phase among its operands (a gradient summed by
            # autograd is backward work), else its consumer's (below). Forward work before
            # any module (the batch being made) and after (the loss) are two boxes: one
            # would make the picture a cycle.
            after_model[i] = any(after_model[k] for k in operands)
            known = [keys[k][0] for k in operands if keys[k][0] in _ORDER]
            if known:
                phase = max(known, key=_ORDER.__getitem__)
                before = phase == "forward" and not after_model[i]
                keys[i] = (phase, ("input",) if before else ("other",))
    consumers = graph.consumers
    for i in range(len(graph.nodes) - 1, -1, -1):  # consumers come later: walk backward
        n = graph.nodes[i]
        if (leaf[i] or not keys[i][0]) and n.id in consumers:
            used_by = keys[pos[consumers[n.id][0]]]
            before = used_by[0] == "forward" and not after_model[i]
            keys[i] = used_by if leaf[i] else (used_by[0], ("input",) if before else ("other",))
    return [k if k[0] else ("other", ("other",)) for k in keys]


def has_modules(graph: NodeGraph) -> bool:
    return any(module_of(n.scope)[0] != "other" for n in graph.nodes)


class ModuleBoxes:
    """The boxes of a module view: box name -> positions of its nodes. A box is named
    "<phase>:<dotted module path>", a row of repeated blocks "<phase>:<parent>.<a>-<b>"."""

    def __init__(self, graph: NodeGraph, target: int) -> None:
        self.keys = module_keys(graph)
        self.target = target
        # box name -> (phase, path prefix, repeated-row children or None, positions)
        self.boxes: dict[str, tuple[str, tuple[str, ...], tuple[str, ...] | None, list[int]]] = {}
        self.singles: list[int] = []  # positions drawn as single nodes
        start: dict[tuple[str, tuple[str, ...]], list[int]] = {}
        for i, (phase, path) in enumerate(self.keys):
            start.setdefault((phase, path[:1]), []).append(i)
        for (phase, prefix), positions in start.items():
            self._add(phase, prefix, None, positions)
        self._open_while_room()

    def _add(self, phase, prefix, repeated, positions) -> None:
        path = prefix + (f"{repeated[0]}-{repeated[-1]}",) if repeated else prefix
        self.boxes[f"{phase}:{'.'.join(path)}"] = (phase, prefix, repeated, positions)

    def _children(self, name: str) -> list:
        """What a box opens into: its submodules (numbered runs as one row), its own ops."""
        phase, prefix, repeated, positions = self.boxes[name]
        depth = len(prefix)
        own: list[int] = []
        by_child: dict[tuple[str, ...], list[int]] = {}
        for i in positions:
            path = self.keys[i][1]
            if len(path) > depth:
                by_child.setdefault(path[: depth + 1], []).append(i)
            else:
                own.append(i)
        if repeated:  # a row of blocks opens into the blocks
            return [(phase, p, None, m) for p, m in by_child.items()]
        numbered = sorted((p for p in by_child if p[-1].isdigit()), key=lambda p: int(p[-1]))
        out: list[tuple[str, tuple[str, ...], tuple[str, ...] | None, list[int]]] = []
        if len(numbered) >= REPEAT_MIN:
            members = sorted(i for p in numbered for i in by_child.pop(p))
            out.append((phase, prefix, tuple(p[-1] for p in numbered), members))
        out += [(phase, p, None, m) for p, m in by_child.items()]
        if own and out:
            out.append((phase, prefix, None, own))
        return out

    def _open(self, name: str, children: list[tuple]) -> None:
        del self.boxes[name]
        for child in children:
            self._add(*child)

    def _open_while_room(self) -> None:
        """Open the boxes one level deeper, all of a level at once (every phase, every
        branch: the picture shows the model at one depth), while they fit the target."""
        while True:
            openable = {k: b for k, b in self.boxes.items() if b[2] is None and len(b[3]) > 1}
            opened = {k: self._children(k) for k in openable}
            opened = {k: c for k, c in opened.items() if c and c != [self.boxes[k]]}
            if not opened:
                return
            depth = min(len(self.boxes[k][1]) for k in opened)
            level = {k: c for k, c in opened.items() if len(self.boxes[k][1]) == depth}
            grown = sum(len(c) - 1 for c in level.values())
            if len(self.boxes) + grown > self.target:
                return
            for name, children in level.items():
                self._open(name, children)

    def expand(self, wanted: str, budget: int) -> bool:
        """Open the boxes `wanted` names (a box name; or a module path, relative to the model
        or not, for its boxes in every phase; boxes holding it open first). A box with
        nothing inside to open shows its nodes one by one, when at most `budget`. False when
        nothing matched."""
        for _ in range(64):  # deeper than any model: each round opens one level
            hits = [k for k in self.boxes if _matches(k, wanted)]
            if not hits:  # an opened module: open what it shows now, one level more
                hits = [k for k in self.boxes if _matches(k, wanted, inside=True)]
            if hits:
                for name in hits:
                    children = self._children(name)
                    if children:
                        self._open(name, children)
                    elif len(self.boxes[name][3]) <= budget:
                        self.singles += self.boxes.pop(name)[3]
                return True
            holders = [k for k, box in self.boxes.items() if _holds(box, wanted)]
            if not holders:
                return False
            for name in holders:
                self._open(name, self._children(name))
        return False

    def pieces(self) -> tuple[list[int], dict[int, str]]:
        """A piece id per position (its box's first position, or its own for a single) and
        each box's name by piece id."""
        piece = [0] * len(self.keys)
        names: dict[int, str] = {}
        for name, (_, _, _, positions) in self.boxes.items():
            first = min(positions)
            names[first] = name
            for i in positions:
                piece[i] = first
        for i in self.singles:
            piece[i] = i
        return piece, names


def _matches(name: str, wanted: str, inside: bool = False) -> bool:
    """Whether box `name` is the module `wanted` names (or, `inside`, within it)."""
    if name == wanted:
        return not inside
    path = name.split(":", 1)[1]
    relative = path.partition(".")[2]
    if inside:
        return any(p.startswith(wanted + ".") for p in (path, relative, name))
    return wanted in (path, relative)


def _holds(box: tuple, wanted: str) -> bool:
    """Whether a box holds the module `wanted` names, deeper down (a row of blocks: in one of
    its blocks)."""
    _, prefix, repeated, _ = box
    parts = tuple(wanted.split("."))
    if parts[:1] != prefix[:1]:
        parts = prefix[:1] + parts
    if len(parts) <= len(prefix) or parts[: len(prefix)] != prefix:
        return False
    return repeated is None or parts[len(prefix)] in repeated


def label(name: str) -> str:
    """What a box says: the module path without the outermost module's class (which every
    box of one model shares), the phase apart: "layer1.0", "transformer.h.0-11"."""
    phase, _, path = name.partition(":")
    head, _, rest = path.partition(".")
    return rest or head
