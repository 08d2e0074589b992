"""The cost of a step judged for a TPU: FLOPs from the HLO (against analytic counts and
FlopCounterMode on the same step), bytes from the compile log, the target chip's roofline
time, the memory fit, the verdict judged for the target, and the out-of-memory card.

Fast tests on constructed facts first; then runs on XLA:CPU.
"""

from __future__ import annotations

import textwrap
from dataclasses import replace

import pytest
import torch
import torch_xla
from torch.utils.flop_counter import FlopCounterMode

import tpu_nb
from tpu_nb.display.reports import RunView
from tpu_nb.runtime.environment import CHIPS, Chip, chip, set_target, target_chip
from tpu_nb.runtime.graph import hlo_flops
from tpu_nb.runtime.tracking import MemoryFit, Residency, _fused, out_of_memory
from tpu_nb.runtime.tracking._cost import GraphCost, memory_fit, residency, roofline_seconds
from tpu_nb.runtime.tracking._fused import fused_optimizer

# -- the chip table and the target -------------------------------------------------------


def test_the_table_holds_the_cloud_tpu_figures_and_names_its_sources():
    v5e = CHIPS["v5e"]
    assert (v5e.peak_flops, v5e.hbm_bytes, v5e.hbm_bandwidth) == (197e12, 16e9, 819e9)
    assert CHIPS["v4"].hbm_bytes == 32 * 2**30 and CHIPS["v5p"].hbm_bytes == 95 * 2**30
    assert set(CHIPS) == {"v4", "v5e", "v5p", "v6e", "TPU7x"}
    assert all(c.source.startswith("https://cloud.google.com/tpu/docs/") for c in CHIPS.values())
    # TPU7x shows two devices per chip: one device has half of everything
    x = CHIPS["TPU7x"]
    assert x.devices == 2
    assert x.per_device().peak_flops == x.peak_flops / 2
    assert x.per_device().hbm_bytes == x.hbm_bytes / 2


def test_chip_names_as_accelerator_types_and_tools_spell_them():
    assert chip("v5litepod-8") is CHIPS["v5e"]
    assert chip("TPU v6e") is CHIPS["v6e"]
    assert chip("7x") is CHIPS["TPU7x"] and chip("tpu7x") is CHIPS["TPU7x"]
    assert chip("v4-32") is CHIPS["v4"]
    assert chip("v9z") is None


def test_the_target_is_v5e_by_default_and_the_device_s_own_chip_on_a_tpu():
    set_target(None)
    assert target_chip("CPU") == (CHIPS["v5e"], False)
    assert target_chip("TPU", "v6e-8") == (CHIPS["v6e"], True)
    try:
        set_target("v5p")
        assert target_chip("CPU") == (CHIPS["v5p"], False)
        assert target_chip("TPU", "v4-8") == (CHIPS["v4"], True)  # a TPU is its own target
    finally:
        set_target(None)


def test_a_wrong_target_or_chip_is_one_line_with_the_fix():
    with pytest.raises(tpu_nb.TpuNbUsageError, match=r"unknown target chip 'v9'.*Fix: one of v4"):
        set_target("v9")
    with pytest.raises(tpu_nb.TpuNbUsageError, match="hbm_bytes=0 is not a positive number"):
        Chip("mine", peak_flops=1e12, hbm_bytes=0, hbm_bandwidth=1e9)
    with pytest.raises(tpu_nb.TpuNbUsageError) as raised:
        tpu_nb.setup(target="v9")
    assert "\n" not in str(raised.value) and "Fix:" in str(raised.value)


def test_the_roofline_is_the_slower_of_compute_and_memory():
    for c in CHIPS.values():
        d = c.per_device()
        assert roofline_seconds(1e12, 1e6, c) == 1e12 / d.peak_flops  # compute-bound
        assert roofline_seconds(1e6, 1e12, c) == 1e12 / d.hbm_bandwidth  # memory-bound
    assert roofline_seconds(None, 1e9, CHIPS["v5e"]) is None


# -- FLOPs from constructed HLO ----------------------------------------------------------

HLO = """\
HloModule IrToHlo.9, entry_computation_layout={(f32[8,16]{1,0})->(f32[8,4]{1,0})}

%AddComputation.1 (x.2: f32[], y.3: f32[]) -> f32[] {
  ROOT %add.4 = f32[] add(f32[] %x.2, f32[] %y.3)
}

ENTRY %IrToHlo.9 (p0.1: f32[8,16], p1.2: f32[16,32], p2.3: f32[32,4]) -> (f32[8,4]) {
  %p0.1 = f32[8,16]{1,0} parameter(0)
  %p1.2 = f32[16,32]{1,0} parameter(1)
  %p2.3 = f32[32,4]{1,0} parameter(2)
  %dot.5 = f32[8,32]{1,0} dot(f32[8,16]{1,0} %p0.1, f32[16,32]{1,0} %p1.2), \
lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %dot.6 = f32[8,4]{1,0} dot(f32[8,32]{1,0} %dot.5, f32[32,4]{1,0} %p2.3), \
lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %dead.7 = f32[8,8]{1,0} dot(f32[8,16]{1,0} %p0.1, f32[16,8]{1,0} %p1.2), \
lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %conv.8 = f32[2,8,6,6]{3,2,1,0} convolution(f32[2,3,8,8]{3,2,1,0} %p0.1, \
f32[8,3,3,3]{3,2,1,0} %p1.2), window={size=3x3}, dim_labels=bf01_oi01->bf01
  %cc.9 = f32[8,4]{1,0} custom-call(f32[8,4]{1,0} %dot.6), custom_call_target="tpu_kernel"
  ROOT %tuple.10 = (f32[8,4]{1,0}, /*index=1*/f32[2,8,6,6]{3,2,1,0}) tuple(\
f32[8,4]{1,0} %cc.9, f32[2,8,6,6]{3,2,1,0} %conv.8)
}
"""


def test_flops_of_constructed_hlo_count_live_matmuls_and_convolutions():
    counted = hlo_flops(HLO)
    matmuls = 2 * 8 * 16 * 32 + 2 * 8 * 32 * 4  # the dead dot left out
    conv = 2 * (2 * 8 * 6 * 6) * (3 * 3 * 3)
    assert counted.flops == matmuls + conv
    assert (counted.dots, counted.convolutions, counted.custom_calls) == (2, 1, 1)
    assert "custom call" in counted.left_out and "elementwise" in counted.left_out


# -- memory and the out-of-memory card, from constructed facts ---------------------------


def test_a_step_that_does_not_fit_says_how_much_and_what_is_biggest():
    resident = Residency(
        params=8 * 10**9, grads=8 * 10**9, optimizer=0, largest=(("model.h", 15 * 10**9),)
    )
    fit = MemoryFit(CHIPS["v5e"], 21.9e9, resident, 5.9e9)
    assert not fit.fits
    text = fit.describe()
    assert text.startswith("does not fit: needs 21.9 GB, a v5e has 16 GB: the biggest are model.h")
    assert MemoryFit(CHIPS["v6e"], 21.9e9, resident, 5.9e9).fits


def test_a_step_whose_temporaries_are_unknown_is_not_said_to_fit():
    resident = Residency(params=80_000)
    unknown = MemoryFit(CHIPS["v5e"], 80_000.0, resident, None)
    assert unknown.fits is None
    text = unknown.describe()
    assert text.startswith("needs at least 80 KB, a v5e has 16 GB (resident 80 KB")
    assert "temporaries not known: tpu_nb has no compile-log sizes" in text
    assert "fits:" not in text and "temporaries 0 B" not in text
    assert MemoryFit(CHIPS["v5e"], 80_000.0, resident, 0.0).describe().startswith("fits: ")
    too_big = MemoryFit(CHIPS["v5e"], 21.9e9, resident, None)
    assert too_big.fits is False
    assert too_big.describe().startswith("does not fit: needs at least 21.9 GB")


