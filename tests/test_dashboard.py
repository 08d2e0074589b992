"""The live dashboard's runtime side and rendering, on the real XLA:CPU runtime.

LiveMonitor (step times, compiles, the recompilation alert and its diff, fallbacks, host
reads, memory) and the HTML/text the dashboard draws from it. Widgets and the notebook stack
are in test_dashboard_widgets.py (InteractiveShell) and test_dashboard_kernel.py (kernels).
"""

import threading
import time

import pytest
import torch
import torch_xla
import torch_xla.core.xla_model as xm
from conftest import line_of, wait_until

import tpu_nb
from tpu_nb.display import dashboard_html as H
from tpu_nb.runtime.errors import TpuNbError
from tpu_nb.runtime.live import LiveMonitor
from tpu_nb.runtime.live._monitor import StepClock
from tpu_nb.runtime.metrics import CompileEvent, Frame, describe_difference
from tpu_nb.runtime.sources import place_text
from tpu_nb.runtime.units import format_seconds, percentile


def _mlp_step(width=48):
    dev = tpu_nb.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, width, device=dev), torch.randint(0, 10, (16,), device=dev)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        torch_xla.sync()

    return step


# -- step times -------------------------------------------------------------------------------


def test_step_clock_spans_k_executions_per_step_and_never_a_gap():
    clock = StepClock(start_wall=100.0)
    # Two executions per step (an .item() inside the loop), steps 3 s apart; a sample from
    # before the start does not count.
    samples = ((99.0, 1), (101.0, 1), (101.5, 1), (104.0, 1), (104.5, 1), (107.0, 1))
    assert clock.feed(2, {"ExecuteTime": (6, samples)}) == [3.0, 3.0, 3.0]
    # 50 executions completed, the buffer shows 2 of them: no interval across the unseen ones.
    assert clock.feed(1, {"ExecuteTime": (56, ((200.0, 1), (201.0, 1)))}) == [1.0]
    assert clock.feed(1, {"ExecuteTime": (57, ((201.0, 1), (202.5, 1)))}) == [1.5]
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.9) == pytest.approx(4.6)


def test_step_times_steps_and_rate_follow_a_training_loop():
    step = _mlp_step()
    for _ in range(5):
        step()
    xm.wait_device_ops()
    monitor = LiveMonitor()
    start = time.perf_counter()
    for i in range(600):
        step()
        if i % 100 == 99:
            monitor.poll()
    xm.wait_device_ops()
    per_step = (time.perf_counter() - start) / 600
    state = monitor.poll()
    monitor.close()
    assert state.steps == 600 and state.metrics.executions == 600
    assert state.metrics.compiles == 0 and state.metrics.cache_hits == 600
    assert state.steps_measured > 100
    # Device-synced step time: the interval between step completions, about the wall time
    # per step (loose bounds: the machine is shared).
    assert per_step / 4 < state.step_median < per_step * 4
    assert state.step_p90 >= state.step_median
    assert state.series and [p.step for p in state.series] == sorted(p.step for p in state.series)
    assert state.series[-1].step == 600
    assert state.execution_rate > 0 and state.elapsed > 0


def test_a_device_loaders_empty_syncs_do_not_split_the_step_time():
    """MpDeviceLoader syncs at each batch, with nothing to run after the loop's own sync: a
    step of a loop with a read in it runs two graphs in two syncs, and its time spans both."""
    from torch.utils.data import DataLoader, TensorDataset
    from torch_xla.distributed.parallel_loader import MpDeviceLoader

    dev = tpu_nb.device()
    w = torch.randn(24, 24, device=dev)
    torch_xla.sync()
    loader = MpDeviceLoader(DataLoader(TensorDataset(torch.randn(240, 24)), batch_size=4), dev)
    delay = 0.02
    monitor = LiveMonitor()
    for i, (x,) in enumerate(loader):
        y = (x @ w).tanh().sum()
        _ = y.item()  # runs the forward's graph
        w = w + 1e-6 * y
        torch_xla.sync()  # runs the update's graph
        time.sleep(delay)  # every step lasts at least this long
        if i % 10 == 9:
            xm.wait_device_ops()
            monitor.poll()
    xm.wait_device_ops()
    state = monitor.poll()
    monitor.close()
    assert state.steps > 60 and state.metrics.executions >= 120  # loader syncs: none ran
    # Each interval the median is taken over spans a whole step, not one graph's part (an
    # update still running when the sleep began may end a few ms into it).
    shortest = min(monitor._recent)
    assert shortest > delay / 2 and state.step_median > delay / 2, shortest


