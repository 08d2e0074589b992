"""What earns a verdict or a hint: the one place tpu_nb judges a run.

Facts are always shown; this module decides which of them call for advice, the way a TPU
engineer reading the report over the user's shoulder would. The report's findings, the
summary line's verdict and the live dashboard all ask it.

- **Compiles.** Compiles are judged per site: the tracked code's line plus the frame below it
  that synced, read or compiled (a library's loop inside `trainer.train()` syncs at its data
  loader and reads at its mask check, two sites of one cell line, as a loop written in the cell
  would on two lines; its reads after the loop are other sites again, so they cannot make the
  loop's site look settled). Each site's compiles are read in the order it ran (its syncs
  and value reads, counted by the recorder). The site's first graph, and the graphs of its
  next steps while state appears (gradients, optimizer state: more device data, or ops
  only the first step ran) are its *warm-up*, a one-time cost. A site that then ran at least
  twice without compiling has *settled*: the other graphs it compiled are a bounded set,
  each compiled once then cached (buckets, both sides of a branch, each tensor of a
  checkpoint) — facts, no advice. A site still compiling at its latest calls *recompiles*
  (advice: fixed shapes, or the library's setting that fixes them); a site whose
  successive graphs each add the same ops again has a *growing* graph (advice: a
  sync at the end of the step). Graphs compiled in one step (or one call, when the run has no
  syncs) are that step's, never a recompilation.
- **Reads.** A device→host read is worth fixing only when it repeats per step inside the
  loop. A read once per cell, every few steps, after the loop or inside a step closure
  (`xm.add_step_closure`) is a fact without advice.
- **The verdict** describes the steady state: the steps after the warm-up, without the
  one-time compiles. With fewer than `MIN_STEADY_STEPS` such steps there is no verdict, and
  the report says why. It is about the chip the run is judged for: off a TPU, XLA:CPU's
  execution is the CPU's, so a host- or CPU-bound step is judged by the host time measured
  here against the target chip's projected device time (tracking._cost).
"""

from __future__ import annotations

import operator
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import reduce
from typing import Any

from tpu_nb.runtime.metrics._compile_log import CompileEvent, Frame
from tpu_nb.runtime.sources import short_path
from tpu_nb.runtime.tracking import _anatomy as anatomy
from tpu_nb.runtime.tracking import _cost as cost
from tpu_nb.runtime.tracking import _device_data as device_data
from tpu_nb.runtime.tracking import _dynamo as dynamo
from tpu_nb.runtime.tracking import _libraries as libraries
from tpu_nb.runtime.tracking._provenance import lowered_on_tpu, user_op
from tpu_nb.runtime.tracking._store import store
from tpu_nb.runtime.units import format_place, format_seconds

MIN_STEADY_STEPS = anatomy.MIN_STEADY_STEPS
_SETTLED_CALLS = 2  # calls of a line without a compile, after its last one: settled
_MAX_WARM_UP = 3  # graphs (the first included) that state appearing can explain
_MIN_GROWING = 3  # graphs in a row, each adding the same ops: a growing graph
_GROWTH_TOLERANCE = 20  # additions differing in one op in 20 or fewer are the same work
_PER_STEP_READS = 3  # a read in at least this many steps (and a quarter of them) is per step

# What a compile of a line is, as the policy sees it.
FIRST, WARM_UP, VARIANT = "first", "warm-up", "variant"
RECOMPILE, GROWING, UNSETTLED = "recompile", "growing", "unsettled"
# A graph of state appearing that the next step compiled again: a line that never settled
# has no steady step's graph.
STATE = "state"
# The run's first sync also ran work earlier cells left pending: its graph is not the line's.
EARLIER = "earlier"
# A compiled function's first graph of its inputs' pending work (torch_xla.compile runs it
# before the function's): compiled once, then cached as the function's graph is.
INPUTS = "inputs"
ONE_TIME = frozenset((FIRST, WARM_UP, STATE, VARIANT, EARLIER, INPUTS))


@dataclass(frozen=True)
class LinePattern:
    """How one line's compiles behaved over the run."""

    key: tuple  # the site (provenance.Site.key): (file, line) of the tracked code, then
    # (file, line) of the library or helper frame below it that did it, when not the line
    kind: str  # "once", "warm-up", "variants", "recompiling", "growing", "unsettled"
    graphs: int  # graphs it compiled in the run
    calls: int  # syncs and value reads it made (0: not counted)
    calls_after: int  # of those, after its last compile
    kinds: tuple[str, ...]  # per compile of the line, in order: FIRST, WARM_UP, ...
    progression: str = ""  # one dimension changing: "dim 0: 9 → 10 → … → 19 (11 shapes)"
    growth: str = ""  # growing: the ops each graph added, "aten::mm ×1, aten::tanh ×1"
    grower: Any = None  # growing: the Frame whose ops accumulate, when the graph says
    site: Any = None  # the provenance.Site of its latest compile (naming the site)
    # a first step's graph unlike the steady step's: why, as its graphs show it ("" : not
    # known, or no such pair)
    first_why: str = ""
    # the ops the captured graphs of its tracked line ran (at every site under it): what a
    # library's advice tells apart (a static cache's in-place update in generate()'s graphs)
    ops: frozenset = frozenset()
    # a function of the user's that a library calls under its line synced and compiled
    # there (a LogitsProcessor syncing once per token inside generate())
    user_syncs: bool = False
    # its last compile came at a sync where the tracked code's tensors (and the tensors of
    # the dicts, lists and tuples it names) had the shapes of the line's sync before
    same_shapes: bool = False
    # its recompiles' graphs are the same op for op, shape for shape: what changed is a
    # Python number they hold (an int index into a device tensor), not a shape
    baked: bool = False

    @property
    def flagged(self) -> bool:
        """Whether this line's compiles call for advice (recompiling or growing)."""
        return self.kind in ("recompiling", "growing")

    @property
    def last_call_only(self) -> bool:
        """Recompiling only at its last call (a shorter last batch, typically)."""
        kinds = self.kinds
        return kinds.count(RECOMPILE) == 1 and kinds[-1] == RECOMPILE and self.calls_after == 0

    @property
    def via(self) -> str:
        """The frame below the line that compiled, when the site is not the line itself."""
        return self.site.via if self.site is not None and len(self.key) > 2 else ""


@dataclass(frozen=True)
class ReadPattern:
    """How one read site behaved: per step in the loop (worth fixing) or not."""

    per_step: bool
    why: str  # "in 30 of 30 steps", "once, after the loop", "in a step closure", ...
    # per step, but its waits cannot cost a quarter of a step on the chip judged for (the
    # host's work and the device's are too unlike for either to hide the other): no advice
    minor: bool = False

    @property
    def advised(self) -> bool:
        """Whether the read earns the read advice."""
        return self.per_step and not self.minor


