"""Compiled code: torch.compile(backend="openxla") and torch_xla.compile under tpu_nb.

Counts stay right across torch_xla's own counter resets (its Dynamo bridge clears every
counter while Dynamo compiles); Dynamo's facts (frames compiled, the guard that failed, graph
breaks) reach the report.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch_xla
import torch_xla.debug.metrics as met

import tpu_nb
from tpu_nb.runtime.environment import wait_device_ops
from tpu_nb.runtime.metrics import snapshot
from tpu_nb.runtime.tracking._dynamo import inputs_sync

X = torch_xla._XLAC


def _raw(name: str) -> int:
    return X._xla_counter_value(name) or 0


def _executions_then_clear(dev, n: int) -> int:
    before = _raw("ExecuteComputation")
    for i in range(n):
        (torch.ones(3, 3, device=dev) * (i + 2)).sum().item()
    return _raw("ExecuteComputation") - before


def test_a_clear_by_torch_xla_is_carried_across():
    dev = tpu_nb.device()
    _executions_then_clear(dev, 1)  # compiled once: later rounds only execute
    start = snapshot()
    first = _executions_then_clear(dev, 3)
    met.clear_counters()  # what torch_xla's Dynamo bridge does while Dynamo compiles
    assert _raw("ExecuteComputation") == 0  # torch_xla's own readers still see the clear
    second = _executions_then_clear(dev, 2)
    delta = snapshot().since(start)
    assert first >= 3 and second >= 2
    assert delta.executions == first + second
    assert delta.host_reads == 5


def test_a_clear_nobody_announced_is_noticed():
    dev = tpu_nb.device()
    _executions_then_clear(dev, 1)
    start = snapshot()
    first = _executions_then_clear(dev, 3)
    snapshot()  # a read (the live monitor's) between the work and the clear
    X._clear_xla_counters()
    second = _executions_then_clear(dev, 1)
    assert snapshot().since(start).executions == first + second


def test_a_compiled_functions_runs_are_counted_once_across_an_unseen_clear():
    # A compiled function's cached graph runs move torch_xla's execution samples and no
    # execution counter: across a reset tpu_nb did not see, where executions are counted
    # from those samples, they are not counted a second time.
    dev = tpu_nb.device()
    f = torch.compile(lambda x: (x * 2).sin() + 1, backend="openxla")
    x = torch.ones(8, device=dev)
    for _ in range(2):
        f(x)  # compiled: later calls run its cached graph
    wait_device_ops()
    start = snapshot()  # the reset watch is installed: the raw reset is a reference from before
    unseen = getattr(X._clear_xla_counters, "__wrapped__", X._clear_xla_counters)
    runs_before = met.metric_data("RunCachedGraphOutputData")[0]
    for _ in range(3):
        f(x)
    unseen()
    for _ in range(3):
        f(x)
    wait_device_ops()
    delta = snapshot().since(start)
    runs = met.metric_data("RunCachedGraphOutputData")[0] - runs_before
    assert "compile cache hits" in delta.unknown  # the reset was noticed only afterwards
    assert runs == 6 == delta.compiled_code_executions
    assert delta.executions == runs


def test_reset_metrics_still_starts_from_zero():
    dev = tpu_nb.device()
    _executions_then_clear(dev, 2)
    met.clear_counters()
    tpu_nb.reset_metrics()
    start = snapshot()
    n = _executions_then_clear(dev, 1)
    assert snapshot().since(start).executions == n == _raw("ExecuteComputation")


# -- in a real InteractiveShell ------------------------------------------------------------------

MODEL_CELL = """\
import torch, torch_xla
torch.manual_seed(0)
dev = torch_xla.device()
mlp = torch.nn.Sequential(
    torch.nn.Linear(4, {width}), torch.nn.ReLU(), torch.nn.Linear({width}, 2)
).to(dev)

def {name}(x):
    return mlp(x).sum()

{name}_c = torch.compile({name}, backend="openxla")
"""

BREAK_CELL = """\
def {name}(x):
    y = mlp(x) * 2
    print("inside")
    if y.sum().item() > -1e9:
        y = y + 1
    return y.sum()

{name}_c = torch.compile({name}, backend="openxla")
"""

LOOP = """\
for n in {sizes}:
    xb = torch.randn(n, 4, device=dev)
    out = {name}_c(xb)
    torch_xla.sync()
