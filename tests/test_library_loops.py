"""Loops that live in libraries, judged as the same loop written in the cell would be, with
the advice a user of that library can apply: transformers' `Trainer` (dynamic, bucketed and
fixed padding, logging through `xm.mesh_reduce`), `generate()` with the dynamic and the
static cache, an `accelerate` loop beside the same loop written in the cell, a peft LoRA step.

Models from their configs (nothing downloaded), tiny, for few steps: the judgement, not the
training, is tested. Each run is a `%%on_tpu` cell in a real InteractiveShell; torch_xla's
raw counters around the cell are the oracle for its figures, and the same code in a plain
cell afterwards does the same work.
"""

from __future__ import annotations

import gc
import os
import re
import sys
from io import StringIO

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing downloaded: the model from its config

import pytest
import torch_xla.debug.metrics as met

import tpu_nb

pytest.importorskip("accelerate")  # Trainer needs it (the test extra installs it)
pytestmark = pytest.mark.timeout(420)

SETUP = """
import time

import torch
from tokenizers import Tokenizer, models
from transformers import (
    BertConfig, BertForSequenceClassification, DataCollatorWithPadding,
    PreTrainedTokenizerFast, Trainer, TrainerCallback, TrainingArguments,
)

# a tokenizer made in memory: its pad() is all the collator uses of it
tokenizer = PreTrainedTokenizerFast(
    tokenizer_object=Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1}, unk_token="[UNK]")),
    pad_token="[PAD]",
)

# Python work of the user's at each step (a callback that logs or computes metrics on the host)
class HostWork(TrainerCallback):
    def __init__(self, seconds):
        self.seconds = seconds

    def on_step_begin(self, args, state, control, **kwargs):
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass

def make_trainer(
    padding, steps=6, logging_steps=100, eval_steps=None, accumulate=1, batch=4, width=32,
    host_work=0.0, optim="adamw_torch",
):
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=64, hidden_size=width, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=2 * width, max_position_embeddings=64,
    )
    model = BertForSequenceClassification(config)
    g = torch.Generator().manual_seed(1)
    lengths = [int(n) for n in torch.randint(5, 40, (batch * steps * accumulate,), generator=g)]
    data = [
        {"input_ids": torch.randint(2, 64, (n,), generator=g).tolist(), "labels": n % 2}
        for n in lengths
    ]

    collate = {  # each batch to its longest sequence, to a multiple of 32, to 48
        "dynamic": DataCollatorWithPadding(tokenizer),
        "bucketed": DataCollatorWithPadding(tokenizer, pad_to_multiple_of=32),
        "fixed": DataCollatorWithPadding(tokenizer, padding="max_length", max_length=48),
    }[padding]
    args = TrainingArguments(
        output_dir="trainer-out", per_device_train_batch_size=batch, max_steps=steps,
        logging_steps=logging_steps, report_to=[], save_strategy="no", optim=optim,
        disable_tqdm=True, dataloader_pin_memory=False, gradient_accumulation_steps=accumulate,
        eval_strategy="steps" if eval_steps else "no", eval_steps=eval_steps,
        per_device_eval_batch_size=4,
    )
    return Trainer(
        model=model, args=args, train_dataset=data, data_collator=collate,
        eval_dataset=data[:12] if eval_steps else None,
        callbacks=[HostWork(host_work)] if host_work else None,
    )

# A causal LM, the most common fine-tuning: Trainer counts each batch's tokens
# (num_items_in_batch) and gathers the count through accelerate at every step.
def make_lm_trainer(steps=6):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32)
    config._attn_implementation = "eager"  # no mask check read: the sync is the question
    model = GPT2LMHeadModel(config)
    g = torch.Generator().manual_seed(2)
    data = [
        {"input_ids": ids, "attention_mask": [1] * 24, "labels": ids}
        for ids in torch.randint(2, 64, (4 * steps, 24), generator=g).tolist()
    ]
    args = TrainingArguments(
        output_dir="trainer-out", per_device_train_batch_size=4, max_steps=steps,
        logging_steps=100, report_to=[], save_strategy="no", optim="adamw_torch",
        disable_tqdm=True, dataloader_pin_memory=False,
    )
    return Trainer(model=model, args=args, train_dataset=data)
"""