NOT_PER_STEP = ReadPattern(False, "")


@dataclass(frozen=True)
class Judgement:
    """The policy's decisions about one run (`RunReport.judgement`)."""

    compile_kinds: tuple[str, ...] = ()  # per RunReport.compile_events entry ("" : not a line's)
    lines: dict = field(default_factory=dict)  # site key (LinePattern.key) -> LinePattern
    reads: dict = field(default_factory=dict)  # Occurrence.order -> ReadPattern
    verdict: Any = None  # anatomy.Verdict of the steady state, or None
    note: str = ""  # why there is no verdict, or what the verdict leaves out
    one_time_compiles: int = 0
    # what each compile counted in one_time_compiles is, as the one-time cost names it
    one_time_kinds: tuple[str, ...] = ()
    one_time_seconds: float = 0.0  # compile time of the warm-up and the settled variants
    steady_steps: int = 0
    # the host sampler's lines over the steady steps alone (what the verdict names); () when
    # the verdict is about every step, or there is none
    steady_lines: tuple = ()
    # judged for a target chip off it: the syncs' time here was mostly XLA:CPU running the
    # steps, which the target runs on the chip; their lines are left out of the host lines
    syncs_left_out: bool = False
    cost: Any = None  # cost.StepCost of a steady step, with its times
    # a loop whose steady steps are judged (or would be, with more steps): only then are its
    # first steps' compiles a one-time cost worth a line
    loop: bool = False

    @property
    def recompiled(self) -> bool:
        return any(p.flagged for p in self.lines.values())

    def one_time_cost(self) -> str:
        """ "one-time cost: 2 compiles (444 ms): the first step's graph, the steady step's; the
        verdict is about the 18 steady steps": the compiles counted as one-time, by what each
        is (`one_time_kinds`). A step that also recompiled is a steady step, its
        first-of-a-kind compiles with it: they are the verdict's, not named here."""
        named = []
        for kind, (one, many) in _ONE_TIME.items():
            count = self.one_time_kinds.count(kind)
            if count:
                named.append(
                    one if count == 1 else many if kind == "variant" else f"{many} ({count})"
                )
        n = self.one_time_compiles
        text = f"one-time cost: {n} compile{'' if n == 1 else 's'}"
        text += f" ({format_seconds(self.one_time_seconds)})"
        if named:
            text += ": " + ", ".join(named)
        if self.verdict is not None and self.steady_steps:
            text += f"; the verdict is about the {self.steady_steps} steady steps"
        return text


# The kinds of one-time compiles, as the one-time cost names them.
_ONE_TIME = {  # (one compile, several)
    "first": ("the first step's graph", "the first step's graphs"),
    "warm-up": ("the steady step's", "the steady step's graphs"),
    "state": ("a graph as state appeared", "graphs as state appeared"),
    "later": ("a graph first needed in a later step", "graphs first needed in a later step"),
    "variant": ("another graph, compiled once", "other graphs, each compiled once"),
    "earlier": ("work earlier cells left pending", "work earlier cells left pending"),
    "inputs": ("a graph of a compiled function's inputs", "graphs of a compiled function's inputs"),
    "after": ("a graph after the loop's last sync", "graphs after the loop's last sync"),
}


# -- compiles per line ---------------------------------------------------------------------


def site_key(event: CompileEvent) -> tuple | None:
    """The site a compile belongs to (its recorded Site.key: the tracked code's line and the
    frame below it that did it), else the log's innermost user frame."""
    site = event.site
    return site.key if site is not None and site.line is not None else line_key(event)


def line_key(event: CompileEvent) -> tuple[str, int] | None:
    """The tracked code's line a compile belongs to (its recorded site), else the log's
    innermost user frame."""
    site = event.site
    frame = site.line if site is not None and site.line is not None else event.user_frame
    return (frame.file, frame.line) if frame is not None else None


def classify_line(
    key: tuple, events: list[CompileEvent], calls: int, *, by_call: bool
) -> LinePattern:
    """The pattern of one line's compiles (`events`, in order) over `calls` calls."""
    # when each compile happened: its step, or (a run without syncs) its line's call
    moments = [(e.call if by_call else e.step) or 0 for e in events]
    last_call = max((e.call for e in events if e.call is not None), default=None)
    calls_after = calls - 1 - last_call if calls and last_call is not None else 0
    graphs = [store.captured_graph(e) for e in events]
    growth, grower = _growth(graphs)
    if growth:
        kinds = tuple(FIRST if i == 0 else GROWING for i in range(len(events)))
        return LinePattern(
            key, "growing", len(events), calls, calls_after, kinds, "", growth, grower
        )
    first_moment = moments[0] if moments else 0
    warm = _warm_up_moments(events, moments, graphs)
    # a compile after the first step's and the warm-up's
    if calls_after >= _SETTLED_CALLS:  # settled
        later = VARIANT
    elif calls and calls < 4:
        later = UNSETTLED
    else:
        later = RECOMPILE
    # a warm-up graph the next step did not run again (it compiled another) is no steady
    # step's; buckets in rotation come back to it
    unused = {m for m in warm if m + 1 in moments and m + 1 not in warm and later != VARIANT}
    kinds = tuple(
        FIRST if m == first_moment else (STATE if m in unused else WARM_UP if m in warm else later)
        for m in moments
    )
    # the line's kind: its most telling compile
    kind = next((name for k, name in _LINE_KINDS if k in kinds), "once")
    why = first_step_why(*_first_and_steady(graphs, kinds)) if WARM_UP in kinds else ""
    return LinePattern(
        key,
        kind,
        len(events),
        calls,
        calls_after,
        kinds,
        progression(graphs),
        first_why=why,
        same_shapes=bool(events) and events[-1].same_shapes,
        baked=kind == "recompiling" and _only_values_changed(graphs, kinds),
    )


def _only_values_changed(graphs: list, kinds: tuple) -> bool:
    """Whether each recompile whose graph and the recompile's before it were both captured
    ran the same IR, op for op and shape for shape, under another hash (at least one such
    pair; the first step's graph can also hold work left before the loop)."""
    pairs = [
        (a, b)
        for a, b, k, j in zip(graphs, graphs[1:], kinds, kinds[1:], strict=False)
        if k == j == RECOMPILE and a is not None and b is not None
    ]
    return bool(pairs) and all(a.hash != b.hash and not b.diff(a) for a, b in pairs)


