"""Model FLOPs of a graph, counted from its HLO text as MaxText and torchtitan count them: the
matrix multiplications and convolutions, 2 FLOPs (a multiply and an add) per
multiply-accumulate. Elementwise ops, reductions (softmax, norms), gathers and custom calls
are left out: they are a few percent of a model's work and run far below the chip's peak.

`dot`: 2 x output elements x the product of the lhs contracting dimensions.
`convolution`: 2 x output elements x the kernel's elements per output feature (its input
features per group times its window); its input and weight gradients, which XLA writes as
convolutions too, count as much as the forward convolution each (as FlopCounterMode counts
them; it counts a grouped convolution's weight gradient as if it were not grouped).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from math import prod

# `%name = f32[2,3]{1,0} op(...)`, or a tuple-shaped result (the ROOT, a multi-output op):
# `%t = (f32[2], /*index=1*/s64[2]) ...`, matched up to its "(" (its shape holds no %name, so
# the operands are the %names after the `=`).
_DEFINITION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\w+\[[\d,]*\]|\()")
_SHAPE = re.compile(r"\w+\[([\d,]*)\]")
_OPERAND = re.compile(r"(?:(\w+\[[\d,]*\])(?:\{[^}]*\})?\s+)?%([\w.\-]+)")
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_DIM_LABELS = re.compile(r"dim_labels=(\w+)_(\w+)->(\w+)")
_FEATURE_GROUPS = re.compile(r"feature_group_count=(\d+)")


@dataclass(frozen=True)
class HloFlops:
    """FLOPs of one graph's matmuls and convolutions, and what else it holds uncounted."""

    flops: int
    dots: int = 0
    convolutions: int = 0
    custom_calls: int = 0  # kernels whose FLOPs XLA cannot see (e.g. a Pallas attention)

    @property
    def left_out(self) -> str:
        """What the count does not include, in words."""
        base = "elementwise ops, reductions and gathers are not counted"
        return f"{base}, nor {self.custom_calls} custom call(s)" if self.custom_calls else base


def _dims(shape: str) -> list[int]:
    m = _SHAPE.match(shape)
    return [int(d) for d in m.group(1).split(",") if d] if m else []


def hlo_flops(text: str) -> HloFlops:
    """Count the model FLOPs of an HLO module's text (`_get_xla_tensors_hlo`).

    Only instructions the computation's result depends on count: torch_xla's lowering can
    leave dead work in the unoptimised HLO (a first convolution's input gradient nobody
    asked for), which XLA removes before it runs anything."""
    shapes: dict[str, str] = {}
    flops = dots = convolutions = customs = 0
    for body in _computations(text):
        for line, head in _live(body):
            if " custom-call(" in line:
                customs += 1
                continue
            if " dot(" not in line and " convolution(" not in line:
                continue
            out = _dims(head.group(2))
            args = line[line.index("(", head.end()) + 1 :]
            operands = _OPERAND.findall(args.split(")", 1)[0])[:2]
            if len(operands) < 2:
                continue
            if any(not shape for shape, _ in operands) and not shapes:
                shapes = _definitions(text)
            lhs, rhs = (_dims(shape or shapes.get(name, "")) for shape, name in operands)
            if " dot(" in line:
                m = _CONTRACTING.search(line)
                contracted = [lhs[int(d)] for d in m.group(1).split(",") if d] if m else []
                flops += 2 * prod(out) * prod(contracted)
                dots += 1
            else:
                flops += _conv_flops(lhs, rhs, out, line)
                convolutions += 1
    return HloFlops(flops, dots, convolutions, customs)


def _computations(text: str) -> list[list[str]]:
    """The instruction lines of each computation in the module."""
    found: list[list[str]] = []
    body: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith("{") and "=" not in stripped.split("(", 1)[0]:
            body = []
            found.append(body)
        elif stripped == "}":
            body = None
        elif body is not None and stripped:
            body.append(line)
    return found


_NAME_REF = re.compile(r"%([\w.\-]+)")
_COUNTED = (" dot(", " convolution(", " custom-call(")


