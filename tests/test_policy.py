"""The policy on constructed facts: what each line's compiles, each read site and the steady
steps are judged to be, without a runtime (milliseconds each).

The same decisions are tested end to end on real loops in test_judgement.py; here each rule
gets the facts that must trigger it and the nearest facts that must not.
"""

from __future__ import annotations

import sysconfig
from dataclasses import replace

from tpu_nb.runtime.metrics import CompileEvent, Frame, MetricsDelta
from tpu_nb.runtime.tracking import RunReport, _policy
from tpu_nb.runtime.tracking._anatomy import Anatomy, StepRecord
from tpu_nb.runtime.tracking._provenance import Occurrence, Site

CELL = "<cell>"
LOOP_LINE = Frame(CELL, 5, "<module>")
READ_LINE = Frame(CELL, 7, "<module>")


def _compile(n: int, step: int, call: int, line: Frame = LOOP_LINE) -> CompileEvent:
    return CompileEvent(
        cause="user torch_xla.sync",
        graph_hash=f"{n:032x}",
        frames=(line,),
        site=Site(line),
        trigger="sync",
        step=step,
        call=call,
    )


def _steps(n: int, compiled: set[int], *, host: float, device: float) -> Anatomy:
    steps, t = [], 100.0
    for i in range(n):
        compile_s = 0.5 if i in compiled else 0.0
        wall = host + compile_s + device
        steps.append(
            StepRecord(
                i,
                t,
                t + wall,
                trace=host,
                compile=compile_s,
                device=device,
                sync=device,
                executions=1,
                compiles=int(i in compiled),
            )
        )
        t += wall
    wall = sum(s.wall for s in steps)
    return Anatomy(tuple(steps), None, {}, wall, device * n, None)


def _facts(
    events, steps: int, *, line_calls=None, site_calls=None, occurrences=(), anatomy=None
) -> RunReport:
    return RunReport(
        name="cell",
        metrics=MetricsDelta(compiles=len(events), syncs=steps),
        compile_events=tuple(events),
        compile_analysis=True,
        syncs=steps,
        line_calls=line_calls or {(CELL, LOOP_LINE.line): steps},
        site_calls=site_calls or {},
        occurrences=tuple(occurrences),
        anatomy=anatomy,
    )


def _kind(judgement, line: Frame = LOOP_LINE) -> str:
    return judgement.lines[(line.file, line.line)].kind


# -- compiles per line ---------------------------------------------------------------------


def test_a_line_compiling_a_new_graph_at_every_step_to_the_last_is_recompiling():
    events = [_compile(i, step=i, call=i) for i in range(12)]
    judgement = _policy.judge(_facts(events, 12))
    assert _kind(judgement) == "recompiling" and judgement.recompiled
    assert judgement.compile_kinds[0] == _policy.FIRST
    assert set(judgement.compile_kinds[3:]) == {_policy.RECOMPILE}


def test_a_few_graphs_then_calls_without_a_compile_are_a_bounded_set_not_a_recompile():
    # three bucket sizes, each compiled once, then ten steps that reuse them
    events = [_compile(i, step=i, call=i) for i in range(3)]
    judgement = _policy.judge(_facts(events, 13))
    assert _kind(judgement) in ("warm-up", "variants") and not judgement.recompiled


def test_one_graph_compiled_once_is_judged_once():
    judgement = _policy.judge(_facts([_compile(0, step=0, call=0)], 10))
    assert _kind(judgement) == "once" and not judgement.recompiled


def test_compiles_of_one_step_are_that_steps_graphs_never_a_recompile():
    # a forward and a backward graph in the first step: one moment, both "first"
    events = [_compile(0, step=0, call=0), _compile(1, step=0, call=0)]
    judgement = _policy.judge(_facts(events, 10))
    assert judgement.compile_kinds == (_policy.FIRST, _policy.FIRST)
    assert not judgement.recompiled


def test_the_first_sync_that_also_ran_earlier_work_is_not_the_lines_graph():
    from tpu_nb.runtime.tracking._pending import EarlierWork, PendingWork

    events = [_compile(0, step=0, call=0), _compile(1, step=1, call=1)]
    earlier = EarlierWork(("w",), ("In [3]",), PendingWork(("w",), 1))
    facts = _replace(_facts(events, 10), earlier=earlier)
    judgement = _policy.judge(facts)
    assert judgement.compile_kinds[0] == _policy.EARLIER
    assert _kind(judgement) == "once"  # the line's own graph is the second