def _first_and_steady(graphs: list, kinds: tuple) -> tuple:
    """The first step's graph that the steady step's (the first warm-up graph) is the next
    version of, and that graph: of the first step's graphs at the line (a library's loader
    syncs once for earlier work, then for the step), the one sharing the most ops with it."""
    steady = graphs[kinds.index(WARM_UP)]
    first = [g for g, k in zip(graphs, kinds, strict=True) if k == FIRST and g is not None]
    if steady is None or not first:
        return None, None
    ops = op_counts(steady)
    return max(first, key=lambda g: sum((op_counts(g) & ops).values())), steady


_LINE_KINDS = (
    (RECOMPILE, "recompiling"),
    (UNSETTLED, "unsettled"),
    (VARIANT, "variants"),
    (WARM_UP, "warm-up"),
)


def first_step_why(a, b) -> str:
    """Why a line's first step compiled a graph unlike its next step's, in the words the
    graphs' facts allow: state the first step created (more inputs later, and either new
    tensors only the first graph filled, as an optimizer's first step() makes its moment
    estimates, or ops only the later graphs run, as a momentum buffer's update), ops only the
    first graph ran (work that was pending when the loop started, or code only the first
    step runs: the graphs cannot tell which), values the first graph computed that later
    steps read as data (more inputs, the same ops); "" when the graphs do not say."""
    if a is None or b is None:
        return ""
    only_first, only_later = op_counts(a) - op_counts(b), op_counts(b) - op_counts(a)
    n = data_inputs(b) - data_inputs(a)  # more inputs in the later graph
    more = f"{n} more device data node{'s' if n != 1 else ''}"
    if n > 0 and only_first and set(only_first) <= _FILLS:
        return (
            "the first step created state that later steps read and update: its graph "
            f"filled new tensors ({_counted(only_first, 3)}) that later steps' graphs read: "
            f"{more} (optimizer state such as Adam's moment estimates, made at its first "
            "step())"
        )
    if only_first:
        return (
            f"the first step's graph also ran {_counted(only_first, 3)}, which later steps do "
            "not: work still pending when the loop started, or code only the first step runs"
        )
    if n > 0 and only_later:
        return (
            f"the first step created state that later steps read and update ({more}, and "
            "ops only they run: optimizer state such as momentum buffers)"
        )
    if n > 0:
        return (
            f"{n} tensor{'s' if n != 1 else ''} the first step's graph computed "
            f"{'are' if n != 1 else 'is'} device data for the later steps (a value made "
            "before the loop and still pending when it started, such as a torch.zeros)"
        )
    return ""


# Ops that fill a new tensor from a value (torch.zeros_like, torch.full): in torch_xla's IR a
# constant expanded to the tensor's shape.
_FILLS = frozenset({"aten::expand", "aten::full", "aten::fill", "aten::zeros", "aten::ones"})


def _warm_up_moments(events, moments, graphs) -> set[int]:
    """The moments after the first whose graph differs from the next as state appearing
    does (more inputs, other outputs, ops only it ran), up to _MAX_WARM_UP graphs in all,
    at consecutive moments: a training loop's first steps."""
    distinct = sorted(set(moments))
    warm: set[int] = set()
    if len(distinct) < 2:
        return warm
    at = {m: i for i, m in reversed(list(enumerate(moments)))}  # a moment's first compile
    for prev, cur in zip(distinct, distinct[1:], strict=False):
        p, c = at[prev], at[cur]
        if len(warm) + 1 >= _MAX_WARM_UP or cur != prev + 1:
            break
        if not _state_appeared(events[p], events[c], graphs[p], graphs[c]):
            break
        warm.add(cur)
    return warm


def _state_appeared(first: CompileEvent, second: CompileEvent, a, b) -> bool:
    """Whether `first`'s graph differs from `second`'s as an earlier step's does: other
    graph inputs or outputs (state created), or ops only the earlier graph ran (a model's
    initialisation pending when the loop started). Same ops with other shapes is not."""
    known = first.inputs is not None and second.inputs is not None
    if known and (first.inputs, first.outputs) != (second.inputs, second.outputs):
        return True
    return a is not None and b is not None and bool(op_counts(a) - op_counts(b))


def _site_ops(events) -> frozenset:
    """The ops of the events' captured graphs (those tpu_nb kept)."""
    graphs = [g for g in map(store.captured_graph, events) if g is not None]
    return frozenset(n.op for g in graphs for n in g.nodes)


def _in_user_function(site) -> bool:
    """Whether a function of the user's (not the tracked line itself, nor a library's) did
    what happened at `site`."""
    return site is not None and site.user is not None and site.library is None


def op_counts(graph) -> Counter:
    """A graph's ops by count, without its inputs and constants."""
    return Counter(n.op for n in graph.nodes if n.kind not in ("data", "constant"))


def data_inputs(graph) -> int:
    """A graph's device data nodes: the tensors on the device it reads (torch_xla's count of
    a graph's inputs, in its compile log, can differ: this is the IR's)."""
    return sum(1 for n in graph.nodes if n.kind == "data")


def _counted(ops: Counter, shown: int) -> str:
    return ", ".join(f"{op} \u00d7{n}" for op, n in ops.most_common(shown))


def line_growth(graphs: list) -> str:
    """The ops each of a line's graphs (captured, in order; None where not) adds to the one
    before, when its latest graphs grow that way; else ""."""
    return _growth(graphs)[0]


def _growth(graphs: list) -> tuple[str, Any]:
    """When the line's graphs, in order, each add the same ops to the previous one (at least
    _MIN_GROWING in a row, ending with the latest captured): those ops, and where they were
    made."""
    tail = [g for g in graphs if g is not None][-_MIN_GROWING:]
    if len(tail) < _MIN_GROWING:
        return "", None
    deltas = []
    for a, b in zip(tail, tail[1:], strict=False):
        ops_a, ops_b = op_counts(a), op_counts(b)
        if ops_a - ops_b or not ops_b - ops_a:
            return "", None
        deltas.append(ops_b - ops_a)
    if any(not _about_the_same(d, deltas[0]) for d in deltas):
        return "", None
    common = reduce(operator.and_, deltas)
    return _counted(common, 4), _maker(tail[-1], common)


def _about_the_same(a: Counter, b: Counter) -> bool:
    """Whether two graphs' additions are the same step's work: equal, or for a step of many
    ops, all but a few (generate()'s last token pads its attention mask no more, one op of
    a forward's 150)."""
    differ = sum(((a - b) + (b - a)).values())
    return differ * _GROWTH_TOLERANCE <= min(sum(a.values()), sum(b.values()))


def _maker(graph, ops: Counter):
    """The user frame that made most nodes of the repeated ops, if the graph says."""
    frames = (n.user_frame for n in graph.nodes if n.op in ops)
    where = Counter((f.file, f.line, f.function) for f in frames if f is not None)
    return Frame(*where.most_common(1)[0][0]) if where else None