def test_bytes_read_in_whole_units_at_every_size():
    from tpu_nb.runtime.tracking import format_bytes

    sizes = [999, 999_600, 1.5e9, 16e9, 4e12, 3e18]
    assert [format_bytes(n) for n in sizes] == [
        "999 B",
        "1 MB",
        "1.5 GB",
        "16 GB",
        "4 TB",
        "3,000,000 TB",
    ]


def test_a_step_with_one_graph_of_unknown_size_is_not_said_to_fit():
    from tpu_nb.runtime.tracking._cost import GraphCost, memory_fit

    resident = Residency(params=80_000)
    sized = GraphCost(input_bytes=80_000, output_bytes=4, aliased_bytes=0, temp_bytes=1e6)
    both = memory_fit([sized, GraphCost(resident=resident)], CHIPS["v5e"])
    assert both is not None and both.fits is None
    text = both.describe()
    assert text.startswith("needs at least 1.08 MB, a v5e has 16 GB"), text
    assert "the graph that needs most of those with compile-log sizes: temporaries 1 MB" in text
    assert "1 other graph its steps ran has none" in text and "fits:" not in text
    alone = memory_fit([sized, sized], CHIPS["v5e"])
    assert alone is not None and alone.fits and alone.describe().startswith("fits: needs 1")
    assert memory_fit([GraphCost(), GraphCost()], CHIPS["v5e"]) is None


def test_a_graph_reading_more_than_the_cell_holds_counts_its_inputs():
    """A Trainer holds its optimizer, not the cell: the state tpu_nb finds is less than the
    step's graph reads, and the graph's inputs are what is resident at least."""
    from tpu_nb.runtime.tracking._cost import GraphCost, memory_fit

    found = Residency(params=55_600)  # the model the cell holds; the optimizer not found
    step = GraphCost(
        input_bytes=159_000, output_bytes=0, aliased_bytes=0, temp_bytes=777_000, resident=found
    )
    fit = memory_fit([step], CHIPS["v5e"])
    assert fit is not None and fit.needed == 159_000 + 777_000
    text = fit.describe()
    assert "the graph's inputs 159 KB, all resident while it runs (your variables hold " in text
    assert "55.6 KB of device data: parameters 55.6 KB" in text, text
    assert "optimizer state 0 B)" in text and "resident 55.6 KB" not in text
    # where the cell holds more than the graph reads, that is what counts, as before
    held = memory_fit([GraphCost(input_bytes=1_000, temp_bytes=0.0, resident=found)], CHIPS["v5e"])
    assert held is not None and held.needed == 55_600 and "resident 55.6 KB" in held.describe()
    # and a chip the inputs and temporaries overflow is told so
    tiny = replace(CHIPS["v5e"], hbm_bytes=900_000)
    assert memory_fit([step], tiny).fits is False


COMPILE_OOM = """\
RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. \
Used 21.95G of 15.48G hbm. Exceeded hbm capacity by 6.47G.

Total hbm usage >= 22.47G:
    reserved        530.00M
    program          21.95G
    arguments            0B

Output size 0B; shares 0B with arguments.

  Largest program allocations in hbm:

  1. Size: 2.00G
     Operator: op_name="aten__mm" source_file="train.py" source_line=42
     Shape: f32[16384,32768]{1,0:T(8,128)}
     Unpadded size: 2.00G
     Allocation type: HLO temp
     ==========================

  2. Size: 512.00M
     Operator: op_name="aten__gelu" source_file="train.py" source_line=43
     Shape: f32[4096,32768]{1,0:T(8,128)}
     Allocation type: HLO temp
     ==========================
"""
RUN_OOM = (
    "Bad StatusOr access: RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to "
    "allocate 196.00M. That was not possible. There are 134.44M free.; (1x0x0_HBM0): while "
    "running replica 0 and partition 0 of a replicated computation"
)


def test_the_recorded_compile_time_oom_becomes_a_card_naming_the_largest_allocation():
    oom = out_of_memory(ValueError(COMPILE_OOM))
    assert oom is not None and oom.when == "compile"
    assert oom.used == pytest.approx(21.95 * 2**30) and oom.capacity == pytest.approx(15.48 * 2**30)
    first = oom.allocations[0]
    assert (first.op, first.file, first.line, first.shape) == (
        "aten__mm",
        "train.py",
        42,
        "f32[16384,32768]",
    )
    card = str(oom)
    assert "needs 21.95 GiB of HBM, the device has 15.48 GiB" in card
    assert "1. 2.00 GiB aten__mm f32[16384,32768] at train.py:42" in card
    assert "torch_xla.utils.checkpoint" in card and "bf16 weights" in card


def test_the_recorded_run_time_oom_and_other_errors():
    oom = out_of_memory(RuntimeError(RUN_OOM))
    assert oom is not None and oom.when == "run"
    assert oom.requested == 196 * 2**20 and oom.free == pytest.approx(134.44 * 2**20)
    assert "a buffer of 196.00 MiB did not fit in the 134.44 MiB of HBM still free" in str(oom)
    assert out_of_memory(RuntimeError("shape mismatch")) is None
    assert out_of_memory(KeyError("RESOURCE_EXHAUSTED")) is None


FUSED_XLA = (
    "`fused=True` requires all the params to be floating point Tensors of supported devices: "
    "['mps', 'cuda', 'xpu', 'hpu', 'cpu', 'mtia', 'privateuseone'] but torch.float32 and xla"
)


def test_a_fused_optimizers_refusal_on_xla_is_read_and_no_other_error_is():
    fused = fused_optimizer(RuntimeError(FUSED_XLA))
    assert fused is not None and fused.devices[:2] == ("mps", "cuda")
    assert "kernels run on mps, cuda, xpu, hpu, cpu and mtia tensors" in fused.headline()
    assert "privateuseone" not in str(fused) and "drop fused=True" in fused.fix()
    # the same refusal of an integer parameter on the CPU is no XLA matter
    on_cpu = FUSED_XLA.replace("torch.float32 and xla", "torch.int64 and cpu")
    assert fused_optimizer(RuntimeError(on_cpu)) is None
    assert fused_optimizer(ValueError(FUSED_XLA)) is None
    assert fused_optimizer(RuntimeError("shape mismatch")) is None


def test_an_optimizer_made_fused_on_the_device_gets_its_card_and_the_fix(shell, capsys):
    shell.run_cell(
        "import torch, torch_xla\nfused_model = torch.nn.Linear(4, 2).to(torch_xla.device())\n"
        "fused_opt = torch.optim.AdamW(fused_model.parameters(), fused=True)"
    )
    capsys.readouterr()
    result = shell.run_cell(
        "%%on_tpu\nfused_model(torch.ones(3, 4, device=torch_xla.device())).sum().backward()\n"
        "fused_opt.step()"
    )
    assert isinstance(result.error_in_exec, RuntimeError)
    shown = capsys.readouterr().out
    assert "torch.optim.AdamW was made with fused=True" in shown, shown
    assert "Fix: drop fused=True where the optimizer is made" in shown
    assert "TrainingArguments" not in shown  # no Trainer made this one
    html = RunView(tpu_nb.last_report())._repr_html_()
    assert "tpunb-error" in html and "fused=True" in html
    # the same cell with the fix runs, and says nothing of it
    shell.run_cell("fused_opt = torch.optim.AdamW(fused_model.parameters())")
    capsys.readouterr()
    result = shell.run_cell(
        "%%on_tpu\nfused_model(torch.ones(3, 4, device=torch_xla.device())).sum().backward()\n"
        "fused_opt.step()"
    )
    assert result.success and "fused=True" not in capsys.readouterr().out
    assert tpu_nb.last_report().fused_optimizer is None