"""


def _raw_counts():
    wait_device_ops()  # every execution's ExecuteTime sample in
    return {
        n: _raw(n) for n in ("ExecuteComputation", "CachedCompile", "MarkStep", "UncachedCompile")
    } | {"ExecuteTime": _execute_samples()}


def _run_counted(shell, capsys, cell: str):
    """Run `cell`: its result (the report), torch_xla's raw counters' movement, its output."""
    before = _raw_counts()
    report = shell.run_cell(cell).result
    raw = {n: _raw_counts()[n] - before[n] for n in before}
    return report, raw, capsys.readouterr().out


def _figures_are_raw(report, raw) -> bool:
    """No Dynamo, no clears: the report's figures are torch_xla's raw counters."""
    m = report.metrics
    return (m.compiles, m.executions, m.cache_hits, m.syncs) == (
        raw["UncachedCompile"],
        raw["ExecuteTime"],
        raw["CachedCompile"],
        raw["MarkStep"],
    )


def _xla_line(out: str) -> dict[str, int]:
    """The plain cell's XLA line as figures: {"compiled": 2, "executed": 5, ...}."""
    lines = [ln for ln in out.splitlines() if ln.startswith("XLA: ")]
    assert len(lines) == 1, out
    # (a figure of 0 is left out of the line: "nothing compiled or executed" when both are)
    found = {what: int(n) for n, what in re.findall(r"(\d+) (compiled|executed)", lines[0])}
    return {"compiled": 0, "executed": 0, **found}


@pytest.mark.stack
def test_torch_compile_batch_sizes_in_on_tpu(shell, capsys):
    assert shell.run_cell(MODEL_CELL.format(name="fwd_a", width=16)).success
    capsys.readouterr()
    cell = "%%on_tpu -o\n" + LOOP.format(sizes="(8, 8, 9, 10, 8, 11)", name="fwd_a")
    report = shell.run_cell(cell).result
    out = capsys.readouterr().out
    compiled = [c for c in report.compiled if c.function == "fwd_a"]
    assert [c.recompile for c in compiled] == [False, True, True, True]
    assert {c.line.line for c in compiled} == {4}  # the cell line that called it
    assert (
        compiled[1].why()
        == "`xb` (the function's `x`) has 9 rows, the cached graph was built for 8"
    )
    assert (
        compiled[3].why()
        == "`xb` (the function's `x`) has 11 rows, the cached graph was built for 8"
    )
    assert all(c.seconds > 0 for c in compiled) and sum(c.xla_compiles for c in compiled) >= 4
    assert "compiled functions (torch.compile):" in out
    assert (
        "recompiled: `xb` (the function's `x`) has 10 rows, the cached graph was built for 9" in out
    )
    assert "line not recorded" not in out
    assert "did not capture both graphs" not in out
    assert report.metrics.compiles == len(report.compile_events)
    assert all(e.site is not None and e.site.line.line == 4 for e in report.compile_events)

    # The same loop again: every shape cached, Dynamo compiles nothing, torch_xla clears no
    # counter, so its raw counters are the truth to compare with.
    before = _raw_counts()
    warm = shell.run_cell(cell).result
    raw = {n: _raw_counts()[n] - before[n] for n in before}
    assert warm.compiled == () and warm.metrics.compiles == 0 == raw["UncachedCompile"]
    # each step: the pending input's graph (counted by torch_xla) and the compiled function's
    # cached graph (run by the Dynamo bridge, in ExecuteTime's samples only)
    assert warm.metrics.executions == raw["ExecuteTime"] == raw["ExecuteComputation"] + 6
    assert warm.metrics.compiled_code_executions == 6
    assert warm.metrics.cache_hits == raw["CachedCompile"]
    assert warm.metrics.syncs == raw["MarkStep"]
    # Across the cold run's counter clears nothing was lost: at least the warm run's work.
    assert report.metrics.executions >= warm.metrics.executions
    assert report.metrics.syncs >= warm.metrics.syncs


def _summary_line(out: str) -> str:
    return next(line for line in out.splitlines() if "XLA: " in line)


SGD_STEP_CELL = """
torch.manual_seed(0)
sgd_model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
sgd_model = sgd_model.to(torch_xla.device())
sgd = torch.optim.SGD(sgd_model.parameters(), lr=0.01, momentum=0.9)

def sgd_step(x, y):
    sgd.zero_grad()
    loss = torch.nn.functional.cross_entropy(sgd_model(x), y)
    loss.backward()
    sgd.step()
    return loss

csgd_step = torch.compile(sgd_step, backend="openxla")
"""


@pytest.mark.stack
def test_a_compiled_step_whose_optimizer_state_appears_is_no_recompile(shell, capsys):
    # SGD with momentum under torch.compile: its step() is compiled with the state dict empty,
    # the first step fills it, and Dynamo's guard on its length fails once. That is a graph
    # as state appeared, like the lazy loop's, not a recompile with padding to advise.
    assert shell.run_cell(SGD_STEP_CELL).success
    capsys.readouterr()
    loop = (
        "%%on_tpu -o\nfor n in {sizes}:\n"
        "    loss = csgd_step(torch.randn(n, 16).to(torch_xla.device()), "
        "torch.randint(0, 4, (n,)).to(torch_xla.device()))"
    )
    report = shell.run_cell(loop.format(sizes="(8,) * 6")).result
    out = capsys.readouterr().out
    state = [c for c in report.compiled if c.state_appeared]
    assert len(state) == 1 and state[0].file.endswith("torch/optim/sgd.py"), report.compiled
    assert "RECOMPILED" not in _summary_line(out), out
    assert "compiled again: the optimizer's state appeared" in out, out
    assert "pad or bucket" not in out and "recompiled" not in out, out
    assert "compiled a graph as state appeared" in out, out
    assert "recompile" not in report.judgement.compile_kinds, report.judgement
    # the same step given a new batch size is still a recompile, with the advice to pad
    report = shell.run_cell(loop.format(sizes="(8, 8, 5, 8)")).result
    out = capsys.readouterr().out
    assert "RECOMPILED" in _summary_line(out) and "pad or bucket" in out, out
    assert report.judgement.compile_kinds.count("recompile") >= 1, report.judgement


