"""Execute notebooks on XLA:CPU and store their outputs: the reference nbval compares with.

    python tools/record_outputs.py notebooks/00_getting_started.ipynb [...]

Run it after changing a notebook or tpu_nb's output, then review the diff.
"""

import os
import sys

import nbformat
from nbclient import NotebookClient

os.environ.setdefault("PJRT_DEVICE", "CPU")
for path in sys.argv[1:]:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": os.path.dirname(path)}},
    ).execute()
    for cell in nb.cells:
        cell.get("metadata", {}).pop("execution", None)
    nbformat.write(nb, path)
    print("recorded", path)