def test_a_fused_optimizer_whose_frames_cannot_be_read_still_gets_its_report(monkeypatch):
    # the card reads the user's objects in the traceback's frames: one that raises on any
    # attribute must leave the user's own error and the rest of the report in place
    class Hostile:
        def __getattr__(self, name):
            raise KeyError(name)

    monkeypatch.setattr(_fused, "frame_variables", lambda frame: {"self": Hostile()})
    model = torch.nn.Linear(4, 2).to(torch_xla.device())
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    with pytest.raises(RuntimeError, match="fused=True"), tpu_nb.track() as report:
        model(torch.ones(3, 4, device=torch_xla.device())).sum().backward()
        opt.step()
    assert report.complete and isinstance(report.error, RuntimeError)
    assert report.fused_optimizer is None


# -- on XLA:CPU ------------------------------------------------------------------------------


def _steady_report(step, steps: int = 3) -> tpu_nb.RunReport:
    """Track `steps` calls of `step` (which syncs), from this frame."""
    with tpu_nb.track("cost") as report:
        for _ in range(steps):
            out = step()  # noqa: F841  (a variable of the tracked frame: captured)
            torch_xla.sync()
    return report


def test_a_matmul_chain_costs_its_analytic_flops_and_the_v5e_roofline():
    set_target(None)
    dev = torch_xla.device()
    x = torch.randn(16, 64, device=dev)
    ws = [torch.randn(64, 64, device=dev) for _ in range(3)]

    def chain():
        y = x
        for w in ws:
            y = torch.relu(y @ w)
        return y

    with tpu_nb.track("cost") as report:
        for _ in range(4):
            out = chain()
            torch_xla.sync()
    del out
    cost = report.cost
    assert cost is not None and not cost.on_chip and cost.chip is CHIPS["v5e"]
    assert cost.flops == 3 * 2 * 16 * 64 * 64
    assert cost.device_seconds == roofline_seconds(cost.flops, cost.moved_bytes, CHIPS["v5e"])
    text = str(report)
    assert "cost per step:" in text and "on a v5e: device work >=" in text


def _model_step(model, batch, opt):
    loss = model(**batch).loss if isinstance(batch, dict) else model(batch).float().sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def _flops_of_steady_step(make_model, make_batch) -> tuple[int | None, int]:
    dev = torch_xla.device()
    with torch.device(dev):
        model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = make_batch(dev)
    with tpu_nb.track("model") as report:
        for _ in range(2):
            loss = _model_step(model, batch, opt)
            torch_xla.sync()
    with FlopCounterMode(display=False) as counter:
        loss = _model_step(model, batch, opt)
    torch_xla.sync()
    del loss
    assert report.cost is not None
    return report.cost.flops, counter.get_total_flops()


def test_resnet18_training_step_flops_equal_flop_counter_mode():
    import torchvision

    counted, expected = _flops_of_steady_step(
        lambda: torchvision.models.resnet18(num_classes=10),
        lambda dev: torch.randn(2, 3, 32, 32, device=dev),
    )
    assert counted == expected


def test_gpt2_training_step_flops_equal_flop_counter_mode():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=32)

    def batch(dev):
        ids = torch.randint(0, 500, (2, 16), device=dev)
        return {"input_ids": ids, "labels": ids}

    counted, expected = _flops_of_steady_step(lambda: GPT2LMHeadModel(config), batch)
    assert counted == expected


def test_a_loader_driven_loop_costs_its_step_also_when_every_graph_is_cached():
    """MpDeviceLoader syncs before it yields each batch: its first sync of a run runs only
    what the loop set up (a zeros), not a step. A second epoch, all cached, costs the step's
    analytic FLOPs as the first did, never "0 FLOP"."""
    import torch_xla.distributed.parallel_loader as pl

    dev = torch_xla.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(128, 32), torch.randint(0, 4, (128,)))
    loader = pl.MpDeviceLoader(torch.utils.data.DataLoader(data, batch_size=16), dev)

    def epoch():
        total = torch.zeros((), device=dev)
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            total += loss
        return total.item()

    # forward 2*b*(32*64 + 64*4); backward: both weight gradients, and the hidden layer's
    # input gradient (the first layer's input needs none)
    b = 16
    expected = 2 * b * (32 * 64 + 64 * 4) + 2 * b * (32 * 64 + 64 * 4) + 2 * b * 64 * 4
    flops = []
    for _ in range(2):
        with tpu_nb.on_tpu(code=(epoch.__code__,)) as report:
            epoch()
        flops.append(report.cost.flops)
    assert report.metrics.compiles == 0  # the second epoch: every graph cached
    assert flops == [expected, expected], flops


def test_xla_cpu_work_is_never_called_device_bound_nor_given_fixes_false_on_a_tpu():
    set_target(None)
    dev = torch_xla.device()
    a = torch.randn(512, 512, device=dev)
    b = torch.randn(512, 512, device=dev) / 512
    with tpu_nb.track("big") as report:
        for _ in range(6):
            for _ in range(4):
                a = torch.tanh(a @ b)
            torch_xla.sync()
    verdict = report.anatomy.verdict
    assert verdict is not None
    assert verdict.kind != "device-bound" or verdict.reason.startswith("judged for a v5e"), verdict
    if verdict.kind in ("host-bound", "device-bound"):
        first = "tracing" if verdict.kind == "host-bound" else "device work"
        assert verdict.reason.startswith(f"judged for a v5e: {first} "), verdict
        assert "the CPU's time" in verdict.reason
    text = str(report)
    for false_on_a_tpu in ("bigger device", "pin_memory", "torch_xla.compile(step_fn)"):
        assert false_on_a_tpu not in text


def test_a_slow_target_makes_the_same_step_device_bound_there():
    # The same loop, judged for a chip 10^6 times slower than a v5e: its projected device
    # time dwarfs the host's tracing, so on that chip the step would be device-bound.
    slow = Chip("slow", peak_flops=1e8, hbm_bytes=16e9, hbm_bandwidth=1e9)
    set_target(slow)
    try:
        dev = torch_xla.device()
        a = torch.randn(256, 256, device=dev)
        b = torch.randn(256, 256, device=dev) / 256
        with tpu_nb.track("slow") as report:
            for _ in range(6):
                a = torch.tanh(a @ b)
                torch_xla.sync()
    finally:
        set_target(None)
    verdict = report.anatomy.verdict
    assert verdict is not None and verdict.kind == "device-bound", verdict
    assert verdict.reason.startswith("judged for a slow: device work >= ")
    assert report.cost.device_seconds == pytest.approx(2 * 256**3 / 1e8)
    assert "shard the step over more chips" in verdict.fix


def test_an_xla_cpu_allocation_failure_in_a_tracked_run_becomes_the_card():
    dev = torch_xla.device()
    with pytest.raises(RuntimeError), tpu_nb.track("oom") as report:
        huge = torch.zeros(2**46, dtype=torch.uint8, device=dev)
        torch_xla.sync()
        del huge
    oom = report.out_of_memory
    assert oom is not None and oom.requested == 2**46
    assert str(report).count("Fix: a smaller batch") == 1
    # The runtime timed the execution that failed and counted none: not "0 (… on device)"
    from tpu_nb.display.reports import RunView

    executions = next(v for k, v in RunView(report).figures() if k == "executions")
    assert executions.startswith("0, and 1 that failed ("), executions
    assert " on device" in executions, executions
    # nor is it told to run more steps for a verdict: more would fail alike
    assert report.judgement.note == "the run failed after 1 step, which compiled its graph"
    assert "run 3 more" not in str(report)