def progression(graphs: list) -> str:
    """One dimension of one op taking other values across a line's graphs: "aten::expand
    dim 0: 9 → 10 → … → 19 (11 shapes)"; "" when the graphs differ otherwise or were not
    captured. The op and dimension come from the first pair of graphs that differ only in
    shapes; each graph's value is read from its node of that op at the same rank."""
    known = [g for g in graphs if g is not None]
    pairs = enumerate(zip(known, known[1:], strict=False))
    found = next(((i, c) for i, (a, b) in pairs if (c := _first_dim_change(a, b))), None)
    if found is None:
        return ""
    start, (op, dim, rank, count) = found
    values: list[str] = []
    # From the first pair that differs only in shapes on: an earlier graph of other ops (a
    # first step that also split or initialised data) holds other nodes of that op.
    for g in known[start:]:
        nodes = [n for n in g.nodes if n.op == op]
        if len(nodes) != count:  # other work in that graph (a first step's initialisation)
            continue
        dims = shape_dims(nodes[rank].shape)
        if dims is not None and len(dims) > dim:
            value = dims[dim].strip()
            if not values or values[-1] != value:  # a warm-up graph of the same shape
                values.append(value)
    distinct = len(dict.fromkeys(values))
    if distinct < 2:
        return ""
    shown = values if len(values) <= 6 else values[:3] + ["\u2026"] + values[-2:]
    arrow = " \u2192 "
    among = f" in the {len(values)} graphs tpu_nb compared" if len(values) < len(graphs) else ""
    return f"{op} dim {dim}: {arrow.join(shown)} ({distinct} shapes{among})"


def _first_dim_change(a, b) -> tuple[str, int, int, int] | None:
    """(op, dimension, rank among the graph's nodes of that op, their number) where two
    graphs with the same ops first differ in one dimension of a shape."""
    diff = b.diff(a)
    if not diff.aligned:
        return None
    for change in diff.causes:
        x, y = change.before, change.after
        if x is None or y is None or x.shape == y.shape:
            continue
        da, db = shape_dims(x.shape), shape_dims(y.shape)
        if da is None or db is None or len(da) != len(db):
            return None
        moved = [i for i, (p, q) in enumerate(zip(da, db, strict=True)) if p != q]
        if len(moved) != 1:
            return None
        same_op = [n.id for n in b.nodes if n.op == y.op]
        return y.op, moved[0], same_op.index(y.id), len(same_op)
    return None


def shape_dims(shape: str) -> list[str] | None:
    """The dimensions of a shape like "f32[8,64]" as text, or None for a tuple shape."""
    if "[" not in shape or shape.startswith("("):
        return None
    inner = shape[shape.index("[") + 1 : shape.index("]")]
    return inner.split(",") if inner else []


# -- reads ---------------------------------------------------------------------------------


def reads_repeat(repeats: int, steps: int) -> bool:
    """Whether reads made in `repeats` steps of `steps` (0: a loop without syncs, each call an
    iteration) are per step: every step, every other step or every few. Logging every tenth
    step is not worth a change."""
    return repeats >= _PER_STEP_READS and (not steps or repeats * 4 >= steps)


def classify_read(occ, run_steps: int) -> ReadPattern:
    """Whether a read site (a provenance.Occurrence of kind "read") repeats per step."""
    if getattr(occ, "in_sync", False):
        return ReadPattern(False, "in a step closure, after the step's graph ran")
    # no sync at all: each call is an iteration of the loop
    repeats, of = (occ.calls, 0) if run_steps == 0 else (occ.steps, run_steps)
    if reads_repeat(repeats, of):
        return ReadPattern(True, f"in {repeats} of {of} steps" if of else "with no sync in between")
    if occ.first_step >= run_steps > 0:
        return ReadPattern(False, "after the loop's last sync")
    if repeats == 1:
        return ReadPattern(False, "once")
    return ReadPattern(False, f"in {repeats} of {of} steps" if of else f"{repeats} times")


# -- the run -------------------------------------------------------------------------------


def judge(report) -> Judgement:
    """The policy's decisions about a run's facts (a RunReport not judged yet: compile events
    placed, the recorder's occurrences and counts, the anatomy without its verdict)."""
    events = list(report.compile_events)
    # the user's steps (the recorder counts no sync with nothing to run, nor a library's
    # logging sync inside a step: tracking._anatomy's steps)
    syncs = report.syncs
    by_line: dict[tuple, list[int]] = {}
    inputs: dict[tuple, list[int]] = {}  # a compiled function's inputs' graphs, per site
    joined = _joined_by_earlier(report, events)
    for i, e in enumerate(events):
        key = site_key(e)
        if key is not None and i not in joined and e.kind != "dynamo":
            (inputs if dynamo.inputs_sync(e) else by_line).setdefault(key, []).append(i)
    # A compiled function's graphs (torch.compile): one-time, unless Dynamo compiled the
    # frame again because a guard failed (what it saw change is the finding's fact), other
    # than the one on an optimizer's state, which fails once as the first step fills it.
    kinds = [
        (
            STATE
            if dynamo.state_appeared(e)
            else RECOMPILE
            if dynamo.what_changed(e)[:1] and _guard_failed(e)
            else FIRST
        )
        if e.kind == "dynamo"
        else (EARLIER if i in joined else "")
        for i, e in enumerate(events)
    ]
    lines = {}
    under: dict[tuple, list[int]] = {}  # tracked line -> its sites' compiles
    for key, indexes in by_line.items():
        under.setdefault(key[:2], []).extend(indexes)
    for key, indexes in by_line.items():
        calls = report.site_calls.get(key, report.line_calls.get(key, 0) if len(key) == 2 else 0)
        pattern = classify_line(key, [events[i] for i in indexes], calls, by_call=syncs == 0)
        line = [events[i] for i in under[key[:2]]]
        lines[key] = replace(
            pattern,
            site=events[indexes[-1]].site,
            ops=_site_ops(line),
            user_syncs=any(e.kind == "sync" and _in_user_function(e.site) for e in line),
        )
        for i, kind in zip(indexes, pattern.kinds, strict=True):
            kinds[i] = kind
    for key, indexes in inputs.items():  # as a line's own graphs are, apart from them
        calls = report.site_calls.get(key, report.line_calls.get(key, 0) if len(key) == 2 else 0)
        pattern = classify_line(key, [events[i] for i in indexes], calls, by_call=syncs == 0)
        for i, kind in zip(indexes, pattern.kinds, strict=True):
            kinds[i] = INPUTS if kind == FIRST else kind
    reads = {
        occ.order: classify_read(occ, syncs) for occ in report.occurrences if occ.kind == "read"
    }
    judgement = Judgement(tuple(kinds), lines, reads)
    judged = _with_verdict(judgement, report, events)
    step_cost = report.cost
    if judged.cost is None and step_cost is not None:  # no steady state: the steps that
        quiet = [s for s in report.steps if not s.compiles]
        judged = replace(judged, cost=cost.timed(step_cost, quiet))  # did not compile
    return judged


