"""Run a notebook headless on XLA:CPU and print its per-cell XLA report (the README's main job).

    python tools/run_notebook.py notebooks/00_getting_started.ipynb [--save OUT.ipynb]

The notebook loads tpu_nb itself (`%load_ext tpu_nb`); after its last cell this runs
`%xla_metrics --cells` in the same kernel and prints the table: what each cell compiled,
executed and transferred, its device->host reads and CPU fallbacks.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def _text(outputs) -> str:
    parts = []
    for out in outputs:
        if out.get("output_type") == "stream":
            parts.append(out["text"])
        elif "data" in out and "text/plain" in out["data"]:
            parts.append(out["data"]["text/plain"])
    return "".join(parts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook")
    parser.add_argument("--save", help="write the executed notebook here")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = parser.parse_args(argv)
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    nb = nbformat.read(args.notebook, as_version=4)
    report_cell = nbformat.v4.new_code_cell("%xla_metrics --cells")
    nb.cells.append(report_cell)
    client = NotebookClient(
        nb,
        timeout=args.timeout,
        kernel_name="python3",
        resources={"metadata": {"path": os.path.dirname(args.notebook) or "."}},
    )
    start = time.perf_counter()
    failed = None
    try:
        client.execute()
    except CellExecutionError as exc:
        failed = exc
    seconds = time.perf_counter() - start
    nb.cells.pop()  # the report cell is not part of the notebook
    if args.save:
        nbformat.write(nb, args.save)
    print(
        f"{args.notebook}: {len(nb.cells)} cells in {seconds:.1f} s on {os.environ['PJRT_DEVICE']}"
    )
    if failed is not None:
        print(f"FAILED:\n{failed}")
        return 1
    print("per-cell XLA report:")
    print(_text(report_cell.get("outputs", [])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