def test_a_compile_time_oom_in_a_cell_shows_the_card_with_its_line(shell, tmp_path, capsys):
    shell.run_cell(f"OOM_TEXT = {COMPILE_OOM!r}")
    result = shell.run_cell("%%on_tpu\nraise ValueError(OOM_TEXT)")
    assert isinstance(result.error_in_exec, ValueError)
    shown = capsys.readouterr().out
    assert "out of memory compiling: the program needs 21.95 GiB of HBM" in shown
    assert "1. 2.00 GiB aten__mm f32[16384,32768] at train.py:42" in shown
    assert tpu_nb.last_report().out_of_memory.allocations[0].line == 42


def test_a_run_time_oom_at_the_cells_end_shows_no_frame_of_tpu_nb(shell, capsys):
    # XLA raises it when the work runs: at %%on_tpu's wait at the cell's end, below no line
    # of the cell. Its traceback holds the cell's call and the error, not tpu_nb's frames.
    shell.run_cell("import torch, torch_xla\ndev = torch_xla.device()")
    capsys.readouterr()
    result = shell.run_cell(
        "%%on_tpu\nhuge = torch.zeros(2**46, dtype=torch.uint8, device=dev)\ntorch_xla.sync()"
    )
    assert isinstance(result.error_in_exec, RuntimeError)
    shown = capsys.readouterr().out
    assert tpu_nb.last_report().out_of_memory.requested == 2**46
    error = shown[shown.rindex("RuntimeError: Out of memory allocating") :]
    assert "Traceback" not in shown and "contextlib" not in shown, shown
    assert "when %%on_tpu waited for it at the cell's end" in error
    shell.run_cell("del huge")


def test_a_tiny_target_warns_before_the_first_step_runs_and_the_report_says_it(py):
    out = py(
        textwrap.dedent(
            """
            import warnings, torch, torch_xla, tpu_nb
            tiny = tpu_nb.Chip("tiny", peak_flops=1e12, hbm_bytes=50_000, hbm_bandwidth=1e9)
            env = tpu_nb.setup(target=tiny)
            print("judged for tiny:", any("judged for a tiny" in a for a in env.applied))
            dev = tpu_nb.device()
            def counter():
                return torch_xla._XLAC._xla_counter_value("ExecuteComputation") or 0
            seen = []
            def keep(message, category, filename, *args, **kwargs):
                seen.append((str(message), counter(), filename))
            warnings.showwarning = keep
            with tpu_nb.track("fit") as report:
                with torch.device(dev):
                    model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.Linear(128, 8))
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                x = torch.randn(16, 128, device=dev)
                before = counter()
                for _ in range(6):
                    model(x).sum().backward(); opt.step(); opt.zero_grad()
                    torch_xla.sync()
            message, executed, filename = seen[0]
            print("warned before running:", executed == before, "does not fit" in message)
            print("at the user's line:", filename == __file__)
            print("report:", report.cost.memory.fits, report.cost.memory.temporaries > 0)
            print(str(report).split("memory on a tiny: ")[1].splitlines()[0][:40])
            print("warning's fix:", message.split("Fix: ")[1])
            print("verdict:", report.judgement.verdict)
            tpu_nb.setup(target="v5e")  # the same steps, on a chip they fit
            with tpu_nb.track("fits") as report:
                for _ in range(6):
                    model(x).sum().backward(); opt.step(); opt.zero_grad()
                    torch_xla.sync()
            print("on a v5e:", report.cost.memory.fits, report.judgement.verdict.kind)
            """
        )
    ).stdout
    assert "judged for tiny: True" in out
    assert "warned before running: True True" in out
    assert "at the user's line: True" in out
    assert "report: False True" in out
    assert "does not fit: needs " in out
    # A step that cannot run on the target is judged by that: not by how fast it would go,
    # and with no fix (a larger batch, for a host-bound step) that makes it bigger. The model
    # alone is more than the chip has: no batch size is the fix.
    verdict = out.split("verdict: ")[1].splitlines()[0]
    assert verdict.startswith("does-not-fit: judged for a tiny: the step needs "), verdict
    assert "of HBM, a tiny has 50 KB: it would not run there" in verdict, verdict
    fix = verdict.split("Fix: ")[1]
    assert "whatever the batch" in fix and "smaller batch" not in fix, fix
    assert "larger batch" not in verdict
    assert "whatever the batch" in out.split("warning's fix: ")[1].splitlines()[0]
    on_v5e = out.split("on a v5e: ")[1].split()
    assert on_v5e[0] == "True" and on_v5e[1] != "does-not-fit", out


def test_a_graph_compiled_before_the_run_leaves_its_temporaries_unknown(py):
    """The compile log gives a graph's temporaries when it compiles: a step whose graph
    compiled outside the tracked run (a plain cell first) says what it does not know, where
    the same step compiled inside a tracked run gets the figure."""
    step = textwrap.dedent(
        """
        def steps():
            for _ in range(3):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward(); opt.step(); opt.zero_grad()
                torch_xla.sync()
        """
    )
    head = textwrap.dedent(
        """
        import torch, torch_xla, tpu_nb
        tpu_nb.setup()
        dev = tpu_nb.device()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 10)).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(32, 64).to(dev), torch.randint(0, 10, (32,)).to(dev)
        """
    )
    show = 'print("memory:", str(report).split("memory on a v5e: ")[1].splitlines()[0])\n'
    tracked = py(head + step + 'with tpu_nb.track("t") as report:\n    steps()\n' + show).stdout
    before = py(
        head + step + 'steps()\nwith tpu_nb.track("t") as report:\n    steps()\n' + show
    ).stdout
    assert "memory: fits: needs " in tracked and "temporaries not known" not in tracked, tracked
    assert "memory: needs at least " in before, before
    assert "the graph's temporaries not known: tpu_nb has no compile-log sizes" in before
    assert "temporaries 0 B" not in before


def test_a_live_cell_compiling_the_process_s_first_graph_keeps_its_sizes(py):
    """torch_xla reads PT_XLA_DEBUG_FILE for a compile's sizes as that compile ends, apart
    from its cause; the live dashboard's thread polls the counters while the first compile
    runs. The sizes must still reach the log (not stderr, for the whole process) and the
    report: the same step tracked with and without --live says the same about memory."""
    out = py(
        """
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        import tpu_nb
        ip.run_line_magic("load_ext", "tpu_nb")
        ip.run_line_magic("tpu_setup", "--device cpu")
        ip.run_cell(
            "import time, torch, torch_xla\\n"
            "dev = torch_xla.device()\\n"
            "torch.manual_seed(0)\\n"
            "model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),"
            " torch.nn.Linear(512, 10)).to(dev)\\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.01)\\n"
            "x, y = torch.randn(64, 256, device=dev), torch.randint(0, 10, (64,), device=dev)"
        )
        body = (
            "start = time.perf_counter()\\n"
            "while time.perf_counter() - start < 2:\\n"
            "    torch.nn.functional.cross_entropy(model(x), y).backward()\\n"
            "    opt.step(); opt.zero_grad(); torch_xla.sync()\\n"
        )
        for flags in ("--live", ""):
            ip.run_cell(f"%%on_tpu {flags}\\n" + body)
            text = str(tpu_nb.last_report())
            print("MEMORY", flags or "plain", text.split("memory on a v5e: ")[1].splitlines()[0])
        """
    )
    memory = [line for line in out.stdout.splitlines() if line.startswith("MEMORY")]
    assert len(memory) == 2, out.stdout[-3000:]
    for line in memory:
        assert " fits: needs " in line and "temporaries not known" not in line, line
    assert "Post Compilation Analysis" not in out.stdout + out.stderr


