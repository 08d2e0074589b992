"""What machine and software this is, and what is wrong with it — without importing torch_xla;
and `install_pair()`, the fix for a missing or mismatched torch/torch_xla pair.

`detect()` reads environment variables, device files and installed package metadata only, so
it answers before torch_xla is imported and when importing it would crash (a torch that does
not match fails with an undefined `_XLAC` symbol). Every problem carries the exact fix.
"""

from __future__ import annotations

import glob
import logging
import math
import os
import platform as _platform
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from packaging.version import InvalidVersion, Version

from tpu_nb.runtime.backend import TORCH_PAIR, installed_version
from tpu_nb.runtime.backend import current as backend
from tpu_nb.runtime.environment import _private_files as private_files

log = logging.getLogger("tpu_nb.runtime.environment")  # the package, not its private module

# Google's PCI vendor id and the device ids of TPU chips, as torch_xla's own chip count reads
# them from /sys (torch_xla/_internal/tpu.py). v2 and v3 share one id. When tpu-info is
# installed (TPU VMs, Colab's TPU runtime) its table names the chip instead: Google keeps it
# current, and it tells v2 from v3 by the PCI subsystem id.
_GOOGLE_PCI_VENDOR = "0x1ae0"
_TPU_PCI_DEVICES = {
    "0x0027": "v2/v3",
    "0x005e": "v4",
    "0x0063": "v5e",
    "0x0062": "v5p",
    "0x006f": "v6e",
    "0x0076": "7x",
    "0x0056": None,
}

_GPU_NAMES = {"gpu", "cuda", "rocm"}
_VALID_PJRT = {"TPU", "CPU"}


@dataclass(frozen=True)
class Problem:
    """Something that stops or spoils a run, with the exact fix."""

    code: str  # stable identifier, e.g. "version-mismatch"
    severity: str  # "error" blocks running; "warning" spoils it; "info" is worth knowing
    message: str  # what is wrong, one sentence
    fix: str  # the exact thing to do

    def __str__(self) -> str:
        return f"[{self.severity}] {self.message} Fix: {self.fix}"


@dataclass(frozen=True)
class Accelerator:
    """The XLA device this machine offers: a TPU (type, chip count) or the CPU."""

    kind: str  # "tpu" or "cpu"
    tpu_type: str | None = None  # e.g. "v5litepod-8", "v4", when known
    chips: int = 0  # TPU chips on this host (0 on CPU)
    evidence: str = ""  # where we saw it: an env var, /dev/accel*, /dev/vfio, PCI ids

    def __str__(self) -> str:
        if self.kind != "tpu":
            return "CPU (no TPU found)"
        name = f"TPU {self.tpu_type}" if self.tpu_type else "TPU"
        chips = f", {self.chips} chip{'s' if self.chips != 1 else ''}" if self.chips else ""
        return f"{name}{chips} (from {self.evidence})"


@dataclass(frozen=True)
class Environment:
    """The result of `detect()` and `setup()`: platform, accelerator, versions, problems."""

    platform: str  # "colab", "kaggle", "tpu-vm" or "local"
    accelerator: Accelerator
    versions: dict[str, str | None]  # python, torch, torch_xla, libtpu, ipython, ...
    pjrt_device: str | None  # PJRT_DEVICE as set now (None: unset)
    cpu_num_devices: int | None
    torch_xla_imported: bool
    runtime_initialized: bool
    debug_file: str | None  # where compile-cause analysis is written, if on
    problems: tuple[Problem, ...] = ()
    # Filled by setup(): what it changed, and what it could not change and why.
    applied: tuple[str, ...] = ()
    not_applied: tuple[str, ...] = ()
    settings: dict[str, str] = field(default_factory=dict)  # the XLA env vars in effect

    @property
    def blocking(self) -> tuple[Problem, ...]:
        """The problems that stop torch_xla from running at all."""
        return tuple(p for p in self.problems if p.severity == "error")

    @property
    def ok(self) -> bool:
        return not self.blocking

    @property
    def multi_device(self) -> str:
        """Which ways of using several devices work here, and why (see tpu_nb.launch)."""
        if self.accelerator.kind == "tpu":
            return (
                "replicas (one process per chip; collectives work) or SPMD (one process, all chips)"
            )
        return (
            "SPMD over CPU_NUM_DEVICES virtual devices (tpu_setup --devices N); replicas "
            "without collectives only: torch_xla 2.9 hangs on collectives between XLA:CPU "
            "devices (pytorch/xla #5005, #9089), so tpu_nb refuses them"
        )

    def report(self) -> str:
        """The environment report as plain text (what `python -m tpu_nb doctor` prints)."""
        v = self.versions
        lines = [
            "tpu_nb environment",
            f"  platform      {self.platform}",
            f"  accelerator   {self.accelerator}",
            f"  device        {self.pjrt_device or 'unset (tpu_nb.setup() chooses)'}"
            + (f", {self.cpu_num_devices} CPU devices" if self.cpu_num_devices else ""),
            f"  runtime       {'initialized' if self.runtime_initialized else 'not started'}",
            f"  compile log   {self.debug_file or 'off (tpu_nb.setup() turns it on)'}",
            "  versions      " + ", ".join(f"{k} {v[k] or '-'}" for k in v),
            f"  multi-device  {self.multi_device}",
        ]
        lines += [f"  applied       {a}" for a in self.applied]
        lines += [f"  not applied   {n}" for n in self.not_applied]
        if self.problems:
            lines.append(f"problems ({len(self.problems)}):")
            for p in self.problems:
                lines.append(f"  {p.severity.upper():8}{p.message}")
                lines.append(f"  {'':8}fix: {p.fix}")
        else:
            lines.append("no problems found")
        return "\n".join(lines)

    __str__ = report


