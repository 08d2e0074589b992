"""Writes notebooks/05_precision.ipynb (sources only; see make_notebook_common.py)."""

from make_notebook_common import code, md, setup_cells, write

cells = [
    md("""
        # 05 · Precision: bfloat16 on TPUs

        TPUs are built around **bfloat16** (bf16): a 16-bit floating-point format whose matrix
        units multiply bf16 numbers at full speed, with half the memory and memory bandwidth of
        float32. Using it well is the single largest speed-up available on a TPU, and using it
        carelessly is a classic source of models that silently stop learning.

        **You will learn**

        - what bf16 keeps from float32 (the range) and what it gives up (the precision), compared
          with float16;
        - how to run a model in bf16 (`model.to(torch.bfloat16)`), and why pure-bf16 training can
          stall;
        - mixed precision with `torch.autocast("xla", dtype=torch.bfloat16)`: bf16 arithmetic,
          float32 weights;
        - why the old `XLA_USE_BF16=1` switch is deprecated;
        - what differs on a CPU: the rounding is the same, the speed and the float32 matrix
          precision are not.
    """),
    *setup_cells(),
    md("""
        ## Three 16- and 32-bit formats

        A floating-point number has an exponent (its range) and a mantissa (its precision).
        bfloat16 keeps float32's 8 exponent bits and cuts the mantissa to 7 bits; float16 does
        the opposite trade. So bf16 covers the same range as float32 (no overflow where float32
        would not overflow) but has only about 3 significant decimal digits, while float16 is
        more precise but overflows above 65504. For training, range matters more: gradients and
        activations span many orders of magnitude, which is why TPUs chose bf16 and why bf16
        needs no loss scaling, unlike float16.

        `eps` is the gap between 1 and the next representable number:
    """),
    code("""
        import torch
        import torch_xla

        dev = torch_xla.device()
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            info = torch.finfo(dtype)
            small = torch.tensor(1.001, dtype=dtype).item()
            large = torch.tensor(70000.0, dtype=dtype).item()
            print(f"{str(dtype):15} max {info.max:9.3g}  eps {info.eps:9.3g}  "
                  f"1.001 -> {small:<13.10g} 70000 -> {large:g}")
    """),
    md("""
        The rounding is part of the format, not of the hardware: the XLA device stores and
        rounds bf16 exactly as the CPU does.
    """),
    code("""
        values = torch.tensor([1.001, 70000.0])
        print("CPU:       ", values.bfloat16().tolist())
        print("XLA device:", values.to(dev).bfloat16().cpu().tolist())
    """),
    md("""
        ## A model in bf16

        `model.to(torch.bfloat16)` converts every parameter (and the inputs must be bf16 too).
        Memory halves, and on a TPU the matrix multiplies run at the bf16 rate. The outputs
        differ from float32 by about bf16's precision, which a classifier rarely notices.
    """),
    code("""
        import copy

        torch.manual_seed(0)
        model32 = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
        x = torch.randn(32, 64)
        expected = model32(x).detach()                      # float32, on the CPU

        model16 = copy.deepcopy(model32).to(dev).to(torch.bfloat16)
        out = model16(x.to(dev).to(torch.bfloat16))


        def megabytes(model):
            return sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6


        print(f"parameters: {megabytes(model32):.3f} MB in float32, {megabytes(model16):.3f} MB in bf16")
        print("output dtype:", out.dtype)
        print("close to float32 (within 3%):", torch.allclose(out.float().cpu(), expected, rtol=0.03, atol=0.03))
    """),
    md("""
        ### Why pure-bf16 training can stall

        With 7 mantissa bits, the numbers next to 1.0 are 0.996 and 1.0078. An update smaller
        than half that gap is rounded away: a weight of 1.0 that receives a hundred updates of
        −0.001 does not move at all in bf16, while in float32 it reaches 0.9. Late in training,
        when updates are small, a model kept entirely in bf16 stops learning.
    """),
    code("""
        for dtype in (torch.float32, torch.bfloat16):
            weight = torch.ones(1, dtype=dtype, device=dev)
            for step in range(100):
                weight -= 0.001                              # a small update ...
                torch_xla.sync()                             # ... once per training step
            print(f"{str(dtype):15} weight after 100 updates of -0.001: {weight.item():.4f}")
    """),
    md("""
        ## Mixed precision: `torch.autocast`

        The fix is to keep the **weights** (and the optimizer's state) in float32 and do the
        expensive **arithmetic** in bf16. `torch.autocast("xla", dtype=torch.bfloat16)` does that
        per operation: matrix multiplies and convolutions run in bf16, while operations that
        need precision (sums behind losses and normalizations) stay in float32. Gradients come
        out in float32, matching the weights, so small updates are not lost.
    """),
    code("""
        model = copy.deepcopy(model32).to(dev)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        target = torch.zeros(32, 10, device=dev)

        with torch.autocast("xla", dtype=torch.bfloat16):
            logits = model(x.to(dev))                        # the matmuls run in bf16
            loss = torch.nn.functional.mse_loss(logits, target)
        loss.backward()
        optimizer.step()
        torch_xla.sync(wait=True)
        print("weights:  ", model[0].weight.dtype)
        print("logits:   ", logits.dtype)
        print("loss:     ", loss.dtype)
        print("gradients:", model[0].weight.grad.dtype)
    """),
    md("""
        The loss is float32 although the logits were bf16: autocast runs `mse_loss` in float32.
        This is the recipe to use on a TPU.

        ## `XLA_USE_BF16=1`: why it is deprecated

        Older tutorials set the environment variable `XLA_USE_BF16=1`. It makes torch_xla store
        **every** float32 tensor on the device as bf16, while still calling it float32. You
        cannot keep anything in float32 (not the weights, not the loss), and nothing in your
        code tells you: `tensor.dtype` says `torch.float32`, but the values have bf16 precision.
        It is deprecated since torch_xla 2.6; use `model.to(torch.bfloat16)` or autocast.

        The variable is read once per process, so we show it in a separate Python process (on
        the CPU, which behaves the same way here):
    """),
    code("""
        import os
        import subprocess
        import sys

        probe = '''
        import torch, torch_xla
        x = torch.tensor([1.001, 70000.0]).to(torch_xla.device())
        print("dtype says:        ", x.dtype)
        print("values on the host:", x.cpu().tolist())
        '''
        # A clean environment for the child: the CPU device, and none of this kernel's XLA
        # debug settings (its compile log is this kernel's).
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PT_XLA_", "XLA_"))}
        env.update(PJRT_DEVICE="CPU", XLA_USE_BF16="1")
        child = subprocess.run([sys.executable, "-c", probe],
                               env=env, capture_output=True, text=True, timeout=300)
        print(child.stdout, end="")      # torch_xla's deprecation notice, then the probe's lines
    """),
    md("""
        `%tpu_setup` (and `tpu_nb.detect()`) warn when `XLA_USE_BF16` is set, with the fix.

        ## What changes on a CPU

        - **Rounding: nothing.** bf16 values are the same numbers everywhere, as shown above.
        - **Speed.** Most CPUs have no bf16 arithmetic units, so bf16 is usually no faster on a
          CPU, often slower. Measure speed on a TPU.
        - **float32 matrix multiplies.** On a TPU, XLA by default multiplies float32 matrices
          with a single bf16 pass: fast, but only about 3 significant digits. This is why float32
          results on a TPU differ from a CPU's in the 3rd or 4th digit. XLA:CPU computes float32
          products in float32:
    """),
    code("""
        import torch_xla.backends

        a = torch.randn(256, 256, generator=torch.Generator().manual_seed(1))
        b = torch.randn(256, 256, generator=torch.Generator().manual_seed(2))
        exact = a.double() @ b.double()
        product = (a.to(dev) @ b.to(dev)).cpu().double()
        error = ((product - exact).abs().max() / exact.abs().max()).item()
        print("matmul precision:", torch_xla.backends.get_mat_mul_precision())
        print("float32 matmul accurate to float32 (relative error < 1e-5):", error < 1e-5)
    """),
    md("""
        On a TPU this prints `False`: that is the single bf16 pass. When a computation needs
        float32 accuracy there, call `torch_xla.backends.set_mat_mul_precision("high")` (3
        passes) or `("highest")` (6 passes, close to true float32) at the start of the program,
        before anything compiles; torch_xla warns if you change it again later.

        ### bf16 speed, on a TPU

        Timing bf16 against float32 means something only on a TPU, so this cell skips itself
        elsewhere. `%tpu_time` waits for the device after every run, so it times the work, not
        just the recording of it.
    """),
    code("""
        import tpu_nb

        if tpu_nb.detect().accelerator.kind != "tpu":
            print("Skipped: no TPU here. Most CPUs have no bf16 arithmetic units, so timing bf16 "
                  "against float32 here says nothing about a TPU.")
        else:
            big_a, big_b = torch.randn(4096, 4096, device=dev), torch.randn(4096, 4096, device=dev)
            for dtype in (torch.float32, torch.bfloat16):
                a16, b16 = big_a.to(dtype), big_b.to(dtype)
                print(dtype, get_ipython().run_line_magic("tpu_time", "-n 20 -r 3 -o a16 @ b16").summary())
    """),
    md("""
        ## Summary

        - bf16 = float32's range with ~3 significant digits; the TPU's matrix units run it at
          full speed, and it halves memory.
        - `model.to(torch.bfloat16)` runs everything in bf16; small updates can then be rounded
          away, so pure-bf16 training may stall.
        - Mixed precision, `torch.autocast("xla", dtype=torch.bfloat16)`: bf16 arithmetic,
          float32 weights, gradients and loss. The recipe for training on a TPU.
        - `XLA_USE_BF16=1` converts everything and hides it behind `dtype == float32`; it is
          deprecated. Convert explicitly.
        - On a CPU the rounding is identical, but bf16 is not faster, and float32 matmuls are
          full float32 (a TPU's default is one bf16 pass: `set_mat_mul_precision`).

        **Next:** [06 · Saving and loading](06_saving_and_loading.ipynb).
    """),
]

write("05_precision", cells)