# What the report calls each figure -> torch_xla's own counter for it.
RAW = {
    "compiles": "UncachedCompile",
    "cache_hits": "CachedCompile",
    "executions": "ExecuteComputation",
    "host_reads": "aten::_local_scalar_dense",
}


def _raw() -> dict[str, int]:
    return {key: met.counter_value(name) or 0 for key, name in RAW.items()}


@pytest.fixture(scope="module")
def run(shell, tmp_path_factory):
    here = os.getcwd()  # Trainer writes its output_dir there: a folder of the test's own
    shell.run_cell(f"import os; os.chdir({str(tmp_path_factory.mktemp('trainer'))!r})")
    assert shell.run_cell(SETUP).success

    def run_cell(body: str, tracked: bool):
        saved, sys.stdout = sys.stdout, StringIO()
        before = _raw()
        try:
            result = shell.run_cell(("%%on_tpu\n" if tracked else "") + body)
            text = sys.stdout.getvalue()
        finally:
            sys.stdout = saved
        raw = {k: v - before[k] for k, v in _raw().items()}
        assert result.success, result.error_in_exec
        return text[text.index("XLA: ") :] if "XLA: " in text else text, raw

    yield run_cell
    os.chdir(here)


def _figures(report) -> dict[str, int]:
    return {key: getattr(report.metrics, key) for key in RAW}


def _advice(text: str) -> str:
    """The report's "what to do" part (not the cell's source quoted after it)."""
    if "what to do:\n" not in text:
        return ""
    return text.split("what to do:\n", 1)[1].split("\nthe cell, annotated:", 1)[0]


def _shares_at_most_100(text: str) -> None:
    shares = [int(m) for m in re.findall(r"\b(\d+)%", text)]
    assert all(share <= 100 for share in shares), text


def _optimizer_steps(report, steps: int) -> None:
    """A step is one of the Trainer's optimizer steps: its logging's syncs (the mark_step
    before it logs, xm.mesh_reduce's rendezvous) are work inside one, and the sync after
    its loop that runs nothing is none; each per-step figure is about those steps."""
    assert len(report.anatomy.steps) == report.syncs == steps, report.anatomy
    # every other sync torch_xla counted is accounted for as no step (the dashboard's count)
    a = report.anatomy
    assert steps + a.loader_syncs + a.other_syncs == report.metrics.syncs, a
    # the step's cost is the training step's graph, not a logging rendezvous' (0 FLOP)
    assert report.cost is not None and report.cost.flops, report.cost
    assert report.cost.device_seconds is None or report.cost.device_seconds > 0, report.cost


def _all_placed(report, text: str) -> None:
    """Every compile, host copy and CPU fallback on the cell's line, with the library frame
    that did it under the line when a library did, and no share over 100 %."""
    assert "not recorded" not in text and "outside this cell's code" not in text, text
    assert all(o.site.line is not None for o in report.occurrences), report.occurrences
    fallbacks = sum(o.count for o in report.occurrences if o.kind == "fallback")
    assert fallbacks == sum(report.metrics.fallbacks.values()), report.occurrences
    # each copy to the host is one a line made: a read's, or a fallback's of its inputs
    copies = sum(o.calls for o in report.occurrences if o.kind == "read")
    assert copies + fallbacks == report.metrics.from_device_transfers, report.occurrences
    placed = [e for e in report.compile_events if e.site is not None and e.site.line]
    assert len(placed) == report.metrics.compiles, report.compile_events
    _shares_at_most_100(text)