def _release(version: str | None) -> tuple[int, ...] | None:
    """'2.9.0+cu128' -> (2, 9, 0), '2.10.0rc1' -> (2, 10, 0); None when absent or not a
    PEP 440 version."""
    if not version:
        return None
    try:
        return Version(version).release
    except InvalidVersion:
        return None


def _same_release(a: str, b: str) -> bool:
    """Whether two installed versions are the same major.minor release (torch and torch_xla
    must be). Versions that are not PEP 440 are compared as written."""
    ra, rb = _release(a), _release(b)
    if ra is None or rb is None:
        return a == b
    return ra[:2] == rb[:2]


def _pair_for(xla_version: str) -> str:
    """The torch/torch_xla release matching this torch_xla: '2.9.0+libtpu' -> '2.9.0'."""
    release = _release(xla_version)
    return ".".join(map(str, release)) if release else TORCH_PAIR


def detect_platform(env: os._Environ | dict = os.environ) -> str:
    if "COLAB_RELEASE_TAG" in env or "COLAB_GPU" in env or "google.colab" in sys.modules:
        return "colab"
    if "KAGGLE_KERNEL_RUN_TYPE" in env or "KAGGLE_URL_BASE" in env:
        return "kaggle"
    if env.get("TPU_ACCELERATOR_TYPE") or _tpu_device_files():
        return "tpu-vm"
    return "local"


def _tpu_device_files() -> list[str]:
    return glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _pci_tpu_chips() -> tuple[int, str | None]:
    count, generation = 0, None
    for dev in glob.glob("/sys/bus/pci/devices/*"):
        if _read(f"{dev}/vendor") != _GOOGLE_PCI_VENDOR:
            continue
        device_id = _read(f"{dev}/device")
        if device_id in _TPU_PCI_DEVICES:
            count += 1
            generation = chip_generation(device_id, _read(f"{dev}/subsystem_device"))
    return count, generation


def chip_generation(device_id: str, subsystem_id: str = "") -> str | None:
    """The TPU generation ("v5p", "v4", ...) of a Google PCI device id: tpu-info's table when
    tpu-info is installed, else ours (which cannot tell v2 from v3). None when unknown."""
    try:
        from tpu_info.device import TpuChip
    except Exception as exc:  # not installed; or broken, which must not stop detect()
        if not isinstance(exc, ImportError):
            log.debug("tpu-info failed to import (%r); using tpu_nb's chip table", exc)
        return _TPU_PCI_DEVICES.get(device_id)
    chip = TpuChip.from_pci_device_id(device_id, subsystem_id)
    return chip.value.name if chip is not None else _TPU_PCI_DEVICES.get(device_id)


def detect_accelerator(env: os._Environ | dict = os.environ) -> Accelerator:
    tpu_type = env.get("TPU_ACCELERATOR_TYPE") or None
    files = _tpu_device_files()
    pci_chips, generation = _pci_tpu_chips()
    if files:
        evidence = "/dev/accel*" if files[0].startswith("/dev/accel") else "/dev/vfio"
        return Accelerator("tpu", tpu_type or generation, len(files), evidence)
    if pci_chips:
        return Accelerator("tpu", tpu_type or generation, pci_chips, "PCI device ids")
    if tpu_type:
        return Accelerator("tpu", tpu_type, _chips_from_bounds(env), "TPU_ACCELERATOR_TYPE")
    return Accelerator("cpu")


