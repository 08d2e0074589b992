"""track(): compile events name the right cause and line; reports are complete on exit."""

import pytest
import torch
import torch_xla
from conftest import line_of

import tpu_nb


def _mlp(dev, width=33, optimizer=torch.optim.SGD):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
    ).to(dev)
    return model, optimizer(model.parameters(), lr=0.1)


def test_first_training_step_compiles_at_the_sync_line():
    dev = tpu_nb.device()
    model, opt = _mlp(dev, optimizer=torch.optim.Adam)  # Adam creates its state at step 1
    x, y = torch.randn(8, 33, device=dev), torch.randint(0, 10, (8,), device=dev)
    torch_xla.sync()

    def train_step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        torch_xla.sync()  # SYNC-LINE

    with tpu_nb.track("step") as report:
        train_step()
    assert report.complete and report.error is None and report.waited
    assert report.metrics.compiles >= 1
    events = report.compile_events
    assert len(events) == report.metrics.compiles
    first = events[0]
    assert first.kind == "sync" and "torch_xla.sync" in first.cause
    assert first.user_frame.file == __file__
    assert first.user_frame.line == line_of(
        "SYNC-LINE", test_first_training_step_compiles_at_the_sync_line
    )
    assert first.user_frame.function == "train_step"
    assert len(first.graph_hash) == 32 and first.inputs > 0 and first.outputs > 0
    assert "graph output" in first.sizes_gb
    assert report.wall_seconds >= report.metrics.compile_seconds > 0
    with tpu_nb.track("second step") as second:
        train_step()
    # The first step created gradients: its graph has other outputs than the steady step's.
    # The line's second graph (the process's history) is not a recompilation of this run,
    # which compiled it once.
    assert second.metrics.compiles == 1
    assert list(second.recompilations) == [(first.user_frame.file, first.user_frame.line)]
    assert not second.recompiled
    with tpu_nb.track("third step") as third:
        train_step()
    assert third.metrics.compiles == 0 and third.metrics.cache_hits >= 1


def test_item_before_sync_is_a_value_access_at_its_line():
    dev = tpu_nb.device()
    a = torch.randn(4, 4, device=dev)
    torch_xla.sync()
    with tpu_nb.track() as report:
        b = (a @ a + 3.25).mean()
        value = b.item()  # ITEM-LINE
    assert isinstance(value, float)
    assert report.metrics.host_reads == 1
    access = [e for e in report.compile_events if e.kind == "value-access"]
    assert len(access) == 1
    assert access[0].user_frame.line == line_of(
        "ITEM-LINE", test_item_before_sync_is_a_value_access_at_its_line
    )
    assert "access tensor value" in access[0].cause


def test_shape_change_between_runs_is_history_not_a_recompilation():
    dev = tpu_nb.device()
    w = torch.randn(16, 16, device=dev)
    torch_xla.sync()

    def run(batch):
        out = torch.randn(batch, 16, device=dev) @ w
        torch_xla.sync()  # SHAPE-LINE
        return out

    with tpu_nb.track() as first:
        run(3)
    assert not first.recompiled
    with tpu_nb.track() as second:
        run(5)  # a new shape: a new graph from the same line, once in this run
    assert second.metrics.compiles == 1
    line = line_of("SHAPE-LINE", test_shape_change_between_runs_is_history_not_a_recompilation)
    ((key, hashes),) = second.recompilations.items()
    assert key == (__file__, line) and len(hashes) == 2
    assert hashes[0] == first.compile_events[0].graph_hash
    assert not second.recompiled and "RECOMPILED" not in second.summary()
    with tpu_nb.track() as third:
        run(5)  # cached: no compile, nothing new
    assert third.metrics.compiles == 0 and third.metrics.cache_hits == 1


def test_histc_fallback_counted_with_its_compile_line():
    dev = tpu_nb.device()
    with tpu_nb.track() as report:
        data = torch.linspace(-2, 2, 40, device=dev) * 1.5
        hist = torch.histc(data, bins=4)  # HISTC-LINE
        total = hist.sum()
    assert report.metrics.fallbacks == {"histc": 1}
    # histc runs on the CPU, so its input is computed and read back first: a compile whose
    # cause is a value access, triggered from the histc line.
    line = line_of("HISTC-LINE", test_histc_fallback_counted_with_its_compile_line)
    lines = {e.user_frame.line for e in report.compile_events if e.kind == "value-access"}
    assert line in lines
    assert float(total.cpu()) == 40


