"""Which lines of a piece of source did what: compiles, CPU fallbacks, device->host reads.

Compile events carry Python frames, so a compile maps to the exact line. Counters carry no
lines, so a CPU fallback or a host read is matched to the lines of the source that call it
(found by reading the source's syntax tree) and to value-access compiles, which have frames.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from tpu_nb.runtime import tracking
from tpu_nb.runtime.compile_log import CompileEvent
from tpu_nb.runtime.tracking import RunReport

HOST_READ_HINT = ("reading a value forces the device to finish everything pending and copy "
                  "it to the host: keep values on the device (accumulate losses in a tensor) "
                  "and read once after the loop, or log with xm.add_step_closure")
# Calls that read a device value on the host.
_READ_METHODS = {"item": ".item()", "tolist": ".tolist()", "numpy": ".numpy()"}
_READ_BUILTINS = {"print": "print()", "float": "float()", "int": "int()", "bool": "bool()"}
_FALLBACK_HINTS = {
    "nonzero": "its output size depends on the data; use torch.where with a mask instead",
    "masked_select": "its output size depends on the data; multiply by the mask instead",
    "unique": "its output size depends on the data; compute it once on the CPU before training",
    "histc": "compute the histogram on the CPU outside the step, or with one-hot sums",
}


@dataclass(frozen=True)
class LineFinding:
    """Something a line did, with what to do about it."""

    line: int            # 1-based line in the source; 0 when not on a line of it
    kind: str            # "compile", "warm-up", "recompile", "fallback", "host-read"
    what: str            # e.g. "aten::histc ran on the CPU", "graph 3a4b... compiled: ..."
    hint: str = ""       # what to do; findings of one kind on one topic share the same text
    place: str = ""      # where, when not a line: "end of cell" (the final sync)
    count: int = 1       # how many times it happened (host reads, fallbacks, graphs)
    via: str = ""        # the library function between the line and the event, e.g.
                         # "torch/optim/adamw.py:480 _single_tensor_adamw"
    seconds: float | None = None   # time it cost where known (a compile's compile time)
    order: int = 0       # when it first happened in the run (findings sort by it)
    changed: tuple[str, ...] = ()  # recompiles: what differs from the line's earlier graph


def fallback_hint(op: str) -> str:
    specific = _FALLBACK_HINTS.get(op)
    base = (f"aten::{op} has no XLA lowering, so it ran on the CPU (its inputs were copied to "
            "the host and its result back)")
    return f"{base}: {specific}" if specific else (
        f"{base}: use an op with an XLA lowering, or move it out of the hot loop")


def _call_lines(tree: ast.AST) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """name -> lines for every call `x.name(...)`/`name(...)`; host-read calls separately."""
    calls: dict[str, list[int]] = {}
    reads: dict[str, list[int]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name is None:
            continue
        calls.setdefault(name, []).append(node.lineno)
        if isinstance(func, ast.Attribute) and name in _READ_METHODS:
            reads.setdefault(_READ_METHODS[name], []).append(node.lineno)
        elif isinstance(func, ast.Name) and name in _READ_BUILTINS:
            reads.setdefault(_READ_BUILTINS[name], []).append(node.lineno)
    return calls, reads


def _line_in(event: CompileEvent, filename: str) -> int | None:
    for frame in event.frames:
        if frame.file == filename:
            return frame.line
    return None


def _recompile_hint(event: CompileEvent) -> str:
    from tpu_nb.runtime.live import describe_difference

    before = tracking.earlier_graph(event)
    differs = "; ".join(describe_difference(before, event)) if before else ""
    return ("this line compiled a different graph before"
            + (f" ({differs})" if differs else "")
            + ": keep shapes and Python values in the step fixed (pad or bucket the batch)")


def attribute(report: RunReport, source: str, filename: str,
              allowed: int = 1) -> list[LineFinding]:
    """Findings of `report` placed on lines of `source` (compiled under `filename`).

    allowed: distinct graphs a line may compile before it counts as recompiling (the cell's
    --max-graphs: deliberate bucketing is not flagged)."""
    findings: list[LineFinding] = []
    # Per line: a warm-up graph (the second, when the first step created state) is expected;
    # the graphs after the first `allowed` others are recompilations.
    recompiled, accepted, warmup = set(), set(), set()
    for line, hashes in report.recompilations.items():
        skip = 1 + (line in report.warmups)
        if line in report.warmups:
            warmup.add(hashes[1])
        accepted.update(hashes[skip:skip + allowed - 1])
        recompiled.update(hashes[skip + allowed - 1:])
    for event in report.compile_events:
        line = _line_in(event, filename)
        if line is None:
            if _line_in(event, tracking.__file__) is not None:   # track()'s final sync
                findings.append(LineFinding(0, "compile", event.describe().split(" at ")[0],
                                            place="end of cell"))
            continue
        kind = "recompile" if event.graph_hash in recompiled else "compile"
        hint = _recompile_hint(event) if kind == "recompile" else ""
        if event.graph_hash in warmup:
            hint = ("expected once: the first step compiled its own graph (it created "
                    "gradients and optimizer state); this is the steady step's graph")
        elif event.graph_hash in accepted:
            hint = f"another graph of this line, within the {allowed} allowed (--max-graphs)"
        if event.kind == "value-access":
            hint = HOST_READ_HINT
        findings.append(LineFinding(line, kind, event.describe().split(" at ")[0], hint))
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return findings
    calls, reads = _call_lines(tree)
    for op, count in sorted(report.metrics.fallbacks.items()):
        lines = calls.get(op) or [None]
        for line in lines:
            findings.append(LineFinding(line or 0, "fallback",
                                        f"aten::{op} ran on the CPU ({count}\u00d7)",
                                        fallback_hint(op)))
    if report.metrics.host_reads:
        access_lines = {f.line for f in findings if f.kind in ("compile", "recompile")
                        and f.hint == HOST_READ_HINT}
        seen = set()
        for what, lines in sorted(reads.items()):
            for line in lines:
                if line not in seen:
                    seen.add(line)
                    findings.append(LineFinding(line, "host-read",
                                                f"{what} may read a device value", HOST_READ_HINT))
        for line in sorted(access_lines - seen):
            findings.append(LineFinding(line, "host-read", "a device value was read",
                                        HOST_READ_HINT))
    return sorted(findings, key=lambda f: (f.line, f.kind))