def _same_work(tracked: dict, plain: dict) -> None:
    # the plain cell runs the graphs the tracked one compiled: from the cache
    assert plain["executions"] == tracked["executions"], (tracked, plain)
    assert plain["host_reads"] == tracked["host_reads"], (tracked, plain)
    total = lambda r: r["compiles"] + r["cache_hits"]  # noqa: E731
    assert total(plain) == total(tracked), (tracked, plain)


def test_trainer_with_dynamic_padding_is_recompiled_and_told_to_pad(run):
    # a callback's 80 ms of Python at each step: tracing and host work far longer than the
    # tiny model's device work on any host (without it, how far apart the two are varies
    # with the host's speed, around the rule's threshold)
    cell = 'make_trainer("dynamic", host_work=0.08).train()'
    text, raw = run(cell, tracked=True)
    report = tpu_nb.last_report()
    assert _figures(report) == raw  # the report's figures are torch_xla's own
    summary = text.splitlines()[0]
    assert "RECOMPILED" in summary and "compile-bound" in summary, text
    verdict = report.anatomy.verdict
    assert verdict.kind == "compile-bound" and "pad_to_multiple_of" in verdict.fix, verdict
    advice = _advice(text)
    assert "pad_to_multiple_of" in advice, text
    # every batch is full (4 × steps examples, 4 a batch): no last batch to drop
    assert "dataloader_drop_last" not in advice, text
    # the step the Trainer cannot change from the cell is not what the advice names
    assert "torch_xla.compile(step_fn)" not in advice and "pad or bucket" not in advice, text
    # recompiling at the cell's line, below it the Trainer's data loader (a site of its own)
    flagged = [p for p in report.judgement.lines.values() if p.flagged]
    assert flagged and all(len(p.key) == 4 for p in flagged), flagged
    # BERT's SDPA mask check reads the device every step, but the host's work per step
    # dwarfs the device's, so the waits cost little: a fact, without transformers' knob
    assert 'attn_implementation="eager"' not in advice, text
    read = next(line for line in text.splitlines() if "bool(tensor) read a device" in line)
    assert "in 6 of 6 steps, but not what limits this loop: tracing takes" in read, read
    _, plain = run(cell, tracked=False)
    _same_work(raw, plain)


def _failing(shell, cell: str) -> tuple[BaseException | None, str]:
    """Run a `%%on_tpu` cell expected to raise: its error and what it printed."""
    saved, sys.stdout = sys.stdout, StringIO()
    try:
        result = shell.run_cell(cell)
        return result.error_in_exec, sys.stdout.getvalue()
    finally:
        sys.stdout = saved


def test_trainer_with_its_default_optimizer_is_told_the_optim_that_runs_on_xla(shell, run):
    # With torch 2.8 and later, Trainer's default optim is torch's fused AdamW, which runs on
    # torch's own devices only: its first optimizer step raises on an XLA device.
    error, text = _failing(
        shell,
        "%%on_tpu\nmake_trainer('fixed', steps=2, optim=TrainingArguments.default_optim).train()",
    )
    assert isinstance(error, RuntimeError), error
    fused = tpu_nb.last_report().fused_optimizer
    assert fused is not None and fused.optimizer == "torch.optim.AdamW", fused
    assert fused.trainer_optim == "adamw_torch_fused" and fused.trainer_made, fused
    assert 'Fix: pass optim="adamw_torch" to TrainingArguments' in text, text
    assert "drop fused=True" not in text  # the Trainer's user made no optimizer
    # an optimizer of the user's given to the same Trainer: its own fused=True is the fix
    error, text = _failing(
        shell,
        "%%on_tpu\n"
        "own = make_trainer('fixed', steps=2, optim=TrainingArguments.default_optim)\n"
        "own.optimizer = torch.optim.AdamW(own.model.parameters(), lr=1e-3, fused=True)\n"
        "own.train()",
    )
    assert isinstance(error, RuntimeError), error
    fused = tpu_nb.last_report().fused_optimizer
    assert fused is not None and not fused.trainer_made, fused
    assert "Fix: drop fused=True where this optimizer is made" in text, text