def test_outside_a_tracked_run_a_loaders_empty_syncs_are_no_steps():
    from torch.utils.data import DataLoader, TensorDataset
    from torch_xla.distributed.parallel_loader import MpDeviceLoader

    dev = tpu_nb.device()
    w = torch.randn(26, 26, device=dev)
    torch_xla.sync()
    loader = MpDeviceLoader(DataLoader(TensorDataset(torch.randn(40, 26)), batch_size=4), dev)
    monitor = LiveMonitor()
    for (x,) in loader:
        w = w + (x @ w).sum() * 1e-6
        torch_xla.sync()  # the loop's own: the loader's next sync has nothing to run
    state = monitor.poll(final=True)
    monitor.close()
    assert state.steps > 10 and state.steps - state.loader_syncs == 10, state
    assert H.summary_text(state, "finished").startswith("XLA dashboard (finished): 10 steps,")
    html = H.execution_html(state, final=True)
    assert f"(10 steps; {state.steps - 10} no steps" in html


def test_outside_a_tracked_run_the_anatomy_panel_does_not_say_no_step_yet():
    step = _mlp_step(width=41)
    monitor = LiveMonitor()
    for _ in range(4):
        step()
    state = monitor.poll(final=True)
    monitor.close()
    assert state.steps == 4 and state.anatomy is None
    html = H.anatomy_html(state)
    assert "no step yet" not in html and "tracked run" in html, html


def _loader_epochs(width: int):
    """(w, epoch): a weight on the device, synced, and one epoch of 10 steps over a device
    loader, each ending in the loop's own sync (the loader's next sync has nothing to run)."""
    from torch.utils.data import DataLoader, TensorDataset
    from torch_xla.distributed.parallel_loader import MpDeviceLoader

    dev = tpu_nb.device()
    w = torch.randn(width, width, device=dev)
    torch_xla.sync()
    data = DataLoader(TensorDataset(torch.randn(40, width)), batch_size=4)

    def epoch(w):
        for (x,) in MpDeviceLoader(data, dev):
            w = w + (x @ w).sum() * 1e-6
            torch_xla.sync()
        return w

    return w, epoch


def test_a_loaders_empty_syncs_before_a_tracked_run_are_no_steps_either():
    w, epoch = _loader_epochs(25)
    monitor = LiveMonitor()
    w = epoch(w)  # untracked
    with tpu_nb.track():
        w = epoch(w)
    state = monitor.poll(final=True)
    monitor.close()
    assert state.steps - state.loader_syncs == 20, state
    assert H.summary_text(state, "finished").startswith("XLA dashboard (finished): 20 steps,")


def test_a_loaders_empty_syncs_in_every_tracked_run_under_one_dashboard_are_no_steps():
    """Three tracked epochs while one dashboard runs, polled only at its end: each epoch's
    loader syncs that ran nothing are no steps, not only the last run's."""
    w, epoch = _loader_epochs(23)
    monitor = LiveMonitor()
    for _ in range(3):
        with tpu_nb.track():
            w = epoch(w)
    state = monitor.poll(final=True)
    monitor.close()
    assert state.steps > 30 and state.steps - state.loader_syncs == 30, state
    assert H.summary_text(state, "finished").startswith("XLA dashboard (finished): 30 steps,")


def test_per_step_reads_are_counted_against_steps_not_a_loaders_syncs():
    from torch.utils.data import DataLoader, TensorDataset
    from torch_xla.distributed.parallel_loader import MpDeviceLoader

    dev = tpu_nb.device()
    w = torch.randn(27, 27, device=dev)
    torch_xla.sync()
    loader = MpDeviceLoader(DataLoader(TensorDataset(torch.randn(40, 27)), batch_size=4), dev)
    monitor = LiveMonitor()
    for (x,) in loader:
        w = w + (x @ w).sum() * 1e-6
        torch_xla.sync()
        _ = w.sum().item()  # a read per step
    state = monitor.poll(final=True)
    monitor.close()
    assert state.metrics.host_reads == 10 and state.steps > 10
    html = H.fallbacks_html(state)
    assert "10 in 10 steps" in html, html
    assert "10 in 10 steps" in H.summary_text(state, "finished")