# -- reads -----------------------------------------------------------------------------------


def _read(steps: int, *, first_step: int = 0, in_sync: bool = False, order: int = 1) -> Occurrence:
    return Occurrence(
        "read",
        ".item()",
        Site(READ_LINE),
        calls=steps,
        count=steps,
        order=order,
        in_sync=in_sync,
        steps=steps,
        first_step=first_step,
        last_step=first_step + steps - 1,
    )


def test_a_read_in_every_step_is_per_step_and_a_read_after_the_loop_is_not():
    every = _read(10)
    after = _read(1, first_step=10, order=2)
    judgement = _policy.judge(_facts([], 10, occurrences=(every, after)))
    assert judgement.reads[every.order].per_step
    assert judgement.reads[every.order].why == "in 10 of 10 steps"
    assert not judgement.reads[after.order].per_step
    assert judgement.reads[after.order].why == "after the loop's last sync"


def test_a_read_in_a_step_closure_or_every_tenth_step_is_a_fact_without_advice():
    assert _policy.classify_read(_read(10, in_sync=True), 10).per_step is False
    assert _policy.classify_read(_read(3), 100).per_step is False  # logging every 30 steps
    assert _policy.classify_read(_read(30), 100).per_step is True


def test_reads_of_a_loop_without_syncs_count_per_call():
    from tpu_nb.runtime.tracking import _attribution

    pattern = _policy.classify_read(_read(10), 0)
    assert pattern.per_step and pattern.why == "with no sync in between"
    # the hint: without a sync in the loop, the read is all that cuts its graph, so dropping
    # it alone would grow one graph over every batch; a loop with syncs needs no such words
    for syncs, hint in (
        (0, _attribution.HOST_READ_NO_SYNC_HINT),
        (10, _attribution.HOST_READ_HINT),
    ):
        facts = _facts([], syncs, occurrences=(_read(10),))
        found = _attribution.findings(facts, _policy.judge(facts), "x\n" * 8, CELL)
        assert [f.hint for f in found if f.kind == "host-read"] == [hint], syncs


# -- the verdict -------------------------------------------------------------------------------


def test_no_verdict_with_too_few_steady_steps_and_the_note_says_how_many_more():
    events = [_compile(0, step=0, call=0)]
    judgement = _policy.judge(_facts(events, 3, anatomy=_steps(3, {0}, host=0.01, device=0.1)))
    assert judgement.verdict is None
    assert "too few steady steps" in judgement.note and "(run 1 more)" in judgement.note
    assert "3 steps: the first step compiled its graph, 2 ran from the cache" in judgement.note
    one = _policy.judge(_facts(events, 1, anatomy=_steps(1, {0}, host=0.01, device=0.1)))
    assert "judge: 1 step, which compiled its graph; a verdict needs 3" in one.note


def test_the_note_names_a_later_step_that_compiled_as_no_cache_hit():
    # 3 batches, the last one shorter: its step compiled another graph, none ran cached
    assert _policy._which_compiled(3, 2, 1) == (
        "3 steps: the first 2 compiled their graphs, 1 compiled another graph"
    )
    assert _policy._which_compiled(5, 1, 2) == (
        "5 steps: the first step compiled its graph, 2 ran from the cache, 2 compiled other graphs"
    )
    assert _policy._which_compiled(4, 0, 0) == "4 steps, all run from the cache"


def test_the_verdict_leaves_the_warm_up_out():
    # a slow first step (its compile) and nine steady steps: the verdict is about the nine
    events = [_compile(0, step=0, call=0)]
    anatomy = _steps(10, {0}, host=0.001, device=0.1)
    judgement = _policy.judge(_facts(events, 10, anatomy=anatomy))
    assert judgement.steady_steps == 9 and judgement.one_time_compiles == 1
    assert judgement.verdict is not None and judgement.verdict.kind != "compile-bound"