def test_trainer_with_fixed_padding_is_not_recompiled(run):
    # logging every other step: Trainer logs through xm.mesh_reduce, whose sync, compile and
    # copy to the host run in C++, frames below the cell's line that torch_xla's log drops.
    # A model a v5e at 1 % of its peak could take as long on as this host traces it (width
    # 512, 32 sequences a batch: ~0.2 ms at its roofline): the mask check's waits may cost as
    # much as overlapping the two would save, on a loaded host too
    trainer = 'make_trainer("fixed", logging_steps=2, batch=32, width=512).train()'
    text, raw = run(trainer, tracked=True)
    report = tpu_nb.last_report()
    assert _figures(report) == raw
    assert "not recorded" not in text, text  # every compile and read placed on the line
    _optimizer_steps(report, 6)
    _shares_at_most_100(text)
    # logging every other step reads the loss in 3 of the 6 steps: Trainer's knob for it
    logged_reads = [o for o in report.occurrences if o.site.via.endswith("_log_save_evaluate")]
    assert logged_reads and all(o.steps == 3 for o in logged_reads), report.occurrences
    assert "device work >= 0 s" not in text, text
    logged = [o for o in report.occurrences if o.site.via.endswith("mesh_reduce")]
    assert logged and all(o.site.line is not None for o in logged), report.occurrences
    # each copy to the host is one a line made: .item(), .cpu() and mesh_reduce's
    copies = sum(o.calls for o in report.occurrences if o.kind == "read")
    assert copies == report.metrics.from_device_transfers, report.occurrences
    assert "RECOMPILED" not in text.splitlines()[0] and not report.recompiled, text
    assert "pad_to_multiple_of" not in text and "pad or bucket" not in text, text
    # judged for a TPU: transformers' SDPA mask check reads the mask on the host in every
    # forward, so each training step stops for the device: read-bound, and the fix is the
    # model's own setting, not torch_xla.compile(step_fn), which Trainer users cannot apply
    verdict = report.anatomy.verdict
    assert verdict is not None and verdict.kind == "read-bound", text
    assert 'attn_implementation="eager"' in verdict.fix, verdict
    assert "torch_xla.compile" not in verdict.fix, verdict
    # the loader's step graph: compiled in the first steps, then cached
    assert report.metrics.cache_hits > 0
    _, plain = run(trainer, tracked=False)
    _same_work(raw, plain)


def test_a_causal_lm_trainers_token_count_gather_is_no_step(run):
    """Trainer gathers each batch's token count through accelerate (a sync of its own) before
    every step of a causal LM: work of the step, not a step. Counted as steps, the run had
    twice its optimizer steps, and each figure per step was a median of half-steps."""
    text, raw = run("make_lm_trainer().train()", tracked=True)
    report = tpu_nb.last_report()
    assert _figures(report) == raw
    _optimizer_steps(report, 6)
    assert report.anatomy.other_syncs >= 6, report.anatomy  # a gather's in each step
    # what compiled at the gather's sync did not compile at the end of a step of the cell's
    assert "a library made (named below)" in text and "the end of the step" not in text, text
    # Trainer's own settings only: no Dynamo backend accelerate refuses
    assert "torch_compile" not in text, text