@pytest.mark.skipif(
    tpu_nb.detect().accelerator.kind != "tpu",
    reason="HBM used/limit/peak need a TPU: XLA:CPU reports no device memory",
)
def test_memory_on_a_tpu_reports_hbm():
    monitor = LiveMonitor()
    keep = torch.ones(1024, 1024, device=tpu_nb.device()) * 2
    torch_xla.sync()
    mem = monitor.poll().memory
    monitor.close()
    assert not mem.device_note and 0 < mem.device_used <= mem.device_limit
    assert "device used" in H.memory_html(monitor.poll()) and keep is not None


def test_memory_host_everywhere_and_the_device_says_it_does_not_report():
    monitor = LiveMonitor()
    mem = monitor.poll().memory
    monitor.close()
    assert mem.host_rss > 50e6 and mem.host_peak >= mem.host_rss * 0.5
    assert (
        mem.device_used is None and mem.device_note == "the device does not report memory (XLA:CPU)"
    )
    html = H.memory_html(monitor.poll())
    assert "does not report memory (XLA:CPU)" in html and "host RSS" in html


def test_the_final_memory_panel_shows_the_tracked_run_s_cost_per_step():
    monitor = LiveMonitor()
    w = torch.randn(32, 32, device=tpu_nb.device())
    with tpu_nb.track("panel") as report:
        for _ in range(4):
            w = torch.tanh(w @ w)
            torch_xla.sync()
    state = monitor.poll(final=True)
    monitor.close()
    assert state.run_cost is report.cost and report.cost.flops == 2 * 32**3
    html = H.memory_html(state)
    assert "Memory; cost per step" in html and "on a v5e: device work &gt;=" in html


# -- compiles and the recompilation alert -----------------------------------------------------


def _weights():
    w = torch.randn(8, 8, device=tpu_nb.device())
    torch_xla.sync()
    return w


def _recompiling_loop(batches, monitor, w, poll_every=1):
    for i, batch in enumerate(batches):
        # Bound until the sync: a lazy tensor dropped before it is never computed.
        _out = (torch.ones(batch, 8, device=tpu_nb.device()) @ w).relu().sum()
        torch_xla.sync()  # SYNC-LINE
        if i % poll_every == 0:
            monitor.poll()
    return monitor.poll()


def test_compile_events_name_cause_line_and_seconds():
    w = _weights()
    monitor = LiveMonitor()
    state = _recompiling_loop((3, 3, 5), monitor, w)
    monitor.close()
    assert state.metrics.compiles == 2 and not state.alerts
    first, second = state.compiles
    assert (first.index, second.index) == (1, 2)
    assert first.event.kind == "sync" and len(first.event.graph_hash) == 32
    assert first.place.file == __file__
    assert first.place.line == line_of("SYNC-LINE", _recompiling_loop)
    assert first.seconds > 0 and second.seconds > 0
    assert 0 <= first.step <= second.step <= 3


def test_more_than_k_graphs_on_one_line_raise_the_alert_with_the_changed_shape():
    w = _weights()
    monitor = LiveMonitor(alert_graphs=3)
    state = _recompiling_loop((4, 5, 6), monitor, w)
    assert not state.alerts  # 3 distinct graphs: not more than 3
    state = _recompiling_loop((11, 12, 13, 14, 15), monitor, w)
    monitor.close()
    assert torch_xla.sync.__module__ == "torch_xla.torch_xla"  # the probe is gone
    (alert,) = state.alerts
    assert alert.place.line == line_of("SYNC-LINE", _recompiling_loop)
    assert len(alert.graphs) >= 4 and alert.limit == 3
    # The probe captured the pending graphs of the line's next syncs and diffed them.
    assert alert.source == "graphs"
    assert any(
        "aten::expand" in line and "f32[" in line and "\u2192" in line for line in alert.differs
    ), alert.differs
    assert "compiled" in alert.describe() and "(more than 3)" in alert.describe()
    html = H.alert_html(state)
    assert "Recompilation" in html and "pad or" in html
    assert "border:2px solid" in H.compile_html(state)  # the panel turns red
    assert "RECOMPILING" in H.header_html(state, "running", "XLA dashboard")
    assert "RECOMPILED" in H.header_html(state, "finished", "XLA dashboard")  # past tense