def test_a_loop_still_compiling_in_its_steady_steps_is_compile_bound_with_the_pad_advice():
    events = [_compile(i, step=i, call=i) for i in range(10)]
    anatomy = _steps(10, set(range(10)), host=0.001, device=0.01)
    judgement = _policy.judge(_facts(events, 10, anatomy=anatomy))
    assert judgement.verdict is not None and judgement.verdict.kind == "compile-bound"
    assert "pad or bucket" in judgement.verdict.fix and "recompiling at" in judgement.verdict.reason


def test_the_one_time_cost_names_only_the_compiles_it_counts():
    # Trainer with dynamic padding: its loader's sync compiles a graph at every step, the one
    # at step 1 as state appeared, while the attention mask's read recompiles at every step;
    # step 1 recompiled, so it is a steady step, its loader graph with it: the one-time cost
    # is the first step's graphs alone, and says so

    events = []
    for step in range(8):
        loader = _compile(2 * step, step=step, call=step)
        events.append(replace(loader, inputs=10 if step == 0 else 12, outputs=3))
        events.append(_compile(2 * step + 1, step=step, call=step, line=READ_LINE))
    facts = _facts(
        events,
        8,
        line_calls={(CELL, LOOP_LINE.line): 8, (CELL, READ_LINE.line): 8},
        anatomy=_steps(8, set(range(8)), host=0.001, device=0.01),
    )
    judgement = _policy.judge(facts)
    assert judgement.compile_kinds[2] == _policy.STATE  # the loader's graph at step 1
    assert judgement.one_time_compiles == 2 and judgement.one_time_kinds == ("first", "first")
    text = judgement.one_time_cost()
    assert text.startswith("one-time cost: 2 compiles") and "appeared" not in text, text
    assert "the first step's graphs (2)" in text, text


def test_a_sites_first_graph_in_a_later_step_of_its_line_is_not_the_first_steps():
    # one line (a Trainer's train()): its step's graph at step 0, cached after; at step 3
    # its logging site compiles its first graph. Another line's first graph at step 1,
    # after a sync before the loop (step 0), is that line's first step's graph
    logging = Frame("transformers/trainer.py", 3195, "_maybe_log_save_evaluate")
    events = [
        _compile(0, step=0, call=0, line=Frame(CELL, 3, "<module>")),
        _compile(1, step=1, call=0),
        replace(_compile(2, step=3, call=0), site=Site(LOOP_LINE, library=logging)),
    ]
    facts = _facts(events, 10, anatomy=_steps(10, {0, 1, 3}, host=0.001, device=0.1))
    judgement = _policy.judge(facts)
    assert judgement.one_time_kinds == ("first", "first", "later"), judgement.compile_kinds


def test_a_graph_compiled_after_the_loop_is_no_steady_steps_time():
    # nine steady steps of device work, then a read after the loop that compiles for 2 s
    # while the host also waits 0.05 s for the last steps' work: the read's compile is no
    # step's, the wait is
    read_line = Frame(CELL, 9, "<module>")
    events = [_compile(0, step=0, call=0), _compile(1, step=10, call=0, line=read_line)]
    a = _steps(10, {0}, host=0.001, device=0.1)
    end = a.steps[-1].end
    tail = StepRecord(10, end, end + 2.1, compile=2.0, wait=0.05, read=0.05, compiles=1, reads=1)
    anatomy = Anatomy(a.steps, tail, {}, a.wall_seconds + tail.wall, a.device_busy, None)
    judgement = _policy.judge(_facts(events, 10, anatomy=anatomy))
    assert judgement.verdict is not None and judgement.verdict.kind != "compile-bound"
    assert judgement.compile_kinds == (_policy.FIRST, _policy.FIRST)
    # (counted in, the compile would be 66 % of the time: "compile-bound ... (0 compiles)")


# -- sites: a loop inside one call of the cell ---------------------------------------------------

PURELIB = sysconfig.get_paths()["purelib"]
HELPER = Frame("/work/project/fitting.py", 10, "fit")  # a module of the user's, not installed
TRAIN = Frame(f"{PURELIB}/transformers/trainer.py", 2213, "train")
LOADER = Frame(f"{PURELIB}/torch_xla/distributed/parallel_loader.py", 35, "__next__")
MASK = Frame(f"{PURELIB}/transformers/modeling_attn_mask_utils.py", 250, "_ignore_causal_mask_sdpa")


