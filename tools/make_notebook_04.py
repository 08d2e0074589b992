"""Writes notebooks/04_multiple_devices.ipynb (sources only; see make_notebook_common.py)."""

from make_notebook_common import code, install_cell, md, write

cells = [
    md("""
        # 04 · Multiple devices: data parallel, two ways

        A TPU host has several chips (a v5e-8 has eight; Colab's TPU runtimes have one or more),
        and a pod slice has many hosts. Training on all of them at once is *data parallel*:
        every device holds the whole model, each works on its own slice of the batch, and the
        gradients are averaged across devices before every update, so all copies stay identical.

        PyTorch/XLA offers two ways to write that:

        1. **One process per device** (`torch_xla.launch`): your training function runs once per
           device, in its own process; each process loads its own share of the data
           (`DistributedSampler`), and `xm.optimizer_step` averages the gradients with an
           all-reduce *collective* between the processes.
        2. **SPMD** (single program, multiple data): *one* process sees all devices as one big
           device. You annotate how tensors are split over a *mesh* of devices
           (`mark_sharding`), and the XLA compiler partitions the program and inserts the
           communication itself.

        **You will learn**

        - how to write the one-process-per-device version with today's names
          (`xr.world_size()`, `xr.global_ordinal()`), `DistributedSampler` and `MpDeviceLoader`;
        - how to launch replicas from a notebook, and the rule *do not touch the device before
          launching*;
        - why the collectives of the first way cannot be shown on a CPU (they hang in torch_xla
          2.9), and why SPMD can;
        - SPMD data parallel over four XLA:CPU devices: a mesh, sharded batches, and proof that
          it computes the same thing as one device.
    """),
    install_cell(),
    md("""
        ## Set-up: four devices on a CPU

        On a TPU, `%tpu_setup` uses all of the host's chips. On a CPU, XLA can pretend to have
        several devices: `--devices 4` sets `CPU_NUM_DEVICES=4` before the runtime starts (it
        cannot change afterwards). The `{SETUP_ARGS}` below is IPython filling in a Python
        variable, so the same cell works on both.

        One more setting, `TF_CPP_MIN_LOG_LEVEL=2`, hides warnings from XLA's C++ code. SPMD
        compiles print a notice at every compile that XLA's partitioner (GSPMD) will eventually
        be replaced by Shardy; it is meant for torch_xla's developers, and errors still show.
        Like the device, it must be set before torch_xla first runs.
    """),
    code("""
        import os

        import tpu_nb

        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        ON_TPU = tpu_nb.detect().accelerator.kind == "tpu"
        SETUP_ARGS = "" if ON_TPU else "--devices 4"
    """),
    code("%load_ext tpu_nb"),
    code("%tpu_setup {SETUP_ARGS}"),
    md("""
        ## Way 1: one process per device

        ### The training function

        `torch_xla.launch(fn)` starts one process per device and calls `fn(index)` in each.
        Inside, every process asks the runtime who it is:

        - `xr.world_size()`: how many replicas take part;
        - `xr.global_ordinal()`: this replica's rank, from 0 to `world_size - 1`.

        The `DistributedSampler` uses the two to give each replica a disjoint share of the
        dataset, and `xm.optimizer_step(optimizer)` all-reduces (averages) the gradients across
        replicas before the update. Every replica seeds the model the same way, so all start from
        identical weights and stay identical.

        A replica's `print` would land in its own process, not in the notebook, so each writes a
        small summary to a file that the notebook reads afterwards.
    """),
    code("""
        import json
        import tempfile
        from pathlib import Path

        import torch
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.distributed.parallel_loader as pl
        import torch_xla.runtime as xr
        from torch import nn
        from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

        # y = x0 + 2*x1 - x2 + x3, to be learned from 1024 examples
        features = torch.randn(1024, 4, generator=torch.Generator().manual_seed(0))
        dataset = TensorDataset(features, features @ torch.tensor([[1.0], [2.0], [-1.0], [1.0]]))


        def make_model():
            torch.manual_seed(0)               # the same initial weights in every replica
            return nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))


        def train_replica(index, results_dir):
            dev = torch_xla.device()
            world, rank = xr.world_size(), xr.global_ordinal()
            sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
            loader = pl.MpDeviceLoader(DataLoader(dataset, batch_size=32, sampler=sampler,
                                                  drop_last=True), dev)
            model = make_model().to(dev)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
            for epoch in range(3):
                sampler.set_epoch(epoch)           # a different shuffle every epoch
                for x, y in loader:
                    optimizer.zero_grad()
                    loss = nn.functional.mse_loss(model(x), y)
                    loss.backward()
                    xm.optimizer_step(optimizer)   # all-reduce the gradients, then step
            summary = {"rank": rank, "world_size": world, "examples per epoch": len(sampler),
                       "final loss": round(loss.item(), 3)}
            Path(results_dir, f"replica-{rank}.json").write_text(json.dumps(summary))
    """),
    md("""
        The sampler's split needs no device, so we can look at it here. With four replicas and
        sixteen examples (no shuffling, to make the pattern visible), each rank takes every
        fourth example:
    """),
    code("""
        for rank in range(4):
            share = DistributedSampler(range(16), num_replicas=4, rank=rank, shuffle=False)
            print(f"rank {rank}: examples {list(share)}")
    """),
    md("""
        ### Launching from a notebook

        Two rules, both consequences of how the replicas are started:

        - **`start_method="fork"`**. The default, `spawn`, starts fresh Python interpreters that
          re-import the `__main__` module to find `train_replica`; a notebook has no importable
          `__main__`, so they fail. `fork` copies the kernel process, with everything defined
          in it.
        - **Do not touch the device before launching.** Each replica opens its own device when
          it starts. If the notebook's process had already started the XLA runtime, the forked
          replicas would inherit a runtime (its threads, its claim on the TPU chips) that cannot
          survive a fork, so torch_xla refuses: `Runtime is already initialized. Do not use the
          XLA device before calling xmp.spawn.` So far this notebook has only *imported*
          torch_xla, which is fine:
    """),
    code("""print("XLA runtime started in this kernel:", tpu_nb.detect().runtime_initialized)"""),
    md("""
        ### Why this cannot run on a CPU

        With several XLA:CPU devices, torch_xla 2.9 runs the replicas as threads of one process,
        and its collectives between them (`all_reduce`, `all_gather`, the ones
        `xm.optimizer_step` uses) hang, then abort: pytorch/xla issues
        [#5005](https://github.com/pytorch/xla/issues/5005) and
        [#9089](https://github.com/pytorch/xla/issues/9089). So the launch below runs only on a
        TPU, and skips itself, saying so, anywhere else. SPMD, further down, does the same job
        on a CPU.
    """),
    code("""
        if not ON_TPU:
            print("Skipped: no TPU here. Collectives between several XLA:CPU devices hang in "
                  "torch_xla 2.9 (pytorch/xla #5005, #9089); run this notebook on a TPU runtime to "
                  "launch the replicas. The SPMD section below runs on the CPU.")
        else:
            results_dir = tempfile.mkdtemp()
            torch_xla.launch(train_replica, args=(results_dir,), start_method="fork")
            for path in sorted(Path(results_dir).glob("replica-*.json")):
                print(json.loads(path.read_text()))
    """),
    md("""
        tpu_nb's launcher takes care of those rules: `tpu_nb.launch(fn)` (or a
        `%%on_tpu --replicas` cell) forks the replicas when the kernel has not used the device
        yet, and otherwise starts them in a fresh worker process that receives the function and
        the variables it uses. Each replica's prints come back prefixed with its ordinal, and
        on XLA:CPU a collective is refused at once instead of hanging. Here a function defined
        in this notebook runs on each of the 4 CPU devices (no collective, so it runs on CPU):
    """),
    code("""
        import tpu_nb
        import torch_xla.runtime as xr

        def who_am_i(index):
            return f"replica {xr.global_ordinal()} of {xr.world_size()}"

        tpu_nb.launch(who_am_i, stream=lambda line: None).values
    """),
    md("""

        ## Way 2: SPMD, one program over a mesh of devices

        With SPMD, one process drives all devices. We describe the devices as a **mesh**, a
        grid with named axes, and say for each tensor how its dimensions map onto the axes.
        Here the mesh is 4 × 1 with axes `data` and `model`: the batch dimension is split over
        `data` (data parallel), and nothing is split over `model` (a model too big for one
        device would split its weights along that axis, the same way).

        `xr.use_spmd()` must come before any tensor is created on the device: it turns the
        devices into one virtual device.
    """),
    code("""
        import numpy as np
        import torch_xla.distributed.spmd as xs

        xr.use_spmd()
        n_devices = xr.global_runtime_device_count()
        mesh = xs.Mesh(np.arange(n_devices), (n_devices, 1), ("data", "model"))
        print(f"{n_devices} devices, mesh shape {mesh.mesh_shape}, axes {mesh.axis_names}")
    """),
    md("""
        ### Sharding a batch

        `mark_sharding(tensor, mesh, ("data", None))` splits dimension 0 over the `data` axis
        and keeps dimension 1 whole. Each device then holds a quarter of the rows, its
        *shard*. The tensor still behaves as one 16 × 2 tensor in your code; the sharding is an
        annotation that the compiler uses.
    """),
    code("""
        dev = torch_xla.device()
        batch = torch.arange(32.0).reshape(16, 2).to(dev)
        sharded = xs.mark_sharding(batch, mesh, ("data", None))
        print("sharding:", torch_xla._XLAC._get_xla_sharding_spec(batch))
        for shard in sharded.local_shards:
            print(f"  {shard.shard_device}: rows {shard.indices[0]}, shape {tuple(shard.data.shape)}")
    """),
    md("""
        `{devices=[4,1]0,1,2,3}` reads: dimension 0 is cut in 4, dimension 1 in 1, over
        devices 0–3.

        ### Training, data parallel

        The parameters are marked *replicated* (`None` for every dimension): every device holds
        all of them. We mark them explicitly so that the very first step already knows their
        layout; left unmarked, the compiler would decide it during step 1, and step 2 would
        compile a second graph. The targets are sharded like the batch.

        Nothing in the step itself mentions devices. From the shardings, the compiler works out
        that each device computes the forward and backward pass on its rows, and that the
        gradients of the replicated weights must be summed across devices: it inserts that
        all-reduce into the compiled program. This is the same collective as in way 1, but XLA
        schedules it inside one program instead of between processes, and that works on
        XLA:CPU devices too.
    """),
    code("""
        import copy

        model = make_model()
        reference = copy.deepcopy(model)             # one device (the CPU), for comparison
        model = model.to(dev)
        for p in model.parameters():
            xs.mark_sharding(p, mesh, (None,) * p.dim())   # replicated on every device
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

        x = features[:64].to(dev)
        y = dataset.tensors[1][:64].to(dev)
        for tensor in (x, y):
            xs.mark_sharding(tensor, mesh, ("data", None))      # rows split over `data`
    """),
    code("""
        %%on_tpu
        for step in range(5):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            torch_xla.sync()
    """),
    md("""
        One graph compiled, then run from the cache: each execution ran on all four devices at
        once (the report counts one execution per step).

        ### The same result as one device

        SPMD changes *where* the work happens, not *what* is computed. Five steps of the same
        training on the CPU, with the same initial weights and the same 64 examples, end with the
        same weights, up to float rounding (the all-reduce sums the per-device gradients in a
        different order):
    """),
    code("""
        ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
        for step in range(5):
            ref_optimizer.zero_grad()
            nn.functional.mse_loss(reference(features[:64]), dataset.tensors[1][:64]).backward()
            ref_optimizer.step()

        same = all(torch.allclose(p.cpu(), q, atol=1e-5)
                   for p, q in zip(model.parameters(), reference.parameters()))
        print("SPMD weights equal the single-device weights:", same)
    """),
    md("""
        ### Feeding sharded batches

        In a real loop, `MpDeviceLoader` shards each batch as it copies it to the devices:
        `input_sharding` says how. Every batch then arrives already split over the `data` axis.
    """),
    code("""
        spmd_loader = pl.MpDeviceLoader(
            DataLoader(dataset, batch_size=64, drop_last=True), dev,
            input_sharding=xs.ShardingSpec(mesh, ("data", None)))
        for x, y in spmd_loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
        print("batch sharding:", torch_xla._XLAC._get_xla_sharding_spec(x))
        print(f"loss after one epoch: {loss.item():.2f}")
    """),
    md("""
        > **tpu_nb's SPMD cells** slot in here: `%%on_tpu --spmd` runs a cell over all devices
        > with a data mesh ready (`mesh`, `shard_batch(tensor)`). The `mark_sharding` calls above
        > are what it does for you.

        ## The rule, seen

        This kernel has now used the devices. Launching replicas from it is refused, before
        anything is started. `torch_xla.launch` refuses SPMD mode outright; underneath it,
        `xmp.spawn` checks the rule from above:
    """),
    code("""
        import torch_xla.distributed.xla_multiprocessing as xmp

        print("XLA runtime started in this kernel:", tpu_nb.detect().runtime_initialized)
        for name, start in (("torch_xla.launch", torch_xla.launch), ("xmp.spawn", xmp.spawn)):
            try:
                start(train_replica, args=("unused",), start_method="fork")
            except (RuntimeError, NotImplementedError) as err:
                print(f"{name}: {type(err).__name__}: {err}")
    """),
    md("""
        To launch replicas with torch_xla, restart the kernel and launch before anything
        touches the device. (tpu_nb's launcher gets around the rule by starting the replicas in
        a fresh worker process when the kernel has already used the device.)

        ## Summary

        - Data parallel = the whole model on every device, a slice of the batch each, gradients
          averaged before every update.
        - One process per device: `torch_xla.launch(fn, start_method="fork")` from a notebook,
          **before** anything touches the device. In `fn`: `xr.world_size()`,
          `xr.global_ordinal()`, a `DistributedSampler`, `MpDeviceLoader`, and
          `xm.optimizer_step` for the all-reduce.
        - The collectives between several XLA:CPU devices hang in torch_xla 2.9 (#5005, #9089):
          on a CPU, use SPMD.
        - SPMD: `xr.use_spmd()` first, a `Mesh` with named axes, `mark_sharding` for the batch
          (split over `data`) and the parameters (replicated); the compiler inserts the
          all-reduce. `MpDeviceLoader(..., input_sharding=...)` shards batches as it loads them.
        - SPMD computes the same result as one device, spread over many.

        **Next:** [05 · Precision](05_precision.ipynb): bfloat16, the TPU's native number
        format.
    """),
]

write("04_multiple_devices", cells)