def test_the_alert_diff_follows_the_latest_graphs_of_the_line():
    w = _weights()
    monitor = LiveMonitor(alert_graphs=2)
    # Each batch size repeats, so the probe (armed by a compile) sees its graph at a later sync.
    state = _recompiling_loop((21, 21, 22, 22, 23, 23, 23), monitor, w)
    first = state.alerts[0].differs
    state = _recompiling_loop((24, 24, 24, 25, 25, 25, 26, 26, 26), monitor, w)
    monitor.close()
    (alert,) = state.alerts
    assert alert.source == "graphs" and alert.differs != first
    assert any("f32[25,8] \u2192 f32[26,8]" in line for line in alert.differs), alert.differs


def test_in_a_tracked_run_the_alert_diffs_the_recorded_graphs_of_its_two_compiles():
    """Under track() (as %%on_tpu --live) the recorder read each pending graph just before it
    compiled: the alert diffs exactly the two graphs it names, not the probe's later syncs."""
    w = _weights()
    monitor = LiveMonitor(alert_graphs=2)
    with tpu_nb.track():  # the loop in the tracked block, as in a cell
        for batch in (31, 32, 33, 34):
            # kept bound until its sync: the recorder reads the pending graph from names
            _out = (torch.ones(batch, 8, device=tpu_nb.device()) @ w).relu().sum()
            torch_xla.sync()
            monitor.poll()
        state = monitor.poll()
    monitor.close()
    (alert,) = state.alerts
    assert alert.source == "recorded" and not alert.settled
    # One progression over the line's graphs, not the last pair alone.
    progression = "aten::expand dim 0: 31 \u2192 32 \u2192 33 \u2192 34 (4 shapes)"
    assert alert.differs == (progression,), alert.differs
    assert "the graphs read just before they compiled" in H.alert_html(state)


def test_alert_on_a_value_read_line_comes_from_the_compile_log():
    monitor = LiveMonitor(alert_graphs=2)
    values = []
    for n in (3, 4, 5, 6):
        values.append((torch.arange(n, device=tpu_nb.device()) * 2).sum().item())  # READ
        monitor.poll()
    state = monitor.poll()
    monitor.close()
    (alert,) = state.alerts
    assert alert.source == "compile log"
    assert alert.place.line == line_of(
        "READ", test_alert_on_a_value_read_line_comes_from_the_compile_log
    )
    assert any("same number of graph inputs" in line for line in alert.differs)
    assert state.metrics.host_reads == 4


def test_describe_difference_from_compile_log_blocks():
    frames = (Frame("train.py", 12, "step"),)
    a = CompileEvent(
        "user torch_xla.sync",
        "a" * 32,
        frames,
        inputs=4,
        outputs=2,
        sizes_gb={"graph input": 0.5, "graph output": 0.1},
    )
    b = CompileEvent(
        "user torch_xla.sync",
        "b" * 32,
        frames,
        inputs=4,
        outputs=2,
        sizes_gb={"graph input": 0.75, "graph output": 0.1},
    )
    c = CompileEvent(
        "most likely user code trying to access tensor value", "c" * 32, frames, inputs=5, outputs=3
    )
    same = describe_difference(a, b)
    assert same[0].startswith("same number of graph inputs (4) and outputs (2)")
    assert same[1] == "sizes: graph input 0.5 GiB -> 0.75 GiB"
    other = describe_difference(b, c)
    assert other[0].startswith("graph inputs 4 -> 5, outputs 2 -> 3")
    assert any(line.startswith("cause: user torch_xla.sync -> most likely") for line in other)
    assert place_text(frames[0]) == "train.py:12 (step)"
    assert place_text(Frame("/tmp/ipykernel_77/123.py", 5, "<module>")) == "cell line 5"


def test_alert_graphs_must_be_a_whole_number():
    for bad in (0, -1, 2.5, True, "3"):
        with pytest.raises(TpuNbError, match="alert_graphs"):
            LiveMonitor(alert_graphs=bad)


# -- fallbacks, host reads, escaping ----------------------------------------------------------


