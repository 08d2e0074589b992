"""Which lines of a tracked run did what: compiles, recompiles, value reads, CPU fallbacks.

Every finding comes from a recorded fact, never from reading the source for likely calls:
compile events carry the site tpu_nb recorded at the sync or read that compiled them (the
tracked code's line, the helper and the library function in between; see provenance.py),
else torch_xla's own frames; value reads and CPU fallbacks are the calls whose counters moved,
each with its site. What a recompile changed comes from the pending graphs captured just
before the line's compiles (the op and shape that differ), else from the compile log's
input/output counts, and the finding says which.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from tpu_nb.runtime.metrics._compile_log import CompileEvent
from tpu_nb.runtime.tracking import _device_data as device_data
from tpu_nb.runtime.tracking import _dynamo as dynamo
from tpu_nb.runtime.tracking import _libraries as libraries
from tpu_nb.runtime.tracking import _policy as policy
from tpu_nb.runtime.tracking._pending import VALUE, assigned_lines, counted_ops
from tpu_nb.runtime.tracking._policy import Judgement
from tpu_nb.runtime.tracking._provenance import ON_TPU_LOWERED, lowered_on_tpu, user_op
from tpu_nb.runtime.tracking._report import FindingKind, LineFinding, RunReport
from tpu_nb.runtime.tracking._store import store

HOST_READ_HINT = (
    "a device value read on the host runs the graph that value needs, waits for it and "
    "copies it: keep values on the device (accumulate losses in a tensor, total += "
    "loss.detach()) and read once after the loop, or log with xm.add_step_closure (it "
    "runs at the next sync)"
)
# The same, for a loop without a sync: the reads are all that cuts its graph.
HOST_READ_NO_SYNC_HINT = (
    f"{HOST_READ_HINT}. This loop has no torch_xla.sync(): without the read nothing cuts its "
    "graph, which then grows with every iteration into one graph of the whole loop, slower "
    "to compile the longer the loop and compiled anew when its length changes, so over more "
    "than a few iterations end each with torch_xla.sync() (MpDeviceLoader does it as it hands "
    "out batches)"
)
# How a report names the sync tpu_nb runs at the end of a run when asked (`--sync`).
END_SYNC = "tpu_nb's end-of-cell sync (--sync)"
_FALLBACK_HINTS = {
    "torch.nonzero": "its output size depends on the data, so it has no static-shape lowering: "
    "keep the shape fixed with a masked reduction, e.g. (x * mask).sum() or "
    "torch.where(mask, x, 0).sum() (one-argument torch.where is nonzero itself)",
    "torch.masked_select": "its output size depends on the data; multiply by the mask instead",
    "torch.unique": "its output size depends on the data; compute it once on the CPU before "
    "training, or count with one-hot sums",
    "torch.histc": "compute the histogram on the CPU outside the step, or with one-hot sums",
    "torch.median": "use torch.quantile(x, 0.5) or sort and index the middle element",
    "torch.bucketize": "compare against the boundaries and sum: (x[..., None] > b).sum(-1)",
    "torch.searchsorted": "compare against the sorted values and sum the mask",
    "F.grid_sample": "no XLA lowering for its backward/forward here: sample with gather on "
    "computed indices, or move it out of the step",
    "the backward of F.interpolate": "autograd runs it inside backward() every step: for an "
    "integer scale factor s, nearest upsampling is "
    "x.repeat_interleave(s, -1).repeat_interleave(s, -2), whose backward runs on the device",
    "torch.isin": "compare against the values and reduce: (x[..., None] == values).any(-1)",
}


def fallback_hint(op: str) -> str:
    """What to do about a CPU fallback of `op` (a counter name like "_unique2", or the op the
    user wrote, like "torch.unique")."""
    wrote = op if "." in op and not op.startswith("aten") else user_op(op)
    if lowered_on_tpu(op):
        return f"{wrote} ran on the CPU: {ON_TPU_LOWERED}"
    fix = _FALLBACK_HINTS.get(
        wrote, "use an op with an XLA lowering, or move it out of the hot loop"
    )
    return (
        f"{wrote} has no XLA lowering, so it ran on the CPU (its inputs were copied to "
        f"the host and its result back): {fix}"
    )


def _cell_line(frame, filename: str) -> int | None:
    return frame.line if frame is not None and frame.file == filename else None


def _event_line(event: CompileEvent, filename: str) -> int | None:
    site = event.site
    if site is not None:
        return _cell_line(site.line, filename)
    # the outermost visible frame of the cell
    return next((f.line for f in reversed(event.frames) if f.file == filename), None)


def _ends_run(event: CompileEvent) -> bool:
    """The compile of track()'s own end-of-run sync (the end of the cell; asked for with
    sync=True or --sync): marked by the probe as tpu_nb's own, as the run's own ("end") or,
    for a run tracked around it, on the recorded site."""
    site = event.site
    if site is not None:
        return site.line is None and site.own == "end"
    return event.trigger == "end"


def _via(event: CompileEvent) -> str:
    return event.site.via if event.site is not None else ""


def graph_facts(before, after) -> tuple[str, ...]:
    """What differs between two captured graphs of one line, as facts: the op, shape or dtype
    where the difference starts; inputs and ops only one of them has."""
    facts: list[str] = []
    diff = after.diff(before)  # Graph.diff: later.diff(earlier)
    # Same ops in the same order: the program is the same and shapes or dtypes changed,
    # where the difference starts is the fact. Otherwise node pairs are guesses of an
    # alignment: say what each graph has that the other does not.
    for change in diff.causes[:3] if diff.aligned else ():
        if change.before is not None and change.after is not None:
            facts.append(_shape_change(change.before, change.after))
    d_before, d_after = policy.data_inputs(before), policy.data_inputs(after)
    if d_before != d_after:
        facts.append(f"device data nodes {d_before} \u2192 {d_after}")
    elif not diff.aligned:  # other ops: the inputs whose shapes changed still say why
        facts += _input_shape_changes(before, after)
    ops_before, ops_after = policy.op_counts(before), policy.op_counts(after)
    only_before, only_after = ops_before - ops_after, ops_after - ops_before
    if only_before:
        facts.append("ops only the earlier graph ran: " + counted_ops(only_before.most_common()))
    if only_after:
        facts.append("ops only the later graph ran: " + counted_ops(only_after.most_common()))
    if not facts and diff:
        facts.append(diff.summary())
    if not facts and before.hash != after.hash:
        facts.append(baked_value_fact(after))
    return tuple(facts)


# Ops whose Python numbers torch_xla keeps in the graph but not in its IR text: a tensor
# indexed or sliced with an int (xs[i], x[:n]) compiles a graph per value.
_BAKED = ("xla::generic_slice", "xla::select", "aten::slice", "aten::select", "xla::unselect")


def baked_value_fact(graph) -> str:
    """Why two graphs of one line differ when their IR is the same op for op: a value baked
    into the graph that the IR text does not show, and where the graph indexes or slices."""
    made = {
        policy.place_name(frame)
        for n in graph.nodes
        if n.op in _BAKED
        for frame in (n.user_frame if n.user_frame is not None else n.location,)
        if frame is not None
    }
    where = f" (this graph indexes or slices at {', '.join(sorted(made)[:3])})" if made else ""
    return (
        "the same ops on the same shapes: a Python number the graph holds changed, one its "
        "IR does not show, such as an int index or slice bound (xs[i], x[:n])" + where
    )


def _input_shape_changes(before, after) -> list[str]:
    """ "graph input f32[16,50] → f32[6,50] (dim 0: 16 → 6)" for the inputs (device data)
    whose shapes differ, paired in order; [] when the shapes are the same."""
    shapes = lambda g: Counter(n.shape for n in g.nodes if n.kind == "data")  # noqa: E731
    gone = sorted((shapes(before) - shapes(after)).elements())
    new = sorted((shapes(after) - shapes(before)).elements())
    pairs = list(zip(gone, new, strict=False))[:2]
    return [f"graph input {a} \u2192 {b}{_moved_dims(a, b)}" for a, b in pairs]


def _moved_dims(a: str, b: str) -> str:
    """ " (dim 0: 16 → 6)": the dimensions (two at most) where two shapes of one rank differ."""
    dims_a, dims_b = policy.shape_dims(a), policy.shape_dims(b)
    if dims_a is None or dims_b is None or len(dims_a) != len(dims_b):
        return ""
    pairs = enumerate(zip(dims_a, dims_b, strict=True))
    moved = [f"dim {i}: {x} \u2192 {y}" for i, (x, y) in pairs if x != y]
    return f" ({', '.join(moved[:2])})" if moved else ""


def _shape_change(a, b) -> str:
    text = (
        f"{b.op} {a.shape} \u2192 {b.shape}"
        if a.shape != b.shape
        else f"{a.op} \u2192 {b.op} ({b.shape})"
    )
    text += _moved_dims(a.shape, b.shape)
    # full paths (graphs captured with frames), else IR debug's own location
    made = b.user_frame if b.user_frame is not None else b.location
    return text + (f", made at {policy.place_name(made)}" if made is not None else "")


def _log_facts(before: CompileEvent, after: CompileEvent) -> tuple[str, ...]:
    facts = []
    if (before.inputs, before.outputs) != (after.inputs, after.outputs):
        facts.append(
            f"graph inputs {before.inputs} \u2192 {after.inputs}, outputs "
            f"{before.outputs} \u2192 {after.outputs}"
        )
    else:
        facts.append(
            f"same number of inputs ({after.inputs}) and outputs ({after.outputs}): a "
            "shape, dtype or Python value inside the graph changed"
        )
    if before.cause != after.cause:
        facts.append(f"cause: {before.cause} \u2192 {after.cause}")
    return tuple(facts) + ("tpu_nb did not capture both graphs, so it cannot name the op",)


def what_changed(event: CompileEvent) -> tuple[str, ...]:
    """What differs between `event`'s graph and the one its line compiled before it."""
    told = dynamo.what_changed(event)  # Dynamo's guard failure, for torch.compile'd code
    earlier = None if told else store.earlier_graph(event)
    if earlier is None:
        return told
    a, b = store.captured_graph(earlier), store.captured_graph(event)
    facts = graph_facts(a, b) if a is not None and b is not None else ()
    return facts or _log_facts(earlier, event)