@pytest.mark.stack
def test_an_optimizer_made_again_is_named_as_a_new_object_not_a_shape(shell, capsys):
    # torch.optim's step is one code for every optimizer: Dynamo compiled it for the first
    # SGD object, and a second one (a setup cell run again) fails its identity guard
    made = SGD_STEP_CELL.replace("sgd", "again").replace("16", "21").replace("32", "23")
    assert shell.run_cell(made).success
    loop = (
        "%%on_tpu\nfor n in (8,) * 3:\n"
        "    loss = cagain_step(torch.randn(n, 21).to(torch_xla.device()), "
        "torch.randint(0, 4, (n,)).to(torch_xla.device()))"
    )
    shell.run_cell(loop)
    shell.run_cell("again = torch.optim.SGD(again_model.parameters(), lr=0.01, momentum=0.9)")
    capsys.readouterr()
    shell.run_cell(loop)
    out = capsys.readouterr().out
    assert "is another object than the one it was compiled for" in out, out
    assert "make the objects once and reuse them" in out, out
    assert "pad or bucket" not in out, out
    assert "compiled again: the optimizer's state appeared" in out, out  # the new SGD's


@pytest.mark.stack
def test_earlier_work_is_the_first_compiled_graphs_inputs_not_the_backwards(shell, capsys):
    # work an earlier cell left pending runs at the Dynamo bridge's sync of the forward's
    # inputs; the backward's own inputs' graph (its gradient seed, made by this step's
    # backward()) is this step's work, compiled once and run at every step
    # (widths and a seed dtype of its own: its graphs are compiled in this cell whatever ran
    # before)
    made = SGD_STEP_CELL.replace("sgd", "pend").replace("16", "19").replace("32", "27")
    made = made.replace("loss.backward()", "loss.double().backward()")
    assert shell.run_cell(made).success
    assert shell.run_cell("with torch.no_grad():\n    pend_model[0].weight.mul_(0.5)").success
    capsys.readouterr()
    shell.run_cell(
        "%%on_tpu\nfor n in (8,) * 4:\n"
        "    loss = cpend_step(torch.randn(n, 19).to(torch_xla.device()), "
        "torch.randint(0, 4, (n,)).to(torch_xla.device()))"
    )
    out = capsys.readouterr().out
    assert "compiled, with earlier cells' work ×1:" in out, out
    assert "compiled its inputs' pending work" in out, out


def test_a_compiled_forward_counts_its_own_xla_compiles_not_the_step_ends(shell, capsys):
    # A compiled forward, an eager backward and the step's sync on a later line: the sync's
    # graphs (the gradients) are the step's, not the function's.
    assert shell.run_cell(MODEL_CELL.format(name="fwd_own", width=12)).success
    cell = (
        "%%on_tpu -o\n"
        "for n in (8, 9):\n"
        "    xb = torch.randn(n, 4, device=dev)\n"
        "    fwd_own_c(xb).backward()\n"
        "    torch_xla.sync()\n"
    )
    report = shell.run_cell(cell).result
    capsys.readouterr()
    frames = [c for c in report.compiled if c.function == "fwd_own"]
    assert len(frames) == 2 and {c.line.line for c in frames} == {4}
    at_sync = [e for e in report.compile_events if e.site and e.site.line and e.site.line.line == 5]
    assert at_sync, [(e.site, e.cause) for e in report.compile_events]
    for frame in frames:
        start, end = frame.log_span
        own = [
            e
            for e in report.compile_events
            if start <= e.offset < end and not (e.site and e.site.line and e.site.line.line == 5)
        ]
        assert frame.xla_compiles == len(own) >= 1, (frame, own)
    assert sum(c.xla_compiles for c in frames) + len(at_sync) <= report.metrics.compiles