def test_fallbacks_and_host_reads_apart_each_with_its_hint():
    monitor = LiveMonitor()
    x = torch.linspace(0, 1, 64, device=tpu_nb.device())
    h = torch.histc(x, bins=8)
    value = (h * 2).sum().item()
    state = monitor.poll()
    assert value == 128.0
    assert state.metrics.fallbacks == {"histc": 1} and state.metrics.host_reads == 1
    html = H.fallbacks_html(state)
    assert "aten::histc</code> ran on the CPU <b>1</b>" in html
    assert "one-hot sums" in html  # histc's own hint
    # One read outside any loop: counted, and nothing to change.
    assert "scalar reads (.item(), bool(), float()) <b>1</b>" in html
    assert "read once after the loop" not in html
    text = H.summary_text(state, "finished")
    assert "CPU fallback aten::histc x1" in text and "1 scalar reads" in text
    assert "read once after the loop" not in text

    # A read in every step: the advice, with the steps it kept pace with.
    w = torch.ones(8, device=tpu_nb.device())
    for _ in range(4):
        w = w * 1.5
        torch_xla.sync()
        float(w.sum().item())
    state = monitor.poll()
    monitor.close()
    assert state.steps >= 4 and state.metrics.host_reads >= 5
    html = H.fallbacks_html(state)
    assert f"in {state.steps} steps" in html and "read once after the loop" in html
    assert "read once after the loop" in H.summary_text(state, "finished")


def test_reads_in_step_closures_get_no_read_advice():
    """Logging with xm.add_step_closure is the fix for per-step reads: counted, not advised
    against."""
    monitor = LiveMonitor()
    logged = []
    w = torch.ones(8, device=tpu_nb.device())
    for _ in range(5):
        w = w * 1.5
        loss = w.sum()
        xm.add_step_closure(lambda v: logged.append(v.item()), args=(loss,))
        torch_xla.sync()
    state = monitor.poll()
    monitor.close()
    assert len(logged) == 5 and state.metrics.host_reads >= 5
    assert state.closure_reads == state.metrics.host_reads
    assert "read once after the loop" not in H.fallbacks_html(state)
    assert "read once after the loop" not in H.summary_text(state, "finished")


def test_a_finished_runs_reads_are_judged_as_its_report_judges_them():
    """An eval loop reads the loss of each batch with no sync in between: the report gives
    the read advice, and the dashboard's final view says the same (one judgement)."""
    monitor = LiveMonitor()
    monitor.poll()
    w = torch.ones(8, device=tpu_nb.device())
    with tpu_nb.track() as report:
        for _ in range(10):
            monitor.poll()
            float((w * 1.5).sum().item())
    state = monitor.poll(final=True)
    monitor.close()
    assert report.syncs == 0 and report.metrics.host_reads == 10
    (read,) = report.judgement.reads.values()
    assert read.per_step and read.why == "with no sync in between"
    assert state.per_step_reads == 10
    text = H.summary_text(state, "finished")
    assert "10 with no sync in between" in text and "read once after the loop" in text
    # with no sync in the loop, dropping the read alone would leave a graph growing with every
    # batch: the view also says to end each iteration with a sync, as the report's hint does
    assert "end each with torch_xla.sync()" in text, text

    # and a read once after a loop of syncs: neither advises
    monitor = LiveMonitor()
    with tpu_nb.track() as report:
        for _ in range(5):
            w = w * 1.5
            torch_xla.sync()
            monitor.poll()
        float(w.sum().item())
    state = monitor.poll(final=True)
    monitor.close()
    assert not any(p.per_step for p in report.judgement.reads.values())
    assert state.per_step_reads == 0
    assert "read once after the loop" not in H.summary_text(state, "finished")


def _spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _reads_each_step(host_seconds, size, matmuls, fallback=False):
    """A tracked loop of 8 steps that reads a device value after each sync (and runs an op
    on the CPU in each, if `fallback`), polled by a monitor while it goes and after it."""
    dev = tpu_nb.device()
    w = torch.randn(size, size, device=dev) / size**0.5
    torch_xla.sync()
    monitor = LiveMonitor()
    with tpu_nb.track() as report:
        for _ in range(8):
            _spin(host_seconds)
            for _ in range(matmuls):
                w = (w @ w).tanh()
            if fallback:
                w = w + torch.histc(w, bins=4).sum() * 0
            torch_xla.sync()
            float(w[0, 0])
        live = monitor.poll(final=True)  # (final: the live anatomy is built now)
    done = monitor.poll(final=True)
    monitor.close()
    return live, done, report


