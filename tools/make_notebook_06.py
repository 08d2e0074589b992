"""Writes notebooks/06_saving_and_loading.ipynb (sources only; see make_notebook_common.py)."""

from make_notebook_common import code, md, setup_cells, write

cells = [
    md("""
        # 06 · Saving, loading and copying XLA tensors

        An XLA tensor's data lives in device memory, out of Python's reach: PyTorch cannot point
        at its bytes the way it does for a CPU tensor. Anything that needs the bytes (saving,
        pickling, `copy.copy`) first copies the tensor to the host. That one fact explains every
        surprise in this notebook.

        **You will learn**

        - what `torch.save` does with an XLA tensor, and where `torch.load` puts it back;
        - the checkpoint recipe: move to the CPU first (`xm.save` does it for you);
        - why a tensor and its view cannot be saved *together* from the device, and the fix;
        - why `copy.copy` of an XLA tensor is a deep copy (and a round trip through the host),
          and what to use instead.
    """),
    *setup_cells(),
    md("""
        We work in a temporary folder, and print file sizes rather than paths (they differ on
        every machine).
    """),
    code("""
        import copy
        import os
        import tempfile

        import torch
        import torch_xla
        import torch_xla.core.xla_model as xm

        dev = torch_xla.device()
        folder = tempfile.mkdtemp()


        def path(name):
            return os.path.join(folder, name)
    """),
    md("""
        ## `torch.save` on an XLA tensor

        `torch.save` works on an XLA tensor: PyTorch copies it to the host and writes that copy,
        together with a note of the device it came from. `torch.load` copies it back to the XLA
        device, so loading the file needs torch_xla installed; `map_location="cpu"` loads it on
        the CPU instead.
    """),
    code("""
        t = torch.arange(6.0, device=dev)
        torch.save(t, path("tensor.pt"))
        print("loaded:                    ", torch.load(path("tensor.pt")).device)
        print("loaded, map_location='cpu':", torch.load(path("tensor.pt"), map_location="cpu").device)
    """),
    md("""
        ## Checkpoints: move to the CPU first

        For a model, save the `state_dict` with its tensors **on the CPU**. The file is then an
        ordinary PyTorch checkpoint that any machine can load, with or without torch_xla.
        `xm.save(data, path)` does exactly that: it moves every XLA tensor in `data` (nested
        dicts and lists included) to the CPU and saves. In a multi-process run it also writes
        from one process only (`master_only=True`), instead of every replica writing the same
        file.

        Loading goes the other way: `load_state_dict` copies the CPU values into the model's
        parameters, which stay on the device.
    """),
    code("""
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2).to(dev)
        xm.save(model.state_dict(), path("model.pt"))

        state = torch.load(path("model.pt"))
        print("saved tensors are on:", {name: str(v.device) for name, v in state.items()})

        restored = torch.nn.Linear(4, 2).to(dev)
        restored.load_state_dict(state)
        same = all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(model.parameters(), restored.parameters()))
        print("restored parameters on", restored.weight.device, "| equal to the saved ones:", same)
    """),
    md("""
        Saving reads every parameter back to the host, so it waits for the device to finish the
        work pending on them. Save every few hundred steps, not every step.

        ## A tensor and its view cannot be saved together from the device

        On the CPU, a view shares memory with its base tensor, and `torch.save` keeps that: it
        writes the shared memory once, and after loading, the view is still a view of the base.

        An XLA tensor has no memory PyTorch can point at, so `torch.save` copies **each** XLA
        tensor to the host separately. A tensor and its view become two unrelated copies: the
        file holds the data twice, and after loading, changing the base no longer changes the
        "view".
    """),
    code("""
        def save_and_reload(base, view, name):
            torch.save({"base": base, "view": view}, path(name))
            loaded = torch.load(path(name))
            loaded["base"].add_(100)                  # does the view follow?
            follows = loaded["view"][0, 0].item() == loaded["base"][0].item()
            print(f"{name:10} {os.path.getsize(path(name)):6} bytes   view follows its base: {follows}")


        base = torch.arange(1000.0)
        save_and_reload(base, base.view(10, 100), "cpu.pt")

        base = torch.arange(1000.0, device=dev)
        save_and_reload(base, base.view(10, 100), "xla.pt")
    """),
    md("""
        The XLA file is twice the size (4,000 bytes of data written twice), and the loaded view
        is a view no more. The fix: **move to the CPU first, save only the base, and recreate
        the view after loading** (on the CPU, or on the device after moving the base there).
        torch_xla's own documentation for `xm.save` gives the same advice: recreate views after
        loading rather than saving them.
    """),
    code("""
        base = torch.arange(1000.0, device=dev)
        torch.save({"base": base.cpu()}, path("fixed.pt"))

        loaded = torch.load(path("fixed.pt"))["base"].to(dev)
        view = loaded.view(10, 100)                   # recreated after loading
        loaded.add_(100)
        print(os.path.getsize(path("fixed.pt")), "bytes   view follows its base:",
              view[0, 0].item() == loaded[0].item())
    """),
    md("""
        On the device, views work as usual: an in-place change to the base shows through the
        view, as the last line checked.

        ## `copy.copy` is a deep copy; `view()` is the shallow one

        `copy.copy` of a CPU tensor is *shallow*: the copy shares memory with the original.
        `copy.copy` of an XLA tensor cannot share what PyTorch cannot see, so it goes through
        the same path as saving: the tensor is copied to the host and back, making a *deep*,
        independent copy, and costing two transfers.
    """),
    code("""
        cpu_tensor = torch.zeros(3)
        copy.copy(cpu_tensor).add_(1)
        print("CPU:        original after changing copy.copy(t):", cpu_tensor)

        xla_tensor = torch.zeros(3, device=dev)
        copy.copy(xla_tensor).add_(1)
        print("XLA device: original after changing copy.copy(t):", xla_tensor.cpu())
    """),
    md("""
        Look at the `XLA:` line: besides the final `.cpu()` read, the `copy.copy` went to the
        host and back.

        Say what you mean instead:

        - a shallow alias that shares the data: `t.view(t.shape)` (or any view: `t[:]`,
          `t.view(-1)`), which on the device is still lazy, free and in sync with `t`;
        - an independent copy: `t.clone()`, computed on the device, with no transfer
          (`copy.deepcopy(t)` also clones an XLA tensor on the device).
    """),
    code("""
        %%on_tpu
        t = torch.zeros(3)
        alias = t.view(t.shape)           # shallow: shares t's data
        independent = t.clone()           # deep: a copy on the device
        t.add_(1)
        print("alias:      ", alias)
        print("independent:", independent)
    """),
    md("""
        The report shows no transfer to the device and none from the host except the two
        prints: everything happened on the device.

        ## Summary

        - `torch.save` copies each XLA tensor to the host on its own; `torch.load` puts it back
          on the XLA device (needs torch_xla) unless `map_location="cpu"`.
        - Save checkpoints on the CPU: `xm.save(model.state_dict(), path)` (moves to the CPU,
          writes from one process), then `load_state_dict(torch.load(path))`.
        - A tensor and its view saved from the device become two unrelated copies (twice the
          bytes, no longer a view): move the base to the CPU, save it alone, recreate views
          after loading.
        - `copy.copy` of an XLA tensor is a deep copy through the host; use `view()` for an
          alias and `clone()` for a copy, both on the device.

        **Next:** [07 · Performance](07_performance.ipynb): reading the reports to make a
        training loop fast.
    """),
]

write("06_saving_and_loading", cells)