def test_report_is_complete_on_error_and_error_propagates():
    dev = tpu_nb.device()
    with pytest.raises(ZeroDivisionError), tpu_nb.track("boom") as report:
        (torch.ones(6, device=dev) * 2).sum().item()
        _ = 1 / 0
    assert report.complete
    assert isinstance(report.error, ZeroDivisionError)
    assert report.metrics.host_reads == 1
    assert tpu_nb.last_report() is report
    assert "failed: ZeroDivisionError" in report.summary()


def test_track_without_wait_does_not_block():
    dev = tpu_nb.device()
    x = torch.randn(32, 32, device=dev)
    torch_xla.sync()
    with tpu_nb.track(wait=False) as report:
        y = (x @ x).relu()
        torch_xla.sync()
    assert not report.waited and report.metrics.syncs == 1 and y.dim() == 2


def test_track_makes_no_sync_of_its_own_and_names_the_work_it_leaves_pending():
    dev = tpu_nb.device()
    x = torch.randn(32, 32, device=dev)
    # wait: an execution still in flight from before the block (this one, or an earlier
    # test's wait=False block) is counted by the block it finishes in
    torch_xla.sync(wait=True)
    with tpu_nb.track() as report:
        kept = (x @ x).sum()  # never synced, never read: left pending, as without tpu_nb
    assert report.metrics.syncs == report.metrics.executions == 0
    pending = report.pending
    assert pending is not None and pending.holders == ("kept",) and pending.tensors == 1
    assert {op for op, _ in pending.ops} >= {"aten::mm", "aten::sum"}, pending.ops
    assert "kept" in str(report) and "not run here" in str(report)
    # the work runs where the next sync is, and is counted there
    with tpu_nb.track() as later:
        torch_xla.sync()
    assert later.metrics.executions == 1 and later.pending is None
    assert kept.item() == pytest.approx(float((x.cpu() @ x.cpu()).sum()), rel=1e-4)


def test_on_tpu_in_a_script_names_the_work_it_leaves_pending():
    """on_tpu() without a namespace looks where track() does: the block's frame."""
    dev = tpu_nb.device()
    x = torch.randn(16, 16, device=dev)
    torch_xla.sync(wait=True)
    with tpu_nb.on_tpu() as report:
        kept = (x @ x).sum()  # left pending, never synced nor read
    pending = report.pending
    assert pending is not None and pending.holders == ("kept",), report
    assert "kept" in str(report) and "not run here" in str(report)
    torch_xla.sync()
    assert kept.item() == pytest.approx(float((x.cpu() @ x.cpu()).sum()), rel=1e-4)


def test_sync_skipped_when_the_block_already_synced_and_done_when_work_is_pending():
    dev = tpu_nb.device()
    x = torch.randn(16, 16, device=dev)
    torch_xla.sync()
    with tpu_nb.track(wait=False, sync=True) as synced:
        y = x @ x
        torch_xla.sync()  # the block's own sync leaves nothing pending
    assert synced.metrics.syncs == 1 and not synced.synced_at_end
    with tpu_nb.track(wait=False, sync=True) as pending:
        z = (y @ x).relu()
        torch_xla.sync()
        z.add_(1)  # in-place work after the sync: pending
    assert pending.metrics.syncs == 2 and pending.synced_at_end and pending.pending is None
    # With wait=False an execution still in flight is counted by the next report: wait here so
    # the next block counts only its own.
    tpu_nb.sync(wait=True)
    with tpu_nb.track(wait=False, sync=True) as unsynced:
        w = z * 2  # no sync of its own: track(sync=True) runs it
    tpu_nb.sync(wait=True)
    assert unsynced.metrics.syncs == 1
    assert torch.allclose(w.cpu(), z.cpu() * 2)
    assert (
        unsynced.metrics.counters.get("UncachedCompile", 0)
        + unsynced.metrics.counters.get("CachedCompile", 0)
        == 1
    )


def _train_loop(batches, width):
    dev = tpu_nb.device()
    model, opt = _mlp(dev, width=width, optimizer=torch.optim.Adam)
    with tpu_nb.track() as report:
        for batch in batches:
            opt.zero_grad()
            model(torch.ones(batch, width, device=dev)).sum().backward()
            opt.step()
            torch_xla.sync()  # LOOP-SYNC
    return report