def _at(site: Site, n: int, step: int) -> CompileEvent:
    return CompileEvent(
        cause="user torch_xla.sync",
        graph_hash=f"{n:032x}",
        frames=(LOOP_LINE,),
        site=site,
        trigger="sync",
        step=step,
        call=step,
    )


def _library_loop(compiles: int, steps: int = 12):
    """One cell line calling a function whose loop syncs `steps` times (compiling at the
    first `compiles`), then reads two values at two other lines of that function."""
    loop = Site(LOOP_LINE, user=HELPER)
    events = [_at(loop, i, step=i) for i in range(compiles)]
    reads = [
        Occurrence(
            "read",
            ".item()",
            Site(LOOP_LINE, user=Frame(HELPER.file, HELPER.line + k, "fit")),
            calls=1,
            count=1,
            order=k,
            steps=1,
            first_step=steps,
            last_step=steps,
        )
        for k in (1, 2)
    ]
    site_calls = {loop.key: steps, **{r.site.key: 1 for r in reads}}
    anatomy = _steps(steps, set(range(compiles)), host=0.001, device=0.01)
    facts = _facts(
        events,
        steps,
        line_calls={(CELL, LOOP_LINE.line): steps + 2},  # the line's calls, reads included
        site_calls=site_calls,
        occurrences=reads,
        anatomy=anatomy,
    )
    return facts, loop


def test_trainers_log_read_in_every_step_gets_its_knob_only_where_the_waits_can_matter():
    """Trainer logging every step reads the loss on the host (with logging_steps=1, nine
    waits a step through xm.mesh_reduce and .item()). Beside a 4 ms step those waits' own
    cost (1 ms each allowed) is most of it: the advice is Trainer's knob. Beside 200 ms of
    tracing they cost little on a v5e: a fact that says why, no advice."""
    from tpu_nb.runtime.environment import CHIPS
    from tpu_nb.runtime.tracking import _attribution, _libraries
    from tpu_nb.runtime.tracking._cost import StepCost

    logging = Frame(f"{PURELIB}/transformers/trainer.py", 3207, "_maybe_log_save_evaluate")
    read = replace(_read(10), site=Site(LOOP_LINE, library=logging, entry=TRAIN), calls=90)

    def judged(host: float):
        a = _steps(10, set(), host=host, device=1e-4)
        steps = tuple(replace(s, executions=2) for s in a.steps)  # each cut in two by a read
        facts = _facts([], 10, occurrences=[read], anatomy=replace(a, steps=steps))
        chip = CHIPS["v5e"]  # 1 µs of the chip's work a step at its peak
        flops = int(chip.per_device().peak_flops * 1e-6)
        facts = replace(facts, cost=StepCost(chip, False, flops=flops, moved_bytes=0.0))
        judgement = _policy.judge(facts)
        found = _attribution.findings(facts, judgement, "x\n" * 8, CELL)
        return judgement, next(f for f in found if f.kind == "host-read")

    judgement, finding = judged(host=0.004)
    assert judgement.verdict.kind == "read-bound", judgement.verdict
    assert finding.hint == _libraries.TRAINER_LOG_FIX, finding
    judgement, finding = judged(host=0.2)
    assert judgement.verdict.kind == "host-bound", judgement.verdict
    assert finding.hint == "" and "not what limits this loop" in finding.what, finding
    assert "waiting for it 9 times a step costs little" in finding.what, finding


def test_a_loop_inside_one_call_recompiling_every_step_is_not_settled_by_its_later_reads():
    facts, loop = _library_loop(compiles=12)
    judgement = _policy.judge(facts)
    pattern = judgement.lines[loop.key]
    assert pattern.kind == "recompiling" and judgement.recompiled, pattern
    assert judgement.verdict is not None and judgement.verdict.kind == "compile-bound"
    # the verdict names the cell's line and the function below it that compiled
    assert ":5 \u2192 fitting.py:10 fit" in judgement.verdict.reason, judgement.verdict
    assert "pad or bucket" in judgement.verdict.fix
    assert facts.recompiled_lines() == {} and _replace(facts, judgement=judgement).recompiled


