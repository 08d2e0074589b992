"""tpu_nb: PyTorch on XLA devices (Cloud TPU, XLA:CPU), made visible in Jupyter and Colab.

    import tpu_nb
    tpu_nb.setup()                 # device, compile-cause analysis: before the first compile
    with tpu_nb.track("step") as report:
        ...                        # XLA work
    print(report)                  # what compiled, why, from which line; what ran; the cost

In a notebook: `%load_ext tpu_nb`, then `%tpu_setup` and `%%on_tpu` cells.
Importing tpu_nb imports neither torch_xla nor IPython: both load when first needed, and the
display layer's names — the live dashboard (`tpu_nb.dashboard`, `tpu_nb.Dashboard`: ipywidgets,
matplotlib) and the graph view (`tpu_nb.GraphView`) — load on first use.

Errors: every exception tpu_nb raises on purpose is a `TpuNbError` (one line: what is wrong,
then "Fix: ..."); `TpuNbUsageError`, `EnvironmentProblem` and `RuntimeStateError` say which
kind (tpu_nb.runtime.errors).
"""

from typing import TYPE_CHECKING

from tpu_nb import runtime
from tpu_nb._version import __version__
from tpu_nb.runtime import *  # noqa: F403  (the library's public names: runtime.__all__)

if TYPE_CHECKING:  # for type checkers and IDEs; at run time they load on first use (_LAZY)
    from tpu_nb.display.dashboard import Dashboard, dashboard
    from tpu_nb.display.graph_view import GraphView

# One list: the library's names plus the display layer's and the version.
__all__ = ["Dashboard", "GraphView", "__version__", "dashboard"]
__all__ += runtime.__all__

# The display layer's names, imported on first use: `import tpu_nb` stays free of ipywidgets
# and matplotlib.
_LAZY = {
    "Dashboard": "tpu_nb.display.dashboard",
    "dashboard": "tpu_nb.display.dashboard",
    "GraphView": "tpu_nb.display.graph_view",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tpu_nb' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def load_ipython_extension(ipython):
    """`%load_ext tpu_nb`: imported lazily so `import tpu_nb` never pulls in IPython."""
    from tpu_nb.ipython import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):
    from tpu_nb.ipython import unload_ipython_extension as unload

    unload(ipython)