def test_reads_in_every_step_get_the_hint_live_only_where_the_judgement_gives_it():
    """While a run goes, the view advises on reads in every step only where the run's
    judgement will: not when tracing takes far longer than the device's work (waiting for it
    once a step costs little), but when the device's work is as long."""
    # tracing (a 50 ms Python spin) far longer than an 8x8 matmul: no advice, live or after
    live, done, report = _reads_each_step(0.05, 8, 1)
    assert report.anatomy.verdict.kind == "host-bound", report
    assert not any(p.advised for p in report.judgement.reads.values()), report
    assert (
        live.per_step_reads is None and "not what limits this loop so far" in live.reads_cost_little
    )
    for text in (H.fallbacks_html(live), H.summary_text(live, "running")):
        assert "8 in 8 steps, but not what limits" in text and H.HOST_READ_HINT not in text, text
    assert done.per_step_reads == 0 and H.HOST_READ_HINT not in H.summary_text(done, "finished")

    # four 384x384 matmuls a step on XLA:CPU, as long as tracing or longer: advised, live too
    live, done, report = _reads_each_step(0.0, 384, 4)
    assert report.anatomy.verdict.kind == "read-bound", report
    assert live.per_step_reads is None and live.reads_cost_little == "", live.reads_cost_little
    for text in (H.fallbacks_html(live), H.summary_text(live, "running")):
        assert H.HOST_READ_HINT in text, text
    assert done.per_step_reads == 8 and H.HOST_READ_HINT in H.summary_text(done, "finished")

    # the host-bound loop with an op on the CPU in every step: that stall is judged as one,
    # so the view does not say the reads cost little
    live, done, report = _reads_each_step(0.05, 8, 1, fallback=True)
    assert report.metrics.fallbacks and live.reads_cost_little == "", live.reads_cost_little
    advised = sum(
        o.count
        for o in report.occurrences
        if o.kind == "read" and report.judgement.reads[o.order].advised
    )
    assert done.per_step_reads == advised, report


HOSTILE = "<img src=x onerror=alert(1)>&$x$.py"


def test_user_strings_are_escaped_in_every_panel_and_safe_in_charts():
    monitor = LiveMonitor(alert_graphs=1)
    code = compile(
        "for n in (2, 3, 4):\n"
        "    out = (torch.ones(n, 4, device=dev) * 3).sum()\n"
        "    torch_xla.sync()\n",
        HOSTILE,
        "exec",
    )
    exec(code, {"torch": torch, "torch_xla": torch_xla, "dev": tpu_nb.device()})
    state = monitor.poll()
    monitor.close()
    assert state.alerts and state.compiles[-1].place.file == HOSTILE
    from tpu_nb.display.live_charts import CompileSvg, StepTimeSvg

    steps = [c.step for c in state.compiles]
    svgs = {
        "step": StepTimeSvg().render(state.series, steps, final=True),
        "compile": CompileSvg().render(state.compiles, final=True),
    }
    html = H.static_html(state, "finished", "XLA <dashboard>", svgs)
    assert "<img src=x" not in html and "onerror=alert(1)>" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;&amp;$x$.py" in html
    assert "XLA &lt;dashboard&gt;" in html
    assert html.count("<svg ") == 2
    assert "tpunb-steps-chart" in html and "tpunb-compile-chart" in html


def test_summary_has_no_timings_and_is_the_same_for_the_same_work():
    step = _mlp_step(width=40)
    step()
    step()  # warm: both runs below are cached
    xm.wait_device_ops()  # (an execution in flight counts later)
    texts = []
    for _ in range(2):
        monitor = LiveMonitor()
        for _ in range(30):
            step()
        xm.wait_device_ops()
        texts.append(H.summary_text(monitor.poll(), "finished"))
        monitor.close()
    assert texts[0] == texts[1]
    assert texts[0].startswith(
        "XLA dashboard (finished): 30 steps, 30 executions, 0 graphs compiled, 30 cache hits"
    )
    assert " ms" not in texts[0] and "/s" not in texts[0]


# -- the Dashboard without a notebook ---------------------------------------------------------


def test_dashboard_polls_in_a_thread_joined_on_exit_and_prints_nothing(capfd):
    step = _mlp_step(width=44)
    threads = set(threading.enumerate())
    with tpu_nb.Dashboard(widgets=False, refresh=0.2) as dash:
        assert dash.running and dash.status == "running"
        assert any(t.name == "tpu_nb-dashboard" for t in threading.enumerate())
        deadline = time.monotonic() + 60
        while dash.stats.refreshes < 3:  # steps until the thread has updated three times
            assert time.monotonic() < deadline, "no three refreshes in 60 s"
            step()
    assert set(threading.enumerate()) == threads and not dash.running
    assert dash.status == "finished" and dash.error is None
    # refresh=0.2: at most 5 updates a second (the first after 0.2 s).
    assert 3 <= dash.stats.refreshes <= dash.stats.thread_seconds / 0.2 + 1
    assert dash.state.steps > 0 and dash.state.steps == dash.state.metrics.syncs
    assert repr(dash) == dash.summary() and dash.summary().startswith(
        f"XLA dashboard (finished): {dash.state.steps} steps"
    )
    # Nothing from the thread; the final view is shown once, from this thread, when an
    # IPython shell exists in the process (another test module's), else nowhere.
    out, err = capfd.readouterr()
    assert out in ("", f"{dash!r}\n") and err == ""


