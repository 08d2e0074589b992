"""Shared by tools/make_notebook_NN.py: cell helpers and the cells every notebook starts with.

Each make_notebook_NN.py writes one notebook of the series (sources only); then
tools/record_outputs.py executes it on XLA:CPU and stores the outputs nbval compares against:

    python tools/make_notebook_01.py
    PYTHONPATH=$PWD PJRT_DEVICE=CPU python tools/record_outputs.py notebooks/01_modules_and_autograd.ipynb
"""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
# The repository the Colab and Binder badges point at (a placeholder owner until it is public).
REPOSITORY = "tpu-nb/tpu_nb"


def md(text: str):
    return new_markdown_cell(dedent(text).strip())


def code(text: str, *tags: str):
    """A code cell; tags such as "raises-exception" (nbval and nbclient expect the error)."""
    cell = new_code_cell(dedent(text).strip())
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def install_cell():
    """First code cell of every notebook: tpu_nb is not installed on Colab or a fresh machine."""
    return code(f"""
        # tpu_nb is the toolkit this series uses. Colab and fresh machines do not have it yet:
        # install it from its repository (it pins torch 2.9.0 + torch_xla 2.9.0, which it needs).
        try:
            import tpu_nb
        except ImportError:
            %pip install --quiet "tpu_nb @ git+https://github.com/{REPOSITORY}"
    """)


def setup_cells(setup_line: str = "%tpu_setup", why: str | None = None):
    """The markdown explaining the set-up, then `%load_ext tpu_nb` and the `%tpu_setup` line."""
    text = why or """
        ## Set-up

        `%load_ext tpu_nb` registers the magics, and `%tpu_setup` picks the device (a TPU if
        there is one, else the CPU) and switches on compile-cause analysis. As always, it runs
        before anything touches the device: torch_xla reads its settings once per process.
    """
    return [install_cell(), md(text), code("%load_ext tpu_nb"), code(setup_line)]


def write(name: str, cells: list) -> Path:
    nb = new_notebook(cells=cells, metadata={
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    })
    path = NOTEBOOKS / f"{name}.ipynb"
    nbformat.write(nb, path)
    print("wrote", path)
    return path