def test_the_card_and_the_cost_are_escaped_in_html(shell):
    from tpu_nb.display.reports import RunView

    hostile = COMPILE_OOM.replace('source_file="train.py"', 'source_file="<b>x</b>.py"')
    shell.run_cell(f"HOSTILE = {hostile!r}")
    shell.run_cell("%%on_tpu --quiet\nraise ValueError(HOSTILE)")
    html = RunView(tpu_nb.last_report())._repr_html_()
    assert "&lt;b&gt;x&lt;/b&gt;.py:42" in html and "<b>x</b>" not in html
    assert "tpunb-error" in html


def test_tpu_setup_target_sets_the_chip_and_a_wrong_one_is_a_usage_error(shell):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="unknown target chip 'v9'.*Fix: one of"):
        shell.run_line_magic("tpu_setup", "--target v9")
    try:
        shell.run_line_magic("tpu_setup", "--device cpu --target v6e")
        assert target_chip("CPU") == (CHIPS["v6e"], False)
    finally:
        set_target(None)


def test_host_time_leaves_out_what_the_syncs_waited_for_the_device():
    from tpu_nb.runtime.tracking import StepCost, StepRecord
    from tpu_nb.runtime.tracking._cost import timed

    # Each step: 1 ms of tracing, then a 3 ms sync of which 2.5 ms waited for the
    # previous step's execution (the device busy then), 0.5 ms the host's own.
    steps = [
        StepRecord(
            index=i,
            start=10.0 * i,
            end=10.0 * i + 0.004,
            trace=0.001,
            sync=0.003,
            host_spans=(("sync", 10.0 * i + 0.001, 10.0 * i + 0.004),),
            device_spans=((10.0 * i + 0.001, 10.0 * i + 0.0035),),
            device=0.0025,
        )
        for i in range(3)
    ]
    cost = timed(StepCost(CHIPS["v5e"], False, flops=197 * 10**9, moved_bytes=0.0), steps)
    assert cost.host_seconds == pytest.approx(0.0015)
    assert cost.device_seconds == pytest.approx(1e-3)  # 197 GFLOP at 197 TFLOP/s
    assert cost.measured_device_seconds == pytest.approx(0.0025)
    assert cost.mfu is None  # not on the chip: no MFU


def test_a_loop_that_keeps_a_tensor_per_step_is_named():
    from tpu_nb.runtime.tracking._cost import kept_step_over_step

    # constructed: (steps made, live device tensors) after steps' syncs
    assert kept_step_over_step([(2, 6), (6, 10), (10, 14), (14, 17)]).startswith(
        "device memory grows step over step: 11 more live device tensors"
    )
    assert kept_step_over_step([(2, 6), (6, 7), (10, 7), (14, 8)]) == ""
    assert kept_step_over_step([(2, 6), (4, 10), (8, 14)]) == ""  # too few steps to say
    # a count that rises and falls (a Trainer's logging and evaluation): nothing is kept
    assert kept_step_over_step([(2, 150), (6, 190), (10, 143), (14, 191)]) == ""
    assert kept_step_over_step([(2, 6), (14, 17)]) == ""  # two samples cannot show a trend

    dev = torch_xla.device()
    with torch.device(dev):
        model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8, device=dev)
    notes = {}
    for keep in (True, False):
        losses = []
        with tpu_nb.track("keep") as report:
            for _ in range(14):
                loss = model(x).sum()
                loss.backward()
                opt.step()
                opt.zero_grad()
                torch_xla.sync()
                if keep:
                    losses.append(loss)
        notes[keep] = report.cost.notes
    assert any("device memory grows step over step" in n for n in notes[True]), notes
    assert "device memory grows" in str(report) or not notes[False]
    assert not any("grows step over step" in n for n in notes[False]), notes


def test_a_step_running_torch_compiled_graphs_says_its_flops_leave_them_out():
    """The Dynamo bridge runs a compiled function's graphs itself: tpu_nb captures the rest
    of the step, and the cost says its figure is that, not the step's."""
    dev = torch_xla.device()
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 16, device=dev)
    forward = torch.compile(lambda x: model(x).square().mean(), backend="openxla")

    def steps(loss_of):
        for _ in range(4):
            opt.zero_grad()
            loss_of(x).backward()
            opt.step()
            torch_xla.sync()

    for loss_of, partial in ((forward, True), (lambda x: model(x).square().mean(), False)):
        with tpu_nb.track() as report:
            steps(loss_of)
        assert report.cost is not None and report.cost.partial is partial, report.cost
        said = "\n".join(report.cost.lines())
        assert ("outside torch.compile'd functions" in said) is partial, said


def test_a_step_holding_no_module_needs_at_least_its_inputs():
    """A loop over plain tensors holds no module or optimizer: its memory need is at least the
    device data its graph reads, never "needs 0 B"."""
    dev = torch_xla.device()
    w = torch.randn(256, 256, device=dev)
    torch_xla.sync()
    with tpu_nb.track() as report:
        for _ in range(4):
            w = (w @ w).tanh()
            torch_xla.sync()
    memory = report.cost.memory
    assert memory is not None and memory.needed >= 256 * 256 * 4, memory
    assert "needs 0 B" not in "\n".join(report.cost.lines())


def test_what_is_held_is_the_most_of_each_part_at_any_moment_of_the_run():
    """Gradients live from backward() to zero_grad(), an optimizer's state from its first
    step() on, and a step holds all three at once: the need adds the most of each part."""
    at_capture = Residency(params=100, grads=100, optimizer=0, largest=(("model", 200),))
    at_end = Residency(params=100, grads=0, optimizer=200, largest=(("model", 300),))
    most = at_capture.most(at_end)
    assert (most.params, most.grads, most.optimizer) == (100, 100, 200)
    assert most.largest == (("model", 300),)
    sized = GraphCost(temp_bytes=50.0, resident=at_capture)
    fit = memory_fit([sized], CHIPS["v5e"], at_end)
    assert fit is not None and fit.needed == 100 + 100 + 200 + 50, fit
    # nothing held at the end (the cell deleted its model): the captures' figure stands
    assert memory_fit([sized], CHIPS["v5e"], Residency()).needed == 250


def test_tensors_counted_whole_while_pending_take_their_laid_out_size():
    """A sharded parameter's gradient (or optimizer state) seen before its step's sync has
    no layout yet and is counted whole; read again laid out (at a later capture, or as the
    run ends), one device's part is the figure. Counted whole at every moment, it stays
    whole: tpu_nb does not guess a layout."""
    pending = Residency(
        params=100, grads=400, optimizer=800, whole=frozenset({"grads", "optimizer"})
    )
    laid_out = Residency(params=100, grads=100, optimizer=200)
    for most in (pending.most(laid_out), laid_out.most(pending)):
        assert (most.grads, most.optimizer, most.whole, most.total) == (100, 200, set(), 400)
    gone = Residency(params=100, grads=0, optimizer=200)  # zero_grad() before the end
    most = pending.most(gone)
    assert (most.grads, most.optimizer, most.whole) == (400, 200, {"grads"}), most