def test_new_shapes_after_the_warm_up_are_a_recompilation():
    report = _train_loop([4, 4, 6, 7, 8, 9], width=19)
    assert report.recompiled
    ((line, graphs),) = report.recompiled_lines().items()
    assert line[1] == line_of("LOOP-SYNC", _train_loop)
    assert graphs == 6
    pattern = report.judgement.lines[line]
    # the second step's graph, with Adam's state, ran at no later step: not a steady graph
    assert pattern.kind == "recompiling" and pattern.kinds[:2] == ("first", "state")
    assert "dim 0: 4 \u2192 6 \u2192 7 \u2192 8 \u2192 9" in pattern.progression
    assert not report.recompiled_lines(allowed=6)  # accepted when six are allowed


def test_a_new_shape_after_a_cached_one_is_named_in_the_progression():
    """Sentences of 5, 9, 5, 12, 9 and 7 tokens: the 12 comes after a 5 the cache held (a
    call captured for another reason); its graph is compared too, and named."""
    dev = tpu_nb.device()
    torch.manual_seed(0)
    # its own size: graphs no other test of the process has compiled
    embed = torch.nn.Embedding(100, 11).to(dev)
    sentences = [torch.arange(n) % 100 for n in (5, 9, 5, 12, 9, 7)]
    torch_xla.sync()
    with tpu_nb.track() as report:
        for tokens in sentences:
            vector = embed(tokens.to(dev)).mean(dim=0)  # noqa: F841
            torch_xla.sync()
    (pattern,) = [p for p in report.judgement.lines.values() if p.graphs > 1]
    assert pattern.graphs == 4
    assert "dim 0: 5 \u2192 9 \u2192 12 \u2192 7 (4 shapes)" in pattern.progression, pattern


def test_the_warm_up_and_a_bounded_set_of_shapes_are_not_a_recompilation():
    warm = _train_loop([4] * 8, width=23)
    assert not warm.recompiled
    assert {p.kind for p in warm.judgement.lines.values()} == {"warm-up"}
    buckets = _train_loop([4, 6, 8] * 4, width=29)
    assert not buckets.recompiled and "RECOMPILED" not in buckets.summary()
    (pattern,) = buckets.judgement.lines.values()
    assert pattern.kind == "variants" and pattern.calls_after >= 2, pattern


def test_reset_metrics_forgets_tpu_nb_history_too():
    from tpu_nb.runtime.metrics import reset_metrics
    from tpu_nb.runtime.tracking import store

    dev = tpu_nb.device()
    with tpu_nb.track():
        for n in (3, 4):
            (torch.ones(n, 5, device=dev) * 2).sum()
            torch_xla.sync()
    assert store.line_events and store.captured and tpu_nb.last_report() is not None
    reset_metrics()
    assert not store.line_events and not store.captured and not store.costs
    assert tpu_nb.last_report() is None


def test_max_graphs_flush_of_earlier_work_is_placed_at_the_start_not_on_a_line():
    """--max-graphs syncs as it starts, so work left pending before the block is not counted
    against the limit: its compile is said to be that, not "code this cell called"."""
    dev = tpu_nb.device()
    left_pending = torch.full((13, 17), 3.0, device=dev) * 2 + 1  # an earlier cell's tensor
    with tpu_nb.on_tpu(max_graphs=2) as report:
        total = torch.ones(19, 5, device=dev).sum()
        torch_xla.sync()  # BLOCK-SYNC
    compiles = [f for f in report.findings if f.kind == "compile"]
    assert [(f.place, f.what.split(" compiled ")[-1]) for f in compiles if not f.line] == [
        (
            "start of cell: work pending from before it",
            "by the sync --max-graphs makes before the cell runs, so that earlier work is not "
            "counted as the cell's",
        )
    ]  # tpu_nb's sync, not torch_xla's "user torch_xla.sync"
    here = test_max_graphs_flush_of_earlier_work_is_placed_at_the_start_not_on_a_line
    assert [f.line for f in compiles if f.line] == [line_of("# BLOCK-SYNC", here)]
    assert not any("not recorded" in f.place for f in report.findings)
    assert left_pending.cpu()[0, 0].item() == 7.0 and total.item() == 95.0