def test_evaluation_inside_train_is_no_step_and_each_optimizer_step_is_one(run):
    """Trainer's evaluation every few steps runs inside train(), through its own device
    loader: its batches are work of the step it follows, not steps (counted as steps, 3 eval
    batches per evaluation made 12 "steps" of 6 optimizer steps). Its syncs also run the
    step's graph and the reset of Trainer's loss, so the training loop's next sync finds
    nothing to run: that sync still ends the step, or each evaluation cost the count one."""
    steps = 6  # two evaluations of 3 batches each, after steps 3 and 6
    cell = 'make_trainer("fixed", steps=6, logging_steps=3, eval_steps=3, accumulate=2).train()'
    text, raw = run(cell, tracked=True)
    report = tpu_nb.last_report()
    assert _figures(report) == raw
    _optimizer_steps(report, steps)
    # a count of steps never exceeds the run's
    for n, of in re.findall(r"in (\d+) of (\d+) steps", text):
        assert int(n) <= int(of) == steps, text
    assert "RECOMPILED" not in text.splitlines()[0] and not report.recompiled, text


def test_trainer_with_bucketed_padding_compiles_each_bucket_once(run):
    steps = 10
    # logging every step: four syncs of Trainer's logging between two steps, none a step
    cell = f'make_trainer("bucketed", steps={steps}, logging_steps=1).train()'
    text, raw = run(cell, tracked=True)
    report = tpu_nb.last_report()
    assert _figures(report) == raw
    _optimizer_steps(report, steps)
    _shares_at_most_100(text)
    assert "device work >= 0 s" not in text, text
    # the loss read to log it every step: per step. Whether its nine waits a step limit the
    # loop depends on how long this host takes to trace a step beside the 1 ms a wait is
    # allowed (the rule, on constructed facts: test_policy): Trainer's knob is the advice,
    # or the read says why it is not
    logged = [
        f
        for f in report.findings
        if f.kind == "host-read" and "in 10 of 10 steps" in f.what and "attn_mask" not in f.via
    ]
    assert logged, text
    for f in logged:
        assert ("logging_steps" in f.hint) != ("not what limits this loop" in f.what), f
    assert "RECOMPILED" not in text.splitlines()[0] and not report.recompiled, text
    assert "pad_to_multiple_of" not in _advice(text), text
    # each bucket's graphs compiled once, then cached: once every bucket has come, a step
    # compiles nothing (whether earlier cells compiled any of them or not)
    last = report.anatomy.steps[-2:]
    assert not any(s.compiles for s in last) and report.metrics.cache_hits > 0, text
    buckets = [p for p in report.judgement.lines.values() if p.kind == "variants"]
    assert buckets and "each compiled once, then no compile in its next" in text, text
    _, plain = run(cell, tracked=False)
    _same_work(raw, plain)


GENERATE_SETUP = """
import torch_xla
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
gpt2_config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=64)
gpt2 = GPT2LMHeadModel(gpt2_config).to(torch_xla.device()).eval()
prompt = torch.randint(1, 64, (1, 6)).to(torch_xla.device())

from transformers import LogitsProcessor, LogitsProcessorList

class SyncEachToken(LogitsProcessor):  # the advice's own sync once per token
    def __call__(self, input_ids, scores):
        torch_xla.sync()
        return scores
"""
# generate() keeps a static cache on the model for its next call, which then does other work
# (it resets the cache): each cell starts without one, so the plain cell repeats the tracked one
GENERATE = (
    'gpt2.__dict__.pop("_cache", None)\n'
    "out = gpt2.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0{})"
)


@pytest.fixture(scope="module")
def gpt2(run, shell):
    assert shell.run_cell(GENERATE_SETUP).success
    return run


def test_generate_with_the_dynamic_cache_is_told_to_use_a_static_one(gpt2):
    text, raw = gpt2(GENERATE.format(""), tracked=True)
    report = tpu_nb.last_report()
    assert _figures(report) == raw
    # generate()'s torch.isin (its stopping criteria) falls back to the CPU at every token
    assert report.metrics.fallbacks, report.metrics
    _all_placed(report, text)
    summary = text.splitlines()[0]
    assert "RECOMPILED" in summary and "compile-bound" in summary, text
    verdict = report.anatomy.verdict
    assert 'cache_implementation="static"' in verdict.fix, verdict
    # each token's graph: a new one, per token, at generate()'s own lines
    assert any(p.flagged and p.graphs >= 3 for p in report.judgement.lines.values()), text
    advice = _advice(text)
    assert 'cache_implementation="static"' in advice, text
    # the sync goes where generate() lets the user put code, not "at the end of each step"
    assert "at the end of each step" not in advice and "LogitsProcessor" in advice, text
    # and what no setting of generate() changes: a graph per length, cached across calls
    assert "pad the prompts to one length" in advice, text
    _, plain = gpt2(GENERATE.format(""), tracked=False)
    _same_work(raw, plain)


