"""Real models no one here wrote, under `%%on_tpu`: truthful on real code.

Hugging Face GPT-2 and BERT built from small configs, torchvision's resnet18, the classic
Kaggle/Colab torch_xla loop (xm.mark_step, ParallelLoader, MpDeviceLoader), synthetic data,
nothing downloaded. Each test checks what a user would rely on: the report's figures equal
torch_xla's own counters (read around the cell with torch_xla.debug.metrics), the same loop
in a plain cell with explicit device= does the same work, and each finding names the cell's
line, the library or helper function in between, and what changed.

What each test checks of the runtime (figures, lines, what changed) does not depend on the
notebook stack, so most run once, on the current one. Marked `stack` (run again on Colab's
IPython 7.34 and ipykernel 6.17): the tests whose findings name another cell by its In [n],
which is how each IPython and ipykernel version names a cell that matters.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing downloaded: every model from its config

import pytest
import torch_xla.debug.metrics as met
from _env import kernel_environment

from tpu_nb.display.reports import RunView
from tpu_nb.ipython import _on_tpu as magics  # where %%on_tpu shows its views
from tpu_nb.runtime.tracking import LineFinding

pytestmark = pytest.mark.timeout(300)

# What the report calls each figure -> torch_xla's own counter for it.
RAW = {
    "compiles": "UncachedCompile",
    "cache_hits": "CachedCompile",
    "executions": "ExecuteComputation",
    "syncs": "MarkStep",
    "host_reads": "aten::_local_scalar_dense",
}


def raw_counters(*extra: str) -> dict[str, int]:
    names = {**RAW, **{n: n for n in extra}}
    return {key: met.counter_value(name) or 0 for key, name in names.items()}


@dataclass
class Ran:
    """A cell run in the shell: its value, the raw counter deltas around it, the report view
    the user was shown (None for a plain cell)."""

    cell: str
    value: Any
    raw: dict[str, int]
    view: RunView | None

    @property
    def report(self):
        return self.view.report

    @property
    def findings(self) -> list[LineFinding]:
        return list(self.view.report.findings)

    @property
    def text(self) -> str:
        return repr(self.view)

    def line(self, marker: str) -> int:
        """The 1-based line of the cell (the magic line is line 1) containing `marker`."""
        hits = [i for i, text in enumerate(self.cell.splitlines(), 1) if marker in text]
        assert len(hits) == 1, (marker, hits)
        return hits[0]

    def of_kind(self, *kinds: str) -> list[LineFinding]:
        return [f for f in self.findings if f.kind in kinds]


def run(shell, monkeypatch, cell: str, *counters: str) -> Ran:
    shown = []
    real_display = magics.display

    def display(obj, *args, **kwargs):
        shown.append(obj)
        return real_display(obj, *args, **kwargs)

    monkeypatch.setattr(magics, "display", display)
    before = raw_counters(*counters)
    result = shell.run_cell(cell)
    after = raw_counters(*counters)
    monkeypatch.setattr(magics, "display", real_display)
    assert result.error_in_exec is None, result.error_in_exec
    assert result.error_before_exec is None, result.error_before_exec
    views = [v for v in shown if isinstance(v, RunView)]
    value = result.result
    if not views and hasattr(value, "findings"):
        # `-o`: the returned report is the cell's Out, shown through the RunView formatter
        views = [RunView(value)]
    return Ran(cell, value, {k: after[k] - before[k] for k in after}, views[-1] if views else None)


def figures(report) -> dict[str, int]:
    m = report.metrics
    return {
        "compiles": m.compiles,
        "cache_hits": m.cache_hits,
        "executions": m.executions,
        "syncs": m.syncs,
        "host_reads": m.host_reads,
    }


def work(raw: dict[str, int]) -> dict[str, int]:
    """The work a run asked of XLA, whatever the compile cache held before it: graphs looked
    up (compiled or found cached), executions, syncs, scalar reads."""
    return {
        "graphs": raw["compiles"] + raw["cache_hits"],
        "executions": raw["executions"],
        "syncs": raw["syncs"],
        "host_reads": raw["host_reads"],
    }


def assert_report_is_raw(ran: Ran) -> None:
    assert figures(ran.report) == {k: ran.raw[k] for k in RAW}, ran.text


# -- GPT-2 -------------------------------------------------------------------------------------

GPT2_SETUP = """\
import torch, torch_xla
from torch.utils.data import DataLoader
from transformers import GPT2Config, GPT2LMHeadModel
config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64)
g = torch.Generator().manual_seed(0)
seqs = [torch.randint(1, 256, (int(n),), generator=g).tolist()
        for n in torch.randint(5, 30, (32,), generator=g)]