@pytest.mark.stack
def test_plain_cell_and_on_tpu_count_the_same_compiled_work(shell, capsys):
    assert shell.run_cell(MODEL_CELL.format(name="fwd_b", width=16)).success
    loop = LOOP.format(sizes="(8, 9, 8)", name="fwd_b")
    shell.run_cell(loop)  # compiles both shapes
    capsys.readouterr()
    shell.run_cell(loop)
    plain = _xla_line(capsys.readouterr().out)
    report = shell.run_cell("%%on_tpu -o\n" + loop).result
    m = report.metrics
    assert plain == {"compiled": m.compiles, "executed": m.executions}
    assert m.executions >= 3
    # cold, in a plain cell: the counts carried across torch_xla's clears are still there
    assert shell.run_cell(MODEL_CELL.format(name="fwd_c", width=16)).success
    capsys.readouterr()
    shell.run_cell(LOOP.format(sizes="(8, 8)", name="fwd_c"))
    cold = _xla_line(capsys.readouterr().out)
    assert cold["executed"] >= 2, cold  # Dynamo compiled (and cleared counters) meanwhile


@pytest.mark.stack
def test_graph_breaks_named_with_reason_and_line(shell, capsys):
    assert shell.run_cell(MODEL_CELL.format(name="fwd_d", width=16)).success
    assert shell.run_cell(BREAK_CELL.format(name="brk")).success
    capsys.readouterr()
    report = shell.run_cell("%%on_tpu -o\nxb = torch.randn(8, 4)\nvalue = brk_c(xb)\n").result
    out = capsys.readouterr().out
    assert "inside" in out  # the function's print ran, once
    breaks = [b for c in report.compiled for b in c.graph_breaks]
    by_line = {b.line: b for b in breaks}
    assert set(by_line) == {3, 4}, breaks  # print, then .item(), in the function's cell
    assert "print" in by_line[3].explanation
    assert "Tensor.item()" in by_line[4].reason
    assert all(c.line is not None and c.line.line == 3 for c in report.compiled)
    assert "graph break at" in out and "Tensor.item()" in out
    # tpu_nb's own .item() hook is not compiled by Dynamo: only the function and the two
    # continuations after its breaks, as without tpu_nb.
    assert [c.function for c in report.compiled] == [
        "brk",
        "torch_dynamo_resume_in_brk_at_3",
        "torch_dynamo_resume_in_brk_at_4",
    ]


def test_fixed_shape_compiles_once_and_no_dynamo_facts_when_warm(shell):
    assert shell.run_cell(MODEL_CELL.format(name="fwd_e", width=16)).success
    cell = "%%on_tpu -o\n" + LOOP.format(sizes="(8, 8, 8)", name="fwd_e")
    first = shell.run_cell(cell).result
    assert [c.recompile for c in first.compiled] == [False]
    assert first.recompilations == {} or not first.recompiled
    second = shell.run_cell(cell).result
    assert second.compiled == () and not second.recompiled


STEP_CELL = """\
import torch, torch_xla
torch.manual_seed(0)
dev = torch_xla.device()
net = torch.nn.Sequential(
    torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)
).to(dev)
opt = torch.optim.SGD(net.parameters(), lr=0.1)

def {name}(x):
    opt.zero_grad()
    loss = net(x).sum()
    loss.backward()
    opt.step()
    return loss

{name}_c = torch_xla.compile({name})
"""

STEP_LOOP = """\
for n in {sizes}:
    xb = torch.randn(n, 4, device=dev)
    loss = {name}_c(xb)
"""


@pytest.mark.stack
def test_torch_xla_compile_one_recompile_names_the_shape(shell, capsys):
    assert shell.run_cell(STEP_CELL.format(name="step_a")).success
    capsys.readouterr()
    cell = "%%on_tpu -o\n" + STEP_LOOP.format(sizes="(8, 8, 8, 8, 9, 8)", name="step_a")
    report, raw, out = _run_counted(shell, capsys, cell)
    assert _figures_are_raw(report, raw)
    assert report.compiled == ()  # torch_xla.compile is not Dynamo
    # One real recompile (the 9-row batch): the function's second graph, not the inputs'.
    ((where, graphs),) = report.recompiled_lines().items()
    assert where[1] == 4 and graphs == 2  # the calling line, the function's two graphs
    assert "recompiled ×1" in out
    # The input that changed is named from the function's arguments at its calls (the
    # calling line passed `xb`), whether or not the recorder captured both graphs.
    assert (
        "torch_xla.compile traced step_a again: `xb` (the function's `x`) has 9 rows, "
        "the cached graph was built for 8"
    ) in out
    assert "did not capture both" not in out
    assert "compiled the steady step's graph" not in out


@pytest.mark.stack
def test_torch_xla_compile_fixed_shape_is_no_recompile(shell, capsys):
    assert shell.run_cell(STEP_CELL.format(name="step_b")).success
    report = shell.run_cell(
        "%%on_tpu -o\n" + STEP_LOOP.format(sizes="(8, 8, 8, 8)", name="step_b")
    ).result
    assert not report.recompiled and report.metrics.executions >= 4