def test_generate_with_a_static_cache_is_not_told_to_use_one(gpt2):
    text, raw = gpt2(GENERATE.format(', cache_implementation="static"'), tracked=True)
    report = tpu_nb.last_report()
    assert _figures(report) == raw
    _all_placed(report, text)
    # it still compiles per token (generate() syncs nowhere between tokens), and the fix
    # says so, not "use a static cache" nor a sync "at the end of each step" of its loop
    advice = _advice(text)
    assert "cache_implementation" not in advice and "LogitsProcessor" in advice, text
    assert "at the end of each step" not in advice, text
    _, plain = gpt2(GENERATE.format(', cache_implementation="static"'), tracked=False)
    _same_work(raw, plain)


def test_generate_that_follows_the_advice_is_told_only_what_is_left(gpt2):
    """A static cache and a sync per token, as the advice says: what still compiles is a
    graph per length, which no setting of generate() avoids; the advice says that, and
    neither of what the cell already does."""
    settings = ', cache_implementation="static", logits_processor=[SyncEachToken()]'
    text, raw = gpt2(GENERATE.format(settings), tracked=True)
    report = tpu_nb.last_report()
    assert _figures(report) == raw
    advice = _advice(text)
    assert "RECOMPILED" in text.splitlines()[0], text
    assert "cache_implementation" not in advice and "LogitsProcessor" not in advice, text
    assert "calls no torch_xla.sync()" not in text, text
    assert "pad the prompts to one length" in advice, text
    _, plain = gpt2(GENERATE.format(settings), tracked=False)
    _same_work(raw, plain)


# The model and data are made in an earlier cell, as a dataset loaded from files would be:
# `%%on_tpu` puts what the cell's own code creates on the device. 60 samples in batches of 8:
# the last batch is shorter, a graph of its own at the loop's last step.
LOOP_PARTS = """
import torch.nn.functional as F

def make_parts():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(60, 16), torch.randint(0, 2, (60,)))
    return net, opt, torch.utils.data.DataLoader(data, batch_size=8)

def make_adamw_parts():  # an optimizer with state, made at its first step(); whole batches
    net, _, loader = make_parts()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    return net, opt, torch.utils.data.DataLoader(loader.dataset, batch_size=8, drop_last=True)

torch_xla.sync()  # nothing an earlier cell left pending runs in the loops' cells
"""
ACCELERATE_LOOP = """
from accelerate import Accelerator
accelerator = Accelerator()
net, opt, loader = accelerator.prepare(*make_parts())
for x, y in loader:
    loss = F.cross_entropy(net(x), y)
    accelerator.backward(loss)
    opt.step()
    opt.zero_grad()
"""
CELL_LOOP = """
dev = torch_xla.device()
net, opt, loader = make_parts()
net.to(dev)
for x, y in loader:
    loss = F.cross_entropy(net(x.to(dev)), y.to(dev))
    loss.backward()
    opt.step()
    opt.zero_grad()
    torch_xla.sync()
"""


def _judged(report, text: str) -> tuple:
    """What a user reads of a run's judgement: the summary's flags and the advice."""
    verdict = report.anatomy.verdict
    return (
        "RECOMPILED" in text.splitlines()[0],
        verdict.kind if verdict is not None else None,
        verdict.fix if verdict is not None else None,
        sorted(m[1] for m in re.finditer(r"^  [a-z ]+ \(line \d+\): (.*)$", _advice(text), re.M)),
    )