def pad_to_32(batch):
    ids = torch.zeros(len(batch), 32, dtype=torch.long)
    for i, seq in enumerate(batch):
        ids[i, :len(seq)] = torch.tensor(seq)
    return ids

def pad_to_longest(batch):
    ids = torch.zeros(len(batch), max(len(s) for s in batch), dtype=torch.long)
    for i, seq in enumerate(batch):
        ids[i, :len(seq)] = torch.tensor(seq)
    return ids
"""

# One loop, written for %%on_tpu (model built in the cell, no device=) and for a plain cell
# (explicit device: .to(dev)). The collate_fn comes from the earlier cell.
GPT2_TRAIN = """\
torch.manual_seed(0)
model = GPT2LMHeadModel(config){to_dev}
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
losses, batch_devices = [], set()
for ids in DataLoader(seqs, batch_size=4, collate_fn=pad_to_32):
    batch_devices.add(ids.device.type)
    ids = ids.to(torch_xla.device())
    loss = model(ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    torch_xla.sync()
    losses.append(loss.detach())
print([round(v.item(), 2) for v in losses])
"""


@pytest.fixture(scope="module")
def gpt2(shell):
    result = shell.run_cell(GPT2_SETUP)
    assert result.error_in_exec is None, result.error_in_exec
    return shell


def test_gpt2_fixed_padding_and_adamw_do_the_plain_cells_work(gpt2, monkeypatch):
    shell = gpt2
    magic = run(shell, monkeypatch, "%%on_tpu -o\n" + GPT2_TRAIN.format(to_dev=""))
    ns = shell.user_ns
    steps = len(ns["losses"])
    # %%on_tpu left the notebook's collate_fn and AdamW's step counters on the CPU...
    assert ns["batch_devices"] == {"cpu"}
    assert {s["step"].device.type for s in ns["opt"].state.values()} == {"cpu"}
    assert next(ns["model"].parameters()).device.type == "xla"  # ...and built the model
    magic_opt_state = {s["step"].device.type for s in ns["opt"].state.values()}

    plain = run(
        shell,
        monkeypatch,
        "dev = torch_xla.device()\n"
        + GPT2_TRAIN.format(to_dev=".to(dev)").replace("torch_xla.device()", "dev"),
    )
    assert {s["step"].device.type for s in ns["opt"].state.values()} == magic_opt_state
    assert_report_is_raw(magic)
    # The same work as the plain cell: one graph, one execution per step (not 16 compiles,
    # 248 executions and 240 reads of AdamW's step counters), one read per printed loss.
    assert work(magic.raw) == work(plain.raw)
    assert magic.raw["executions"] == magic.raw["syncs"] == steps
    assert magic.raw["host_reads"] == steps
    assert not magic.report.recompiled and "RECOMPILED" not in magic.text
    assert magic.of_kind("recompile") == []
    sync = magic.line("torch_xla.sync()")
    assert {f.line for f in magic.of_kind("compile", "warm-up")} == {sync}
    (read,) = magic.of_kind("host-read")
    assert (read.line, read.count) == (magic.line("print("), steps)


def test_gpt2_dynamic_padding_names_the_sequence_length_on_the_sync_line(gpt2, monkeypatch):
    shell = gpt2
    shell.user_ns["uneven"] = [[1] * 9, [2] * 7, [3] * 30, [4] * 12, [5] * 3, [6] * 9]
    ran = run(
        shell,
        monkeypatch,
        "%%on_tpu -o\n"
        "torch.manual_seed(0)\n"
        "model = GPT2LMHeadModel(config)\n"
        "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
        "for ids in DataLoader(uneven, batch_size=2, collate_fn=pad_to_longest):\n"
        "    ids = ids.to(torch_xla.device())\n"
        "    loss = model(ids, labels=ids).loss\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n"
        "    torch_xla.sync()\n",
    )
    assert_report_is_raw(ran)
    # batches padded to 9, 30, 9: the first step's graph, then one graph per length. Three
    # steps cannot tell dynamic padding from buckets: the report says so, and what changed.
    assert ran.raw["compiles"] == 3 and ran.raw["executions"] == 3
    assert not ran.report.recompiled and "RECOMPILED" not in ran.text
    assert "too few calls to tell whether it keeps compiling" in ran.text
    (recompile,) = ran.of_kind("variant")
    assert recompile.line == ran.line("torch_xla.sync()")
    # what changed: the sequence dimension (dim 1 of [batch, seq, embedding]), 30 -> 9
    # (the batch of token ids itself, s64[2,30] -> s64[2,9], or the embeddings it feeds)
    assert any(
        re.search(r"\[2,30(,64)?\] \u2192 \S*\[2,9(,64)?\] \(dim 1: 30 \u2192 9", fact)
        for fact in recompile.changed
    ), (recompile.changed, ran.report.capture_seconds, getattr(ran.report, "record_errors", None))
    assert "dim 1: 30 \u2192 9" in ran.text


# -- BERT evaluation ---------------------------------------------------------------------------

BERT_SETUP = """\
import torch, torch_xla
from transformers import BertConfig, BertForSequenceClassification
bconfig = BertConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=64,
                     intermediate_size=128, vocab_size=256, max_position_embeddings=64)
