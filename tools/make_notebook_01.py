"""Writes notebooks/01_modules_and_autograd.ipynb (sources only; see make_notebook_common.py)."""

from make_notebook_common import code, md, setup_cells, write

cells = [
    md("""
        # 01 · Modules and autograd on the device

        A model is parameters plus the operations that use them; training needs the gradients of
        a loss with respect to those parameters. This notebook puts a layer on the XLA device and
        follows its gradients.

        **You will learn**

        - how to move a module to the device, and why `module.to(dev)` moves it *in place*;
        - that the device computes the same thing as the CPU (and how to check it);
        - that `loss.backward()` on the device only *records* the backward pass, and
          `torch_xla.sync()` runs forward and backward as one compiled graph;
        - that gradients are created and stay on the device: no copies to the host;
        - why `torch.manual_seed` is not enough for random numbers made on the device;
        - what a tiny training loop's report looks like, and why its first step compiles twice.
    """),
    *setup_cells(),
    md("""
        ## A layer on the device

        We create a `Linear` layer on the CPU, keep an exact copy there as a reference, and move
        the original to the device. Unlike `tensor.to(dev)`, which returns a new tensor,
        `module.to(dev)` moves the module's parameters **in place** and returns the same module.
        That is why an optimizer must be created *after* the move: it holds references to the
        parameter objects it will update.
    """),
    code("""
        import copy

        import torch
        import torch_xla

        dev = torch_xla.device()
        torch.manual_seed(0)                      # the CPU generator: initializes the layer
        layer = torch.nn.Linear(4, 3)
        reference = copy.deepcopy(layer)          # stays on the CPU

        moved = layer.to(dev)
        print("same module object:", moved is layer)
        print("layer on", layer.weight.device, "| reference on", reference.weight.device)
    """),
    md("""
        The `XLA:` line shows two transfers to the device: the weight and the bias. Nothing was
        compiled or executed; the parameters are now *device data*, the inputs of future graphs.

        ## Forward: recorded, not run

        Calling the layer on a device tensor records a matrix multiply and an addition. The result
        already has its shape, dtype and `grad_fn` (autograd's record of how it was computed), but
        no values yet: `0 executed`.
    """),
    code("""
        x_cpu = torch.arange(8.0).reshape(2, 4) / 8
        x = x_cpu.to(dev)
        y = layer(x)
        print(y.shape, y.dtype, y.device, "grad_fn:", type(y.grad_fn).__name__)
    """),
    md("""
        ## Backward: gradients are created on the device

        `loss.backward()` runs autograd as usual. On the XLA device, each backward operation is
        again *recorded*: after `backward()`, `layer.weight.grad` exists, lives on the device and
        has its shape, but its values are part of the same pending graph as the forward pass.
        Still `0 executed`.
    """),
    code("""
        loss = y.pow(2).mean()
        loss.backward()
        print("weight.grad:", layer.weight.grad.device, tuple(layer.weight.grad.shape))
        print("bias.grad:  ", layer.bias.grad.device, tuple(layer.bias.grad.shape))
    """),
    md("""
        `torch_xla.sync()` cuts the recording here: everything pending (the loss, the forward,
        the gradients) is compiled into **one** graph and run. Forward and backward are fused and
        optimized together, which is where XLA's speed comes from. `wait=True` also waits until
        the device has finished, so the `XLA:` line below counts the execution; in a training
        loop you leave it out and let the device work while Python records the next step.
    """),
    code("torch_xla.sync(wait=True)"),
    md("""
        ## The same numbers as the CPU

        The reference layer has the same parameters, so running forward and backward on the CPU
        must give the same loss and gradients. Reading the device values with `.cpu()` copies
        them to the host (the `→host` transfers). We compare with a tolerance rather than exact
        equality: different hardware may sum in a different order, and a TPU multiplies
        float32 matrices at reduced precision by default ([05 · Precision](05_precision.ipynb)).
    """),
    code("""
        ref_loss = reference(x_cpu).pow(2).mean()
        ref_loss.backward()
        print("loss matches:        ", torch.allclose(loss.cpu(), ref_loss, atol=1e-3))
        print("weight grad matches: ", torch.allclose(layer.weight.grad.cpu(), reference.weight.grad, atol=1e-3))
        print("bias grad matches:   ", torch.allclose(layer.bias.grad.cpu(), reference.bias.grad, atol=1e-3))
    """),
    md("""
        ## Updating the parameters, on the device

        A gradient step is arithmetic on device tensors, so it is recorded too. Nothing crosses
        to the host: the parameters and their gradients never leave the device during training,
        which is what makes a TPU fast (host↔device copies are slow by comparison).

        `zero_grad()` then sets the gradients to `None` (the default, `set_to_none=True`), so the
        next `backward()` creates fresh ones instead of adding into the old ones.
    """),
    code("""
        with torch.no_grad():
            for p in layer.parameters():
                p -= 0.1 * p.grad                 # recorded on the device
        layer.zero_grad()
        print("grad after zero_grad:", layer.weight.grad)
        torch_xla.sync(wait=True)                 # run the update
    """),
    md("""
        ## Random numbers made on the device need their own seed

        `torch.manual_seed` seeds PyTorch's **CPU** generator. Random tensors created directly on
        the device (`torch.randn(..., device=dev)`, and the initial weights of a module created on
        the device) come from XLA's own generator, seeded with `torch_xla.manual_seed`. For
        reproducible runs on the device, seed both.
    """),
    code("""
        def two_draws(seed_fn):
            seed_fn(0)
            first = torch.randn(3, device=dev)
            seed_fn(0)
            second = torch.randn(3, device=dev)
            return torch.equal(first.cpu(), second.cpu())

        print("torch.manual_seed reproduces device draws:    ", two_draws(torch.manual_seed))
        print("torch_xla.manual_seed reproduces device draws:", two_draws(torch_xla.manual_seed))
    """),
    md("""
        ## A model and an optimizer, in a `%%on_tpu` cell

        Inside `%%on_tpu`, the model and the data are created directly on the device (no
        `.to(dev)`). The loop is the usual one, plus `torch_xla.sync()` at the end of each step:
        without it, the loop would record one ever-growing graph of all 20 steps instead of
        running step by step.

        The model learns to add its four inputs.
    """),
    code("""
        %%on_tpu
        torch_xla.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)   # after the model is on the device
        inputs = torch.rand(64, 4)
        targets = inputs.sum(dim=1, keepdim=True)

        for step in range(20):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            torch_xla.sync()
    """),
    md("""
        Read the report: 20 steps, but only **2 graphs compiled** and 18 cache hits. The first
        step's graph is different from the others: before it, the gradients did not exist and
        the freshly initialized weights were still pending random numbers, so its inputs and
        outputs differ. From step 2 on, every step is the same graph with new values, served
        from the cache. tpu_nb recognizes that pattern and says it is expected once.

        More steps reuse the same graph: `0 compiled`. Reading the loss with `.item()` copies
        one number to the host; the report points at that line, because such a read inside a
        loop would stall the device at every step (more in [03](03_lazy_tensors.ipynb)). Here it
        runs once, after the loop.
    """),
    code("""
        %%on_tpu
        for step in range(20):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            torch_xla.sync()
        print(f"loss after 40 steps: {loss.item():.2f}")
    """),
    md("""
        ## Summary

        - `module.to(dev)` moves the parameters in place; create the optimizer afterwards. Inside
          `%%on_tpu`, modules are created on the device directly.
        - Forward, `backward()` and the optimizer step are all *recorded*; `torch_xla.sync()` runs
          them as one compiled graph. The gradients are created on the device and stay there.
        - The device computes the same math as the CPU: compare with `torch.allclose` and a
          tolerance.
        - Seed the device's generator with `torch_xla.manual_seed`; `torch.manual_seed` only
          seeds the CPU's.
        - A training loop compiles its first step, then its steady step, then runs from the
          cache. Anything more is worth a look.

        **Next:** [02 · Training](02_training.ipynb): a CNN, a data loader that feeds the
        device in the background, and the optimizer step.
    """),
]

write("01_modules_and_autograd", cells)