def test_a_fixed_shape_loop_inside_one_call_is_not_flagged():
    facts, loop = _library_loop(compiles=1)
    judgement = _policy.judge(facts)
    assert judgement.lines[loop.key].kind == "once" and not judgement.recompiled
    assert judgement.verdict is not None and judgement.verdict.kind != "compile-bound"


def test_two_sites_of_one_line_are_judged_apart():
    # trainer.train(): the loader's sync compiles a new graph every step; the mask check's
    # read compiled its graph once and reused it
    sync = Site(LOOP_LINE, library=LOADER, entry=TRAIN)
    check = Site(LOOP_LINE, library=MASK, entry=TRAIN)
    events = [_at(sync, i, step=i) for i in range(10)] + [_at(check, 99, step=0)]
    facts = _facts(events, 10, site_calls={sync.key: 10, check.key: 10})
    judgement = _policy.judge(facts)
    assert judgement.lines[sync.key].kind == "recompiling"
    assert judgement.lines[check.key].kind == "once"
    assert len(judgement.lines[sync.key].kinds) == 10


def test_a_trainer_loop_that_recompiles_gets_trainers_padding_knob():
    from tpu_nb.runtime.tracking import _attribution

    sync = Site(LOOP_LINE, library=LOADER, entry=TRAIN)
    events = [_at(sync, i, step=i) for i in range(10)]
    anatomy = _steps(10, set(range(10)), host=0.001, device=0.01)
    facts = _facts(events, 10, site_calls={sync.key: 10}, anatomy=anatomy)
    judgement = _policy.judge(facts)
    assert "pad_to_multiple_of" in judgement.verdict.fix, judgement.verdict
    # a shorter last batch is no fact here (each step compiled): not told to drop it
    assert "dataloader_drop_last" not in judgement.verdict.fix
    found = _attribution.findings(facts, judgement, "trainer.train()\n" * 6, CELL)
    hints = {f.hint for f in found if f.kind == "recompile"}
    assert hints == {judgement.verdict.fix}


def test_generate_recompiling_per_token_gets_the_static_cache_and_an_unknown_library_its_line():
    generate = Frame(f"{PURELIB}/transformers/generation/utils.py", 2400, "generate")
    other = Frame(f"{PURELIB}/somelib/sampler.py", 31, "sample")
    for site, expected in (
        (Site(LOOP_LINE, library=MASK, entry=generate), 'cache_implementation="static"'),
        (Site(LOOP_LINE, library=other, entry=other), "somelib/sampler.py:31 sample"),
        (Site(LOOP_LINE), "pad or bucket"),  # the cell's own loop: the general advice
    ):
        events = [_at(site, i, step=i) for i in range(10)]
        anatomy = _steps(10, set(range(10)), host=0.001, device=0.01)
        judgement = _policy.judge(_facts(events, 10, site_calls={site.key: 10}, anatomy=anatomy))
        assert expected in judgement.verdict.fix, (site, judgement.verdict)


def test_a_per_step_read_in_a_library_names_its_knob_and_the_users_own_read_keeps_its_hint():
    from tpu_nb.runtime.tracking import _attribution

    def read(site: Site, order: int) -> Occurrence:
        return Occurrence("read", "bool(tensor)", site, 10, 10, order, steps=10, last_step=9)

    mask = read(Site(LOOP_LINE, library=MASK, entry=TRAIN), 1)
    other = Frame(f"{PURELIB}/somelib/loop.py", 77, "run")
    unknown = read(Site(LOOP_LINE, library=other), 2)
    own = read(Site(READ_LINE), 3)
    facts = _facts([], 10, occurrences=(mask, unknown, own))
    judgement = _policy.judge(facts)
    found = _attribution.findings(facts, judgement, "x\n" * 8, CELL)
    hint = {f.order: f.hint for f in found if f.kind == "host-read"}
    assert 'attn_implementation="eager"' in hint[1]
    assert "somelib/loop.py:77 run" in hint[2] and "library's" in hint[2]
    assert hint[3] == _attribution.HOST_READ_HINT


