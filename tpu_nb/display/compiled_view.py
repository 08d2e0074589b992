"""The "compiled functions" section of a run's report: what Dynamo compiled (torch.compile),
per function — where it was called, how many graphs, why each recompile happened (the guard
that failed, in the user's words), and each graph break with its reason and line.

Plain data in, text lines and escaped HTML out; RunView (reports.py) shows it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html import escape

from tpu_nb.display.style import MUTED, RED, WARN, bullets
from tpu_nb.runtime.metrics import Frame
from tpu_nb.runtime.sources import place_text
from tpu_nb.runtime.units import format_seconds

_RESUME = re.compile(r"^torch_dynamo_resume_in_(.+)_at_(\d+)$")
_KWARGS_FLAG = re.compile(r" \(has_kwargs (?:True|False)\)")  # Dynamo's internal flags


@dataclass
class CompiledFunction:
    """Dynamo's compiles of one function (its graph-break continuations included)."""

    name: str
    where: str  # "cell line 5 (f)", "model.py:12 (forward)"
    called_at: list[str] = field(default_factory=list)  # the tracked code's lines
    graphs: int = 0
    seconds: float = 0.0
    xla_compiles: int = 0
    recompiles: list[str] = field(default_factory=list)  # why, in the user's words
    # compiled again once as the optimizer's state appeared: why, no fix to give
    state: list[str] = field(default_factory=list)
    # compiled again for another object (an optimizer made again): why
    objects: list[str] = field(default_factory=list)
    dynamic: list[str] = field(default_factory=list)
    breaks: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    # Dynamo stopped compiling it (its recompile limit): why, and the XLA compiles of the
    # eager code it runs from then on.
    gave_up: str = ""
    eager_compiles: int = 0

    def lines(self) -> list[str]:
        head = (
            f"{self.name} ({self.where})"
            + (f", called at {', '.join(self.called_at)}" if self.called_at else "")
            + f": {self.graphs} graph{'s' if self.graphs != 1 else ''} compiled by Dynamo "
            f"({format_seconds(self.seconds)})"
        )
        if self.xla_compiles:
            head += f", {self.xla_compiles} XLA compile{'s' if self.xla_compiles != 1 else ''}"
        out = [head]
        out += [f"recompiled: {why}" for why in self.recompiles]
        out += [f"compiled again: {why}" for why in self.state]
        out += [f"recompiled: {why}" for why in self.objects]
        if self.objects:
            out.append("each new object is a new graph: make the objects once and reuse them")
        if self.dynamic:
            out.append(f"compiled as dynamic: {', '.join(self.dynamic)}")
        elif self.recompiles:
            out.append(
                "each new shape is a new graph (torch_xla turns Dynamo's automatic dynamic "
                "shapes off): pad or bucket the inputs to a few sizes"
            )
        if self.gave_up:
            n = self.eager_compiles
            out.append(
                f"Dynamo stopped compiling it ({self.gave_up}) and runs it eagerly from then "
                f"on: {n} XLA compile{'s' if n != 1 else ''} of its eager code since"
            )
        out += self.breaks
        out += [f"Dynamo could not compile it: {f}" for f in self.failures]
        return out


def compiled_functions(compiled) -> list[CompiledFunction]:
    """Group a report's Dynamo compiles (tracking DynamoCompile) by function, in order."""
    groups: dict[tuple[str, str], CompiledFunction] = {}
    for c in compiled:
        resumed = _RESUME.match(c.function)
        name = resumed.group(1) if resumed else c.function
        key = (c.file, name)
        group = groups.get(key)
        if group is None:
            where = place_text(Frame(c.file, c.first_line, "<module>"))
            group = groups[key] = CompiledFunction(name, where)
        line = getattr(c, "line", None)
        if line is not None:
            at = place_text(line).split(" (")[0]
            if at not in group.called_at:
                group.called_at.append(at)
        group.seconds += c.seconds
        if getattr(c, "gave_up", False):  # no graph: the frame runs eagerly from now on
            group.gave_up = f"{c.failed}; last: {c.why()}" if c.recompile else c.failed
            group.eager_compiles += c.xla_compiles
            continue
        group.graphs += 1
        group.xla_compiles += c.xla_compiles
        if c.recompile:
            kept = group.state if c.state_appeared else group.recompiles
            (group.objects if c.new_object else kept).append(c.why())
        group.dynamic += [d for d in c.dynamic if d not in group.dynamic]
        for b in c.graph_breaks:
            at = place_text(Frame(b.file, b.line, "<module>"))  # the place, no function name
            words = f"graph break at {at}: {b.reason}"
            if b.explanation:
                words += f" ({b.explanation})"
            words = _KWARGS_FLAG.sub("", words)
            if words not in group.breaks:
                group.breaks.append(words)
        if c.failed:
            group.failures.append(c.failed)
    return list(groups.values())


def compiled_text(compiled) -> list[str]:
    """The section as text lines ([] when Dynamo compiled nothing)."""
    functions = compiled_functions(compiled)
    if not functions:
        return []
    out = ["compiled functions (torch.compile):"]
    for f in functions:
        first, *rest = f.lines()
        out.append(f"  {first}")
        out += [f"      {line}" for line in rest]
    return out


def compiled_html(compiled) -> str:
    """The section as HTML ("" when Dynamo compiled nothing); every string escaped."""
    functions = compiled_functions(compiled)
    if not functions:
        return ""
    items = []
    for f in functions:
        first, *rest = f.lines()
        details = "".join(
            f"<br><span style='color:{_colour(line)}'>{escape(line)}</span>" for line in rest
        )
        items.append(escape(first) + details)
    return bullets("tpunb-compiled", "compiled functions (torch.compile)", items)


def _colour(line: str) -> str:
    if line.startswith(("recompiled", "Dynamo could not", "Dynamo stopped")):
        return RED
    if line.startswith("graph break"):
        return WARN
    return MUTED
