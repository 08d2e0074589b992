"""Import matplotlib (and the dashboard's charts built on it) so that an interrupt cannot break it.

matplotlib takes about half a second to import, typically inside the first `--live` cell. A
KeyboardInterrupt in the middle leaves its already-executed submodules in `sys.modules`, bound
to a `matplotlib` package that was never finished (and then removed): every later import fails
(`module 'matplotlib' has no attribute 'get_data_path'`, `KeyError: 'Collection:kwdoc'`) until
the kernel restarts. So the import runs with the interrupt held back until it is complete (then
raised), and a half-import left by anyone else is purged and redone.

Every import of matplotlib in tpu_nb goes through here (`import_charts()`, `import_mpl(name)`);
tests/test_interrupts.py checks that no other module imports it or the charts directly.
"""

from __future__ import annotations

import importlib
import signal
import sys
import threading
from contextlib import contextmanager
from types import ModuleType

_PACKAGES = ("matplotlib", "mpl_toolkits")
_CHARTS = "tpu_nb.display.charts"


def import_charts() -> ModuleType:
    """`tpu_nb.display.charts`, imported whole even if the user interrupts meanwhile (the
    interrupt is raised once the import is complete) and re-imported cleanly if an earlier
    matplotlib import was cut short."""
    return import_mpl(_CHARTS)


def import_mpl(name: str) -> ModuleType:
    """A matplotlib module (e.g. "matplotlib.figure"), or one built on matplotlib, imported
    as `import_charts()` imports the charts."""
    module = sys.modules.get(name)
    if module is not None and not half_imported():
        return module
    with interrupt_after():
        if half_imported():
            purge()
        try:
            return importlib.import_module(name)
        except Exception:  # a half-import that left no orphans to recognise it by
            purge()
            return importlib.import_module(name)


def half_imported() -> bool:
    """True when matplotlib submodules are loaded but the package itself is not (what an
    interrupted import leaves), or the package lacks what its import defines last."""
    package = sys.modules.get("matplotlib")
    if package is None:
        return any(name.startswith("matplotlib.") for name in list(sys.modules))
    return not hasattr(package, "get_data_path") or not hasattr(package, "rcParams")


def purge() -> None:
    """Forget every matplotlib module (and the charts built on them) so the next import starts
    from scratch. Modules keep working for whoever still holds them."""
    for name in list(sys.modules):
        if name == _CHARTS or name.split(".")[0] in _PACKAGES:
            del sys.modules[name]


@contextmanager
def interrupt_after():
    """Hold a Ctrl-C / kernel interrupt (SIGINT) back until the block ends, then deliver it to
    the handler that was in place (Python's raises KeyboardInterrupt).

    Only the main thread receives signals; elsewhere the block runs as is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        if callable(previous):
            previous(signal.SIGINT, None)  # a handler's frame may be None
        elif previous == signal.SIG_DFL:
            signal.raise_signal(signal.SIGINT)