def _one_time_kinds(events, kinds, counted: tuple[int, ...], report) -> tuple[str, ...]:
    """What each one-time compile is: its kind, except for a line's first graph compiled
    after the loop's last sync ("after": a read of the result, no step's graph) and a first
    graph compiled in a later step of the loop than its first ("later": a Trainer's first
    logging step, a hand loop's logging line every few steps), the loop's first step being
    the earliest of the lines it runs again (called more than once; a sync before the loop
    is no step of it). A read after the first step's sync counts in the next step: the
    first iteration reaches one step past the loop's first."""
    earliest: dict = {}
    for e in events:
        if e.step is not None:
            key = line_key(e)
            earliest[key] = min(earliest.get(key, e.step), e.step)
    looping = [step for key, step in earliest.items() if report.line_calls.get(key, 0) > 1]
    loop_start = min(looping, default=None)
    syncs = report.syncs or 0
    out = []
    for i in counted:
        kind, e = kinds[i], events[i]
        if kind == FIRST and syncs and e.step >= syncs:
            kind = "after"
        elif kind == FIRST and (
            e.step > earliest.get(line_key(e), e.step)
            or (loop_start is not None and e.step > loop_start + 1)
        ):
            kind = "later"
        out.append(kind)
    return tuple(out)


def _joined_by_earlier(report, events: list[CompileEvent]) -> set[int]:
    """The compiles of the run's first sync when earlier work was pending as the run started:
    that sync ran it with the run's first step, in one graph unlike the line's own."""
    steps = [e.step for e in events if e.trigger == "sync" and e.step is not None]
    if report.earlier is None or not steps:
        return set()
    first = min(steps)
    at_first = [i for i, e in enumerate(events) if e.trigger == "sync" and e.step == first]
    # the first sync's own: a device loader's before its first batch, then the first step's
    # end, are two syncs of one step
    head = events[at_first[0]]
    joined = {i for i in at_first if events[i].call == head.call and events[i].site == head.site}
    # torch_xla.compile(fn) ran that work apart, in its inputs' graph: fn's own is the line's
    apart = {i for i in joined if dynamo.pending_first(events[i])}
    # the Dynamo bridge syncs each compiled graph's inputs apart, the forward's and then the
    # backward's (its gradient seed, made by this step's backward()): the first ran it
    inputs = sorted(i for i in joined if dynamo.inputs_sync(events[i]))
    return apart or set(inputs[:1]) or joined


def _guard_failed(event: CompileEvent) -> bool:
    return dynamo.what_changed(event)[0].startswith("Dynamo compiled")


def _with_verdict(judgement: Judgement, report, events) -> Judgement:
    # Steps whose compiles are all one-time (first, warm-up, once-each graphs) are left out
    # of the steady state; a step that also recompiled stays in.
    by_step: dict[int, list[str]] = {}
    for event, kind in zip(events, judgement.compile_kinds, strict=True):
        if event.step is not None and kind:
            by_step.setdefault(event.step, []).append(kind)
    one_time_steps = {step for step, kinds in by_step.items() if all(k in ONE_TIME for k in kinds)}
    one_time_events = tuple(
        i
        for i, (event, kind) in enumerate(zip(events, judgement.compile_kinds, strict=True))
        if kind and event.step in one_time_steps
    )
    a = report.anatomy
    steps = getattr(a, "steps", ())
    ran = (*steps, a.tail) if getattr(a, "tail", None) else tuple(steps)
    seconds = sum(s.compile for s in ran if s.index in one_time_steps)
    judgement = replace(
        judgement,
        one_time_compiles=len(one_time_events),
        one_time_kinds=_one_time_kinds(events, judgement.compile_kinds, one_time_events, report),
        one_time_seconds=seconds,
    )
    growing = [p for p in judgement.lines.values() if p.kind == "growing"]
    if growing:
        grown = report.cost
        if grown is not None:
            grown = replace(grown, notes=(*grown.notes, cost.SPANS_STEPS))
        return replace(judgement, verdict=_growing_verdict(growing[0]), cost=grown, loop=True)
    if not isinstance(a, anatomy.Anatomy) or not steps:
        return judgement
    if type(report.error).__name__ == "RecompilationError":
        # --max-graphs stopped the loop at its first graph too many: the steps before it
        # are not the loop's steady state, and the error says what to do
        return replace(judgement, note="--max-graphs stopped the run before its steady state")
    steady = tuple(s for s in steps if s.index not in one_time_steps)
    blind = not events and not report.compile_analysis
    if blind:
        # No compile log: which compiles were a warm-up is not known. What is known: the steps
        # after the last one that compiled. Compiles in half the steps or more are a fact of
        # the steady state whatever their cause; fewer leave the steps after them to judge.
        compiled = [s.index for s in steady if s.compiles]
        if compiled and len(compiled) * 2 < len(steady):
            after = tuple(s for s in steady if s.index > max(compiled))
            unknown = (
                f"{len(compiled)} of the {len(steady)} steps compiled, and without the compile "
                "log (%tpu_setup before the first compile) whether those were the first "
                "steps' graphs or recompilation is not known"
            )
            if len(after) < MIN_STEADY_STEPS:
                return replace(judgement, steady_steps=len(after), note=unknown)
            steady = after
            last = f"the verdict is about the {len(after)} steps after the last one that compiled"
            judgement = replace(judgement, note=f"{unknown}; {last}")
    judgement = replace(judgement, steady_steps=len(steady))
    if len(steady) < MIN_STEADY_STEPS:
        first, more = len(steps) - len(steady), MIN_STEADY_STEPS - len(steady)
        so_far = _which_compiled(len(steps), first, sum(1 for s in steady if s.compiles))
        note = (
            f"too few steady steps to judge: {so_far}; a verdict needs {MIN_STEADY_STEPS} "
            f"steady steps (run {more} more)"
            if report.error is None
            else f"the run failed after {so_far}"  # more steps would fail alike
        )
        return replace(judgement, note=note, loop=report.error is None)
    lines = _steady_lines(a, steady, steps)
    verdict = anatomy.steady_verdict(steady, lines, a.tail)
    if verdict is not None and verdict.kind == "compile-bound":
        verdict = _recompile_verdict(verdict, judgement, report)
        if blind:
            verdict = replace(verdict, fix=BLIND_COMPILE_FIX)
    kept = lines if verdict is not None else ()
    verdict, timed = _for_target(verdict, report.cost, steady)
    waiting = _syncs_waiting(verdict, timed, steady)
    if waiting:
        kept = tuple(h for h in kept if h.kind != "sync")
        verdict = replace(verdict, lines=tuple(h for h in verdict.lines if h.kind != "sync"))
    stalls = _stalls(report, judgement, syncs=len(steps))
    waits = sum(o.calls for o in stalls) / max(1, len(steps))  # per step
    reads_only = stalls and all(o.kind == "read" for o in stalls)
    minor = _waits_cost_little(timed, waits) if reads_only else ""
    if minor:
        reads = dict(judgement.reads)
        for o in stalls:
            reads[o.order] = replace(
                reads[o.order], why=f"{reads[o.order].why}, {minor}", minor=True
            )
        judgement = replace(judgement, reads=reads)
    stalled = _stall_verdict(report, stalls, lines, steady, syncs=len(steps)) if not minor else None
    if stalled is not None and (verdict is None or verdict.kind != "compile-bound"):
        verdict, kept = stalled, ()
    if verdict is not None and verdict.kind == "host-bound" and _in_trainer(report):
        # torch_xla.compile(step_fn) is no fix a Trainer user can apply: Trainer's own is
        verdict = replace(verdict, fix=libraries.TRAINER_HOST_FIX)
    too_big = _memory_verdict(timed)
    if too_big is not None:  # how fast a step that cannot run goes is beside the point
        verdict, kept = too_big, ()
    return replace(
        judgement, verdict=verdict, steady_lines=kept, syncs_left_out=waiting, cost=timed, loop=True
    )