def _live(body: list[str]):
    """(line, definition match) of the counted instructions the computation's ROOT needs."""
    uses: dict[str, list[str]] = {}
    defined: dict[str, tuple[str, re.Match]] = {}
    root = None
    for line in body:
        head = _DEFINITION.match(line)
        if head is None:
            continue
        name = head.group(1)
        defined[name] = (line, head)
        uses[name] = _NAME_REF.findall(line[head.end() :])
        if line.lstrip().startswith("ROOT"):
            root = name
    if root is None:
        return []
    seen, todo = {root}, [root]
    while todo:
        for used in uses.get(todo.pop(), ()):
            if used in defined and used not in seen:
                seen.add(used)
                todo.append(used)
    return [defined[n] for n in seen if any(op in defined[n][0] for op in _COUNTED)]


def _conv_flops(lhs: list[int], rhs: list[int], out: list[int], line: str) -> int:
    """The FLOPs of the forward convolution this one is or is the gradient of:
    2 x N x output features x output positions x input features per group x window.

    XLA writes a weight gradient as a convolution whose output is the kernel (output labels
    not starting with the batch, `fb01_io01->01bf`) and an input gradient as one over the
    output gradient with the kernel turned round (`bf01_01oi->bf01`; dilated by the stride):
    counting their own multiply-adds would count the dilation's and padding's zeros."""
    m = _DIM_LABELS.search(line)
    if m is None or not (len(m.group(1)) == len(lhs) and len(m.group(2)) == len(rhs)):
        return 0
    rhs_labels, out_labels = m.group(2), m.group(3)
    if len(out_labels) != len(out):
        return 0
    if not out_labels.startswith("b"):  # weight gradient: rhs is dy, out is the kernel
        return 2 * prod(rhs) * prod(out) // out[out_labels.index("f")]
    if rhs_labels[0].isdigit() or "lhs_dilate" in line:  # input gradient: lhs is dy
        groups = _FEATURE_GROUPS.search(line)
        g = int(groups.group(1)) if groups else 1
        return 2 * prod(lhs) * prod(rhs) // rhs[rhs_labels.index("i")] // g
    return 2 * prod(out) * prod(rhs) // rhs[rhs_labels.index("o")]


def _definitions(text: str) -> dict[str, str]:
    """Every instruction's result shape by name (operands printed without their shapes)."""
    return {m.group(1): m.group(2) for m in map(_DEFINITION.match, text.splitlines()) if m}


# -- per node, from the IR's shapes (for the cost of each part of a graph) ---------------------

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f16": 2, "bf16": 2, "s16": 2, "u16": 2}
_DTYPE_BYTES |= {"f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8}
_MATMULS = frozenset(("aten::mm", "aten::bmm", "aten::matmul", "aten::linear"))
_BIASED_MATMULS = frozenset(("aten::addmm", "aten::baddbmm"))
_ARRAY_DIMS = re.compile(r"([a-z][a-z0-9]*)\[([\d,]*)\]")


def shape_bytes(shape: str) -> int:
    """Bytes of an IR shape's arrays: "f32[2,3]" -> 24; tuples add up."""
    return sum(
        _DTYPE_BYTES.get(dtype, 4) * prod(int(d) for d in dims.split(",") if d)
        for dtype, dims in _ARRAY_DIMS.findall(shape)
    )


def node_flops(op: str, out: str, operands: list[str]) -> int:
    """The matmul and convolution FLOPs of one IR node, by the rule of `hlo_flops`, from
    its output shape and its operands' shapes. Other ops count 0."""
    if op in _MATMULS or op in _BIASED_MATMULS:
        # the two matrices, whatever position the bias takes; the contracted size is the
        # dimension they share (either may come transposed)
        mats = [d for d in (_dims(_first_array(o)) for o in operands) if len(d) >= 2][:2]
        if len(mats) < 2:
            return 0
        a, b = mats
        k = a[-1] if a[-1] in (b[-2], b[-1]) else a[-2]
        return 2 * prod(_dims(out)) * k
    if op == "aten::convolution_overrideable" and len(operands) >= 2:
        return 2 * prod(_dims(out)) * prod(_dims(operands[1])[1:])
    if op == "aten::convolution_backward_overrideable" and len(operands) >= 3:
        # the input and the weight gradient, each as much as the forward convolution
        grad_out = _dims(_first_array(operands[0]))
        return 2 * 2 * prod(grad_out) * prod(_dims(operands[2])[1:]) if grad_out else 0
    return 0


def _first_array(shape: str) -> str:
    m = _ARRAY_DIMS.search(shape)
    return m.group(0) if m else ""