def findings(
    facts: RunReport,
    judgement: Judgement | None,
    source: str,
    filename: str,
    allowed: int = 1,
) -> tuple[LineFinding, ...]:
    """What the run's facts, as judged, say about the lines of `source` (compiled under
    `filename`), in the order they happened.

    allowed: distinct graphs a line may compile (the cell's --max-graphs: deliberate
    bucketing is not flagged); a line's second graph after a first step that differed in
    its inputs or ops is its warm-up, said with what differed."""
    found = _compile_findings(facts, judgement, filename, allowed)
    found += _read_findings(facts, judgement, filename)
    found += _fallback_findings(facts, filename)
    found += _pending_findings(facts, source, filename)
    found += _device_data_findings(facts, filename)
    return tuple(sorted(found, key=lambda f: f.sort_key))


def _device_data_findings(report: RunReport, filename: str) -> list[LineFinding]:
    """A dataset on the device that a DataLoader indexed per sample: on the line that built
    it (tracking._device_data), with the loader's failure explained when the run failed so."""
    out = []
    error = report.error
    crashed = device_data.loader_copy_failed(error)
    for i, found in enumerate(report.device_datasets):
        lines = sorted({line for file, line in found.built if file == filename})
        what = (
            f"{found.describe()}, which a DataLoader indexed sample by sample: each batch "
            "a graph of slices of device tensors (its indices constants of the graph: a new "
            "graph for each new batch), and a device loader copies such batches back to the "
            "host to send them"
        )
        if crashed:
            what += (
                f"; the cell's {type(error).__name__} ('{crashed}') is torch_xla's device "
                "loader failing that copy in its worker thread"
            )
        where = "" if lines else "outside this cell's code (built on the device elsewhere)"
        for line in lines or [0]:
            out.append(
                LineFinding(line, "device-data", what, device_data.FIX, place=where, order=i)
            )
    return out