torch.manual_seed(0)
bert = BertForSequenceClassification(bconfig).to(torch_xla.device()).eval()
eval_batches = [(torch.randint(1, 256, (4, 16)), torch.ones(4, 16, dtype=torch.long),
                 torch.randint(0, 2, (4,))) for _ in range(5)]
"""

BERT_EVAL = """\
%%on_tpu -o
total = 0.0
with torch.no_grad():
    for ids, mask, labels in eval_batches:
        dev = torch_xla.device()
        out = bert(ids.to(dev), attention_mask=mask.to(dev), labels=labels.to(dev))
        step_loss = out.loss.item()
        total += step_loss
        if step_loss < 0:
            print("converged")
print(f"mean loss {total / len(eval_batches):.3f}")
"""


def test_bert_evaluation_host_reads_per_line_with_the_transformers_function(shell, monkeypatch):
    assert shell.run_cell(BERT_SETUP).error_in_exec is None
    steps = len(shell.user_ns["eval_batches"])
    for attempt in ("first run", "run again: nothing compiles, the findings stay"):
        ran = run(shell, monkeypatch, BERT_EVAL)
        assert_report_is_raw(ran)
        reads = ran.of_kind("host-read")
        # every read placed on a line, with counts adding up to the raw counter
        assert sum(f.count for f in reads) == ran.raw["host_reads"] > 0, attempt
        assert all(f.line and not f.place for f in reads), reads
        by_line = {f.line: f for f in reads}
        # transformers' own mask check reads a value once per call: placed on the user's
        # line that called the model, naming transformers' function
        model_read = by_line[ran.line("out = bert(")]
        assert model_read.count == steps
        assert model_read.via.startswith("transformers/modeling_attn_mask_utils.py:")
        assert "_prepare_4d_attention_mask" in model_read.via
        item = by_line[ran.line(".item()")]
        assert (item.count, item.via) == (steps, "")
        # the branch never taken and the print of a Python float read nothing
        assert set(by_line) == {ran.line("out = bert("), ran.line(".item()")}
        assert not [
            f for f in ran.findings if f.line in (ran.line('"converged"'), ran.line("mean loss"))
        ]
        # an evaluation under no_grad is never told about gradients
        assert "gradient" not in ran.text.lower(), attempt
        assert not [
            f for f in ran.findings if "grad" in " ".join((f.what, f.hint, *f.changed)).lower()
        ], attempt
        assert not ran.report.recompiled
        # no finding names tpu_nb's own frames (its final sync is "end of cell")
        assert not [f for f in ran.findings if "tpu_nb" in f.via], ran.findings
    assert ran.raw["compiles"] == 0 and ran.raw["cache_hits"] > 0
    # the same cell without %%on_tpu (the model was placed in the set-up cell): the same work
    plain = run(shell, monkeypatch, BERT_EVAL.replace("%%on_tpu -o\n", ""))
    assert work(plain.raw) == work(ran.raw)


# -- resnet18 built in the cell ----------------------------------------------------------------

RESNET_TRAIN = """\
torch.manual_seed(0)
net = torchvision.models.resnet18(num_classes=10){to_dev}
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
images, labels = images_cpu.to(torch_xla.device()), labels_cpu.to(torch_xla.device())
for step in range(3):
    loss = torch.nn.functional.cross_entropy(net(images), labels)
    loss.backward()
    opt.step()
    opt.zero_grad()
    torch_xla.sync()