def test_an_accelerate_loop_is_judged_as_the_same_loop_in_the_cell(run, shell):
    assert shell.run_cell(LOOP_PARTS).success
    text, raw = run(ACCELERATE_LOOP, tracked=True)
    report = tpu_nb.last_report()
    assert _figures(report) == raw
    _all_placed(report, text)
    # the shorter last batch: its graph is the loop's last, and the fix is the loader's
    assert "drop_last=True" in _advice(text), text
    assert "the recompiles are the library's" not in text, text
    assert "created state" not in text, text  # plain SGD keeps none
    accelerate = _judged(report, text)
    cell_text, _ = run(CELL_LOOP, tracked=True)
    assert accelerate == _judged(tpu_nb.last_report(), cell_text), (text, cell_text)
    _, plain = run(ACCELERATE_LOOP, tracked=False)
    _same_work(raw, plain)


def test_an_accelerate_loops_first_step_is_told_from_the_graph_its_loader_ran(run, shell):
    # The device loader's first sync has nothing to run; its second runs the first step,
    # whose graph tells why the steady step's differs: the state AdamW made at its first step
    assert shell.run_cell(LOOP_PARTS).success
    text, raw = run(ACCELERATE_LOOP.replace("make_parts", "make_adamw_parts"), tracked=True)
    assert _figures(tpu_nb.last_report()) == raw
    assert "RECOMPILED" not in text.splitlines()[0], text
    assert "why they differ is not known" not in text, text
    assert "the first step created state that later steps read and update" in text, text


ACCUMULATE_LOOP = """
from accelerate import Accelerator
accelerator = Accelerator(gradient_accumulation_steps=2)
net, opt, loader = accelerator.prepare(*make_adamw_parts())
for epoch in range(2):
    for x, y in loader:
        with accelerator.accumulate(net):
            loss = F.cross_entropy(net(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
"""


def test_an_accelerate_accumulation_loop_is_judged_on_every_graph_its_line_compiled(run, shell):
    # accelerate's accumulation alternates graphs at the loader's syncs; tpu_nb captures
    # some of them only (the graph its loader's sync runs is not always one a variable
    # reaches). Each must fit: the memory line counts every graph the loop's line compiled,
    # captured or not, with the compile log's sizes.
    assert shell.run_cell(LOOP_PARTS).success
    text, raw = run(ACCUMULATE_LOOP, tracked=True)
    report = tpu_nb.last_report()
    assert _figures(report) == raw
    _all_placed(report, text)
    memory = report.cost.memory
    compiled = {e.graph_hash for e in report.compile_events}  # all at the loop's line
    assert len(compiled) == raw["compiles"] >= 2, report.compile_events
    assert memory.graphs >= len(compiled), (memory, report.compile_events)
    assert f"of the {memory.graphs} graphs its steps ran" in text, text
    # the figure is that of the graph needing most: no less than any compiled graph needs
    for e in report.compile_events:
        sizes = {k: v * 2**30 for k, v in e.sizes_gb.items()}
        need = sizes.get("intermediate tensor", 0) + sizes.get("graph input", 0)
        assert memory.needed >= need, (memory, e)


PEFT_LOOP = """
from peft import LoraConfig, get_peft_model

torch.manual_seed(0)
base = GPT2LMHeadModel(gpt2_config)
lora = LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True, task_type="CAUSAL_LM")
peft_model = get_peft_model(base, lora).to(torch_xla.device())
opt = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-3)
batch = torch.randint(1, 64, (4, 16))
for step in range(6):
    ids = batch.to(torch_xla.device())
    loss = peft_model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    torch_xla.sync()
"""


