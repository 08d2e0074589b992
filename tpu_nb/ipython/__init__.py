"""tpu_nb.ipython: the IPython extension (`%load_ext tpu_nb`).

Thin: each magic parses its arguments, calls a public runtime/display function and shows the
result. Loading imports neither torch nor torch_xla; they load with the first XLA work.
"""

from __future__ import annotations

from tpu_nb.ipython.extension import load_ipython_extension, unload_ipython_extension

__all__ = ["load_ipython_extension", "unload_ipython_extension"]