print(f"{{loss.item():.3f}}")
"""


def test_resnet18_built_in_the_cell_initialisation_is_no_recompilation(shell, monkeypatch):
    assert (
        shell.run_cell(
            "import torch, torch_xla, torchvision\n"
            "images_cpu = torch.randn(2, 3, 32, 32)\n"
            "labels_cpu = torch.tensor([1, 7])\n"
            # what earlier cells left pending (the BERT cell's outputs) runs here, not in
            # the first step of the cells compared below
            "torch_xla.sync()"
        ).error_in_exec
        is None
    )
    magic = run(shell, monkeypatch, "%%on_tpu -o\n" + RESNET_TRAIN.format(to_dev=""))
    magic_loss = shell.user_ns["loss"].item()
    assert_report_is_raw(magic)
    assert not magic.report.recompiled and "RECOMPILED" not in magic.text
    assert magic.of_kind("recompile") == []
    sync = magic.line("torch_xla.sync()")
    first, steady = magic.of_kind("compile", "warm-up")
    assert (first.line, steady.line) == (sync, sync)

    # The plain cell moving the model with .to(dev) has the same initial weights (the CPU's
    # generator, seeded) and runs the very same graphs: it compiles none, finds every one in
    # the cache, and prints the same loss.
    plain = run(
        shell,
        monkeypatch,
        "dev = torch_xla.device()\n"
        + RESNET_TRAIN.format(to_dev=".to(dev)").replace("torch_xla.device()", "dev"),
    )
    assert work(magic.raw) == work(plain.raw)
    assert plain.raw["compiles"] == 0
    assert magic_loss == shell.user_ns["loss"].item()
    assert magic.raw["executions"] == magic.raw["syncs"] == 3


# -- a timm-style model built in the cell ------------------------------------------------------

TIMM_SETUP = """\
import torch, torch_xla

class Block(torch.nn.Module):
    def __init__(self, dim, drop_path):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Linear(dim, dim)
        self.drop_path = drop_path

    def forward(self, x):
        y = self.mlp(self.norm(x))
        if self.training and self.drop_path > 0:  # stochastic depth, per sample
            keep = torch.rand(x.shape[0], 1, 1, device=x.device) >= self.drop_path
            y = y * keep.to(x.dtype) / (1 - self.drop_path)
        return x + y

class TinyTimm(torch.nn.Module):
    # timm's pattern: the stochastic-depth schedule read from a linspace in __init__
    def __init__(self, depth=4, dim=16, classes=3, drop_path_rate=0.1):
        super().__init__()
        dpr = [x.item() for x in torch.linspace(0, drop_path_rate, depth)]
        self.blocks = torch.nn.Sequential(*[Block(dim, dpr[i]) for i in range(depth)])
        self.head = torch.nn.Linear(dim, classes)

    def forward(self, x):
        return self.head(self.blocks(x).mean(1))

timm_data = torch.randn(4, 5, 16)
timm_target = torch.tensor([0, 1, 2, 0])
torch_xla.sync()  # what earlier cells left pending runs here, not in the cells compared
"""

TIMM_TRAIN = """\
torch.manual_seed(0)
torch_xla.manual_seed(0)  # stochastic depth draws on the device
{build}
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data, target = timm_data.to(torch_xla.device()), timm_target.to(torch_xla.device())
for step in range(3):
    loss = torch.nn.functional.cross_entropy(model(data), target)
    loss.backward()
    opt.step()
    opt.zero_grad()
    torch_xla.sync()
print(f"{{loss.item():.3f}}")
"""


def test_timm_style_model_built_in_the_cell_matches_the_moved_model(shell, monkeypatch):
    """A model whose __init__ reads values (timm's stochastic-depth schedule, `x.item()`
    over a `torch.linspace`) is built under %%on_tpu as torch builds it, on the host, then
    moved: it reads nothing from the device, as `TinyTimm().to(dev)` in a plain cell."""
    assert shell.run_cell(TIMM_SETUP).error_in_exec is None
    magic = run(shell, monkeypatch, "%%on_tpu -o\n" + TIMM_TRAIN.format(build="model = TinyTimm()"))
    magic_loss = shell.user_ns["loss"].item()
    assert_report_is_raw(magic)
    assert next(shell.user_ns["model"].parameters()).device.type == "xla"
    moved = run(
        shell, monkeypatch, TIMM_TRAIN.format(build="model = TinyTimm().to(torch_xla.device())")
    )
    assert work(magic.raw) == work(moved.raw)
    assert moved.raw["compiles"] == 0  # the very same graphs: all cached
    assert magic_loss == shell.user_ns["loss"].item()
    # one read: the printed loss; the schedule's .item() calls read the host's linspace
    assert magic.raw["host_reads"] == moved.raw["host_reads"] == 1
    (print_read,) = magic.of_kind("host-read")
    assert print_read.line == magic.line("print(")
    assert magic.raw["syncs"] == moved.raw["syncs"] == 3


# -- CPU fallback inside a model defined in another cell ---------------------------------------

ROBUST_CELL = """\
import torch, torch_xla

class RobustHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        centre = torch.median(h)
        signs = torch.unique(x.sign())
        return (h - centre).relu().sum() + signs.sum()

robust = RobustHead().to(torch_xla.device())
"""


@pytest.mark.stack
def test_fallback_in_a_module_from_another_cell_is_placed_on_the_calling_line(shell, monkeypatch):
    assert shell.run_cell(ROBUST_CELL).error_in_exec is None
    ran = run(
        shell,
        monkeypatch,
        "%%on_tpu -o\n"
        "for _ in range(3):\n"
        "    score = robust(torch.randn(4, 8))\n"
        "    torch_xla.sync()\n",
        "aten::median",
        "aten::_unique2",
    )
    assert_report_is_raw(ran)
    assert ran.report.metrics.fallbacks == {
        "median": ran.raw["aten::median"],
        "_unique2": ran.raw["aten::_unique2"],
    }
    assert ran.raw["aten::median"] == ran.raw["aten::_unique2"] == 3
    median, unique = ran.of_kind("fallback")
    for fallback in (median, unique):
        assert (fallback.line, fallback.count, fallback.place) == (ran.line("robust("), 3, "")
        # the function in between is the other cell's forward, named by its cell
        assert re.fullmatch(r"In \[\d+\], line \d+ forward", fallback.via), fallback.via
    # counter names mapped to the op the user wrote, each with its own hint
    assert median.what.startswith("torch.median ran on the CPU (aten::median")
    assert "torch.quantile" in median.hint
    assert unique.what.startswith("torch.unique ran on the CPU (aten::_unique2")
    assert "output size depends on the data" in unique.hint
    assert "outside this cell" not in ran.text


def test_module_built_in_the_cell_its_pending_init_is_no_recompilation_at_a_read(
    shell, monkeypatch
):
    """A model constructed in the cell leaves its random initialisation pending; the first
    value read (here the CPU fallback's) runs it with the first step. That graph differs
    from the next step's (it also ran the initialisation, and drew the first random batch
    from the initial seed), but the line did not recompile."""
    assert (
        shell.run_cell(
            "import torch, torch_xla\n"
            "class MedianShift(torch.nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.lin = torch.nn.Linear(8, 6)\n"
            "    def forward(self, x):\n"
            "        h = self.lin(x)\n"
            "        return (h - torch.median(h)).sum()\n"
        ).error_in_exec
        is None
    )
    ran = run(
        shell,
        monkeypatch,
        "%%on_tpu -o\n"
        "fresh = MedianShift()\n"
        "for _ in range(3):\n"
        "    score = fresh(torch.randn(4, 8))\n"
        "    torch_xla.sync()\n",
    )
    assert_report_is_raw(ran)
    assert {f.line for f in ran.of_kind("fallback")} == {ran.line("fresh(")}
    assert not ran.report.recompiled and "RECOMPILED" not in ran.text, ran.text
    assert ran.of_kind("recompile") == []


# -- the legacy Kaggle/Colab loop --------------------------------------------------------------

KAGGLE_SETUP = """\
import torch, torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
from torch.utils.data import DataLoader, TensorDataset
g = torch.Generator().manual_seed(0)
ds = TensorDataset(torch.randn(64, 16, generator=g), torch.randint(0, 4, (64,), generator=g))

def train_loop(loader, model, opt):
    for x, y in loader:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        xm.optimizer_step(opt)