def test_a_compile_torch_xla_logs_no_cause_for_is_named_as_the_fallbacks():
    """A CPU fallback inside autograd's backward makes torch_xla compile the fallback's
    inputs with no cause in its log: the log is intact, and the report names that compile as
    the fallback's (neither a disk problem nor an unknown cause), even the first time the op
    falls back in the process."""
    import torch.nn.functional as F

    x = torch.randn(1, 2, 4, 4, device=tpu_nb.device(), requires_grad=True)
    torch_xla.sync()
    with tpu_nb.track() as report:
        y = F.interpolate(x * 2, scale_factor=2, mode="nearest")
        y.sum().backward()
        torch_xla.sync()
    assert report.metrics.fallbacks.get("upsample_nearest2d_backward") == 1
    assert report.metrics.compiles > len(report.compile_events)
    assert report.compile_log_problem == "", report.compile_log_problem
    (placed,) = [o for o in report.occurrences if o.kind == "fallback"]
    assert placed.count == 1 and placed.compiles == 1, placed  # on the backward() line
    assert placed.site.line is not None and placed.site.line.function == _this_test(), placed


def _this_test() -> str:
    return "test_a_compile_torch_xla_logs_no_cause_for_is_named_as_the_fallbacks"


def _fallbacks(report) -> list:
    found = [f for f in report.findings if f.kind == "fallback"]
    # every fallback counted once: the findings add up to torch_xla's counters
    assert sum(f.count for f in found) == sum(report.metrics.fallbacks.values()), found
    return found


def test_an_op_seen_falling_back_once_is_placed_in_every_later_run_with_or_without_a_sync():
    dev = tpu_nb.device()
    a, b = torch.arange(10, device=dev), torch.tensor([1, 3, 5], device=dev)

    def loop():
        for _ in range(3):
            torch.isin(a, b)  # the isin line
            torch_xla.sync()

    def no_sync():
        for _ in range(3):
            torch.isin(a, b)  # the isin line

    for code in (loop, loop, no_sync):
        with tpu_nb.on_tpu(code=(code.__code__,)) as report:
            code()
    with tpu_nb.on_tpu(code=(loop.__code__,)) as again:
        loop()
    for ran, fn in ((report, no_sync), (again, loop)):
        (placed,) = _fallbacks(ran)
        assert placed.line == line_of("# the isin line", fn) and placed.count == 3
        assert placed.what.startswith("torch.isin ran on the CPU")
        assert "(x[..., None] == values).any(-1)" in placed.hint


def test_a_fallback_autograd_runs_inside_backward_is_placed_on_the_backward_line():
    import torch.nn.functional as F

    x = torch.randn(1, 2, 4, 4, device=tpu_nb.device(), requires_grad=True)
    torch_xla.sync()

    def step():
        for _ in range(3):
            y = F.interpolate(x * 2, scale_factor=2, mode="nearest")
            y.sum().backward()  # the backward line
            torch_xla.sync()

    for _ in range(2):
        with tpu_nb.on_tpu(code=(step.__code__,)) as report:
            step()
    (placed,) = _fallbacks(report)
    assert placed.line == line_of("# the backward line", step) and placed.count == 3
    assert placed.what.startswith("the backward of F.interpolate ran on the CPU")
    # it falls back on XLA:CPU only (torch_xla lowers it on a TPU): said, with nothing to do
    assert "on a TPU torch_xla lowers this op" in placed.what and placed.hint == ""


def test_the_shape_watch_looks_at_every_name_a_cell_binds_and_only_those():
    """A new shape reaches a graph through a name the tracked code binds: every way a cell
    binds one is watched, and what it only reads (modules, attributes, builtins) is not."""
    from tpu_nb.runtime.tracking._provenance import names_bound, names_watched

    cell = compile(
        """
import torch as T
from torch.nn import functional as F
for step, (x, (y, z)) in enumerate(loader):
    x, y = x.to(dev), y.to(dev)
    loss = F.cross_entropy(model(x), y)
    total += loss
    with T.no_grad() as guard:
        if (w := x.sum()) > 0:
            pass
def refill():
    global batch
    batch, local = next(it), 1
lst = [k for k in range(3)]
""",
        "<cell>",
        "exec",
    )
    bound = names_bound([cell])
    assert {"T", "F", "step", "x", "y", "z", "loss", "total", "guard", "w"} <= bound
    assert {"refill", "batch", "lst"} <= bound
    assert not bound & {"loader", "dev", "model", "enumerate", "cross_entropy", "to", "local"}
    # what it reads is watched too, but for modules, functions and classes: a batch a helper
    # of an earlier cell assigns with `global` is the cell's tensor all the same
    namespace = {"loader": [], "dev": "xla", "model": torch.nn.Linear(2, 2), "T": torch}
    watched = names_watched([cell], namespace)
    assert {"loader", "dev", "model", "step", "x"} <= set(watched)
    assert not set(watched) & {"enumerate", "range", "next", "cross_entropy", "to", "local"}

    def helper(a):
        b, c = a  # one instruction for both names on Python 3.13
        for d in b:
            e = d
        return c, e

    assert names_bound([helper.__code__]) == {"a", "b", "c", "d", "e"}