@pytest.mark.stack
def test_torch_xla_compile_runs_earlier_work_apart_from_the_first_steps_graph(shell, capsys):
    # torch_xla.compile runs all pending work in a graph of its own before the function's:
    # work an earlier cell left pending is that graph, and the function's first graph is the
    # line's first step's, not one "with this step's"
    assert shell.run_cell(STEP_CELL.format(name="step_e")).success
    assert shell.run_cell("left_over = torch.ones(3, device=dev) * 2").success
    capsys.readouterr()
    cell = "%%on_tpu -o\n" + STEP_LOOP.format(sizes="(5, 5, 5, 5, 5)", name="step_e")
    report, raw, out = _run_counted(shell, capsys, cell)
    assert _figures_are_raw(report, raw), raw
    assert "`left_over`, left pending before this cell" in out, out
    assert "in a graph of its own before the function's" in out, out
    assert "one graph with this step's" not in out, out
    assert "the first step's graph, work earlier cells left pending" in out, out
    assert "at the sync torch_xla.compile makes after the function runs" in out, out
    assert "why is not known" not in out, out
    # the second call's inputs (its `xb` alone) compiled a graph once: no steady compile
    assert "a graph of a compiled function's inputs" in out, out
    assert "compile-bound" not in out.splitlines()[0], out


@pytest.mark.stack
def test_max_graphs_counts_the_compiled_functions_graphs(shell, capsys):
    from tpu_nb.runtime.tracking import RecompilationError

    assert shell.run_cell(MODEL_CELL.format(name="fwd_g", width=16)).success
    two = "%%on_tpu --max-graphs 2\n" + LOOP.format(sizes="(8, 8, 9, 9)", name="fwd_g")
    assert shell.run_cell(two).success  # two shapes: two graphs, allowed
    capsys.readouterr()
    assert shell.run_cell(MODEL_CELL.format(name="fwd_h", width=23)).success
    three = "%%on_tpu --max-graphs 2\n" + LOOP.format(sizes="(8, 9, 10, 8)", name="fwd_h")
    result = shell.run_cell(three)
    error = result.error_in_exec
    assert isinstance(error, RecompilationError)
    assert shell.user_ns["n"] == 10  # stopped at the third shape, not before
    assert "`xb` (the function's `x`) has 10 rows, the cached graph was built for 9" in str(error)


def _dynamo_loop(compiled, sizes, monitor):
    dev = tpu_nb.device()
    for n in sizes:
        compiled(torch.randn(n, 4).to(dev))  # CALL-LINE
        torch_xla.sync()
        monitor.poll()
    return monitor.poll()


def test_dashboard_counts_a_compiled_functions_graphs_per_dynamo_compile():
    from tpu_nb.runtime.live import LiveMonitor

    dev = tpu_nb.device()
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 19), torch.nn.ReLU(), torch.nn.Linear(19, 2)).to(
        dev
    )

    def loss(x):
        return mlp(x).sum()

    compiled = torch.compile(loss, backend="openxla")
    monitor = LiveMonitor(alert_graphs=2)
    with tpu_nb.track():
        state = _dynamo_loop(compiled, (8, 8, 9), monitor)
        assert not state.alerts  # two shapes: two compiles of the function, allowed
        state = _dynamo_loop(compiled, (10,), monitor)
    monitor.close()
    lines = {
        k: [(e.kind, e.offset, e.graph_hash[:6]) for e in v] for k, v in monitor._lines.items()
    }
    assert len(state.alerts) == 1, lines
    (alert,) = state.alerts
    assert alert.source == "Dynamo"
    assert "`x` has 10 rows, the cached graph was built for 9" in " ".join(alert.differs)


def test_compiled_functions_section_is_escaped_in_html():
    from tpu_nb.display.compiled_view import compiled_html, compiled_text
    from tpu_nb.runtime.tracking._dynamo import DynamoCompile, GraphBreak, changed_inputs

    reason = "tensor 'x' size mismatch at index 0. expected 8, actual 9"
    frames = (
        DynamoCompile("0/0", "<lambda>", "/tmp/<model>.py", 3, seconds=0.5),
        DynamoCompile(
            "0/1",
            "<lambda>",
            "/tmp/<model>.py",
            3,
            seconds=0.25,
            guard_failures=(reason,),
            changed=changed_inputs(reason),
            input_shapes={"l_x_": (9, 4)},
            graph_breaks=(GraphBreak("Unsupported <script>", "/tmp/<model>.py", 5),),
        ),
    )
    text = "\n".join(compiled_text(frames))
    assert "recompiled: `x` has 9 rows, the cached graph was built for 8" in text
    assert "graph break at <model>.py:5: Unsupported <script>" in text
    html = compiled_html(frames)
    assert "<script>" not in html and "<model>" not in html
    assert "&lt;script&gt;" in html and "&lt;lambda&gt;" in html and "&lt;model&gt;" in html
    assert compiled_html(()) == "" and compiled_text(()) == []


# -- a small transformer block -------------------------------------------------------------------
# One encoder layer (attention, layer norms, feed-forward): the graphs a real model makes, at a
# size that compiles in about a second on XLA:CPU. Batches are (rows, 5 tokens, 16 features).