"""


@pytest.mark.stack
def test_kaggle_mp_device_loader_in_a_helper_names_the_cells_line(shell, monkeypatch):
    assert shell.run_cell(KAGGLE_SETUP).error_in_exec is None
    ran = run(
        shell,
        monkeypatch,
        "%%on_tpu -o\n"
        "device = xm.xla_device()\n"
        "model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),\n"
        "                            torch.nn.Linear(32, 4)).to(device)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = pl.MpDeviceLoader(DataLoader(ds, batch_size=16), device)\n"
        "for epoch in range(2):\n"
        "    train_loop(loader, model, opt)\n",
    )
    assert_report_is_raw(ran)
    compiles = ran.of_kind("compile", "warm-up", "state", "variant", "recompile", "growing")
    assert len(compiles) == ran.raw["compiles"] > 0
    call = ran.line("train_loop(loader")
    for finding in compiles:
        assert finding.line == call, finding
        # the helper from the other cell, then the loader's sync at the step's end
        assert re.fullmatch(
            r"In \[\d+\], line \d+ train_loop \u2192 "
            r"torch_xla/distributed/parallel_loader\.py:\d+ \w+",
            finding.via,
        ), finding.via
    assert "no line" not in ran.text and "line not recorded" not in ran.text


@pytest.mark.stack
@pytest.mark.parametrize("user_syncs", [True, False])
def test_mp_device_loaders_own_syncs_are_no_steps(shell, monkeypatch, user_syncs):
    # 2 epochs of 8 batches: 16 steps, whether the loop syncs each step itself or leaves it
    # to MpDeviceLoader (whose sync before each batch then ends the step before it).
    assert shell.run_cell(KAGGLE_SETUP).error_in_exec is None
    ran = run(
        shell,
        monkeypatch,
        "%%on_tpu -o\n"
        "dev = torch_xla.device()\n"
        "model = torch.nn.Linear(16, 4).to(dev)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for epoch in range(2):\n"
        "    for x, y in pl.MpDeviceLoader(DataLoader(ds, batch_size=8), dev):\n"
        "        loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "        loss.backward(); opt.step(); opt.zero_grad()\n"
        + ("        torch_xla.sync()\n" if user_syncs else ""),
    )
    anatomy = ran.report.anatomy
    assert len(anatomy.steps) == 16
    assert anatomy.loader_syncs == ran.raw["syncs"] - 16 > 0
    assert f"16 steps (and {anatomy.loader_syncs} syncs of the data loader" in anatomy.summary()


def test_kaggle_parallel_loader_and_mark_step_name_the_cells_lines(shell, monkeypatch):
    assert shell.run_cell(KAGGLE_SETUP).error_in_exec is None
    ran = run(
        shell,
        monkeypatch,
        "%%on_tpu -o\n"
        "device = xm.xla_device()\n"
        "model = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.Tanh(),\n"
        "                            torch.nn.Linear(24, 4)).to(device)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)\n"
        "para = pl.ParallelLoader(DataLoader(ds, batch_size=16), [device])\n"
        "for x, y in para.per_device_loader(device):\n"
        "    opt.zero_grad()\n"
        "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    xm.mark_step()\n",
    )
    assert_report_is_raw(ran)
    compiles = ran.of_kind("compile", "warm-up", "state", "variant", "recompile", "growing")
    assert len(compiles) == ran.raw["compiles"] > 0
    # the steps' graphs at the user's mark_step; what was pending when the loop started ran
    # at the loader's own sync, on the `for` line
    step, loop = ran.line("xm.mark_step()"), ran.line("for x, y in para")
    assert step in {f.line for f in compiles} and {f.line for f in compiles} <= {step, loop}
    for finding in compiles:
        if finding.line == loop:
            assert re.fullmatch(
                r"torch_xla/distributed/parallel_loader\.py:\d+ \w+", finding.via
            ), finding.via
    assert "no line" not in ran.text and "line not recorded" not in ran.text


# -- scenario 1 in a real kernel ---------------------------------------------------------------

KERNEL_COUNTERS = """\
import json, tpu_nb
import torch_xla.debug.metrics as met
RAW = {raw!r}

def raw():
    return {{key: met.counter_value(name) or 0 for key, name in RAW.items()}}

def since(before):
    return {{key: value - before[key] for key, value in raw().items()}}