def _compile_findings(
    report: RunReport, judgement: Judgement | None, filename: str, allowed: int
) -> list[LineFinding]:
    out = []
    kinds = judgement.compile_kinds if judgement is not None else ()
    for order, event in enumerate(report.compile_events):
        # The --max-graphs guard's own sync as it starts (at the block's `with` line, if any):
        # work left pending from before the block, not a line of it. The probe marks that
        # sync as tpu_nb's own, and the recorder's site carries the mark.
        guard_start = event.site is not None and event.site.own == "guard-start"
        line = None if guard_start else _event_line(event, filename)
        what = plain_cause(event)
        detail = raw_detail(event)
        if line is None:
            out.append(_unplaced_compile(event, guard_start, order, detail))
            continue
        kind = kinds[order] if order < len(kinds) else ""
        if kind == policy.EARLIER and report.earlier is not None:
            out.append(_earlier_compile(report.earlier, line, event, order))
            continue
        if dynamo.inputs_sync(event):  # not the function's graph: counted apart, as the
            # policy and --max-graphs count a line's graphs
            what = "the pending work of a compiled function's inputs, run before its graph"
            out.append(
                LineFinding(line, "inputs", what, via=_via(event), order=order, detail=detail)
            )
            continue
        key = policy.site_key(event)
        pattern = judgement.lines.get(key) if judgement is not None and key else None
        finding_kind, hint = _compile_kind(kind, pattern, allowed, bool(report.device_datasets))
        if finding_kind == "recompile" and dynamo.new_object(event):
            hint = policy.NEW_OBJECT_FIX
        changed = what_changed(event) if kind != policy.FIRST else ()
        patterned = kind in (policy.VARIANT, policy.RECOMPILE, policy.GROWING)
        if pattern is not None and patterned and (pattern.progression or kind == policy.GROWING):
            # the line's pattern says it once: its progression, or the ops it adds (what the
            # compiler itself said changed, Dynamo or torch_xla.compile, is still said here)
            changed = dynamo.what_changed(event)
        if finding_kind == "compile" and kind == policy.RECOMPILE:  # within --max-graphs
            what += f"; another graph of this line, within the {allowed} --max-graphs allows"
        out.append(
            LineFinding(
                line,
                finding_kind,
                what,
                hint,
                via=_via(event),
                order=order,
                changed=changed,
                pattern=_site_pattern(pattern) if pattern is not None else "",
                progression=pattern.progression if pattern is not None else "",
                detail=detail,
            )
        )
    return out