_STALL_SHARE = 0.25  # per-step reads and fallbacks taking this share of the steady time
_WAITING_SHARE = 0.1  # syncs waiting for XLA:CPU this share of it: left out of host lines
# What one wait may cost on a TPU beyond the device's work (launching the graph cut at the
# read, copying the value back, each well under a millisecond on a TPU VM): an allowance
# above what those take, so that reads are called minor only where no such cost could make
# them matter.
_WAIT_ALLOWANCE = 1e-3
# Off a TPU the chip's time for a step is known from below only (its roofline): a chip is
# taken to run it at no less than 1 % of its peak, and no slower than XLA:CPU here.
_SLOWEST_PACE = 100


def _stalls(report, judgement: Judgement, syncs: int) -> list:
    """The value reads and CPU fallbacks made in (nearly) every step, in the loop."""
    stalls = []
    for occ in report.occurrences:
        if occ.in_sync or occ.site is None or occ.site.line is None:
            continue
        if occ.kind == "read":
            per_step = judgement.reads.get(occ.order, NOT_PER_STEP).per_step
        elif occ.kind == "fallback" and not lowered_on_tpu(occ.what):  # not XLA:CPU's own
            per_step = reads_repeat(occ.steps, syncs)
        else:
            continue
        if per_step:
            stalls.append(occ)
    return stalls


def _waits_cost_little(timed, waits: float) -> str:
    """Why the `waits` per step for the device, at its value reads, cannot cost a quarter of
    a step on the chip judged for ("": they might). A wait stops the host until the device
    has run the step's pending work, so host and device work that could overlap run one
    after the other: removing the waits saves at most the shorter of the two, of their sum,
    and each wait's own cost (_WAIT_ALLOWANCE). Off a TPU the device's time is known only
    from its roofline up to that pace divided by _SLOWEST_PACE, and no slower than XLA:CPU
    here (anywhere up to XLA:CPU's time when the graphs' FLOPs were not counted): the saving
    is judged at its largest over that range."""
    if timed is None or timed.host_seconds is None or timed.measured_device_seconds is None:
        return ""
    host = timed.host_seconds
    low = high = timed.measured_device_seconds
    roofline = timed.device_seconds  # None: the graphs' FLOPs were not counted
    if not timed.on_chip:
        cpu = high
        low = min(roofline or 0.0, cpu)
        high = min(roofline * _SLOWEST_PACE, cpu) if roofline else cpu
    if not _waits_save_little(host, low, high, waits):
        return ""
    device = format_seconds(low)
    if not timed.on_chip:
        top = format_seconds(high)
        slowest = "1 % of its peak" if high < cpu else "XLA:CPU's time here"
        device = (
            f"{device} to {top} on a {timed.chip.name} (from its roofline to {slowest})"
            if roofline
            else f"up to {top}, XLA:CPU's here"
        )
    return _cost_little_why(host, high, device, waits)


def _waits_save_little(host: float, low: float, high: float, waits: float) -> bool:
    """Whether removing `waits` per step saves under a quarter of a step (_STALL_SHARE) at
    most, with `host` seconds of tracing and the device's work between `low` and `high`."""
    if low <= host <= high or host <= 0:
        return False  # the two may be alike: overlap could halve the step
    own = waits * _WAIT_ALLOWANCE
    return max((min(host, d) + own) / (host + d) for d in (low, high)) < _STALL_SHARE


def _cost_little_why(host: float, high: float, device: str, waits: float, so_far="") -> str:
    if host > high:
        return (
            f"but not what limits this loop{so_far}: tracing takes {format_seconds(host)} per "
            f"step, the device's work {device}, so waiting for it {_times(waits)} a step "
            "costs little"
        )
    return (
        f"but not what limits this loop{so_far}: the device's work takes {device} per step, "
        f"tracing only {format_seconds(host)}, so waiting for it {_times(waits)} a step "
        "costs little"
    )


def live_reads_cost_little(steps, reads: int, fallbacks: int = 0) -> str:
    """For a live view while a tracked run goes: why `reads` over its `steps` so far (in
    every step) cannot cost a quarter of a step on the chip judged for, as the run's
    judgement will say ("": they might, too few steps without compiles to tell, or
    `fallbacks` that also keep pace with the steps: an op on the host is a stall). Off a
    TPU the device's work has no roofline yet (the run's graphs are costed as it ends): it
    is taken anywhere from none to XLA:CPU's time here, a range wider than the judgement's."""
    if reads_repeat(fallbacks, len(steps)):
        return ""
    steady = [s for s in steps if not s.compiles]
    if len(steady) < 3 or not reads:
        return ""
    # (every read counts, not only those in every step: a larger allowance for the waits)
    waits = reads / len(steps)
    host, device = cost.step_times(steady)
    on_chip = cost.judged_chip()[1]
    low = device if on_chip else 0.0
    if not _waits_save_little(host, low, device, waits):
        return ""
    where = format_seconds(device) + ("" if on_chip else " on XLA:CPU here")
    return _cost_little_why(host, device, where, waits, " so far")


def _times(per_step: float) -> str:
    n = max(1, round(per_step))
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