"""


def execute_notebook(sources: list[str], allow_errors: bool = False):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    with kernel_environment():  # the kernel chooses its own latched XLA settings (%tpu_setup)
        NotebookClient(
            nb,
            timeout=240,
            kernel_name="python3",
            allow_errors=allow_errors,
            resources={"metadata": {"path": str(Path(__file__).parents[1])}},
        ).execute()
    return nb


def outputs(cell, kinds) -> str:
    return "".join(
        o.get("text", "") or o.get("data", {}).get("text/plain", "")
        for o in cell.outputs
        if o.output_type in kinds
    )


def _summary_figures(text: str) -> dict[str, int]:
    """The figures of a report's or XLA line's summary: "2 compiled", "8 executed", ..."""
    found = {}
    for key, words in (
        ("compiles", "compiled"),
        ("executions", "executed"),
        ("cache_hits", "cache hits?"),
        ("host_reads", "host reads?"),
    ):
        match = re.search(rf"(\d+) {words}", text)
        found[key] = int(match.group(1)) if match else 0
    return found


@pytest.mark.kernel
def test_gpt2_fixed_padding_in_a_real_kernel_matches_the_plain_cell():
    magic_cell = "%%on_tpu -o\n" + GPT2_TRAIN.format(to_dev="")
    # the plain cell places the model itself, as most code does: .to(dev)
    plain_cell = "dev = torch_xla.device()\n" + GPT2_TRAIN.format(to_dev=".to(dev)").replace(
        "torch_xla.device()", "dev"
    )
    sources = [
        "%load_ext tpu_nb\n%tpu_setup --device cpu",
        GPT2_SETUP + KERNEL_COUNTERS.format(raw=RAW),
        "before = raw()",
        magic_cell,
        "magic_raw, magic = since(before), tpu_nb.last_report()\n"
        "magic_state = sorted({s['step'].device.type for s in opt.state.values()})\n"
        "magic_batches = sorted(batch_devices)\n"
        "before = raw()",
        plain_cell,
        "plain_raw = since(before)\n"
        "m = magic.metrics\n"
        "print(json.dumps(dict(magic_raw=magic_raw, plain_raw=plain_raw, steps=len(losses),\n"
        "    magic=dict(compiles=m.compiles, cache_hits=m.cache_hits, executions=m.executions,\n"
        "               syncs=m.syncs, host_reads=m.host_reads),\n"
        "    state=magic_state, batches=magic_batches, recompiled=magic.recompiled)))",
    ]
    nb = execute_notebook(sources)
    facts = json.loads(outputs(nb.cells[6], ("stream",)).strip().splitlines()[-1])
    steps = facts["steps"]
    assert facts["magic"] == {k: facts["magic_raw"][k] for k in RAW}
    assert work(facts["magic_raw"]) == work(facts["plain_raw"])
    assert facts["plain_raw"]["compiles"] == 0  # the very same graphs: all cached
    assert facts["magic_raw"]["executions"] == facts["magic_raw"]["host_reads"] == steps
    assert (facts["state"], facts["batches"], facts["recompiled"]) == (["cpu"], ["cpu"], False)

    # What the user sees: the report under the %%on_tpu cell, the XLA line under the plain
    # one, with the same figures (the plain cell's graphs were all in the cache); the reads
    # placed on the cell's line.
    (shown,) = [
        text
        for text in (outputs(nb.cells[3], ("display_data", "execute_result")),)
        if text.startswith("XLA: ")
    ]  # -o: the report is the cell's Out, once
    summary = shown.splitlines()[0]
    assert "RECOMPILED" not in shown
    xla_line = [
        line for line in outputs(nb.cells[5], ("stream",)).splitlines() if line.startswith("XLA: ")
    ][-1]
    shown_magic, shown_plain = _summary_figures(summary), _summary_figures(xla_line)
    for figures_ in (shown_magic, shown_plain):
        figures_["graphs"] = figures_.pop("compiles") + figures_.pop("cache_hits")
    assert shown_magic == shown_plain
    assert shown_magic["host_reads"] == shown_magic["executions"] == steps
    print_line = Ran(magic_cell, None, {}, None).line("print(")
    assert f"line {print_line}: read from the device \u00d7{steps}" in shown


@pytest.mark.stack
@pytest.mark.kernel
def test_findings_name_other_cells_by_their_in_number_in_a_real_kernel():
    nb = execute_notebook(
        [
            "%load_ext tpu_nb\n%tpu_setup --device cpu",
            "import torch, torch_xla\n\ndef mean_of(t):\n    return t.mean().item()",
            "%%on_tpu -o\nx = torch.arange(6.0)\nm = mean_of(x * 2)\n",
        ]
    )
    helper, cell = nb.cells[1], nb.cells[2]
    shown = outputs(cell, ("display_data", "execute_result"))
    assert "line 3: read from the device \u00d71" in shown, shown
    assert f"In [{helper.execution_count}], line 4 mean_of" in shown, shown
    assert ".py:4 mean_of" not in shown, shown


# -- the same numbers as the plain cell, in fresh kernels ----------------------------------------

SAME_NUMBERS_SETUP = """\
import json
import torch, torch_xla, torchvision
import torch_xla.debug.metrics as met
dev = torch_xla.device()
COUNTERS = {"compiles": "UncachedCompile", "cache_hits": "CachedCompile",
            "executions": "ExecuteComputation", "syncs": "MarkStep",
            "host_reads": "aten::_local_scalar_dense"}
TRANSFERS = {"to_device": "TransferToDeviceTime", "to_host": "TransferFromDeviceTime"}

