"""The TPU a run is judged for: a table of chips (peak bf16 FLOP/s, HBM, HBM bandwidth) and
the target — the chip this process runs on when it is a TPU, else the chip the user names
(`setup(target=...)`, v5e by default: Colab's free TPU).

Figures are per chip, from the Cloud TPU system architecture pages (`Chip.source`). TPU7x
shows two devices per chip, so one XLA device has half of each figure (`per_device`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from tpu_nb.runtime.errors import TpuNbUsageError

log = logging.getLogger("tpu_nb.runtime.environment")

GiB = 2**30
GB = 10**9
_FIGURES = ("peak_flops", "hbm_bytes", "hbm_bandwidth")  # per chip; a device has its share


@dataclass(frozen=True)
class Chip:
    """One TPU chip's peak bf16 FLOP/s, HBM bytes and HBM bytes per second; `devices`: the
    XLA devices torch_xla shows per chip. Describe a chip the table lacks with your own
    figures: `Chip("mine", peak_flops=100e12, hbm_bytes=8e9, hbm_bandwidth=500e9)`."""

    name: str
    peak_flops: float
    hbm_bytes: float
    hbm_bandwidth: float
    devices: int = 1
    source: str = ""

    def __post_init__(self) -> None:
        for what in _FIGURES:
            value = getattr(self, what)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise TpuNbUsageError(
                    f"Chip {what}={value!r} is not a positive number. Fix: give it in "
                    "FLOP/s or bytes, e.g. Chip('mine', peak_flops=100e12, hbm_bytes=8e9, "
                    "hbm_bandwidth=500e9)."
                )
        if not isinstance(self.devices, int) or self.devices < 1:
            raise TpuNbUsageError(
                f"Chip devices={self.devices!r} is not a whole number >= 1. Fix: the XLA "
                "devices one chip shows, e.g. devices=2 for TPU7x."
            )

    def per_device(self) -> Chip:
        """The share of one XLA device (a TPU7x chip shows two)."""
        if self.devices == 1:
            return self
        shares = {what: getattr(self, what) / self.devices for what in _FIGURES}
        return replace(self, name=f"{self.name} device", devices=1, **shares)


_DOCS = "https://cloud.google.com/tpu/docs/"
CHIPS: dict[str, Chip] = {
    "v4": Chip("v4", 275e12, 32 * GiB, 1200 * GB, source=_DOCS + "v4"),
    "v5e": Chip("v5e", 197e12, 16 * GB, 819 * GB, source=_DOCS + "v5e"),
    "v5p": Chip("v5p", 459e12, 95 * GiB, 2765 * GB, source=_DOCS + "v5p"),
    "v6e": Chip("v6e", 918e12, 32 * GB, 1638 * GB, source=_DOCS + "v6e"),
    "TPU7x": Chip("TPU7x", 2307e12, 192 * GiB, 7380 * GB, devices=2, source=_DOCS + "tpu7x"),
}
DEFAULT_TARGET = "v5e"  # Colab's free TPU
# Other spellings: accelerator types (v5litepod-8), tpu-info's and the PCI table's names.
_ALIASES = {
    "v5litepod": "v5e",
    "v5lite": "v5e",
    "v5 lite": "v5e",
    "v6lite": "v6e",
    "v6 lite": "v6e",
    "7x": "TPU7x",
    "v7x": "TPU7x",
}


def chip(name: str) -> Chip | None:
    """The table's chip for a name: "v5e", "v5litepod-8", "TPU v6e", "tpu7x"; else None."""
    key = name.strip().lower().removeprefix("tpu ").split("-")[0].strip()
    key = _ALIASES.get(key, key).lower()
    return next((found for known, found in CHIPS.items() if known.lower() == key), None)


def check_target(target: str | Chip) -> Chip:
    """A chip from what the user gave (`setup(target=...)`, `%tpu_setup --target`)."""
    if isinstance(target, Chip):
        return target
    found = chip(target) if isinstance(target, str) else None
    if found is None:
        raise TpuNbUsageError(
            f"unknown target chip {target!r}. Fix: one of {', '.join(CHIPS)}, or describe "
            "yours with tpu_nb.Chip(name, peak_flops=..., hbm_bytes=..., hbm_bandwidth=...)."
        )
    return found


_target: Chip | None = None


def set_target(target: str | Chip | None) -> Chip | None:
    """Judge runs for `target` from now on (None: back to the default)."""
    global _target
    _target = None if target is None else check_target(target)
    return _target


def target_chip(device_kind: str = "", accelerator_type: str | None = None) -> tuple[Chip, bool]:
    """(the chip runs are judged for, whether it is the chip they run on).

    On a TPU (`device_kind` "TPU") it is the device's own chip, read from the accelerator
    type; elsewhere the target set by `setup(target=...)`, else v5e."""
    if device_kind.upper() == "TPU":
        own = chip(accelerator_type) if accelerator_type else None
        if own is not None:
            return own, True
        log.debug("TPU chip %r not in the table; judging for the target", accelerator_type)
    return (_target or CHIPS[DEFAULT_TARGET]), False