BLOCK_CELL = """\
import torch, torch_xla
torch.manual_seed(0)
dev = torch_xla.device()
block = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).to(dev)
block_opt = torch.optim.SGD(block.parameters(), lr=0.01)

def tc_fwd(x):
    return block(x).sum()

def tc_brk(x):
    y = block(x)
    print("inside")
    if y.sum().item() > -1e9:
        y = y + 1
    return y.sum()

def tx_step(x):
    block_opt.zero_grad()
    y = block(x)
    if y.sum().item() > -1e9:
        y = y + 1
    loss = y.sum()
    loss.backward()
    block_opt.step()
    return loss

tc_fwd_c = torch.compile(tc_fwd, backend="openxla")
tc_brk_c = torch.compile(tc_brk, backend="openxla")
tx_step_c = torch_xla.compile(tx_step)
"""

BLOCK_LOOP = """\
for n in {sizes}:
    xb = torch.randn(n, 5, 16, device=dev)
    out = {name}(xb)
    torch_xla.sync()
"""


def _lines(report) -> set:
    return {e.site.line.line if e.site and e.site.line else None for e in report.compile_events}


@pytest.mark.stack
def test_transformer_block_under_torch_compile(shell, capsys):
    assert shell.run_cell(BLOCK_CELL).success
    capsys.readouterr()
    cell = "%%on_tpu -o\n" + BLOCK_LOOP.format(sizes="(2, 2, 3, 2)", name="tc_fwd_c")
    report = shell.run_cell(cell).result
    out = capsys.readouterr().out
    compiled = [c for c in report.compiled if c.function == "tc_fwd"]
    assert [c.recompile for c in compiled] == [False, True]
    why = "`xb` (the function's `x`) has size 3 in dimension 0, the cached graph was built for 2"
    assert compiled[1].why() == why
    assert f"recompiled: {why}" in out
    assert _lines(report) == {4}  # every compile on the line that called the function
    assert "line not recorded" not in out and "did not capture both" not in out
    assert report.metrics.compiles == len(report.compile_events) >= 2

    # Warm: Dynamo compiles nothing and clears no counter; the raw counters are the truth.
    before = _raw_counts()
    warm = shell.run_cell(cell).result
    raw = {n: _raw_counts()[n] - before[n] for n in before}
    assert warm.compiled == () and warm.metrics.compiles == 0 == raw["UncachedCompile"]
    assert warm.metrics.executions == raw["ExecuteTime"] >= 4  # the bridge's runs included
    assert (warm.metrics.cache_hits, warm.metrics.syncs) == (raw["CachedCompile"], raw["MarkStep"])
    # A plain cell does the same work and says so.
    capsys.readouterr()
    shell.run_cell(BLOCK_LOOP.format(sizes="(2, 2, 3, 2)", name="tc_fwd_c"))
    plain = _xla_line(capsys.readouterr().out)
    assert plain == {"compiled": warm.metrics.compiles, "executed": warm.metrics.executions}


@pytest.mark.stack
def test_transformer_block_graph_break_under_torch_compile(shell, capsys):
    assert shell.run_cell(BLOCK_CELL).success
    capsys.readouterr()
    report = shell.run_cell("%%on_tpu -o\n" + BLOCK_LOOP.format(sizes="(2,)", name="tc_brk_c"))
    report = report.result
    out = capsys.readouterr().out
    by_line = {b.line: b for c in report.compiled for b in c.graph_breaks}
    assert set(by_line) == {12, 13}, by_line  # print, then .item(), in the cell that defines it
    assert "print" in by_line[12].explanation and "Tensor.item()" in by_line[13].reason
    assert "graph break at cell line 12: Failed to trace builtin operator" in out
    assert "graph break at cell line 13: Unsupported Tensor.item() call" in out
    assert _lines(report) == {4}
    assert "line not recorded" not in out


@pytest.mark.stack
def test_transformer_block_under_torch_xla_compile(shell, capsys):
    assert shell.run_cell(BLOCK_CELL).success
    capsys.readouterr()
    cell = "%%on_tpu -o\n" + BLOCK_LOOP.format(sizes="(2, 2, 2, 3, 2)", name="tx_step_c")
    report, raw, out = _run_counted(shell, capsys, cell)
    assert _figures_are_raw(report, raw)
    assert _lines(report) == {4}
    assert (
        "torch_xla.compile traced tx_step again: `xb` (the function's `x`) has size 3 in "
        "dimension 0, the cached graph was built for 2"
    ) in out
    # The .item() inside the function splits its graph: named with its line in the function.
    assert re.search(r"line 4: read from the device ×5: \.item\(\)", out), out
    assert re.search(r"line 4 → In \[\d+\], line 20 tx_step", out), out
    assert "line not recorded" not in out and "did not capture both" not in out
    # A plain cell does the same work and says so.
    capsys.readouterr()
    plain_cell = BLOCK_LOOP.format(sizes="(2, 2, 2, 3, 2)", name="tx_step_c")
    shell.run_cell(plain_cell)
    plain = _xla_line(capsys.readouterr().out)
    warm = shell.run_cell("%%on_tpu -o\n" + plain_cell).result
    assert plain == {"compiled": warm.metrics.compiles, "executed": warm.metrics.executions}


