"""Writes notebooks/00_getting_started.ipynb (sources only; tools/record_outputs.py fills in
the outputs nbval compares against)."""

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

cells = [
    new_markdown_cell(
        "# 00 · Getting started: PyTorch tensors on an XLA device\n\n"
        "**You will learn** how to put tensors on an XLA device (a Cloud TPU, or the CPU through "
        "XLA anywhere else), what `tpu_nb` shows you after each cell, and why a tensor on the "
        "device is a *copy* of a CPU tensor.\n\n"
        "This notebook runs as-is on a Colab TPU runtime and on any laptop's CPU."),
    new_markdown_cell(
        "## Set-up\n\n`%load_ext tpu_nb` registers the magics without importing torch_xla. "
        "`%tpu_setup` checks the environment, picks the device (a TPU if there is one) and "
        "switches on compile-cause analysis. It must run **before the first XLA computation**: "
        "torch_xla reads these settings once per process."),
    new_code_cell("%load_ext tpu_nb"),
    new_code_cell("%tpu_setup"),
    new_markdown_cell(
        "## Tensors on the device\n\n`torch_xla.device()` is the XLA device. Operations on its "
        "tensors are *recorded* into a graph, then compiled and run when a value is needed "
        "(printing it here). After each cell that did XLA work, tpu_nb prints one line: graphs "
        "compiled, executions, transfers, reads back to the host."),
    new_code_cell(
        "import torch\nimport torch_xla\n\n"
        "dev = torch_xla.device()\n"
        "t = torch.arange(6, dtype=torch.float32, device=dev).reshape(2, 3)\n"
        "print(t.device)\nt"),
    new_markdown_cell(
        "## `%%on_tpu`: the device is the default, and a report per cell\n\n"
        "Inside a `%%on_tpu` cell, tensors and modules created without `device=` land on the "
        "XLA device. The cell waits for the device at the end, then reports what compiled "
        "(and from which line), what ran, and what it cost. Click the summary to expand it."),
    new_code_cell(
        "%%on_tpu\n"
        "a = torch.ones(2, 3)          # on the XLA device, no device= needed\n"
        "b = a * 2 + t                 # add and multiply\n"
        "c = b @ b.T                   # matrix multiply\n"
        "c"),
    new_markdown_cell("A 1-D convolution works the same way:"),
    new_code_cell(
        "%%on_tpu\n"
        "signal = torch.arange(16.0).reshape(1, 1, 16)\n"
        "edge = torch.tensor([[[1.0, 0.0, -1.0]]])\n"
        "torch.nn.functional.conv1d(signal, edge)"),
    new_markdown_cell(
        "## Moving tensors: `.to(dev)` and `.cpu()` make copies\n\n"
        "Changing the device copy does not change the CPU tensor, and the other way round."),
    new_code_cell(
        "on_cpu = torch.zeros(3)\n"
        "on_device = on_cpu.to(dev)\n"
        "on_device += 1\n"
        "print(\"CPU tensor:   \", on_cpu)\n"
        "print(\"device tensor:\", on_device.cpu())"),
    new_markdown_cell(
        "## A CPU module meets a device tensor\n\n"
        "Modules are created on the CPU unless told otherwise. Feeding an XLA tensor to a CPU "
        "module is an error: move the module with `.to(dev)` (or create it inside `%%on_tpu`)."),
    new_code_cell(
        "layer = torch.nn.Linear(3, 2)           # parameters on the CPU\n"
        "try:\n"
        "    layer(torch.ones(1, 3, device=dev))\n"
        "except RuntimeError as err:\n"
        "    print(\"RuntimeError:\", str(err).splitlines()[0])\n"
        "layer = layer.to(dev)\n"
        "layer(torch.ones(1, 3, device=dev)).shape"),
    new_markdown_cell(
        "## Summary\n\n"
        "- `%load_ext tpu_nb` then `%tpu_setup`, before the first XLA computation.\n"
        "- `torch_xla.device()` is the device; operations are recorded and compiled lazily.\n"
        "- `%%on_tpu` makes the device the default and reports each cell's compiles, "
        "executions, transfers and host reads.\n"
        "- `.to(dev)` and `.cpu()` copy; modules must live on the same device as their inputs."),
]

nb = new_notebook(cells=cells, metadata={
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
})
nbformat.write(nb, "notebooks/00_getting_started.ipynb")