# torch_xla's words for why a graph compiled, and the same in words a learner can use.
_PLAIN_CAUSES = {
    "dynamo processing input graphs": "the pending work of a compiled function's inputs",
    "parallel loader": "at the device loader's own torch_xla.sync() (MpDeviceLoader syncs as "
    "it hands out batches)",
    "access tensor value": "a value read needed results not computed yet, so the pending work "
    "compiled and ran first",
    "dynamo is compiling": "the graph torch.compile captured from the function, compiled by "
    "torch_xla",
    "torch_xla.sync": "at torch_xla.sync(), the end of the step",
    "prior calling the target function": "the pending work of a compiled function's inputs, "
    "run before the function",
    "torch_xla.compile": "at the sync torch_xla.compile makes after the function runs",
    "mark_step": "at xm.mark_step(), the end of the step",
}


# A sync a library made (Trainer's logging, accelerate's gather): no end of a step of the
# code's, necessarily.
_LIBRARY_SYNCS = {
    "torch_xla.sync": "at a torch_xla.sync() a library made (named below)",
    "mark_step": "at an xm.mark_step() a library made (named below)",
}


def plain_cause(event: CompileEvent) -> str:
    """Why `event`'s graph compiled, in plain words (torch_xla's own are in `raw_detail`)."""
    if event.trigger == "fallback":
        return (
            "a CPU fallback on this line needed the values of its inputs, so their pending "
            "work compiled and ran first"
        )
    low = event.cause.lower()
    by_library = event.site is not None and getattr(event.site, "library", None) is not None
    for needle, words in _PLAIN_CAUSES.items():
        if needle in low:
            return _LIBRARY_SYNCS.get(needle, words) if by_library else words
    words = " (torch_xla's words are in the details)" if event.cause else ""
    return f"why is not known{words}"


def raw_detail(event: CompileEvent) -> str:
    """The graph's hash and torch_xla's own words for its cause: for a details part."""
    cause = f": torch_xla says \u201c{event.cause}\u201d" if event.cause else ""
    return f"graph {event.graph_hash[:8]}{cause}"


def _site_pattern(pattern) -> str:
    """A site's pattern as the report says it, with the frame below the line that compiled
    when the site is not the line itself ("at transformers/…/parallel_loader.py:35 …: …")."""
    text = policy.describe_pattern(pattern)
    return f"at {pattern.via}: {text}" if pattern.via else text


