"""Writes notebooks/07_performance.ipynb (sources only; see make_notebook_common.py)."""

from make_notebook_common import code, md, setup_cells, write

cells = [
    md("""
        # 07 · Performance: reading the reports, fixing the loop

        A training step on a TPU is fast when three things hold: the step compiles once and
        then runs from the cache, the host never waits for the device in the middle of the loop,
        and every operation runs on the device. This notebook takes a loop that breaks all three,
        reads what tpu_nb reports about it, and fixes it line by line.

        **You will learn**

        - what the persistent compile cache does, and why its speed-up shows only on a TPU;
        - how to read a `%%on_tpu` report: compiles and their causes, host reads, CPU fallbacks,
          each on its line, with what to do;
        - the three usual fixes: fixed shapes, no host reads in the loop, ops with an XLA
          lowering;
        - how to log from a training loop without stalling it (`add_step_closure`);
        - how to time a step properly with `%tpu_time`.
    """),
    *setup_cells(),
    md("""
        ## The persistent compile cache

        Compiled graphs are cached in memory, so a loop compiles each graph once per
        *process*. Restart the kernel and everything compiles again; on a TPU, a large model's
        first step can take minutes. The **persistent** cache writes compiled programs to disk,
        so the next process loads them instead of compiling. Turn it on first thing in a
        notebook with `%tpu_setup --cache DIR` (in a script: `tpu_nb.setup(cache_dir=DIR)`); on
        Colab, a folder on Google Drive survives runtime restarts.

        To see it work without restarting this kernel, we run the same small training script
        twice in fresh Python processes, sharing one cache folder. This comes first in the
        notebook on purpose: on a TPU only one process at a time can hold the chips, so the
        child processes must run before this kernel touches the device.
    """),
    code("""
        import json
        import os
        import subprocess
        import sys
        import tempfile

        script = '''
        import json, sys
        import tpu_nb
        tpu_nb.setup(cache_dir=sys.argv[1])
        import torch, torch_xla
        dev = tpu_nb.device()
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(dev)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(64, 256).to(dev)
        with tpu_nb.track() as report:
            for step in range(3):
                optimizer.zero_grad()
                model(x).sum().backward()
                optimizer.step()
                torch_xla.sync()
        from torch_xla.debug.metrics import counter_value
        print(json.dumps({"compiled": report.metrics.compiles, "seconds": report.metrics.compile_seconds,
                          "misses": counter_value("PersistentCacheMiss") or 0,
                          "hits": counter_value("PersistentCacheHit") or 0,
                          "unloadable": counter_value("PersistentCacheDeserializeFailure") or 0}))
        '''
        cache = tempfile.mkdtemp()
        # The children get this machine's device, and none of this kernel's XLA settings.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PT_XLA_", "XLA_"))}
        for run in (1, 2):
            child = subprocess.run([sys.executable, "-c", script, cache], env=env,
                                   capture_output=True, text=True, timeout=600)
            r = json.loads(child.stdout.splitlines()[-1])
            print(f"process {run}: graphs compiled: {r['compiled']} ({r['seconds']:.2f} s) | "
                  f"persistent cache: {r['misses']} missed, {r['hits']} loaded, "
                  f"{r['unloadable']} found but not loadable")
    """),
    md("""
        Process 1 finds an empty cache: every graph misses, compiles, and is written to disk.
        What process 2 does depends on the device:

        - **On a TPU**, it loads the programs from the cache (`loaded`) and its compile time
          drops to almost nothing.
        - **On a CPU**, XLA:CPU cannot load a serialized program back (`found but not
          loadable`), so it compiles again and saves no time. The cache is written, but only
          helps on a TPU.

        ## A loop with three problems

        A small classifier, trained on data that is already on the device. The loop looks
        innocent; it contains the three most common performance problems of PyTorch on XLA.
        (The report's times are in the collapsed details: click the summary line.)
    """),
    code("""
        import torch
        import torch_xla
        import torch_xla.core.xla_model as xm
        from torch import nn

        dev = torch_xla.device()
        g = torch.Generator().manual_seed(0)
        features = torch.randn(200, 32, generator=g)
        labels = (features[:, :4].sum(dim=1) > 0).long()          # a learnable rule
        features, labels = features.to(dev), labels.to(dev)


        def fresh_model():
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2)).to(dev)
            return model, torch.optim.SGD(model.parameters(), lr=0.1)


        loss_fn = nn.CrossEntropyLoss()
        model, optimizer = fresh_model()
    """),
    code("""
        %%on_tpu
        for epoch in range(3):
            for x, y in zip(features.split(48), labels.split(48)):    # 4 batches of 48, then 8
                optimizer.zero_grad()
                logits = model(x)
                loss = loss_fn(logits, y)
                loss.backward()
                optimizer.step()
                correct = len(torch.nonzero(logits.argmax(dim=1) == y))
                if loss.item() < 0.05:
                    print("converged")
                torch_xla.sync()
    """),
    md("""
        The summary line already says it: many graphs compiled, host reads, CPU fallbacks,
        **RECOMPILED**. The report puts each finding on its line:

        1. **`torch.nonzero`** (line 9) is a *CPU fallback*: its output size depends on the data,
           which XLA's static shapes cannot express, so torch_xla copies the input to the host,
           runs the op there, and copies the result back. It also splits the step's graph in
           two, because the device must finish computing the input first. Counting the correct
           predictions needs no data-dependent shape: `(prediction == y).sum()`.
        2. **`loss.item()`** (line 10) is a *host read* in every step: the host waits for the
           device, and the `if` makes Python's control flow depend on a device value. Decide
           on the device, or check once per epoch.
        3. **`features.split(48)`**: 200 examples make four batches of 48 and one of 8. The
           last batch has another shape, so its step is another graph: the sync line (line 12)
           compiled three graphs, the first step's warm-up, the steady step, and the step for
           the batch of 8. The reads on lines 9 and 10 compiled three graphs each, for the same
           reasons. Drop the ragged batch, or pad it (see [03](03_lazy_tensors.ipynb)).

        ## The same loop, fixed
    """),
    code("""
        model, optimizer = fresh_model()
        usable = len(features) // 48 * 48                              # drop the ragged batch
    """),
    code("""
        %%on_tpu
        for epoch in range(3):
            correct = torch.zeros((), dtype=torch.long)
            for x, y in zip(features[:usable].split(48), labels[:usable].split(48)):
                optimizer.zero_grad()
                logits = model(x)
                loss = loss_fn(logits, y)
                loss.backward()
                optimizer.step()
                correct += (logits.argmax(dim=1) == y).sum()           # on the device
                torch_xla.sync()
        print(f"accuracy in the last epoch: {correct.item() / usable:.0%}")   # one read
    """),
    md("""
        No fallbacks, one host read (after the loop), and a step that compiles its warm-up and
        steady graphs once each, then runs from the cache. Compare the two reports' wall times
        (expand them): on a TPU, where a host read costs a round trip and a compile seconds,
        the difference is much larger than on a CPU.

        ## Logging without stalling: `add_step_closure`

        You still want to see the loss while training. `xm.add_step_closure(fn, args)` runs
        `fn(*args)` right after the step's graph has executed, at the next `torch_xla.sync()`.
        Reading the loss there costs a transfer of an already computed value, without cutting
        the graph in the middle of the step.
    """),
    code("""
        def log_loss(step, loss):
            print(f"step {step:2}: loss {loss.item():.2f}")


        model, optimizer = fresh_model()
    """),
    code("""
        %%on_tpu
        for step, (x, y) in enumerate(zip(features[:usable].split(48), labels[:usable].split(48))):
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            if step % 2 == 0:
                xm.add_step_closure(log_loss, args=(step, loss))
            torch_xla.sync()
    """),
    md("""
        The losses print, and the report shows no compile caused by reading a value: the reads
        happened after each step's graph had run. On a TPU, log every few dozen steps, not
        every step: each read is still a transfer the host waits for.

        ## Timing a step: `%tpu_time`

        `%time` and `%timeit` would time only the *recording* of a step: the work runs later,
        asynchronously. `%tpu_time` syncs and waits for the device after every run, reports the
        first run (recording, compiling, running) apart from the steady state, and warns when
        the steady state still compiles. Here the step's graph is already in the cache, so the
        first run compiles nothing. `-n` and `-r` fix the number of runs (by default it picks
        enough for about 0.2 s).
    """),
    code("""
        x, y = features[:48], labels[:48]


        def train_step():
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            return loss
    """),
    code("%tpu_time -n 10 -r 3 train_step()"),
    md("""
        ## The whole session

        `%xla_metrics` shows the XLA counters since the kernel started: how much of the session
        went into compiling, executing and transferring. (`%xla_metrics --cells` breaks it down
        per cell, and `--all` lists every counter torch_xla keeps.)
    """),
    code("%xla_metrics"),
    md("""
        > **Live view:** tpu_nb's dashboard (`%%on_tpu --live`, `%tpu_dashboard`) slots in
        > here: it shows these figures *while* a cell runs (step times, compiles, transfers,
        > and device memory on a TPU), so a loop that starts to recompile or stall is visible
        > at once instead of after the cell. The reports above stay the per-cell summary.

        ## Summary: a checklist

        - **Compile once.** Fixed shapes (drop or pad ragged batches, bucket variable lengths);
          expect a warm-up graph and a steady graph, then cache hits. `--max-graphs` makes extra
          graphs an error.
        - **Do not read in the loop.** No `.item()`, `print(tensor)` or `if tensor` per step;
          accumulate on the device and read once, or log from `xm.add_step_closure`.
        - **Stay on the device.** A CPU fallback (`nonzero`, `masked_select`, `unique`, `histc`,
          `median`, `bincount`, …) copies data to the host and back and splits the graph; use
          fixed-shape alternatives (masks, sums, `torch.where`).
        - **Time with `%tpu_time`**, which waits for the device; `%timeit` does not.
        - **Restart faster on a TPU** with the persistent compile cache, `%tpu_setup --cache DIR`
          (no speed-up on a CPU, where compiled programs cannot be loaded back).

        This is the end of the series. The notebooks run as-is on a Colab TPU runtime: there,
        the skipped cells run, and the timings are a TPU's.
    """),
]

write("07_performance", cells)
