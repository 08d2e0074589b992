"""Help for code copied from old tutorials: names torch_xla 2.9 removed or renamed.

The code people copy (Colab and Kaggle posts, the "PyTorch on TPUs" guide, env-setup.py)
uses XRT-era names. `install()` (done by `%load_ext tpu_nb`) makes an AttributeError on a
removed name say its exact replacement, and gives `xmp.spawn`'s notebook failures ("Runtime is
already initialized", "Unsupported nprocs") a note pointing to `%%on_tpu --replicas` and
`tpu_nb.launch`. Nothing else changes: existing names resolve as before (the module-level
`__getattr__` only runs for names the module does not have), and `uninstall()` removes it all.
The tables are tested against the installed torch_xla (tests/test_legacy.py).
"""

from __future__ import annotations

import functools
import importlib.abc
import sys
from typing import Any

from tpu_nb.runtime.probe import Hooks, Subscription, probe

XM = "torch_xla.core.xla_model"
XMP = "torch_xla.distributed.xla_multiprocessing"

# Removed from torch_xla (AttributeError today) -> the exact replacement.
REMOVED: dict[tuple[str, str], str] = {
    (XM, "xrt_world_size"): "torch_xla.runtime.world_size()",
    (XM, "get_ordinal"): "torch_xla.runtime.global_ordinal()",
}
# Still present but deprecated in 2.9 -> what to write instead (taught by the tutorials).
DEPRECATED: dict[tuple[str, str], str] = {
    (XM, "xla_device"): "torch_xla.device()",
    (XM, "mark_step"): "torch_xla.sync()",
    (XM, "get_local_ordinal"): "torch_xla.runtime.local_ordinal()",
    (XM, "is_master_ordinal"): "torch_xla.runtime.global_ordinal() == 0",
    (XM, "xla_device_hw"): "torch_xla.runtime.device_type()",
}
SPAWN_NOTE = (
    "tpu_nb: from a notebook, run a cell once per device with `%%on_tpu --replicas` "
    "or call `tpu_nb.launch(fn, *args)`: they fork before the kernel touches XLA, or "
    "use a fresh worker process after, so neither fails this way"
)
# torch_xla's words when spawn is refused: "Unsupported nprocs ...", and "Runtime is already
# initialized ..." (the second phrase is enough to match it)
_SPAWN_FAILURES = ("Unsupported nprocs", "already initialized")


def _module_getattr(module_name: str):
    def __getattr__(name: str) -> Any:
        new = REMOVED.get((module_name, name))
        message = f"module {module_name!r} has no attribute {name!r}"
        if new is not None:
            message += f": it was removed from torch_xla (XRT-era API). Use {new} instead (tpu_nb)"
        raise AttributeError(message, name=name, obj=sys.modules.get(module_name))

    __getattr__.__tpu_nb_legacy__ = True  # type: ignore[attr-defined]
    return __getattr__


def _spawn_with_note(spawn):
    @functools.wraps(spawn)
    def wrapped(*args, **kwargs):
        try:
            return spawn(*args, **kwargs)
        except Exception as exc:
            if any(text in str(exc) for text in _SPAWN_FAILURES):
                _add_note(exc, SPAWN_NOTE)
            raise

    wrapped.__tpu_nb_legacy__ = True
    wrapped.__tpu_nb_original__ = spawn
    return wrapped


def _add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):  # Python >= 3.11
        exc.add_note(note)
    # IPython 7 (Colab) does not print notes: put it in the message too.
    if len(exc.args) == 1 and isinstance(exc.args[0], str) and note not in exc.args[0]:
        exc.args = (f"{exc.args[0]}\n{note}",)


def _patch(module) -> None:
    name = getattr(module, "__name__", "")
    if name == XM and "__getattr__" not in vars(module):
        module.__getattr__ = _module_getattr(XM)
    elif name == XMP:
        spawn = getattr(module, "spawn", None)
        if spawn is not None and not getattr(spawn, "__tpu_nb_legacy__", False):
            module.spawn = _spawn_with_note(spawn)


def _unpatch(module) -> None:
    if module is None:
        return
    hook = vars(module).get("__getattr__")
    if getattr(hook, "__tpu_nb_legacy__", False):
        del module.__getattr__
    spawn = vars(module).get("spawn")
    if getattr(spawn, "__tpu_nb_legacy__", False):
        module.spawn = spawn.__tpu_nb_original__


class _Finder(importlib.abc.MetaPathFinder):
    """Patches the two modules when they are imported after `install()`."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in (XM, XMP):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _Loader(spec.loader)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        _patch(module)


_finder = _Finder()


def _install(hooks: Hooks) -> None:
    """The probe's "legacy-names" kind: the finder, and the two modules if already imported
    (one imported later is patched by the finder's loader; both undone together)."""
    sys.meta_path.insert(0, _finder)
    hooks.undo(_remove, "legacy-names finder")
    for name in (XM, XMP):
        if name in sys.modules:
            _patch(sys.modules[name])


def _remove() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    for name in (XM, XMP):
        _unpatch(sys.modules.get(name))


probe().define("legacy-names", _install)
_held: list[Subscription] = []  # the extension's, while it is loaded


def install() -> None:
    """Notes on removed names and on xmp.spawn failures (see the module docstring)."""
    if not _held:
        _held.append(probe().subscribe(_finder, ("legacy-names",), of_run=False))


def uninstall() -> None:
    while _held:
        _held.pop().close()