def _earlier_compile(earlier, line: int, event: CompileEvent, order: int) -> LineFinding:
    pending = earlier.pending
    ops = f" ({counted_ops(pending.ops)})" if pending.ops else ""
    if dynamo.pending_first(event):  # torch_xla.compile ran it apart, before the function
        what = (
            f"the compiled function's first call ran {earlier.names()}, left pending before "
            f"this cell{ops}, in a graph of its own before the function's"
        )
    elif not event.step_end:  # a device loader's before its first batch: no step traced yet
        what = (
            f"the first sync, before the loop's first step, ran {earlier.names()}, left "
            f"pending before this cell{ops}, in a graph of its own: not this line's (its "
            "next graphs are)"
        )
    else:
        what = (
            f"the first sync also ran {earlier.names()}, left pending before this cell{ops}: "
            "one graph with this step's, not this line's own (its next graphs are)"
        )
    return LineFinding(line, "earlier", what, via=_via(event), order=order)


def _compile_kind(kind: str, pattern, allowed: int, datasets: bool) -> tuple[FindingKind, str]:
    """The finding kind of a compile the policy classified, and its hint ("" : a fact)."""
    site, ops = (pattern.site, pattern.ops) if pattern is not None else (None, frozenset())
    if kind == policy.WARM_UP:
        return "warm-up", ""
    if kind == policy.STATE:
        return "state", ""
    if kind in (policy.VARIANT, policy.UNSETTLED):
        return "variant", ""
    if kind == policy.GROWING:
        syncs = pattern is not None and pattern.user_syncs
        return "growing", libraries.growing_fix(site, ops, syncs) or policy.GROWING_FIX
    if kind == policy.RECOMPILE:
        if pattern is not None and pattern.graphs <= allowed:
            return "compile", ""
        last_call = pattern is not None and pattern.last_call_only
        return "recompile", policy.recompile_fix(pattern, datasets, last_call=last_call)
    return "compile", ""


def _unplaced_compile(event: CompileEvent, guard_start: bool, order: int, detail: str):
    # tpu_nb's own syncs (the final one; the guard's at the start): no code in between to name
    own = True
    if _ends_run(event):
        # torch_xla's log calls every torch_xla.sync() "user torch_xla.sync": this one is
        # tpu_nb's, asked for with --sync / sync=True
        place = "end of cell"
        what = f"by {END_SYNC}"
    elif guard_start:
        place = "start of cell: work pending from before it"
        what = (
            "by the sync --max-graphs makes before the cell runs, so that earlier work "
            "is not counted as the cell's"
        )
    else:
        place, own = "code this cell called (line not recorded)", False
        what = plain_cause(event)
    via = "" if own else _via(event)
    return LineFinding(0, "compile", what, place=place, via=via, order=order, detail=detail)


def _at_occurrence(
    occ, kind: FindingKind, what: str, hint: str, count: int, filename: str, base: int
):
    """A finding on the line of a value read or fallback, when it is a line of the cell."""
    line = _cell_line(occ.site.line, filename) or 0
    place = "" if line else "outside this cell's code"
    via, order = occ.site.via, base + occ.order
    return LineFinding(line, kind, what, hint, place, count, via, order=order)


def _unplaced(kind: FindingKind, what: str, hint: str, place: str, count: int, base: int):
    """A finding tpu_nb could not place on a line (a count the recorder did not see)."""
    return LineFinding(0, kind, what, hint, place, count, order=base, phase="unplaced")


def _read_findings(
    report: RunReport, judgement: Judgement | None, filename: str
) -> list[LineFinding]:
    out, placed = [], 0
    base = len(report.compile_events)
    for occ in report.occurrences:
        if occ.kind != "read":
            continue
        placed += occ.count
        reads = "a copy of device data to the host"
        if occ.count:
            reads = f"{occ.count} scalar read{'s' if occ.count != 1 else ''}"
        pattern = policy.ReadPattern(True, "")  # not judged: every read is worth the hint
        if judgement is not None:
            pattern = judgement.reads.get(occ.order, policy.NOT_PER_STEP)
        what = f"{occ.what} read a device value ({occ.calls}\u00d7: {reads}"
        what += f", {pattern.why})" if pattern.why else ")"
        if occ.in_sync:
            what = f"{occ.what} in a step closure read a device value ({occ.calls}\u00d7: {reads})"
        general = HOST_READ_HINT if report.syncs else HOST_READ_NO_SYNC_HINT
        hint = (libraries.read_fix(occ.site) or general) if pattern.advised else ""
        out.append(_at_occurrence(occ, "host-read", what, hint, occ.calls, filename, base))
    unplaced = report.metrics.host_reads - placed
    if unplaced > 0 and report.occurrences is not None:
        what = f"{unplaced} scalar reads tpu_nb could not place on a line"
        out.append(_unplaced("host-read", what, "", "line not recorded", unplaced, base))
    return out


