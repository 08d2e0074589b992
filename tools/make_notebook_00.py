"""Writes notebooks/00_getting_started.ipynb (sources only; see make_notebook_common.py)."""

from make_notebook_common import code, install_cell, md, write

cells = [
    md("""
        # 00 · Getting started: PyTorch tensors on an XLA device

        PyTorch runs on Cloud TPUs through **PyTorch/XLA** (`torch_xla`): tensors live on an
        *XLA device*, and the operations you write are compiled by the XLA compiler before they
        run. The same code runs on any machine's CPU through XLA, which is how this notebook is
        tested.

        **You will learn**

        - how to start: `%load_ext tpu_nb`, then `%tpu_setup` *before* anything touches the device;
        - how to create tensors on the XLA device and compute with them (add, multiply, matrix
          multiply, a 1-D convolution);
        - why printing a tensor is the moment the work actually happens, and what the one-line
          `XLA:` summary after a cell tells you;
        - that `.to(device)` and `.cpu()` make **copies**;
        - what happens when a module that lives on the CPU meets a tensor on the device.

        The notebook runs as-is on a Colab TPU runtime (Runtime › Change runtime type › TPU) and
        on any laptop's CPU.
    """),
    install_cell(),
    md("""
        ## Set-up: before the first XLA computation

        `%load_ext tpu_nb` registers the magics; it does not import torch_xla yet.

        `%tpu_setup` checks that torch and torch_xla are a matching pair, picks the device (a TPU
        if this machine has one, otherwise the CPU) and switches on torch_xla's *compile-cause
        analysis*, which tpu_nb reads to tell you which line made XLA compile. torch_xla reads
        these settings **once per process**, at its first use of the device, so `%tpu_setup` has
        to come first. Run it later and it tells you what it could no longer change.
    """),
    code("%load_ext tpu_nb"),
    code("%tpu_setup"),
    md("""
        The table says where we are: the accelerator found (here the CPU, as no TPU is present),
        the versions, and what `%tpu_setup` changed. `compile log` is the file where torch_xla
        writes why each graph compiled; you never need to open it, tpu_nb reads it for you.
    """),
    md("""
        ## Tensors on the device

        `torch_xla.device()` is the XLA device, the way `"cuda"` names a GPU. Tensors created
        there are XLA tensors. Operations on them are not run one by one like on a CPU: they are
        **recorded** into a graph, and the graph is compiled and run when a value is actually
        needed. Showing a tensor needs its values, so here the last line, `t`, is what runs the
        work.

        After each cell that did XLA work, tpu_nb prints one `XLA:` line: graphs compiled (and
        the compile time), graph executions, transfers to the device (`→dev`) and back to the
        host (`→host`).
    """),
    code("""
        import torch
        import torch_xla

        dev = torch_xla.device()
        t = torch.arange(6, dtype=torch.float32, device=dev).reshape(2, 3)
        print(t.device)
        t
    """),
    md("""
        One graph was compiled and executed, and one result came back to the host to be
        printed. Compiling is the expensive part, so XLA keeps every compiled graph in a cache
        keyed by the graph's *structure*: its operations, shapes and dtypes. Values that come in
        as data (a tensor copied from the CPU, the result of an earlier step) are inputs of the
        graph, not part of it, so the same computation on new data reuses the compiled graph.
        The second print below shows `0 compiled` and a `cache hit`:
    """),
    code("""
        def double_sum(x):
            return (x * 2).sum()

        print(double_sum(torch.tensor([1.0, 2.0, 3.0, 4.0]).to(dev)))
    """),
    code("print(double_sum(torch.tensor([5.0, 6.0, 7.0, 8.0]).to(dev)))"),
    md("""
        Keep this in mind for later notebooks: a graph is compiled once per *shape*. A loop whose
        shapes stay fixed compiles once and then runs from the cache; a loop whose shapes change
        compiles again and again ([03 · Lazy tensors](03_lazy_tensors.ipynb) shows how to see
        that and fix it).
    """),
    md("""
        ## `%%on_tpu`: the device is the default, and a report per cell

        Writing `device=dev` everywhere is noisy. Inside a cell that starts with `%%on_tpu`,
        tensors and modules created without `device=` land on the XLA device. At the end, the
        cell runs whatever is still pending, waits for the device, and shows a report: what
        compiled (and from which line), what ran, what it cost. Click the summary line to expand
        it.

        Here are addition, multiplication and a matrix multiplication:
    """),
    code("""
        %%on_tpu
        a = torch.ones(2, 3)          # on the XLA device, no device= needed
        b = a * 2 + t                 # multiply and add: recorded, not run yet
        c = b @ b.T                   # matrix multiply: recorded too
        c
    """),
    md("""
        All three operations became **one** graph, compiled once at the end of the cell
        (`end of cell` in the report). That fusion is why XLA is fast on a TPU: the compiler sees
        the whole computation and schedules it as a unit instead of launching one kernel per
        operation.

        A 1-D convolution works the same way. The kernel `[1, 0, -1]` computes the difference
        between neighbours two steps apart, so on the ramp `0, 1, 2, …` every output is `-2`:
    """),
    code("""
        %%on_tpu
        signal = torch.arange(16.0).reshape(1, 1, 16)     # (batch, channels, length)
        edge = torch.tensor([[[1.0, 0.0, -1.0]]])         # (out channels, in channels, width)
        torch.nn.functional.conv1d(signal, edge)
    """),
    md("""
        ## Moving tensors: `.to(dev)` and `.cpu()` make copies

        A CPU tensor and an XLA tensor live in different memories (the host's RAM and the
        device's HBM on a TPU), so moving between them copies the data. Changing the copy on the
        device does not change the CPU tensor, and the other way round. Each copy is also a
        transfer, counted in the `XLA:` line: on a TPU they go over PCIe and cost real time, so
        move data once and keep it on the device.
    """),
    code("""
        on_cpu = torch.zeros(3)
        on_device = on_cpu.to(dev)      # a copy on the device
        on_device += 1                  # changes the device copy only
        back = on_device.cpu()          # a copy back on the host
        back += 10                      # changes that host copy only
        print("CPU tensor:   ", on_cpu)
        print("device tensor:", on_device.cpu())
        print("copied back:  ", back)
    """),
    md("""
        ## A CPU module meets a device tensor

        Modules (`torch.nn.Linear`, a whole model) create their parameters on the CPU unless told
        otherwise. An XLA tensor cannot meet a CPU tensor inside one operation: PyTorch never
        moves data between devices behind your back, because a silent copy in the middle of a
        model would be slow and surprising. So feeding a device tensor to a CPU module is an
        error. Fix it by moving the module: `module.to(dev)` moves its parameters in place (and
        returns the same module), or create the module inside a `%%on_tpu` cell.
    """),
    code("""
        layer = torch.nn.Linear(3, 2)           # parameters on the CPU
        try:
            layer(torch.ones(1, 3, device=dev))
        except RuntimeError as err:
            print("RuntimeError:", str(err).splitlines()[0])
        layer = layer.to(dev)                   # parameters copied to the device
        print(layer.weight.device, layer(torch.ones(1, 3, device=dev)).shape)
    """),
    md("""
        The shape is known without running anything: XLA tensors carry their shape and dtype
        while the values are still pending, which is why `0 executed` above.
    """),
    md("""
        ## Summary

        - Start every notebook with `%load_ext tpu_nb` and `%tpu_setup`, **before** the first XLA
          computation: torch_xla reads its settings once per process.
        - `torch_xla.device()` is the device. Operations on its tensors are recorded into a
          graph; the graph is compiled and run when a value is needed (printing, `.cpu()`).
        - XLA caches compiled graphs by structure and shape: the same computation on new values
          does not compile again.
        - `%%on_tpu` makes the device the default inside a cell and reports what compiled, from
          which line, and what ran.
        - `.to(dev)` and `.cpu()` copy data between host and device; modules must live on the same
          device as their inputs.

        **Next:** [01 · Modules and autograd](01_modules_and_autograd.ipynb): a layer on the
        device, backward, and gradients that stay on the device.
    """),
]

write("00_getting_started", cells)