def test_a_fallback_only_xla_cpu_makes_stops_no_step_on_a_tpu():
    # the backward of F.interpolate falls back on XLA:CPU in every step; torch_xla lowers it
    # on a TPU, so no verdict or fix for the chip may rest on it. torch.unique falls back on
    # any device: the same facts for it are a stall
    from tpu_nb.runtime.tracking import _attribution
    from tpu_nb.runtime.tracking._provenance import ON_TPU_LOWERED

    anatomy = _steps(10, {0}, host=0.001, device=0.01)
    anatomy = replace(
        anatomy, steps=tuple(replace(s, executions=3) for s in anatomy.steps)
    )  # each step split into 3 graphs by the fallback's waits

    def judged(op: str):
        occ = Occurrence("fallback", op, Site(LOOP_LINE), 10, 10, 1, steps=10, last_step=9)
        facts = _facts([_compile(0, step=0, call=0)], 10, occurrences=(occ,), anatomy=anatomy)
        judgement = _policy.judge(facts)
        found = _attribution.findings(facts, judgement, "x\n" * 8, CELL)
        return judgement.verdict, next(f for f in found if f.kind == "fallback")

    verdict, finding = judged("aten::upsample_nearest2d_backward")
    assert verdict is None or "fallback" not in verdict.reason, verdict
    assert ON_TPU_LOWERED in finding.what and finding.hint == "", finding
    verdict, finding = judged("aten::_unique2")
    assert verdict is not None and verdict.kind == "read-bound", verdict
    assert "CPU fallbacks stop the steps" in verdict.reason, verdict
    assert "XLA:CPU" not in finding.what and "one-hot" in finding.hint, finding


def _replace(report: RunReport, **changes) -> RunReport:
    import dataclasses

    return dataclasses.replace(report, **changes)


def test_a_line_with_time_of_two_kinds_says_which_is_which():
    from tpu_nb.runtime.frame import Frame
    from tpu_nb.runtime.tracking._anatomy import Verdict
    from tpu_nb.runtime.tracking._sampler import HostLine

    line = Frame("train.py", 4, "<module>")
    via = "transformers/trainer.py:2213 train"
    mixed = Verdict(
        "host-bound",
        "tracing 2 ms per step",
        "fewer, larger ops",
        (HostLine(line, via, 0.7, 0.7), HostLine(line, via, 0.3, 0.3, kind="sync")),
    )
    assert mixed.where == (
        f"most of it at train.py:4 (70%, tracing, in {via}), train.py:4 (30%, syncing, in {via})"
    )
    one_kind = Verdict("host-bound", "", "", (HostLine(line, via, 0.7, 0.7),) * 2)
    assert "tracing" not in one_kind.where  # the verdict's kind already says it
    # a sync line says "sync" once: after its own line, or after torch_xla's sync under it
    assert str(HostLine(line, "", 0.3, 0.3, kind="sync")) == "train.py:4 (sync): 300 ms (30%)"
    under = HostLine(line, "torch_xla/torch_xla.py:78 sync", 0.3, 0.3, kind="sync")
    assert str(under) == "train.py:4 \u2192 torch_xla/torch_xla.py:78 sync: 300 ms (30%)"


def test_both_forms_of_the_device_loaders_copy_failure_are_named():
    from tpu_nb.runtime.tracking._device_data import loader_copy_failed

    old = RuntimeError("Check failed: data()->tensor_data")
    assert loader_copy_failed(old) == "Check failed: data()->tensor_data"
    seen = RuntimeError("Check failed: tensor_data: \n*** Begin stack trace ***\n\ttsl::...")
    assert loader_copy_failed(seen) == "Check failed: tensor_data:"
    assert loader_copy_failed(RuntimeError("Check failed: shape")) == ""
    assert loader_copy_failed(None) == ""


# -- why a line's first step compiled a graph of its own ---------------------------------------


def _graph(inputs: int, *ops: str):
    from tpu_nb.runtime.graph import Graph
    from tpu_nb.runtime.graph._nodes import Node, node_kind

    names = ("xla::device_data",) * inputs + ops
    nodes = tuple(Node(i, op, "f32[4]", "f32", node_kind(op)) for i, op in enumerate(names))
    return Graph(nodes=nodes, edges=())