def test_a_peft_lora_training_step(gpt2):
    text, raw = gpt2(PEFT_LOOP, tracked=True)
    report = tpu_nb.last_report()
    assert _figures(report) == raw
    _all_placed(report, text)
    # the six steps, each one graph from the cache after the first two
    assert len(report.anatomy.steps) == 6 and report.metrics.cache_hits >= 4, text
    # the frozen base and its adapters: one step's graph and the warm-up's, then cached
    assert "RECOMPILED" not in text.splitlines()[0] and not report.recompiled, text
    assert report.judgement.one_time_compiles == report.metrics.compiles, text
    assert report.anatomy.verdict is not None, text
    _, plain = gpt2(PEFT_LOOP, tracked=False)
    _same_work(raw, plain)


# The data built in the `%%on_tpu` cell itself, as a new user writes it: the cell moves what
# it builds unplaced to the device, so the TensorDataset holds device tensors, which the
# DataLoader indexes sample by sample. `{device}` places the data on the host instead.
DEVICE_DATA_LOOP = """
from accelerate import Accelerator
accelerator = Accelerator()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
x, y = torch.randn(64, 16{device}), torch.randint(0, 2, (64,){device})
data = torch.utils.data.TensorDataset(x, y)
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
net, opt, loader = accelerator.prepare(net, opt, loader)
for x, y in loader:
    loss = F.cross_entropy(net(x), y)
    accelerator.backward(loss)
    opt.step()
    opt.zero_grad()
"""


def _device_data(report) -> list:
    return [f for f in report.findings if f.kind == "device-data"]


# torch_xla's device loader can fail in its worker thread on such batches: what is tested
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dataset_built_on_the_device_is_named_with_its_fix(run, shell):
    assert shell.run_cell(LOOP_PARTS).success
    saved, sys.stdout = sys.stdout, StringIO()
    try:
        result = shell.run_cell("%%on_tpu\n" + DEVICE_DATA_LOOP.format(device=""))
        text = sys.stdout.getvalue()
    finally:
        sys.stdout = saved
    report = tpu_nb.last_report()
    found = _device_data(report)
    # A loop the loader's copy failure stopped leaves the device loader's threads slicing
    # the device data beside the next cells (torch_xla then fails in them): closed here.
    from torch_xla.distributed.parallel_loader import ParallelLoader

    for loader in [o for o in gc.get_objects() if isinstance(o, ParallelLoader)]:
        loader.close()
    # on the line that built its tensors (line 7 of the cell, after the magic's), with the fix
    assert [f.line for f in found] == [7], text
    assert "TensorDataset of device tensors ([64, 16], [64])" in found[0].what, found
    assert 'device="cpu"' in _advice(text) and "built data on the device (line 7)" in text, text
    if not result.success:  # torch_xla's device loader copying device batches can fail
        assert "Check failed" in str(result.error_in_exec)
        assert "torch_xla's device loader failing that copy" in found[0].what, text
    # the same data in a loop written in the cell: each batch's indices are constants of
    # its graph, so it recompiles every batch, and the fix is the data's, not padding
    cell_loop = DEVICE_DATA_LOOP.format(device="").split("net, opt, loader =")[0]
    cell_loop = cell_loop.replace("from accelerate", "#")
    cell_loop += (
        "for x, y in loader:\n"
        "    loss = F.cross_entropy(net(x), y)\n"
        "    loss.backward(); opt.step(); opt.zero_grad()\n"
        "    torch_xla.sync()\n"
    )
    text, _ = run(cell_loop.replace("accelerator = Accelerator()", ""), tracked=True)
    report = tpu_nb.last_report()
    assert [f.line for f in _device_data(report)] == [7] and report.recompiled, text
    assert 'device="cpu"' in report.anatomy.verdict.fix, text
    assert "pad or bucket" not in text, text
    # built on the host, the same loop: nothing to say about its data
    text, _ = run(DEVICE_DATA_LOOP.format(device=', device="cpu"'), tracked=True)
    assert not _device_data(tpu_nb.last_report()), text
    assert "built data on the device" not in text, text