def _stall_verdict(report, stalls: list, lines, steady, syncs: int):
    """read-bound when value reads or CPU fallbacks made in (nearly) every step stop the
    steady steps mid-way: each makes the host wait for the device's pending work, so a step
    runs as several graphs and tracing cannot overlap the device (on any chip; on a TPU each
    wait is also a round trip to the chip). It takes either the facts that the steady steps
    ran as several graphs each, or a measured share of their time (_STALL_SHARE: the host
    time sampled on the stalling lines, else the time inside reads)."""
    if not stalls or not steady:
        return None
    places = {(o.site.line.file, o.site.line.line) for o in stalls}
    if lines:
        share = sum(h.share for h in lines if (h.line.file, h.line.line) in places)
    else:
        wall = sum(s.wall for s in steady)
        share = sum(s.read for s in steady) / wall if wall > 0 else 0.0
    # graphs that at least half the steady steps ran (the lower median of an even count)
    graphs = sorted(s.executions for s in steady)[(len(steady) - 1) // 2]
    if share < _STALL_SHARE and graphs < 2:
        return None
    named = "; ".join(_stall_name(o, syncs) for o in stalls[:3])
    m = report.metrics
    split = f"each steady step ran as {graphs} graphs and " if graphs >= 2 else ""
    kinds = {o.kind for o in stalls}
    what = {"read": "value reads", "fallback": "CPU fallbacks"}
    stop = " and ".join(what[k] for k in ("read", "fallback") if k in kinds)
    reason = (
        f"{stop} stop the steps: {named}. The host waits for the "
        f"device at each, so {split}tracing cannot overlap the device's work "
        f"({m.executions} executions and {m.from_device_transfers} transfers to the host in "
        f"{syncs} steps); on a TPU each wait is also a round trip to the chip"
    )
    # a library's read (transformers' mask check) is fixed with the library's setting
    fixes = [libraries.read_fix(o.site) for o in stalls if o.kind == "read"]
    mine = {"read": "read-bound", "fallback": "fallback-bound"}
    fix = next(
        (f for f in fixes if f),
        anatomy.FIXES[mine[next(iter(kinds))] if len(kinds) == 1 else "read-and-fallback-bound"],
    )
    return anatomy.Verdict("read-bound", reason, fix)


def _stall_name(occ, syncs: int) -> str:
    where = place_name(occ.site.line)
    what = f"{occ.what} read" if occ.kind == "read" else f"{user_op(occ.what)} on the CPU"
    return f"{what} at {where} (in {occ.steps} of {syncs} steps)"


def _in_trainer(report) -> bool:
    """Whether the run's steps are transformers Trainer's (its syncs, reads or compiles)."""
    sites = [*(e.site for e in report.compile_events), *(o.site for o in report.occurrences)]
    return any(map(libraries.in_trainer, sites))


def _for_target(verdict, step_cost, steady):
    """Off a TPU, a host- or CPU-bound verdict judged for the target chip: the host's
    tracing, syncs and input measured here against the target's projected device time."""
    if step_cost is None:
        return verdict, None
    timed = cost.timed(step_cost, steady)
    if verdict is not None and timed.on_chip and timed.mfu is not None:
        return replace(verdict, reason=f"{verdict.reason}; MFU {timed.mfu:.0%}"), timed
    # (a read-bound share measured here is mostly reads waiting for XLA:CPU to run the step)
    if (
        verdict is None
        or timed.on_chip
        or verdict.kind not in ("host-bound", "cpu-bound", "read-bound")
    ):
        return verdict, timed
    if timed.device_seconds is None or timed.host_seconds is None:
        return verdict, timed
    host, device = format_seconds(timed.host_seconds), format_seconds(timed.device_seconds)
    if timed.host_seconds >= timed.device_seconds:
        kind, lines = "host-bound", verdict.lines if verdict.kind == "host-bound" else ()
        reason = f"tracing {host} per step, device work >= {device}"
    else:
        kind, lines = "device-bound", ()
        reason = f"device work >= {device} per step, tracing {host}"
    cpu = format_seconds(timed.measured_device_seconds)
    reason = f"judged for a {timed.chip.name}: {reason}; XLA:CPU ran it in {cpu}, the CPU's time"
    return replace(verdict, kind=kind, reason=reason, fix=anatomy.FIXES[kind], lines=lines), timed


def _memory_verdict(timed) -> anatomy.Verdict | None:
    """Off a TPU, a step that does not fit the target chip's HBM: it would stop there at its
    first compile or allocation, so its speed is not judged (a host-bound step's fix, a
    larger batch, would make it worse)."""
    fit = timed.memory if timed is not None and not timed.on_chip else None
    if fit is None or fit.fits is not False:
        return None
    chip = fit.chip
    device = " device" if chip.devices > 1 else ""
    at_least = " at least" if fit.temporaries is None or fit.unsized else ""
    reason = (
        f"judged for a {chip.name}: the step needs{at_least} {cost.format_bytes(fit.needed)} "
        f"of HBM, a {chip.name}{device} has {cost.format_bytes(chip.per_device().hbm_bytes)}: "
        "it would not run there, so its speed is not judged"
    )
    return anatomy.Verdict("does-not-fit", reason, fit.fix)


def _syncs_waiting(verdict, timed, steady) -> bool:
    """Whether a host-bound verdict judged for a target chip, off it, sees syncs that mostly
    waited while XLA:CPU ran the steps' graphs, for a tenth of the steady steps' time or more
    (less is no line worth leaving out): host time here, the target chip's device time
    there, and the verdict counts only their own part."""
    if verdict is None or verdict.kind != "host-bound" or timed is None or timed.on_chip:
        return False
    synced, waited = cost.sync_waits(steady)
    return waited > synced / 2 and waited > _WAITING_SHARE * sum(s.wall for s in steady)


def _steady_lines(a, steady, steps) -> tuple:
    """The host lines of the steady steps: the run's, less the warm-up steps' time and the
    code after the loop (the tail, but for its wait for the device: see
    anatomy.waiting_only)."""
    tail = anatomy.waiting_only(a.tail)
    after = a.tail is not None and (tail is None or tail.wall < a.tail.wall)
    if a.sampler is None or (len(steady) == len(steps) and not after):
        return a.host_lines
    kept = {s.index for s in steady}
    left_out = [(s.start, s.end) for s in steps if s.index not in kept]
    if a.tail is not None:
        left_out.append((a.tail.start, a.tail.end))
    wall = sum(s.wall for s in steady) + (tail.wall if tail else 0.0)
    if a.dropped_steps and steps:  # the sampler also counted the steps no longer kept
        wall += max(0.0, steps[0].start - a.sampler.started)
    return a.sampler.lines(wall, without=tuple(left_out))


def _recompile_verdict(verdict, judgement: Judgement, report):
    # a line within the graphs --max-graphs allows compiles what the user said to expect
    allowed = report.allowed_graphs
    flagged = [
        p for p in judgement.lines.values() if p.kind == "recompiling" and p.graphs > allowed
    ]
    if not flagged:
        return verdict
    where = ", ".join(_line_name(p) for p in flagged[:3])
    last_call = all(p.last_call_only for p in flagged)
    fix = recompile_fix(flagged[0], bool(report.device_datasets), last_call=last_call)
    return replace(verdict, reason=f"{verdict.reason}; recompiling at {where}", fix=fix)


def recompile_fix(pattern: LinePattern | None, datasets: bool, *, last_call: bool) -> str:
    """The fix for a line that recompiles (`pattern`, None when not known), for the verdict
    and the line's finding alike. `last_call`: only its last call did (a shorter last batch);
    `datasets`: the run has a dataset on the device (the batches' indices are what changes)."""
    site, ops = (pattern.site, pattern.ops) if pattern is not None else (None, frozenset())
    if last_call:  # unless the line's shape watch saw the same shapes at that call
        same = pattern is not None and pattern.same_shapes
        return libraries.last_call_fix(site) or (LAST_STEP_FIX if same else LAST_CALL_FIX)
    if datasets:
        return device_data.RECOMPILE_FIX
    if pattern is not None and pattern.baked:
        return BAKED_FIX
    syncs = pattern is not None and pattern.user_syncs
    return libraries.recompile_fix(site, ops, syncs) or RECOMPILE_FIX


def _growing_verdict(pattern: LinePattern):
    where = _line_name(pattern)
    made = f" (made by {place_name(pattern.grower)})" if pattern.grower is not None else ""
    return anatomy.Verdict(
        "compile-bound",
        f"the graph grows every step: no torch_xla.sync() cuts it, so {where} compiled "
        f"{pattern.graphs} graphs, each adding {pattern.growth}{made} to the last",
        libraries.growing_fix(pattern.site, pattern.ops, pattern.user_syncs) or GROWING_FIX,
    )


def _line_name(pattern: LinePattern) -> str:
    """The site's name: "In [3], line 2", then "→ transformers/trainer.py:2213 train" for a
    site below the line."""
    file, line = pattern.key[:2]
    return format_place(short_path(file), line) + (f" \u2192 {pattern.via}" if pattern.via else "")


def place_name(frame) -> str:
    """A frame's file (short) and line, as the report names a place."""
    return format_place(short_path(frame.file), frame.line)


NEW_OBJECT_FIX = (
    "the compiled function was given another object than the one it was compiled for (an "
    "optimizer or model made again): Dynamo compiles per object, and torch.optim's step is "
    "one code for every optimizer; make the objects once and reuse them"
)
BAKED_FIX = (
    "the graphs differ only in a Python number they hold, such as an int index into a "
    "device tensor (xs[i]): each new value compiles a new graph; index with a tensor on the "
    "device instead, xs[idx][0] with idx = torch.tensor([i]).to(device) (the index is then an "
    "input of one graph), or move each batch from the host (a DataLoader)"
)
RECOMPILE_FIX = (
    "keep shapes and Python values in the step fixed (pad or bucket the batch to a few "
    "fixed sizes); when a few graphs are what you expect, state how many with "
    "--max-graphs N, which accepts N per line and stops the cell at one more"
)
BLIND_COMPILE_FIX = (
    "the steps keep compiling; which lines compile and what changes between their graphs is "
    "not known without the compile log: run %tpu_setup before the first compile (restart the "
    "kernel first), then this cell again"
)
LAST_CALL_FIX = (
    "only the line's last call compiled a new graph: when that is a shorter last batch, "
    "use DataLoader(..., drop_last=True) or pad the last batch to the batch size"
)
LAST_STEP_FIX = (
    "only the line's last call compiled a new graph, though the tensors the cell names kept "
    "their shapes: its last step traced other work (a branch only it takes, such as a "
    "sampler's final step; or a shorter batch the cell does not name, which "
    "DataLoader(..., drop_last=True) avoids); compiled once, it runs from the cache when the "
    "cell runs again, so it costs only a first run"
)


GROWING_FIX = (
    "call torch_xla.sync() at the end of each step, so each step runs the same graph "
    "(reads such as .item() run the graph but do not cut it)"
)


def describe_pattern(p: LinePattern) -> str:
    """A line's compiles in one sentence, as the report says them."""
    n = p.graphs
    graphs = f"{n} graph{'s' if n != 1 else ''}"
    shapes = f" ({p.progression})" if p.progression else ""
    if p.kind == "growing":
        return (
            f"its graph grows: each of its {n} graphs adds {p.growth} to the one before "
            "(nothing syncs between them)"
        )
    if p.kind == "recompiling" and p.last_call_only:
        return f"{graphs}; the last at its last call, after {p.calls - 1} calls{shapes}"
    if p.kind == "recompiling":
        return (
            f"{graphs}, {p.kinds.count(RECOMPILE)} of them after its first steps, still "
            f"compiling at its latest calls{shapes}"
        )
    if p.kind == "unsettled":
        return (
            f"{graphs} in its first {p.calls} calls: too few calls to tell whether it keeps "
            f"compiling{shapes}"
        )
    # (its later calls compiled nothing; whether each ran a graph, the line does not know)
    after = "call" if p.calls_after == 1 else f"{p.calls_after} calls"
    cached = f", then no compile in its next {after}" if p.calls_after else ""
    if p.kind == "variants":
        return f"{graphs}, each compiled once{cached}{shapes}"
    if p.kind == "warm-up":
        why = f" ({p.first_why})" if p.first_why else " (why they differ is not known)"
        return f"{graphs}: the first step's and the steady step's{why}{cached}"
    return f"{graphs}{cached}"


def _which_compiled(steps: int, compiled: int, recompiled: int = 0) -> str:
    """ "4 steps: the first 2 compiled their graphs, 2 ran from the cache", in words that
    count (one step, none compiled, none cached; `recompiled`: later steps that compiled
    another graph)."""
    if steps == 1:
        ran = "which compiled its graph" if compiled or recompiled else "run from the cache"
        return f"1 step, {ran}"
    if compiled == steps:
        return f"{steps} steps, each compiling its graph"
    if compiled == recompiled == 0:
        return f"{steps} steps, all run from the cache"
    cached = steps - compiled - recompiled
    parts = [f"the first {compiled} compiled their graphs"] if compiled > 1 else []
    parts += ["the first step compiled its graph"] if compiled == 1 else []
    parts += [f"{cached} ran from the cache"] if cached else []
    if recompiled:
        parts.append(
            f"{recompiled} compiled another graph"
            if recompiled == 1
            else f"{recompiled} compiled other graphs"
        )
    return f"{steps} steps: " + ", ".join(parts)