def test_an_optimizers_first_step_filling_its_state_is_named_as_state_not_pending_work():
    # AdamW's first step(): zeros_like for each moment (an expanded constant in the IR); the
    # later steps' graphs take those tensors as inputs
    first = _graph(3, "aten::mm", "aten::expand", "aten::expand", "aten::lerp")
    later = _graph(5, "aten::mm", "aten::lerp")
    why = _policy.first_step_why(first, later)
    assert why.startswith("the first step created state that later steps read and update")
    assert "aten::expand \u00d72" in why and "2 more device data nodes" in why
    assert "pending" not in why


def test_ops_only_the_first_graph_ran_without_new_inputs_stay_an_open_question():
    # a value made before the loop, still pending at its first sync: no state appears, so
    # the graphs cannot tell pending work from code only the first step runs
    first = _graph(3, "aten::normal", "aten::expand", "aten::mm")
    later = _graph(3, "aten::mm")
    why = _policy.first_step_why(first, later)
    assert why.startswith("the first step's graph also ran")
    assert "work still pending when the loop started, or code only the first step runs" in why
    # filled tensors beside other ops only the first graph ran: not only state, still open
    mixed = _policy.first_step_why(_graph(3, "aten::expand", "aten::sum"), _graph(4))
    assert mixed.startswith("the first step's graph also ran")


def test_a_momentum_buffer_read_by_later_steps_is_state_with_their_own_ops():
    why = _policy.first_step_why(_graph(3, "aten::mm"), _graph(4, "aten::mm", "aten::mul"))
    assert why.startswith("the first step created state") and "1 more device data node," in why
    assert _policy.first_step_why(_graph(3, "aten::mm"), _graph(3, "aten::mm")) == ""


def test_the_first_steps_graph_named_is_the_one_the_steady_graph_follows():
    # a library's loader syncs first for work left before the loop (no inputs), then for the
    # first step: the steady graph is compared with that step's, not the first graph at the
    # line, so its new inputs are the optimizer's state, not all of its device data
    earlier = _graph(0, "aten::normal")
    first = _graph(3, "aten::mm", "aten::mul")
    steady = _graph(5, "aten::mm", "aten::mul", "aten::lerp")
    kinds = (_policy.FIRST, _policy.FIRST, _policy.WARM_UP)
    a, b = _policy._first_and_steady([earlier, first, steady], kinds)
    assert a is first and b is steady
    assert "2 more device data nodes" in _policy.first_step_why(a, b)
    # one first graph: that one, as before; none captured: nothing said
    assert _policy._first_and_steady([first, steady], kinds[1:]) == (first, steady)
    assert _policy._first_and_steady([None, steady], kinds[1:]) == (None, None)


def test_state_appearing_is_the_steady_steps_graph_only_when_the_next_steps_reuse_it():
    # a loop whose second step's graph has the optimizer's state as new inputs: the steady
    # step's graph when the next steps run it from the cache, even if a ragged last batch
    # compiles once more at the end ...

    def loop(compiled_steps, steps):
        events = [
            replace(_compile(s, step=s, call=s), inputs=10 if s == 0 else 12)
            for s in compiled_steps
        ]
        return _policy.judge(
            _facts(events, steps, anatomy=_steps(steps, set(), host=0.001, device=0.01))
        )

    ragged = loop([0, 1, 11], 12)
    assert ragged.compile_kinds == (_policy.FIRST, _policy.WARM_UP, _policy.RECOMPILE)
    # ... but not when the next step compiled again (a new shape every step): no step ran
    # it again, so the line has no steady step's graph; still state appearing, a one-time cost
    every = loop(range(12), 12)
    assert every.compile_kinds[:3] == (_policy.FIRST, _policy.STATE, _policy.RECOMPILE)
    assert every.one_time_kinds == ("first", "state")
    text = every.one_time_cost()
    assert "the first step's graph, a graph as state appeared" in text, text
    assert "steady step's" not in text