def test_the_need_takes_what_every_capture_of_the_run_saw_held():
    """A loop accumulating gradients over two syncs, whose last capture (the optimizer's
    step, after zero_grad()) saw no gradient: the gradients another capture of the same
    run saw held count too."""
    from tpu_nb.runtime.tracking._cost import step_cost
    from tpu_nb.runtime.tracking._store import store

    costs = {
        "accumulating": GraphCost(temp_bytes=10.0, resident=Residency(params=100, grads=100)),
        "stepping": GraphCost(temp_bytes=10.0, resident=Residency(params=100, optimizer=200)),
    }
    for name, graph_cost in costs.items():
        store.keep_cost(name, graph_cost)
    try:
        site = ("cell", 5)
        alone = step_cost({site: "stepping"}, {site: 4}, 4)
        both = step_cost({site: "stepping"}, {site: 4}, 4, captured=sorted(costs))
    finally:
        for name in costs:
            store.costs.pop(name, None)
    assert alone.memory is not None and alone.memory.resident.total == 300, alone.memory
    assert both.memory is not None and both.memory.resident.total == 400, both.memory
    assert both.memory.needed == 410, both.memory


def test_every_graph_a_loop_site_ran_must_fit_not_only_the_one_it_ran_most():
    """Gradient accumulation runs a backward-only graph at most syncs and the optimizer's
    step at one in k: the step's memory is that of the graph which needs most, whichever
    ran most; its FLOPs stay those of the graph run most."""
    from tpu_nb.runtime.tracking._cost import step_cost
    from tpu_nb.runtime.tracking._store import store

    costs = {
        "accumulating": GraphCost(flops=1000, temp_bytes=10.0, output_bytes=0.0),
        "stepping": GraphCost(flops=1000, temp_bytes=500.0, output_bytes=300.0),
    }
    for name, graph_cost in costs.items():
        store.keep_cost(name, graph_cost)
    try:
        site = ("cell", 5)
        calls = {site: {"accumulating": 6, "stepping": 2}}
        most = step_cost({site: "accumulating"}, {site: 8}, 8)
        every = step_cost({site: "accumulating"}, {site: 8}, 8, site_graphs=calls)
        # a graph that ran only before the loop (another site, called once) is not the step's
        warm = step_cost(
            {site: "accumulating", ("cell", 2): "stepping"},
            {site: 8, ("cell", 2): 1},
            8,
            site_graphs={site: {"accumulating": 8}, ("cell", 2): {"stepping": 1}},
        )
    finally:
        for name in costs:
            store.costs.pop(name, None)
    assert most.memory is not None and most.memory.needed == 10, most.memory
    assert every.memory is not None and every.memory.needed == 800, every.memory
    assert every.flops == 1000 and every.memory.graphs == 2
    assert "of the 2 graphs its steps ran, the one that needs most: temporaries 500 B" in (
        every.memory.describe()
    )
    assert warm.memory is not None and warm.memory.needed == 10
    assert "graphs, the one" not in warm.memory.describe()


def test_graphs_compiled_at_a_loops_line_count_whether_captured_or_not():
    """A capture can miss a graph its line compiled (no variable reaches its tensors): each
    compiled graph at the loop's line must fit, with the compile log's sizes, and counts
    beside the captured ones, but not twice: a captured graph tpu_nb could not match to its
    compile may be one of those compiled."""
    from tpu_nb.runtime.metrics._compile_log import CompileEvent
    from tpu_nb.runtime.tracking._cost import step_cost
    from tpu_nb.runtime.tracking._store import store

    class At:  # a provenance.Site's key is all step_cost reads of it
        def __init__(self, key):
            self.key = key

    site = ("cell", 6)
    gib = 2**30

    def compiled(graph_hash: str, temporaries: float, at=site) -> CompileEvent:
        sizes = {"graph input": 100 / gib, "intermediate tensor": temporaries / gib}
        return CompileEvent("user mark_step", graph_hash, (), sizes_gb=sizes, site=At(at))

    costs = {  # captured: two known by the compile that wrote their sizes, one not
        "steady": GraphCost(graph_hash="log-steady", input_bytes=100.0, temp_bytes=50.0),
        "cached": GraphCost(graph_hash="log-earlier-run", input_bytes=100.0, temp_bytes=0.0),
        "unmatched": GraphCost(input_bytes=100.0),
    }
    for name, graph_cost in costs.items():
        store.keep_cost(name, graph_cost)
    try:
        # a Trainer's loader line: a graph an earlier cell compiled (cached here), the first
        # step's, compiled but never captured, and the steady step's
        missed = step_cost(
            {site: "steady"},
            {site: 8},
            8,
            site_graphs={site: {"steady": 6, "cached": 2}},
            compiles=[compiled("log-first", 900.0), compiled("log-steady", 50.0)],
        )
        # a capture tpu_nb could not match to a compile may be the one compiled here
        seen_twice = step_cost(
            {site: "steady"},
            {site: 8},
            8,
            site_graphs={site: {"steady": 6, "unmatched": 2}},
            compiles=[compiled("log-first", 20.0), compiled("log-steady", 50.0)],
        )
        # a graph compiled before the loop, at another line, is not the step's
        before = step_cost(
            {site: "steady"},
            {site: 8},
            8,
            site_graphs={site: {"steady": 8}},
            compiles=[compiled("log-setup", 5000.0, ("cell", 2))],
        )
    finally:
        for name in costs:
            store.costs.pop(name, None)
    assert missed.memory is not None and missed.memory.needed == 100 + 900, missed.memory
    assert missed.memory.graphs == 3, missed.memory
    assert "of the 3 graphs its steps ran" in missed.memory.describe()
    assert seen_twice.memory is not None and seen_twice.memory.graphs == 2, seen_twice.memory
    assert seen_twice.memory.needed == 100 + 50, seen_twice.memory
    assert before.memory is not None and before.memory.needed == 100 + 50, before.memory
    assert before.memory.graphs == 1, before.memory


def test_the_optimizer_state_a_graph_makes_is_counted_once():
    """The optimizer's first step writes its state anew (outputs not written in place), and
    tpu_nb finds that state held as well. Counted as both, that step would need more than any
    step does (a ResNet-18 accumulating gradients: 292 MB where the steady step needs 270;
    an AdamW loop whose graphs an earlier run of the cell cached: 143 KB for 128)."""
    params, state = 100_000, 200_000
    backward = GraphCost(  # accumulating into the gradients, in place
        temp_bytes=1_000.0, output_bytes=params, aliased_bytes=params, resident=Residency(params)
    )
    making = GraphCost(
        temp_bytes=5_000.0,
        output_bytes=params + state,
        aliased_bytes=params,  # the weights written over, the state anew
        resident=Residency(params, optimizer=state),
    )
    steady = GraphCost(
        temp_bytes=50_000.0,
        output_bytes=params + state,
        aliased_bytes=params + state,
        resident=Residency(params, params, state),
    )
    fit = memory_fit([backward, making, steady], CHIPS["v5e"])
    assert fit is not None and fit.needed == params + params + state + 50_000, fit
    alone = memory_fit([making], CHIPS["v5e"])
    assert alone is not None and alone.made == state
    assert alone.needed == params + 5_000 + state, alone  # the state once
    assert "the optimizer state it makes among them (counted once" in alone.describe()
    # a steady step whose gradients are new outputs as large as the state (SGD with
    # momentum after zero_grad()) writes the state in place: it read it, it did not make it
    momentum = GraphCost(
        temp_bytes=5_000.0,
        output_bytes=params + params + params,
        aliased_bytes=params + params,  # weights and momentum in place, gradients anew
        resident=Residency(params, params, params),
    )
    sgd = memory_fit([momentum], CHIPS["v5e"])
    assert sgd is not None and sgd.made == 0 and sgd.needed == 3 * params + 5_000 + params