def test_a_tracked_block_among_other_work_is_not_the_dashboards_wall_time():
    step = _mlp_step(width=43)
    with tpu_nb.Dashboard(widgets=False) as dash:
        time.sleep(0.5)  # the cell's other work: loading data, building the model
        with tpu_nb.track() as report:
            step()
    assert dash.state.run_wall_seconds == report.wall_seconds
    assert dash.elapsed >= 0.5 + report.wall_seconds, (dash.elapsed, report.wall_seconds)
    assert f"syncs in {format_seconds(dash.elapsed)}" in dash._repr_html_()


@pytest.mark.parametrize(
    "error, status",
    [(ValueError("bad"), "failed: ValueError"), (KeyboardInterrupt(), "interrupted")],
)
def test_dashboard_stops_on_error_and_interrupt(error, status):
    threads = set(threading.enumerate())
    dash = tpu_nb.Dashboard(widgets=False)
    with pytest.raises(type(error)), dash:
        (torch.ones(3, device=tpu_nb.device()) * 2).sum()
        raise error
    assert dash.status == status and not dash.running
    assert set(threading.enumerate()) == threads
    assert dash.summary().startswith(f"XLA dashboard ({status})")


def test_a_failing_poll_stops_updates_and_is_reported_not_printed(capfd):
    dash = tpu_nb.Dashboard(widgets=False, refresh=0.1)
    dash.start()
    real = dash._monitor.poll

    def broken():
        raise RuntimeError("counter read failed")

    dash._monitor.poll = broken
    thread = dash._thread
    assert thread is not None
    wait_until(lambda: not thread.is_alive(), what="the polling thread to end")
    dash._monitor.poll = real
    dash.stop()
    assert isinstance(dash.error, RuntimeError)
    assert "the dashboard stopped updating: RuntimeError" in dash.summary()
    assert "counter read failed" in dash._repr_html_()
    out, err = capfd.readouterr()
    assert out in ("", f"{dash!r}\n") and err == ""


def test_options_are_checked_with_the_fix():
    for kwargs, words in (
        ({"refresh": 0}, "refresh must be"),
        ({"refresh": "fast"}, "refresh must be"),
        ({"refresh": 1.0, "chart_refresh": 0.5}, "chart_refresh"),
        ({"alert_graphs": 0}, "alert_graphs"),
    ):
        with pytest.raises(TpuNbError, match=words):
            tpu_nb.Dashboard(**kwargs)
    dash = tpu_nb.Dashboard(widgets=False)
    with pytest.raises(TpuNbError, match="not running"):
        dash.refresh_now()
    with dash:
        assert dash.refresh_now() is dash.state and dash.state.steps == 0
    with pytest.raises(TpuNbError, match="make a new one"):
        dash.start()


def test_without_compile_analysis_compiles_are_counted_and_the_panel_says_why_no_causes(py):
    out = py(
        """
        import torch, torch_xla
        import tpu_nb
        from tpu_nb.display import dashboard_html as H
        dev = torch_xla.device()
        (torch.ones(2, device=dev) + 1).sum().item()      # compiled before any setup()
        with tpu_nb.Dashboard(widgets=False) as dash:
            for n in (3, 4):
                kept = (torch.ones(n, device=dev) * 2).sum()
                torch_xla.sync()
        s = dash.state
        print("RESULT", s.compile_analysis, s.metrics.compiles, len(s.compiles),
              all(c.event is None and c.seconds > 0 for c in s.compiles), not s.alerts)
        print("HTML", "compile causes unknown" in H.compile_html(s),
              "cause unknown" in H.compile_html(s))
    """,
        env={"PT_XLA_DEBUG_LEVEL": None, "PT_XLA_DEBUG_FILE": None},
    ).stdout
    assert "RESULT False 2 2 True True" in out
    assert "HTML True True" in out
