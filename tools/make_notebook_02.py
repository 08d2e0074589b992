"""Writes notebooks/02_training.ipynb (sources only; see make_notebook_common.py)."""

from make_notebook_common import code, md, setup_cells, write

cells = [
    md("""
        # 02 · Training a CNN on the device

        Time for a real training loop: a small convolutional network on MNIST-shaped images
        (28×28, one channel, ten classes).

        **You will learn**

        - why a training step on an XLA device ends with `torch_xla.sync()`, and what happens
          without it;
        - that the optimizer step is part of the compiled graph, like forward and backward;
        - why shapes must stay fixed from batch to batch (`drop_last=True`);
        - how `MpDeviceLoader` feeds the device in the background and syncs for you;
        - how to follow the loss without stalling the device;
        - how to evaluate on the device and read the result once.

        The data is synthetic, so the notebook needs no download and runs anywhere in well under
        a minute: each class is a fixed random pattern plus noise, something a CNN learns quickly.
    """),
    *setup_cells(),
    md("""
        ## Data: on the CPU, in a `DataLoader`

        Data starts on the host, as usual: a dataset and a `DataLoader` that batches and shuffles
        it. Two details matter on an XLA device:

        - `drop_last=True`: 2048 images in batches of 64 is 32 full batches, but with any other
          size the last batch would be smaller. A different shape is a different graph, and a
          different graph is a new compilation, in every epoch. Dropping (or padding) the
          ragged batch keeps one shape.
        - A seeded `generator` makes the shuffling, and so this notebook, reproducible.
    """),
    code("""
        import torch
        import torch_xla
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        dev = torch_xla.device()


        def synthetic_digits(n, seed):
            \"\"\"n noisy 28x28 images of 10 fixed random patterns, and their labels.\"\"\"
            patterns = torch.rand(10, 1, 28, 28, generator=torch.Generator().manual_seed(1234))
            g = torch.Generator().manual_seed(seed)
            labels = torch.randint(0, 10, (n,), generator=g)
            images = patterns[labels] + 0.5 * torch.randn(n, 1, 28, 28, generator=g)
            return TensorDataset(images, labels)


        train_set = synthetic_digits(2048, seed=0)
        test_set = synthetic_digits(512, seed=1)
        train_loader = DataLoader(train_set, batch_size=64, shuffle=True, drop_last=True,
                                  generator=torch.Generator().manual_seed(0))
        print(len(train_loader), "batches of", train_loader.batch_size)
    """),
    md("""
        ## The model and the optimizer

        Two convolution blocks and a linear classifier. It is created on the CPU (seeded, so the
        run is reproducible) and moved to the device; the optimizer comes after the move, so it
        holds the device parameters.
    """),
    code("""
        class SmallCNN(nn.Module):
            def __init__(self):
                super().__init__()
                self.features = nn.Sequential(
                    nn.Conv2d(1, 8, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),    # 8x14x14
                    nn.Conv2d(8, 16, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 16x7x7
                )
                self.classify = nn.Linear(16 * 7 * 7, 10)

            def forward(self, x):
                return self.classify(self.features(x).flatten(1))


        torch.manual_seed(0)
        model = SmallCNN().to(dev)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()


        def train_step(images, labels):
            optimizer.zero_grad()
            loss = loss_fn(model(images), labels)
            loss.backward()
            optimizer.step()
            return loss.detach()
    """),
    md("""
        ## One step, looked at closely

        `train_step` records forward, backward **and the optimizer update** (the momentum
        buffers and the new weights are device tensors like any other). `torch_xla.sync()` then
        compiles all of it into one graph and runs it.

        We run the step twice on one batch. The first step compiles a graph of its own: before
        it, there were no gradients and no momentum buffers, so its inputs differ. The second
        step is the *steady* step that later steps reuse.
    """),
    code("""
        images, labels = next(iter(train_loader))        # one batch, on the CPU
        images, labels = images.to(dev), labels.to(dev)
    """),
    code("""
        %%on_tpu
        for _ in range(2):
            loss = train_step(images, labels)
            torch_xla.sync()
    """),
    md("""
        ## Why every step ends with `torch_xla.sync()`

        On an XLA device, a loop without a sync does not run step by step: it keeps recording,
        and the graph grows with every step (forward, backward and update of step 1, then of
        step 2 on top, …). The graph would be compiled only when a value is finally read, it
        would be different for every number of steps, and its size would grow without bound.

        `torch_xla.sync()` marks the end of a step: the graph recorded so far is compiled (or
        taken from the cache) and launched, and recording starts again from the results. The
        launch is *asynchronous*: while the device runs step *n*, Python already records step
        *n + 1*.

        ## An epoch with an explicit loop

        Move each batch to the device, run the step, sync. The running loss is accumulated **on
        the device** (`total += loss`) and read once at the end: reading it at every step
        (`loss.item()`) would make the host wait for the device at every step, losing that
        overlap.
    """),
    code("""
        %%on_tpu
        model.train()
        total = torch.zeros((), device=dev)
        for images, labels in train_loader:
            images, labels = images.to(dev), labels.to(dev)    # host -> device, every step
            total += train_step(images, labels)
            torch_xla.sync()
        print(f"epoch 1: mean loss {total.item() / len(train_loader):.2f}")
    """),
    md("""
        Read the report: 32 steps, 2 graphs compiled, 30 cache hits. The step now also adds its
        loss into `total`, which makes it a new graph; and on the first step `total` was itself
        still pending (a `torch.zeros` not yet run), so that one step compiled its own graph.
        Then 64 transfers to the device (images and labels, batch by batch) and a single read
        back to the host, on the `print` line: the mean loss.

        (The `DataLoader`'s own shuffling stays on the CPU inside `%%on_tpu`: only tensors your
        code creates land on the device.)

        ## `MpDeviceLoader`: feeding the device in the background

        In the loop above, the host copies each batch to the device only when the step asks for
        it. `MpDeviceLoader` wraps the `DataLoader` and copies upcoming batches to the device in
        background threads while the current step runs, so the device does not wait for data.
        It also calls `torch_xla.sync()` after each batch it yields, so the loop needs neither
        `.to(dev)` nor an explicit sync.
    """),
    code("""
        import torch_xla.distributed.parallel_loader as pl

        device_loader = pl.MpDeviceLoader(train_loader, dev)
    """),
    code("""
        %%on_tpu
        for epoch in (2, 3, 4):
            total = torch.zeros((), device=dev)
            for images, labels in device_loader:               # already on the device
                total += train_step(images, labels)            # synced by the loader
            print(f"epoch {epoch}: mean loss {total.item() / len(train_loader):.2f}")
    """),
    md("""
        96 steps and no new step graph: each step is the steady graph compiled in epoch 1. The
        one small compile is `total = torch.zeros(...)`: the loader syncs before it yields the
        first batch, so creating `total` ran as a tiny graph of its own (one extra execution per
        epoch). Transfers to the device drop from 64 per epoch to 4: the loader copies 8
        batches at a time. The loss falls quickly, as it should on this easy data.

        ## Watching a loop while it runs: `%%on_tpu --live`

        A report after the cell is good; for a loop that runs for minutes you want to see it
        *while* it runs. `--live` attaches tpu_nb's dashboard to the cell: steps and step
        times, graphs compiled with the line that caused them (it turns red if one line keeps
        compiling new graphs), transfers, CPU fallbacks and host reads, host memory (and device
        memory on a TPU), with charts of step time and compile time. It updates from inside
        the running cell twice a second and shows the final state when the cell ends.
    """),
    code("""
        %%on_tpu --live
        for epoch in (5, 6):
            total = torch.zeros((), device=dev)
            for images, labels in device_loader:
                total += train_step(images, labels)
            print(f"epoch {epoch}: mean loss {total.item() / len(train_loader):.2f}")
    """),
    md("""
        ## The same report from a script: `tpu_nb.track`

        The magics are thin wrappers over tpu_nb's library, which works the same in a plain
        Python script. `tpu_nb.track()` measures a block and gives a `RunReport`: wall time,
        graphs compiled (with their causes), executions, transfers, host reads. In a plain cell,
        the `XLA:` line that follows tells the same story.
    """),
    code("""
        import tpu_nb

        with tpu_nb.track("epoch 7") as report:
            total = torch.zeros((), device=dev)
            for images, labels in device_loader:
                total += train_step(images, labels)
        print(report.summary())
    """),
    md("""
        ## Evaluation

        `model.eval()` and `torch.no_grad()` work as on any device: no gradients are recorded, so
        the evaluation graph is smaller. The correct predictions are counted on the device and
        read once. The test batches hold 128 images; 512 test images make four full batches, so
        there is no ragged last batch here either.
    """),
    code("""
        model.eval()
        test_loader = pl.MpDeviceLoader(DataLoader(test_set, batch_size=128), dev)
        correct = torch.zeros((), dtype=torch.long, device=dev)
        with torch.no_grad():
            for images, labels in test_loader:
                correct += (model(images).argmax(dim=1) == labels).sum()
        print(f"test accuracy: {correct.item() / len(test_set):.0%}")
    """),
    md("""
        ## Summary

        - A training step (forward, backward, optimizer update) is recorded and compiled as one
          graph; `torch_xla.sync()` ends the step and launches it asynchronously.
        - Without a sync per step, the graph grows with every step; with one, each step after
          the first reuses the same compiled graph.
        - Keep shapes fixed: `drop_last=True` (or padding) for the last batch.
        - `MpDeviceLoader` overlaps host→device copies with compute and syncs after each batch.
        - Accumulate metrics on the device and read them once per epoch: every `.item()` makes
          the host wait for the device.
        - `tpu_nb.track()` gives the same report as the magics, in scripts too.

        **Next:** [03 · Lazy tensors](03_lazy_tensors.ipynb): the pending graph itself, what
        forces it to run, and how to catch and fix recompilations.
    """),
]

write("02_training", cells)