def _fallback_findings(report: RunReport, filename: str) -> list[LineFinding]:
    out: list[LineFinding] = []
    placed: Counter = Counter()
    base = len(report.compile_events)
    for occ in report.occurrences:
        if occ.kind != "fallback":
            continue
        op = occ.what.split("::", 1)[-1]
        placed[op] += occ.count
        what = f"{user_op(occ.what)} ran on the CPU (aten::{op}, {occ.count}\u00d7)"
        if occ.compiles:  # started from C++ inside backward(): no cause in the compile log
            what += (
                f"; copying its inputs to the host compiled {occ.compiles} "
                f"graph{'s' if occ.compiles != 1 else ''} (the fallback's, inside backward())"
            )
        # the op's rewrite, after the library's line when a library made it; none for an op
        # only XLA:CPU runs on the CPU (a fact of this machine, not of the chip)
        library = libraries.fallback_fix(occ.site, user_op(occ.what))
        fix = f"{library}; {fallback_hint(occ.what)}" if library else fallback_hint(occ.what)
        if lowered_on_tpu(occ.what):
            what, fix = f"{what}; {ON_TPU_LOWERED}", ""
        out.append(_at_occurrence(occ, "fallback", what, fix, occ.count, filename, base))
    for op, count in sorted(report.metrics.fallbacks.items()):
        left = count - placed[op]
        if left > 0:
            what = f"{user_op('aten::' + op)} ran on the CPU (aten::{op}, {left}\u00d7)"
            where = (
                "line not recorded (the first calls of an op tpu_nb had not seen fall back "
                "yet, or a call from C++)"
            )
            hint = fallback_hint(op)
            if lowered_on_tpu(op):
                what, hint = f"{what}; {ON_TPU_LOWERED}", ""
            out.append(_unplaced("fallback", what, hint, where, left, base))
    return out


def _pending_findings(report: RunReport, source: str, filename: str) -> list[LineFinding]:
    """Findings for the work the block left pending (report.pending): one per variable that
    holds it (on the line of the block that assigns it, when that is one line), and one for
    the pending graph (with the lines that traced it when IR locations were recorded). No
    advice: leaving work for the next sync is what the same code does without tpu_nb."""
    pending = report.pending
    if pending is None:
        return []
    out = []
    for i, name in enumerate(pending.holders):
        lines = assigned_lines(source, name) if name != VALUE else []
        if name == VALUE:  # shown below the report: showing it runs its work
            found = LineFinding(
                0,
                "pending",
                f"{name} holds work not run yet (showing it, after this report, runs it)",
                place="end of cell",
            )
        elif len(lines) == 1:
            found = LineFinding(lines[0], "pending", f"{name} holds work not run yet")
        else:
            where = "not assigned in this code"
            if lines:
                where = f"assigned on lines {', '.join(map(str, lines))}"
            what = f"{name} ({where}) holds work not run yet"
            found = LineFinding(0, "pending", what, place="end of cell")
        out.append(replace(found, order=i, phase="left"))
    graph = f"{pending.tensors} tensor{'s' if pending.tensors != 1 else ''} left pending"
    if pending.nodes:
        graph += f": a graph of {pending.nodes} IR nodes ({counted_ops(pending.ops)})"
    traced = sorted({line for file, line in pending.lines if file == filename})
    if traced:
        graph += f", traced on line{'s' if len(traced) > 1 else ''} " + ", ".join(map(str, traced))
    graph += (
        "; not run in this cell (as without tpu_nb): the next sync or value read runs it "
        "and is counted with it"
    )
    out.append(LineFinding(0, "pending", graph, place="end of cell", order=len(out), phase="left"))
    return out
