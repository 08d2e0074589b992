"""Whole Python stacks for IR nodes, from the HLO module's stack-frame index.

torch_xla's IR text names only the innermost frame of each node, by file basename
(`location=forward@linear.py:134`): inside `model(x)` that is torch's code, never the
notebook line. The frames are all recorded, though (IR debug), and lowering to HLO writes
them out: each HLO instruction's metadata carries its node's op type and a stack_frame_id
into the module's StackFrameIndexProto (full file paths, every frame). Nodes are lowered in
the IR text's post-order, each into a run of consecutive instruction ids, so walking both in
order pairs them up. A stack is attached only when its innermost frame is the node's own
`location=`; a node whose pairing is in doubt keeps no stack rather than a wrong one.

The HLO proto is decoded by hand (protobuf wire format, a few fields of xla/service/hlo.proto):
no protobuf package or generated classes are needed.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING

from tpu_nb.runtime.frame import Frame

if TYPE_CHECKING:
    from tpu_nb.runtime.graph._graph import Graph

# Field numbers in xla/service/hlo.proto and xla/xla_data.proto (OpMetadata).
_MODULE_COMPUTATIONS, _MODULE_ENTRY_ID, _MODULE_STACK_INDEX = 3, 6, 17
_COMPUTATION_INSTRUCTIONS, _COMPUTATION_ID = 2, 5
_INSTRUCTION_METADATA, _INSTRUCTION_ID = 7, 35
_METADATA_OP_TYPE, _METADATA_STACK_FRAME = 1, 15
_INDEX_FILES, _INDEX_FUNCTIONS, _INDEX_LOCATIONS, _INDEX_FRAMES = 1, 2, 3, 4


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, i
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) pairs of one message: ints for varints, bytes otherwise."""
    out: list[tuple[int, int | bytes]] = []
    i, end = 0, len(buf)
    while i < end:
        key, i = _varint(buf, i)
        kind = key & 7
        value: int | bytes
        if kind == 0:
            value, i = _varint(buf, i)
        elif kind == 2:
            size, i = _varint(buf, i)
            value, i = buf[i : i + size], i + size
        elif kind == 1:
            value, i = buf[i : i + 8], i + 8
        elif kind == 5:
            value, i = buf[i : i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {kind}")
        out.append((key >> 3, value))
    return out


def _all(fields, number: int) -> list:
    return [v for f, v in fields if f == number]


def _one(fields, number: int, default=None):
    return next((v for f, v in fields if f == number), default)


def _stacks(index: bytes) -> dict[int, tuple[Frame, ...]]:
    """stack_frame_id -> frames, innermost first."""
    fields = _fields(index)
    files = [b.decode("utf-8", "replace") for b in _all(fields, _INDEX_FILES)]
    functions = [b.decode("utf-8", "replace") for b in _all(fields, _INDEX_FUNCTIONS)]
    locations = []
    for loc in map(_fields, _all(fields, _INDEX_LOCATIONS)):
        # file_name_id, function_name_id, line (the ids are 1-based)
        file, function = files[_one(loc, 1, 1) - 1], functions[_one(loc, 2, 1) - 1]
        locations.append(Frame(file=file, line=_one(loc, 3, 0), function=function))
    frames = [(_one(f, 1, 0), _one(f, 2, 0)) for f in map(_fields, _all(fields, _INDEX_FRAMES))]
    stacks: dict[int, tuple[Frame, ...]] = {}
    for frame_id in range(1, len(frames) + 1):
        chain: list[Frame] = []
        current = frame_id
        while current and len(chain) < 1000:
            location_id, parent = frames[current - 1]
            chain.append(locations[location_id - 1])
            current = parent
        stacks[frame_id] = tuple(chain)
    return stacks


def instruction_stacks(proto: bytes) -> list[tuple[str, tuple[Frame, ...]]]:
    """(op type, stack) of the entry computation's instructions, in creation order, with
    consecutive repeats folded (one run per lowered node, roughly)."""
    module = _fields(proto)
    index = _one(module, _MODULE_STACK_INDEX)
    stacks = _stacks(index) if index else {}
    entry_id = _one(module, _MODULE_ENTRY_ID)
    entry = None
    for raw in _all(module, _MODULE_COMPUTATIONS):
        computation = _fields(raw)
        if entry is None or _one(computation, _COMPUTATION_ID) == entry_id:
            entry = computation
    rows = []
    for raw in _all(entry or [], _COMPUTATION_INSTRUCTIONS):
        inst = _fields(raw)
        meta = _fields(_one(inst, _INSTRUCTION_METADATA, b""))
        op_type = _one(meta, _METADATA_OP_TYPE, b"").decode("utf-8", "replace")
        stack = stacks.get(_one(meta, _METADATA_STACK_FRAME, 0), ())
        rows.append((_one(inst, _INSTRUCTION_ID, 0), op_type, stack))
    rows.sort(key=lambda r: r[0])
    runs: list[tuple[str, tuple[Frame, ...]]] = []
    for _, op_type, stack in rows:
        if op_type and (not runs or runs[-1] != (op_type, stack)):
            runs.append((op_type, stack))
    return runs


def _inner(stack: tuple[Frame, ...]) -> tuple:
    """The innermost frame as a node's `location=` names it (file basename), or ()."""
    return (os.path.basename(stack[0].file), stack[0].line, stack[0].function) if stack else ()


def _agrees(stack: tuple[Frame, ...], loc: Frame | None) -> bool:
    return loc is not None and bool(stack) and _inner(stack) == (loc.file, loc.line, loc.function)


def _node_key(node) -> tuple:
    loc, op_type = node.location, node.op.replace(":", "_")
    return (op_type, loc.file, loc.line, loc.function) if loc else (op_type,)


def _pairs(a: list, b: list, window: int = 48) -> dict[int, int]:
    """Pair equal keys of two nearly equal sequences in order, in linear time: on a
    mismatch, skip ahead in whichever sequence reaches a match sooner (within `window`).
    (A general diff is quadratic on 20,000 repetitive keys; here gaps are short.)"""
    pairs: dict[int, int] = {}
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            pairs[i] = j
            i, j = i + 1, j + 1
            continue
        skip_b = next((d for d in range(1, window) if j + d < len(b) and b[j + d] == a[i]), None)
        skip_a = next((d for d in range(1, window) if i + d < len(a) and a[i + d] == b[j]), None)
        if skip_b is not None and (skip_a is None or skip_b <= skip_a):
            j += skip_b
        elif skip_a is not None:
            i += skip_a
        else:
            i, j = i + 1, j + 1
    return pairs


def with_frames(graph: Graph, proto: bytes) -> Graph:
    """A copy of `graph` whose located nodes carry their whole stacks (see module doc).

    Nodes and instruction runs are aligned like two texts, on (op, innermost frame): a node
    that lowered to nothing, or a parameter shared by several device-data nodes, is a gap
    in one sequence, not a shift of everything after it. A node left unpaired right after a
    node with the same key shares its run (same stack, so the instructions merged).
    """
    runs = instruction_stacks(proto)
    node_keys = [_node_key(n) for n in graph.nodes]
    run_keys = [(op_type, *_inner(stack)) for op_type, stack in runs]
    paired = _pairs(node_keys, run_keys)
    nodes, last = [], None
    for i, node in enumerate(graph.nodes):
        j = paired.get(i)
        if j is None and last is not None and run_keys[last] == node_keys[i]:
            j = last
        if j is not None:
            last = j
            stack = runs[j][1]
            if _agrees(stack, node.location):
                node = replace(node, frames=stack)
        nodes.append(node)
    return replace(graph, nodes=tuple(_fill_from_neighbours(graph, nodes)))


def _fill_from_neighbours(graph: Graph, nodes: list) -> list:
    """A located node with no instructions of its own (a no-op cast, a parameter shared with
    another device-data node) takes the stack of a neighbour recorded at the same line: the
    same Python call made both."""
    pos = graph._position
    consumers = graph.consumers
    for _ in range(2):
        for i, node in enumerate(nodes):
            if node.frames or node.location is None:
                continue
            for other in list(consumers.get(node.id, ())) + list(node.inputs):
                frames = nodes[pos[other]].frames if other in pos else ()
                if _agrees(frames, node.location):
                    nodes[i] = replace(node, frames=frames)
                    break
    return nodes