def test_the_module_and_optimizer_an_object_holds_are_found():
    """A Trainer holds the model and its optimizer (and the optimizer's state) as attributes:
    what the cell's variables hold on the device counts them, named by the variable."""
    dev = torch_xla.device()
    model = torch.nn.Linear(7, 3).to(dev)  # shapes no other test compiles
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 7, device=dev)).sum().backward()
    optimizer.step()
    torch_xla.sync()

    class Holder:
        pass

    trainer = Holder()
    trainer.model, trainer.optimizer = model, optimizer
    found = residency([{"trainer": trainer, "Holder": Holder, "torch": torch}])
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert (found.params, found.grads, found.optimizer) == (params, params, 2 * params), found
    assert found.largest[0][0] == "trainer.model", found
    # a variable of the module itself keeps its own name, and nothing is counted twice
    both = residency([{"model": model, "trainer": trainer}])
    assert both.total == found.total and both.largest[0][0] == "model", both


def test_the_state_a_graph_makes_is_told_apart_through_the_logs_rounding():
    """The compile log gives sizes in GiB to six decimals: a first AdamW step making 88,160
    bytes of state reads as writing 88,047 anew, less than the state, and was taken for a
    step that reads the state, counting it twice (254 KB where the loop needs 211)."""
    params, state = 44_080, 88_160
    making = GraphCost(
        temp_bytes=30_000.0,
        output_bytes=params + state - 113.0,
        aliased_bytes=params,
        resident=Residency(params, optimizer=state),
    )
    fit = memory_fit([making], CHIPS["v5e"])
    assert fit is not None and fit.made == state, fit
    assert fit.needed == params + 30_000 + state - 113, fit


def test_new_gradients_count_once_and_never_more_than_are_held():
    """Constructed facts: gradients the graph computes anew leave what is held for its
    outputs, up to the outputs not written in place and to the gradients held (a sharded
    parameter's gradient seen whole while pending counts its device's part)."""
    steady = GraphCost(
        temp_bytes=50.0,
        output_bytes=300.0,
        aliased_bytes=200.0,  # weights and state in place; the gradients anew
        resident=Residency(params=100, grads=100, optimizer=200, new_grads=100),
    )
    fit = memory_fit([steady], CHIPS["v5e"])
    assert fit is not None and fit.new_grads == 100 and fit.needed == 300 + 50 + 100, fit
    assert "the gradients it computes among them (counted once" in fit.describe()
    in_place = replace(steady, resident=replace(steady.resident, new_grads=0))
    assert memory_fit([in_place], CHIPS["v5e"]).needed == 400 + 50 + 100  # accumulated
    # SPMD over 4 devices: the gradients pending whole at the capture, laid out at the end;
    # the graph also writes 200 of other new outputs
    sharded = GraphCost(
        temp_bytes=50.0,
        output_bytes=500.0,
        aliased_bytes=200.0,
        resident=Residency(
            params=100, grads=400, optimizer=200, whole=frozenset({"grads"}), new_grads=400
        ),
    )
    laid_out = Residency(params=100, grads=100, optimizer=200)
    fit = memory_fit([sharded], CHIPS["v5e"], laid_out)
    assert fit is not None and fit.new_grads == 100 and fit.needed == 300 + 50 + 300, fit
    # never more than the outputs not written in place
    few = replace(steady, output_bytes=240.0)
    assert memory_fit([few], CHIPS["v5e"]).new_grads == 40


def test_gradients_a_step_computes_anew_are_counted_once():
    """zero_grad() lets the last gradients go, so backward() computes them anew: held by
    .grad when the step is captured, still pending, and among the graph's new outputs.
    Counted as both, the step needed its gradients twice over. XLA's own sizes of the
    graph (its inputs, temporaries and outputs not written in place, all on the chip while
    it runs) are the oracle."""
    dev = torch_xla.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(  # shapes no other test compiles
        torch.nn.Linear(47, 93), torch.nn.ReLU(), torch.nn.Linear(93, 47)
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 47, device=dev)
    torch_xla.sync()
    with tpu_nb.track() as report:
        for _ in range(5):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            torch_xla.sync()
    memory = report.cost.memory
    assert memory is not None and memory.resident is not None, report.cost
    grads = memory.resident.grads
    assert grads == sum(p.numel() * p.element_size() for p in model.parameters())
    assert memory.new_grads == grads, memory
    on_chip = max(
        g.input_bytes + g.temp_bytes + g.output_bytes - g.aliased_bytes
        for g in report.cost.graphs
        if None not in (g.input_bytes, g.temp_bytes, g.output_bytes, g.aliased_bytes)
    )
    assert on_chip <= memory.needed < on_chip + grads / 2, (memory, on_chip)
    assert "the gradients it computes among them (counted once" in memory.describe()


def test_a_loop_whose_rarer_graph_writes_more_is_judged_on_that_graph():
    """Every fourth step also keeps a 4 MB copy of a weight: a graph run once in four that
    needs 4 MB more than the loop's other. The memory line counts it (it read 0 B, from the
    graph run most) and says which of the two graphs its figures are."""
    dev = torch_xla.device()
    x = torch.zeros(41, device=dev)  # shapes no other test compiles
    w = torch.ones(1000, 1007, device=dev)
    torch_xla.sync()
    with tpu_nb.track() as report:
        for i in range(8):
            x = x + 1
            if i % 4 == 3:
                snapshot = w * 2
            torch_xla.sync()
    assert snapshot.shape == w.shape
    memory = report.cost.memory
    assert memory is not None and memory.graphs == 2, memory
    copy = w.numel() * w.element_size()
    assert memory.outputs >= 0.99 * copy and memory.needed >= 0.99 * copy, memory
    assert "of the 2 graphs its steps ran, the one that needs most" in memory.describe()
    # a loop of one graph: its own figures, no word of others
    with tpu_nb.track() as single:
        for _ in range(8):
            x = x + 1
            torch_xla.sync()
    assert single.cost.memory is not None and single.cost.memory.graphs == 1
    assert "graphs, the one" not in single.cost.memory.describe()


def test_sizes_from_the_compile_log_are_read_as_gib():
    """torch_xla's compile log gives a graph's sizes in "GB" that are GiB: a graph reading
    16 MiB reads 16,777,216 bytes, which the memory line gives as 16.8 MB."""
    dev = torch_xla.device()
    x = torch.zeros(2**24 + 64, dtype=torch.uint8).to(dev)  # a shape no other test compiles
    torch_xla.sync()
    with tpu_nb.track() as report:
        for _ in range(3):
            x = x + 1
            torch_xla.sync()
    inputs = [g.input_bytes for g in report.cost.graphs if g.input_bytes]
    assert inputs and inputs[0] == pytest.approx(2**24 + 64, rel=1e-4), report.cost.graphs


def _accumulating(every: int, optimizer: bool = True):
    """A training loop stepping its AdamW optimizer every `every` micro-batches, under
    track(); returns (the report, its parameters' bytes)."""
    dev = torch_xla.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3) if optimizer else None
    data = [(torch.randn(8, 32), torch.randint(0, 4, (8,))) for _ in range(12)]
    torch_xla.sync()
    with tpu_nb.track() as report:
        for i, (x, y) in enumerate(data):
            loss = torch.nn.functional.cross_entropy(model(x.to(dev)), y.to(dev))
            loss.backward()
            if opt is not None and (i + 1) % every == 0:
                opt.step()
                opt.zero_grad()
            torch_xla.sync()
    return report, sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.parametrize("every", [1, 2, 4])
