"""The one place torch_xla is imported, lazily, failures explained instead of raw tracebacks."""

from __future__ import annotations

import os
import sys

from tpu_nb.runtime.environment._detect import TORCH_PAIR, installed_version
from tpu_nb.runtime.errors import EnvironmentProblem


def xla():
    """Return the `torch_xla` module, importing it on first use.

    A torch that does not match torch_xla fails inside the import with an undefined `_XLAC`
    symbol; XLA:GPU requests fail later with a PJRT plugin error. Both become a TpuNbError that
    names the fix.
    """
    module = sys.modules.get("torch_xla")
    if module is not None and hasattr(module, "_XLAC"):
        return module
    _refuse_gpu()
    try:
        import torch_xla
    except ImportError as exc:  # undefined symbol, missing package, broken install
        raise EnvironmentProblem(_explain_import_error(exc)) from None
    return torch_xla


def xlac():
    """The `torch_xla._XLAC` extension module (counters, metrics, graph dumps)."""
    return xla()._XLAC


def _refuse_gpu() -> None:
    pjrt = os.environ.get("PJRT_DEVICE", "")
    if pjrt.lower() in ("gpu", "cuda", "rocm"):
        raise EnvironmentProblem(
            f"PJRT_DEVICE={pjrt} asks for XLA:GPU, which torch_xla 2.9 no longer includes. "
            "Fix: tpu_nb.setup('cpu') (or 'tpu' on a TPU host); for an NVIDIA GPU use plain "
            "PyTorch with device='cuda'."
        )


def _explain_import_error(exc: ImportError) -> str:

    text = str(exc)
    pair = f"pip install torch=={TORCH_PAIR} torch-xla=={TORCH_PAIR}"
    if "undefined symbol" in text:
        return (
            f"torch_xla {installed_version('torch_xla')} cannot load with torch "
            f"{installed_version('torch')}: they were built for different releases. "
            f"Fix: {pair}, then restart the runtime."
        )
    if installed_version("torch_xla") is None:
        return f"torch_xla is not installed. Fix: {pair}"
    return f"import torch_xla failed ({text}). Fix: reinstall the pair: {pair}"


def wait_device_ops() -> None:
    """Block until every launched execution has finished (so ExecuteTime is recorded)."""
    import torch_xla.core.xla_model as xm

    xm.wait_device_ops()