def test_steps_run_as_several_graphs_only_when_most_steady_steps_did():
    """A read in every step cuts each step in two graphs: read-bound, by that fact alone.
    Where only every other step ran two (the read's graph in half of them), most steps did
    not, and no such verdict is earned from it."""

    def judged(executions):
        a = _steps(10, set(), host=0.001, device=0.01)
        steps = tuple(replace(s, executions=n) for s, n in zip(a.steps, executions, strict=True))
        facts = _facts([], 10, occurrences=[_read(10)], anatomy=replace(a, steps=steps))
        return _policy.judge(replace(facts, compile_analysis=True))

    every = judged([2] * 10).verdict
    assert every is not None and every.kind == "read-bound", every
    assert "each steady step ran as 2 graphs" in every.reason, every.reason
    half = judged([1, 2] * 5).verdict
    assert half is None or half.kind != "read-bound", half


def test_reads_in_every_step_earn_no_verdict_when_host_and_device_work_are_far_apart():
    """A read in every step makes the host wait for the device, so the two run one after the
    other: removing the waits saves at most the shorter of them. With 200 ms of tracing per
    step against a v5e that needs 1 µs (its roofline) to 100 µs (at 1 % of its peak), that
    is under a quarter of a step: the loop is host-bound and the read is a fact without
    advice, whatever XLA:CPU's own time here (10 ms). With the chip's work as long as the
    tracing, the same reads stop the steps; and so they do in a short step, where each
    wait's own cost (a launch and a copy back, a generous 1 ms allowed) could be a large
    part of it."""
    from tpu_nb.runtime.environment import CHIPS
    from tpu_nb.runtime.tracking import _attribution
    from tpu_nb.runtime.tracking._cost import StepCost

    def judged(host: float, device: float = 0.01, roofline: float | None = 1e-6):
        a = _steps(10, set(), host=host, device=device)
        steps = tuple(replace(s, executions=2) for s in a.steps)  # each cut in two by the read
        chip = CHIPS["v5e"]  # FLOPs a v5e runs in `roofline` seconds at its peak
        flops = None if roofline is None else int(chip.per_device().peak_flops * roofline)
        facts = _facts([], 10, occurrences=[_read(10)], anatomy=replace(a, steps=steps))
        facts = replace(facts, cost=StepCost(chip, False, flops=flops, moved_bytes=0.0))
        judgement = _policy.judge(facts)
        found = _attribution.findings(facts, judgement, "x\n" * 8, CELL)
        return judgement, next(f for f in found if f.kind == "host-read")

    for device in (0.01, 1e-4):  # XLA:CPU's time here changes nothing about a v5e
        judgement, read = judged(host=0.2, device=device)
        assert judgement.verdict.kind == "host-bound", judgement.verdict
        assert "judged for a v5e" in judgement.verdict.reason
        assert read.hint == "", read
        assert "in 10 of 10 steps" in read.what and "not what limits this loop" in read.what
        # the host's time per step here: its tracing and its own time in syncs
        tracing = "210" if device == 0.01 else "200"
        assert f"tracing takes {tracing} ms per step" in read.what, read
        span = "1.00 µs to 100 µs on a v5e (from its roofline to 1 % of its peak)"
        assert f"the device's work {span}" in read.what, read
        assert "waiting for it once a step costs little" in read.what, read
        pattern = judgement.reads[1]
        assert pattern.per_step and not pattern.advised

    # XLA:CPU here faster than a v5e at 1 % of its peak: the slowest pace taken is XLA:CPU's
    judgement, read = judged(host=0.2, device=1e-4, roofline=1e-5)
    capped = "10.0 µs to 100 µs on a v5e (from its roofline to XLA:CPU's time here)"
    assert capped in read.what, read

    # the chip's work as long as the tracing; a short step, where the waits' own cost counts
    for host, device, roofline in ((0.01, 0.01, 0.005), (0.002, 0.0001, 1e-6)):
        judgement, read = judged(host, device, roofline)
        assert judgement.verdict.kind == "read-bound", (host, device, judgement.verdict)
        assert read.hint == _attribution.HOST_READ_HINT and "not what limits" not in read.what

    # the graphs' FLOPs not counted: the device's time is taken from none to XLA:CPU's (as
    # the live view takes it), and the far-apart loop is judged alike, saying what is known
    judgement, read = judged(host=0.2, roofline=None)
    assert read.hint == "" and "the device's work up to 10.0 ms, XLA:CPU's here," in read.what
    judgement, read = judged(host=0.01, roofline=None)
    assert read.hint == _attribution.HOST_READ_HINT, read