@pytest.mark.stack
def test_backward_of_a_compiled_function_is_on_the_users_line(shell, capsys):
    """Autograd runs the backward of a torch.compile'd function on a thread of its own,
    where its graphs compile: they belong to the line that called backward."""
    assert shell.run_cell(MODEL_CELL.format(name="fwd_k", width=13)).success
    capsys.readouterr()
    cell = (
        "%%on_tpu -o\nfor n in (8, 8):\n    batch = torch.randn(n, 4, device=dev)\n"
        "    loss = fwd_k_c(batch)\n    loss.backward()\n    torch_xla.sync()\n"
    )
    report = shell.run_cell(cell).result
    out = capsys.readouterr().out
    assert "line not recorded" not in out
    assert None not in _lines(report) and _lines(report) <= {4, 5, 6}
    autograd = [e for e in report.compile_events if e.site.line.line == 5]
    assert all(inputs_sync(e) for e in autograd), autograd


MOMENTUM_CELL = """\
import torch, torch_xla
torch.manual_seed(0)
dev = torch_xla.device()
mnet = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(dev)
mopt = torch.optim.SGD(mnet.parameters(), lr=0.1, momentum=0.9)

def mstep(x):
    mopt.zero_grad()
    loss = mnet(x).sum()
    loss.backward()
    mopt.step()
    return loss

mstep_x = torch_xla.compile(mstep)
mstep_d = torch.compile(mstep, backend="openxla")
xb = torch.randn(8, 4, device=dev)
torch_xla.sync()
"""


@pytest.mark.stack
@pytest.mark.parametrize("compiled", ["mstep_x", "mstep_d"])
def test_tpu_time_tells_a_compiled_steps_first_run_from_its_steady_state(shell, compiled):
    assert shell.run_cell(MOMENTUM_CELL).success
    before = snapshot()
    timing = shell.run_line_magic("tpu_time", f"-o -n 2 -r 2 {compiled}(xb)")
    total = snapshot().since(before).compiles
    # The first run compiles the step; with momentum, the step after it is another graph
    # (the optimizer's state appears): the warm-up, not recompilation.
    assert timing.first_compiles >= 1
    assert timing.first_compiles + timing.warmup_compiles == total
    assert timing.steady_compiles == 0 and not timing.recompiles
    summary = timing.summary()
    assert "no recompilation" in summary and "STILL RECOMPILING" not in summary
    if timing.warmup_runs:
        assert f"warm-up: {timing.warmup_runs} more run" in summary
    # Timed again: nothing compiles, the first run is a steady-state run.
    again = shell.run_line_magic("tpu_time", f"-o -n 2 -r 2 {compiled}(xb)")
    assert again.first_compiles == again.warmup_runs == again.steady_compiles == 0
    assert "(0 graphs compiled)" in again.summary()


# -- every execution counted: compiled functions' cached graphs too ----------------------------


def _execute_samples() -> int:
    data = met.metric_data("ExecuteTime")
    return data[0] if data else 0


def _mlp():
    dev = torch_xla.device()
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)).to(
        dev
    )


def _with_a_break(model):
    def noisy(x):
        y = model(x)
        print("", end="")  # a graph break: two graphs per call
        return (y * 2).sum()

    return noisy


@pytest.mark.parametrize(
    "compiler, sizes",
    [
        ("torch.compile", (8, 8, 8)),
        ("torch.compile", (8, 8, 9, 9)),
        ("torch.compile with a break", (8, 8, 9)),
        ("torch_xla.compile", (8, 8, 9)),
    ],
)
def test_executions_equal_torch_xlas_execution_samples(compiler, sizes):
    model = _mlp()
    if compiler == "torch.compile":
        fn = torch.compile(model, backend="openxla")
    elif compiler == "torch.compile with a break":
        fn = torch.compile(_with_a_break(model), backend="openxla")
    else:
        fn = torch_xla.compile(lambda x: model(x).sum())
    dev = torch_xla.device()
    torch_xla.sync()
    wait_device_ops()
    before = _execute_samples()
    with tpu_nb.track(compiler) as report:
        for n in sizes:
            fn(torch.randn(n, 4).to(dev))
        torch_xla.sync()
    assert report.waited  # every execution finished: its sample is in
    assert report.metrics.executions == _execute_samples() - before > 0
    bridge = report.metrics.compiled_code_executions
    if compiler.startswith("torch.compile"):
        # each call runs its cached graph(s) through the bridge, without the counter
        per_call = 2 if "break" in compiler else 1
        assert bridge >= per_call * len(sizes), report.metrics
        assert "compiled functions'" in str(report.metrics)
    else:  # torch_xla.compile traces each call and syncs: counted executions
        assert bridge == 0