def test_an_optimizers_state_counts_also_when_it_steps_after_the_captures(every):
    """With gradient accumulation the optimizer first steps after the captures of the
    loop's first syncs: its state (AdamW: two moments per parameter) is still what a step
    holds on the chip, beside the gradients held from one sync to the next. Stepping at
    every sync, the same state; the gradients are then the step graph's own temporaries
    (zero_grad() lets them go before the sync)."""
    report, params = _accumulating(every)
    memory = report.cost.memory
    assert memory is not None and memory.resident is not None, report.cost
    held = memory.resident
    grads = params if every > 1 else 0
    assert (held.params, held.grads, held.optimizer) == (params, grads, 2 * params), held
    assert memory.needed >= held.total, memory


def test_a_loop_without_an_optimizer_holds_no_optimizer_state():
    report, params = _accumulating(1, optimizer=False)
    held = report.cost.memory.resident
    assert (held.params, held.optimizer) == (params, 0), held


def test_a_sharded_models_gradients_are_one_devices_part_in_the_report(py):
    # The gradients of weights sharded 4 ways over 4 CPU devices, pending at the captures
    # before each sync, are a quarter on each device once laid out: the report says so.
    out = py(
        """
        import numpy as np, torch, torch_xla, tpu_nb
        import torch_xla.runtime as xr
        import torch_xla.distributed.spmd as xs
        xr.use_spmd()
        mesh = xs.Mesh(np.arange(4), (4, 1), ("fsdp", "model"))
        dev = torch_xla.device()
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 8)).to(dev)
        for p in model.parameters():
            xs.mark_sharding(p, mesh, ("fsdp",) + (None,) * (p.dim() - 1))
        opt = torch.optim.AdamW(model.parameters())
        x, y = torch.randn(16, 64).to(dev), torch.randint(0, 8, (16,)).to(dev)
        with tpu_nb.track() as report:
            for _ in range(4):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                torch_xla.sync()
        held = report.cost.memory.resident
        full = sum(p.numel() * p.element_size() for p in model.parameters())
        print("RESULT", [held.params * 4, held.grads * 4, held.optimizer * 2, full])
        """,
        env={"CPU_NUM_DEVICES": "4"},
        timeout=180,
    ).stdout
    params, grads, state, full = eval(out.split("RESULT")[-1].strip())
    assert params == grads == state == full, (params, grads, state, full)


def test_a_sharded_model_counts_one_devices_part(py):
    # SPMD over 4 CPU devices: a weight sharded 4 ways is a quarter on each device, one
    # sharded 2 ways (replicated on the other mesh axis) a half, a replicated one whole.
    out = py(
        """
        import numpy as np, torch, torch_xla
        import torch_xla.runtime as xr
        import torch_xla.distributed.spmd as xs
        from tpu_nb.runtime.tracking._cost import residency
        xr.use_spmd()
        mesh = xs.Mesh(np.arange(4), (2, 2), ("a", "b"))
        dev = torch_xla.device()
        four, two, whole = (torch.nn.Linear(64, 64, bias=False).to(dev) for _ in range(3))
        xs.mark_sharding(four.weight, mesh, ("a", "b"))
        xs.mark_sharding(two.weight, mesh, ("a", None))
        print("RESULT", [residency([{"m": m}]).params for m in (four, two, whole)])
        """,
        env={"CPU_NUM_DEVICES": "4"},
        timeout=120,
    ).stdout
    full = 64 * 64 * 4
    assert out.split("RESULT")[-1].strip() == str([full // 4, full // 2, full])


def test_a_syncs_own_time_leaves_out_its_wait_for_the_device():
    # (pure logic) each sync's time less the device time it overlaps, found among sorted
    # spans without looking at every span of the run for every sync
    from types import SimpleNamespace

    from tpu_nb.runtime.tracking._cost import Busy, _own_sync, union

    busy = union([(0.0, 1.0), (0.5, 1.5), (3.0, 4.0), (6.0, 7.0)])
    assert busy == [(0.0, 1.5), (3.0, 4.0), (6.0, 7.0)]
    step = SimpleNamespace(
        sync=4.0, host_spans=[("sync", 1.0, 3.5), ("trace", 5.0, 6.5), ("sync", 6.5, 8.0)]
    )
    # waited 0.5 (1.0-1.5) + 0.5 (3.0-3.5) + 0.5 (6.5-7.0); the trace span is not a sync's
    assert _own_sync(step, Busy(busy)) == pytest.approx(4.0 - 1.5)
    assert _own_sync(SimpleNamespace(sync=1.0, host_spans=[("sync", 1.5, 2.5)]), Busy(busy)) == 1.0


def test_the_fix_for_a_step_that_does_not_fit_follows_what_takes_the_room():
    """The model and its optimizer's state over the chip: no batch size helps. Temporaries
    over it: a smaller batch or recomputed activations do."""
    small = replace(CHIPS["v5e"], hbm_bytes=1_000_000)
    model_too_big = memory_fit(
        [GraphCost(input_bytes=10, temp_bytes=10.0, resident=Residency(params=2_000_000))], small
    )
    assert model_too_big is not None and model_too_big.fits is False
    assert "keeps on the chip (2 MB: parameters" in model_too_big.fix
    assert "whatever the batch" in model_too_big.fix and "smaller batch" not in model_too_big.fix
    activations = memory_fit(
        [GraphCost(input_bytes=10, temp_bytes=3e6, resident=Residency(params=400_000))], small
    )
    assert activations is not None and activations.fits is False
    assert activations.fix.startswith("the graph's temporaries (3 MB: activations"), activations.fix
    assert "a smaller batch" in activations.fix and "whatever the batch" not in activations.fix
    # new outputs, not activations, over the room left: no batch advice for them
    written = memory_fit(
        [
            GraphCost(
                input_bytes=10,
                output_bytes=5e5,
                aliased_bytes=0,
                temp_bytes=1e5,
                resident=Residency(params=600_000),
            )
        ],
        small,
    )
    assert written is not None and written.fits is False
    assert written.fix.startswith("what the graph writes anew (500 KB of outputs"), written.fix
    assert "batch" not in written.fix


def test_a_loop_with_a_ragged_last_batch_costs_the_step_it_runs_most():
    """200 examples in batches of 48 make four of 48 and one of 8 per epoch: the last batch
    is a graph of its own, and the last one run. A step's cost is that of the 48's graph,
    which most steps run (torch's FlopCounterMode counts the same step), not the 8's."""
    dev = torch_xla.device()
    torch.manual_seed(0)
    with torch.device(dev):
        model = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2)
        )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    features = torch.randn(200, 32, device=dev)
    labels = (torch.arange(200, device=dev) % 2).long()
    torch_xla.sync()

    def step(x, y):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    with tpu_nb.track("ragged") as report:
        for _ in range(3):
            for x, y in zip(features.split(48), labels.split(48), strict=True):
                loss = step(x, y)
                torch_xla.sync()
    with FlopCounterMode(display=False) as counter:
        loss = step(features[:48], labels[:48])
    torch_xla.sync()
    del loss
    assert report.cost is not None
    assert report.cost.flops == counter.get_total_flops(), (report.cost.flops, counter)


def test_the_parts_a_memory_line_lists_add_up_to_what_it_needs():
    step = GraphCost(
        input_bytes=10,
        output_bytes=5_000,
        aliased_bytes=1_000,  # an updated weight written over its input
        temp_bytes=2_000.0,
        resident=Residency(params=100_000),
    )
    fit = memory_fit([step], CHIPS["v5e"])
    assert fit is not None and fit.needed == 100_000 + 2_000 + 4_000
    text = fit.describe()
    assert text.startswith("fits: needs 106 KB, a v5e has 16 GB (resident 100 KB"), text
    assert "the graph's temporaries 2 KB; its outputs not written in place 4 KB)" in text, text