def _chips_from_bounds(env) -> int:
    bounds = env.get("TPU_CHIPS_PER_HOST_BOUNDS", "")
    try:
        return math.prod(int(b) for b in bounds.split(",")) if bounds else 0
    except ValueError:
        return 0


def _versions() -> dict[str, str | None]:
    libtpu = installed_version("libtpu") or installed_version("libtpu-nightly")
    return {
        "python": _platform.python_version(),
        "torch": installed_version("torch"),
        "torch_xla": installed_version("torch_xla") or installed_version("torch-xla"),
        "libtpu": libtpu,
        "ipython": installed_version("ipython"),
        "ipykernel": installed_version("ipykernel"),
        "ipywidgets": installed_version("ipywidgets"),
    }


def pair_install_command(release: str = TORCH_PAIR, tpu: bool = False) -> list[str]:
    """The pip command (as an argument list) that installs a matching torch/torch_xla pair."""
    xla = f"torch-xla[tpu]=={release}" if tpu else f"torch-xla=={release}"
    return [sys.executable, "-m", "pip", "install", f"torch=={release}", xla]


def install_pair(
    *, tpu: bool | None = None, dry_run: bool = False, stream: Callable[[str], None] = print
) -> tuple[int, bool]:
    """pip-install torch and torch_xla at the pinned pair (with `[tpu]` on TPU hosts), in a
    subprocess, streaming its output.

    pip runs with an argument list, never a shell string. Returns (pip's exit status,
    whether the runtime must be restarted: torch was already imported in this process).
    """
    if tpu is None:
        tpu = detect_accelerator().kind == "tpu"
    command = pair_install_command(TORCH_PAIR, tpu=tpu)
    if dry_run:
        command.append("--dry-run")
    stream("$ " + " ".join(command[2:]))
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        stream(line.rstrip("\n"))
    status = proc.wait()
    restart = "torch" in sys.modules and not dry_run
    return status, restart


def _pip_text(release: str, tpu: bool) -> str:
    """The same command as typed in a shell: pip install torch==2.9.0 'torch-xla[tpu]==2.9.0'."""
    return "pip " + shlex.join(pair_install_command(release, tpu)[3:])


def runtime_initialized() -> bool:
    """Whether this process has started the XLA runtime (never starts it, never imports it)."""
    return backend().process.started()


def _problems(versions, accelerator, env) -> Iterator[Problem]:
    tpu = accelerator.kind == "tpu"
    torch_v, xla_v = versions["torch"], versions["torch_xla"]
    if torch_v is None:
        yield Problem(
            "torch-missing", "error", "torch is not installed.", _pip_text(TORCH_PAIR, tpu)
        )
    if xla_v is None:
        yield Problem(
            "torch-xla-missing", "error", "torch_xla is not installed.", _pip_text(TORCH_PAIR, tpu)
        )
    elif torch_v is not None and not _same_release(torch_v, xla_v):
        pair = _pair_for(xla_v)
        yield Problem(
            "version-mismatch",
            "error",
            f"torch {torch_v} does not match torch_xla {xla_v}: importing torch_xla will fail "
            "with an undefined _XLAC symbol (the torch_xla wheel does not pin torch).",
            _pip_text(pair, tpu) + " (then restart the runtime)",
        )
    if xla_v is not None and tpu and versions["libtpu"] is None:
        yield Problem(
            "libtpu-missing",
            "error",
            "This host has a TPU but libtpu is not installed.",
            _pip_text(_pair_for(xla_v), True),
        )
    if xla_v is not None and installed_version("tensorflow") is not None:
        yield Problem(
            "tensorflow-installed",
            "error" if tpu else "warning",
            f"The full tensorflow {installed_version('tensorflow')} is installed next to "
            "torch_xla; on a TPU it claims the device and its bundled libraries conflict with "
            "torch_xla's.",
            "pip uninstall -y tensorflow (install tensorflow-cpu if you still need TensorFlow)",
        )
    if env.get("XLA_USE_BF16"):
        yield Problem(
            "xla-use-bf16",
            "warning",
            "XLA_USE_BF16 is set; it is deprecated in torch_xla 2.9 and silently changes every "
            "float32 tensor to bfloat16.",
            "unset XLA_USE_BF16 and convert explicitly: model.to(torch.bfloat16), or "
            "torch.autocast('xla', dtype=torch.bfloat16)",
        )
    pjrt = env.get("PJRT_DEVICE")
    if pjrt and pjrt.lower() in _GPU_NAMES:
        yield Problem(
            "xla-gpu",
            "error",
            f"PJRT_DEVICE={pjrt} asks for XLA:GPU, which torch_xla 2.9 no longer includes "
            '("No PjRtPlugin registered for: CUDA").',
            "set PJRT_DEVICE=TPU or PJRT_DEVICE=CPU (tpu_nb.setup('cpu')); for an NVIDIA GPU "
            "use plain PyTorch with device='cuda'",
        )
    elif pjrt and pjrt.upper() not in _VALID_PJRT:
        yield Problem(
            "pjrt-device-unknown",
            "error",
            f"PJRT_DEVICE={pjrt} is not a device torch_xla 2.9 knows.",
            "set PJRT_DEVICE=TPU or PJRT_DEVICE=CPU (or call tpu_nb.setup())",
        )
    elif pjrt and pjrt.upper() == "TPU" and not tpu:
        yield Problem(
            "no-tpu",
            "error",
            "PJRT_DEVICE=TPU but this machine has no TPU.",
            "use tpu_nb.setup('cpu') (or PJRT_DEVICE=CPU), or switch the notebook to a TPU runtime",
        )
    if runtime_initialized():
        yield Problem(
            "runtime-initialized",
            "info",
            "The XLA runtime is already running in this process: the device, the number of "
            "CPU devices and debug settings can no longer change.",
            "restart the runtime (kernel) and call tpu_nb.setup() before using the device",
        )


