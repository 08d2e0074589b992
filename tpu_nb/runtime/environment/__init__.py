"""The machine, the software and the device: what is installed and wrong (`detect`, without
importing torch_xla), the settings torch_xla latches (`setup`), the device and sync point, the
cell-scoped default device, the pair install, and old tutorials' torch_xla names.

Above errors/units/sources/frame and the backend (the one place torch_xla is imported).
"""

from tpu_nb.runtime.environment._chips import CHIPS, Chip, chip, set_target, target_chip
from tpu_nb.runtime.environment._configure import (
    MAX_CPU_DEVICES,
    chosen_device,
    ensure_setup,
    setup,
    setup_action,
    undo_debug_settings,
)
from tpu_nb.runtime.environment._defaults import default_device
from tpu_nb.runtime.environment._detect import (
    TORCH_PAIR,
    Accelerator,
    Environment,
    Problem,
    chip_generation,
    detect,
    detect_accelerator,
    install_pair,
)
from tpu_nb.runtime.environment._device import device, sync, wait_device_ops
from tpu_nb.runtime.environment._legacy import install as install_legacy_names
from tpu_nb.runtime.environment._legacy import uninstall as uninstall_legacy_names

__all__ = [
    "CHIPS",
    "Chip",
    "chip",
    "detect_accelerator",
    "set_target",
    "target_chip",
    "MAX_CPU_DEVICES",
    "TORCH_PAIR",
    "Accelerator",
    "Environment",
    "Problem",
    "chip_generation",
    "chosen_device",
    "default_device",
    "detect",
    "device",
    "ensure_setup",
    "install_legacy_names",
    "install_pair",
    "setup",
    "setup_action",
    "sync",
    "undo_debug_settings",
    "uninstall_legacy_names",
    "wait_device_ops",
]