def raw():
    found = {k: met.counter_value(n) or 0 for k, n in COUNTERS.items()}
    found.update({k: (met.metric_data(n) or (0,))[0] for k, n in TRANSFERS.items()})
    return found

def since(before):
    return {k: v - before[k] for k, v in raw().items()}
"""

# Each workload places what it builds itself, as code copied from the web does; the last line
# of each prints its numbers and the raw counters' deltas.
SAME_NUMBERS_CELLS = {
    "three lines": """\
torch.manual_seed(0)
m = torch.nn.Linear(4, 3).to(dev)
t = torch.randn(3).to(dev)
print(float(m.weight.sum()), float(t.sum()))""",
    "gpt2": """\
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
torch_xla.manual_seed(0)
config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64)
model = GPT2LMHeadModel(config).to(torch_xla.device())
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.randint(0, 256, (4, 32)).to(torch_xla.device())
losses = []
for step in range(8):
    loss = model(ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    torch_xla.sync()
    losses.append(loss.detach())
print([round(v.item(), 6) for v in losses])""",
    "resnet18": """\
torch.manual_seed(0)
net = torchvision.models.resnet18(num_classes=10).to(dev)
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
images, labels = torch.randn(2, 3, 32, 32).to(dev), torch.tensor([1, 7]).to(dev)
for step in range(3):
    loss = torch.nn.functional.cross_entropy(net(images), labels)
    loss.backward()
    opt.step()
    opt.zero_grad()
    torch_xla.sync()
print(round(loss.item(), 6))""",
    "timm-style": """\
class Schedule(torch.nn.Module):
    def __init__(self, depth=4, dim=16):
        super().__init__()
        self.rates = [x.item() for x in torch.linspace(0, 0.1, depth)]  # reads in __init__
        self.blocks = torch.nn.Sequential(*[torch.nn.Linear(dim, dim) for _ in range(depth)])

    def forward(self, x):
        return self.blocks(x).mean()

torch.manual_seed(0)
sched = Schedule().to(dev)
out = sched(torch.randn(5, 16).to(dev))
torch_xla.sync()
print(sched.rates, round(out.item(), 6))""",
}


def _same_numbers_cells() -> dict[str, str]:
    """The cells to compare. On Colab's notebook stack, the ones without a real model: what
    that stack changes is how the magic runs a cell, which those cells show; the real models
    run on the same torch as on the current stack, where they are compared in full."""
    if os.environ.get("TPU_NB_STACK") == "colab":
        return {k: v for k, v in SAME_NUMBERS_CELLS.items() if k in ("three lines", "timm-style")}
    return SAME_NUMBERS_CELLS


def _same_numbers_notebook(prefix: str) -> list[str]:
    sources = [SAME_NUMBERS_SETUP]
    for cell in _same_numbers_cells().values():
        sources += ["before = raw()", prefix + cell, "print(json.dumps(since(before)))"]
    return sources


@pytest.mark.kernel
@pytest.mark.stack
@pytest.mark.timeout(600)
def test_placed_code_prints_the_plain_kernels_numbers_and_does_its_work():
    plain = execute_notebook(_same_numbers_notebook(""))
    magic = execute_notebook(
        ["%load_ext tpu_nb\n%tpu_setup --device cpu\n%config TpuNb.show_xla_line = False"]
        + _same_numbers_notebook("%%on_tpu --quiet\n")
        + [
            "%%on_tpu --quiet\n"
            "torch.manual_seed(0)\n"
            "built = torch.nn.Linear(4, 3)  # placed by nothing: lands on the device\n"
            "print(built.weight.device, float(built.weight.sum()))"
        ]
    )
    offset = 1  # the magic notebook's set-up cell

    def stdout(cell) -> str:
        return "".join(o.text for o in cell.outputs if o.get("name") == "stdout")

    for i, name in enumerate(_same_numbers_cells()):
        at = 1 + 3 * i + 1
        printed = [stdout(nb.cells[at + k]) for nb, k in ((plain, 0), (magic, offset))]
        assert printed[0] == printed[1] and printed[0].strip(), (name, printed)
        work = [
            json.loads(outputs(nb.cells[at + 1 + k], ("stream",)))
            for nb, k in ((plain, 0), (magic, offset))
        ]
        assert work[0] == work[1], (name, work)
    last = stdout(magic.cells[-1]).split()
    three = stdout(plain.cells[2]).split()
    assert last == ["xla:0", three[0]]  # the seeded weights of `nn.Linear(4, 3).to(dev)`