_XLA_VARS = (
    "PJRT_DEVICE",
    "CPU_NUM_DEVICES",
    "PT_XLA_DEBUG_LEVEL",
    "PT_XLA_DEBUG_FILE",
    "XLA_IR_DEBUG",
    "XLA_HLO_DEBUG",
    "XLA_USE_BF16",
    "XLA_PERSISTENT_CACHE_PATH",
)


def detect(*, check_import: bool = False) -> Environment:
    """Describe this machine, its torch/torch_xla install and what is wrong with it.

    Never imports torch_xla. With `check_import=True`, also tries `import torch_xla` in a
    subprocess (a few seconds) and reports a failure with its explanation.
    """
    env = backend().process.settings()  # with PT_XLA_DEBUG_* kept from child processes
    versions = _versions()
    accelerator = detect_accelerator(env)
    problems = list(_problems(versions, accelerator, env))
    known = any(p.code in ("version-mismatch", "torch-missing") for p in problems)
    if check_import and versions["torch_xla"] and not known and (failure := _import_failure()):
        problems.append(failure)
    try:
        cpu_devices = int(env["CPU_NUM_DEVICES"]) if env.get("CPU_NUM_DEVICES") else None
    except ValueError:
        cpu_devices = None
    debug_file = env.get("PT_XLA_DEBUG_FILE") if env.get("PT_XLA_DEBUG_LEVEL") else None
    if debug_file:  # the file's name, not the descriptor torch_xla is given
        debug_file = private_files.log_name(debug_file)
    return Environment(
        platform=detect_platform(env),
        accelerator=accelerator,
        versions=versions,
        pjrt_device=env.get("PJRT_DEVICE"),
        cpu_num_devices=cpu_devices,
        torch_xla_imported=backend().process.is_loaded(),
        runtime_initialized=runtime_initialized(),
        debug_file=debug_file,
        problems=tuple(problems),
        settings={k: env[k] for k in _XLA_VARS if k in env},
    )


def _import_failure() -> Problem | None:
    """Import torch_xla in a child process; explain the failure if it does not import."""
    code = "import torch, torch_xla"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PJRT_DEVICE": "CPU"},
        )
    except subprocess.TimeoutExpired:
        return Problem(
            "import-hangs",
            "error",
            "import torch_xla did not finish in 120 s.",
            "reinstall the pair: " + _pip_text(TORCH_PAIR, False),
        )
    if proc.returncode == 0:
        return None
    last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
    if "undefined symbol" in last:
        return Problem(
            "version-mismatch",
            "error",
            "import torch_xla fails with an undefined _XLAC symbol: torch and "
            "torch_xla were built for different releases.",
            _pip_text(TORCH_PAIR, False) + " (then restart the runtime)",
        )
    return Problem(
        "import-fails",
        "error",
        f"import torch_xla fails: {last}",
        "reinstall the pair: " + _pip_text(TORCH_PAIR, False),
    )