def test_the_shape_watch_reads_a_batch_in_a_container_without_running_its_methods():
    """A batch in a dict, a BatchEncoding (a UserDict), a list or a tuple is watched, read
    from the container's storage: no method of the user's subclass runs (it could do
    anything), and a container too large to be a batch is not looked into."""
    from collections import UserDict

    from tpu_nb.runtime.tracking._provenance import _HELD, _watch_kind

    def loud(*_):
        raise AssertionError("tpu_nb ran a method of the user's container")

    class Batch(dict):
        values = items = keys = __iter__ = __len__ = __getitem__ = loud

    class Batches(list):
        __iter__ = __len__ = __getitem__ = loud

    class Encoding(UserDict):
        __getattr__ = __getitem__ = __iter__ = __len__ = keys = values = loud

    tensor = torch.ones(2)
    for held in (Batch(x=tensor), Batches([tensor]), (tensor,), Encoding(x=tensor)):
        assert _watch_kind(held)(held) == (tensor,)
    many = Batch({str(i): tensor for i in range(_HELD + 1)})
    assert _watch_kind(many)(many) == ()
    assert _watch_kind("a string") is None and _watch_kind(3) is None


def _new_shape_every_step(shapes, limit):
    dev = tpu_nb.device()
    with tpu_nb.on_tpu(max_graphs=limit) as report:
        for n in shapes:
            x = torch.ones(n, 3, device=dev) * 2
            torch_xla.sync()  # a new graph at every call
    assert x.shape[0] == shapes[-1]
    return report


def test_the_sync_max_graphs_makes_as_it_starts_is_no_step_of_the_loop():
    """A loop of 6 steps is 6 steps under --max-graphs too, whether its own sync as it
    starts has nothing to run or runs work left pending before the block."""
    dev = tpu_nb.device()

    def loop(max_graphs, rows):  # new rows each time: each run compiles its own graphs
        with tpu_nb.on_tpu(max_graphs=max_graphs) as report:
            w = torch.zeros(rows, 3, device=dev)
            for _ in range(6):
                w = w * 0.5 + 1
                torch_xla.sync()
        assert w.sum().item() == pytest.approx(rows * 3 * (2 - 0.5**5))
        return report

    for rows, pending in ((31, None), (37, torch.full((7, 2), 3.0, device=dev) * 2)):
        plain, limited = loop(None, rows), loop(4, rows + 1)
        assert plain.syncs == limited.syncs == 6, pending
        assert len(plain.steps) == len(limited.steps) == 6, pending
        assert limited.judgement.steady_steps == plain.judgement.steady_steps > 0, pending
        if pending is not None:
            assert pending[0, 0].item() == 6.0


def test_graphs_within_max_graphs_are_no_recompilation_in_the_summary_or_the_verdict():
    # must fire: no limit, a line compiling a new graph at each of 8 steps recompiles
    free = _new_shape_every_step(range(61, 69), None)
    assert free.recompiled and "RECOMPILED at 1 line(s)" in free.summary()
    assert "recompiling at" in free.judgement.verdict.reason, free.judgement.verdict
    # must not: --max-graphs 8 says 8 graphs are expected, and the fix is not to say so
    allowed = _new_shape_every_step(range(41, 49), 8)
    assert not allowed.recompiled and "RECOMPILED" not in allowed.summary()
    verdict = allowed.judgement.verdict
    assert verdict is None or "recompiling" not in verdict.reason, verdict
    assert verdict is None or "--max-graphs" not in verdict.fix, verdict