# One count for --max-graphs and the report: a function called with a new size at each step,
# eagerly (its own sync) or compiled by either compiler, under --max-graphs 2.
COUNTED_FNS = {
    "eager": "def {name}(x):\n    y = (x * 2 + 1).sum()\n    torch_xla.sync()\n    return y\n",
    "openxla": "def {name}_f(x):\n    return (x * 2 + 1).sum()\n"
    "{name} = torch.compile({name}_f, backend='openxla')\n",
    # (other arithmetic than the eager function's: graphs of its own, none cached)
    "torch_xla.compile": "def {name}_f(x):\n    return (x * 2 + 5).sum()\n"
    "{name} = torch_xla.compile({name}_f)\n",
}


@pytest.mark.parametrize("how", list(COUNTED_FNS))
def test_max_graphs_stops_where_the_reports_count_for_the_line_passes_it(shell, how):
    from tpu_nb.runtime.tracking import RecompilationError

    name = "counted_" + re.sub(r"\W", "_", how)
    assert shell.run_cell("import torch, torch_xla\n" + COUNTED_FNS[how].format(name=name)).success
    cell = (
        "%%on_tpu --max-graphs 2\n"
        "for n in range(1, 21):\n"
        "    x = torch.ones(n)\n"
        f"    out = {name}(x)\n"  # cell line 4
        "    torch_xla.sync()\n"
    )
    error = shell.run_cell(cell).error_in_exec
    assert isinstance(error, RecompilationError), error
    assert shell.user_ns["n"] == 3  # the step of the line's third graph, not before or after
    report = tpu_nb.last_report()
    # The report's count for line 4: every graph of the line's own code (the inputs'
    # pending work apart), the same that stopped the run.
    graphs = {
        e.graph_hash
        for e in report.compile_events
        if e.site is not None
        and e.site.line is not None
        and e.site.line.line == 4
        and not inputs_sync(e)
    }
    assert len(graphs) == 2 + (how != "torch_xla.compile")  # its detector stops the trace
    if how != "torch_xla.compile":
        assert "line 4 compiled graph 3 (max_graphs=2)" in str(error)
    # and the report's rows for line 4 say that count: the inputs' graphs are a row apart
    from tpu_nb.display.reports import group_findings

    rows = [g for g in group_findings(list(report.findings)) if g.line == 4]
    own = ("compile", "warm-up", "state", "variant", "recompile", "growing")
    assert sum(g.count for g in rows if g.kind in own) == len(graphs), rows
    inputs = [e for e in report.compile_events if inputs_sync(e) and e.site is not None]
    assert sum(g.count for g in rows if g.kind == "inputs") == len(inputs), rows


def test_a_function_past_dynamos_recompile_limit_is_named_and_its_eager_compiles_counted(shell):
    from tpu_nb.display.compiled_view import compiled_text

    name = "past_limit"
    # Its own computation: graphs no other test compiled, so each eager size compiles.
    fn = COUNTED_FNS["openxla"].format(name=name).replace("x * 2 + 1", "x * 3 - 7")
    assert shell.run_cell("import torch, torch_xla\n" + fn).success
    cell = (
        "%%on_tpu -o\n"
        "for n in range(1, 7):\n"
        "    x = torch.ones(n)\n"
        f"    out = {name}(x)\n"  # cell line 4
        "    torch_xla.sync()\n"
    )
    with torch._dynamo.config.patch(recompile_limit=2):
        report = shell.run_cell(cell).result
    section = "\n".join(compiled_text(report.compiled))
    head = re.search(rf"{name}_f \(cell line 2\), called at cell line 4: (\d+) graphs", section)
    assert head and head.group(1) == "2", section  # the limit's two, not the one it gave up on
    assert "?" not in section, section
    stopped = re.search(
        r"Dynamo stopped compiling it \(recompile_limit reached; last: `x` has size 3 .*\) "
        r"and runs it eagerly from then on: (\d+) XLA compiles of its eager code",
        section,
    )
    assert stopped, section
    assert int(stopped.group(1)) == 4  # sizes 3 to 6, each its own eager graph


def _closure_step():
    """A torch_xla.compile'd training step whose model and optimizer live in its closure: no
    frame on the stack at its sync names them."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 4, device=torch_xla.device())

    def body():
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    return torch_xla.compile(body)


def test_a_step_whose_tensors_are_out_of_reach_is_not_searched_at_every_sync():
    # Looking for the pending graph walks what the code holds (~0.3 ms here). A line whose
    # tensors no frame names finds nothing; it is looked at again once (a data loader's
    # first sync also finds nothing), not at every sync up to the per-line limit.
    step = _closure_step()
    step()
    with tpu_nb.track(sync=False) as report:
        for _ in range(30):
            step()
    assert report.syncs == 30
    # the first call, its retry, the steady step's third call
    assert report.captures <= 3, report.captures
