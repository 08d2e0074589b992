"""`setup()`: choose the device and switch on what tpu_nb reads, before torch_xla latches it.

torch_xla reads its settings once, at different moments (checked on torch_xla 2.9):
  - XLA_IR_DEBUG ......................... when torch_xla is imported (then _set_ir_debug)
  - XLA_HLO_DEBUG ........................ at each lowering (any time)
  - PJRT_DEVICE / CPU_NUM_DEVICES ........ when the runtime starts (first device use)
  - the persistent compile cache ......... when the runtime starts
  - XLA_METRICS_SAMPLES .................. when the first metric is recorded
  - PT_XLA_DEBUG_LEVEL / _FILE ........... at the first compile
`setup()` validates everything first, then sets only what can still take effect, and names
what cannot and why. Calling it again with the same arguments changes nothing.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Literal

from tpu_nb.runtime.backend import current as backend
from tpu_nb.runtime.environment import _private_files as private_files
from tpu_nb.runtime.environment._chips import Chip, check_target, set_target
from tpu_nb.runtime.environment._detect import (
    Environment,
    detect,
    detect_accelerator,
    runtime_initialized,
)
from tpu_nb.runtime.errors import EnvironmentProblem, TpuNbUsageError, check_whole_number

# The most virtual XLA:CPU devices tpu_nb asks for (setup's num_devices, %tpu_setup --devices,
# launch/--replicas/--spmd device counts). 256 start in ~4 s and ~1 GB, like 4; a typo such as
# 100000000000 would otherwise eat all memory before the first cell could be interrupted.
MAX_CPU_DEVICES = 256
DEVICES = ("auto", "tpu", "cpu")
# Samples kept per metric: enough for percentiles of recent steps, while a metric read (a copy
# of the buffer) stays ~2 µs instead of ~38 µs at torch_xla's default of 1,024.
METRICS_SAMPLES = "128"
SetupAction = Literal["setup", "install", "check"]  # what a %tpu_setup asks for


def _check_device(device: str, accelerator) -> str:
    if not isinstance(device, str):
        raise TpuNbUsageError(
            f"device must be one of {', '.join(map(repr, DEVICES))}; got "
            f"{device!r}. Fix: device='auto' (a TPU if there is one, else the "
            f"CPU), or 'tpu' or 'cpu'."
        )
    name = device.strip().lower()
    if name in ("gpu", "cuda", "rocm"):
        raise EnvironmentProblem(
            f"device={device!r}: XLA:GPU was removed from torch_xla 2.9. Fix: use "
            "device='tpu' on a TPU host or device='cpu' anywhere; for an NVIDIA GPU use plain "
            "PyTorch with device='cuda' (no tpu_nb.setup needed)."
        )
    if name not in DEVICES:
        raise TpuNbUsageError(
            f"unknown device {device!r}. Fix: use one of {', '.join(map(repr, DEVICES))}."
        )
    if name == "auto":
        # A PJRT_DEVICE the user (or the platform) set is a choice, not a guess to override:
        # a TPU VM host told PJRT_DEVICE=CPU runs on its CPU.
        explicit = os.environ.get("PJRT_DEVICE", "").strip().lower()
        if explicit == "cpu":
            return "cpu"
        if explicit != "tpu":
            return "tpu" if accelerator.kind == "tpu" else "cpu"
        name = "tpu"
    if name == "tpu" and accelerator.kind != "tpu":
        asked, fix = ("device='tpu'", "use device='cpu' (or 'auto')")
        if device.strip().lower() == "auto":
            asked, fix = (
                "PJRT_DEVICE=TPU is set",
                "unset PJRT_DEVICE, or choose the CPU with device='cpu'",
            )
        raise EnvironmentProblem(
            f"{asked} but this machine has no TPU (no TPU_ACCELERATOR_TYPE, /dev/accel* or "
            f"/dev/vfio). Fix: {fix}, or switch the notebook to a TPU runtime."
        )
    return name


def _check_num_devices(num_devices, device: str) -> int | None:
    if num_devices is None:
        return None
    check_whole_number(num_devices, "num_devices", high=MAX_CPU_DEVICES, fix="e.g. num_devices=4")
    if device != "cpu":
        raise TpuNbUsageError(
            "num_devices sets the number of virtual XLA:CPU devices; a TPU host "
            "uses all of its chips. Fix: drop num_devices, or use device='cpu'."
        )
    return num_devices


def _check_inherited_devices(device: str, started: bool) -> None:
    """A CPU_NUM_DEVICES already in the environment is held to the bound --devices is: a
    typo such as 100000000000 would eat all memory at the first device use."""
    value = os.environ.get("CPU_NUM_DEVICES")
    if device != "cpu" or started or value is None:
        return
    text = value.strip()
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= MAX_CPU_DEVICES):
        raise EnvironmentProblem(
            f"CPU_NUM_DEVICES={value!r} in the environment is not a device count from 1 to "
            f"{MAX_CPU_DEVICES}. Fix: num_devices=4 (%tpu_setup --devices 4) to override it, "
            "or remove it (del os.environ['CPU_NUM_DEVICES']) for one device."
        )


def _check_options(**flags) -> None:
    debug_file = flags.pop("debug_file")
    fix = "Fix: e.g. debug_file='/tmp/compile-analysis.log', or leave it out."
    if debug_file is not None and not isinstance(debug_file, (str, os.PathLike)):
        raise TpuNbUsageError(f"debug_file must be a file path; got {debug_file!r}. {fix}")
    if debug_file is not None:
        _expand_home(os.fspath(debug_file), "debug_file", fix)
    for name, value in flags.items():
        if not isinstance(value, bool) and not (name == "hlo_debug" and value is None):
            raise TpuNbUsageError(
                f"{name} must be True or False; got {value!r}. Fix: e.g. {name}=True."
            )


def _check_cache_dir(cache_dir) -> str | None:
    """The compile cache directory as an absolute path (`~` expanded), checked before anything
    is changed: an existing file, an unwritable place or /proc would fail only later."""
    if cache_dir is None:
        return None
    raw = os.fspath(cache_dir) if isinstance(cache_dir, (str, os.PathLike)) else None
    if not isinstance(raw, str) or not raw.strip() or "\0" in raw:
        raise TpuNbUsageError(
            f"cache_dir must be a directory path; got {cache_dir!r}. Fix: e.g. "
            "cache_dir='~/.cache/xla' (created if missing)."
        )
    fix = "Fix: choose a directory of yours, e.g. cache_dir='~/.cache/xla'."
    path = os.path.abspath(_expand_home(raw, "the compile cache", fix))
    existing = path
    while not os.path.exists(existing):  # the nearest part of the path that exists
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        what = "is a file" if existing == path else f"is inside a file ({existing})"
        raise TpuNbUsageError(f"the compile cache {path} {what}, not a directory. {fix}")
    top = "/" + existing.strip("/").split("/")[0]
    if top in ("/proc", "/sys", "/dev"):  # root may "write" there, yet nothing is created
        raise TpuNbUsageError(
            f"the compile cache {path} is in {top}, a kernel file system, not a "
            f"place for files. {fix}"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise EnvironmentProblem(
            f"the compile cache {path} cannot be "
            f"{'written' if existing == path else 'created'}: {existing} is not "
            f"writable by you. {fix}"
        )
    return path


def _expand_home(raw: str, what: str, fix: str) -> str:
    """`~` or `~user` expanded; an unknown user is refused (os.path.expanduser would leave the
    path as it is, and a folder literally named `~user` would appear in the notebook's)."""
    expanded = os.path.expanduser(raw)
    if raw.startswith("~") and expanded == raw:
        user = raw[1:].split(os.sep, 1)[0]
        who = f"no user named {user!r} on this machine" if user else "no home directory is known"
        raise TpuNbUsageError(f"{what} {raw!r} starts with ~, but there is {who}. {fix}")
    return expanded


def _make_cache_dir(path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise EnvironmentProblem(
            f"the compile cache {path} cannot be created ({exc.strerror}). Fix: "
            "choose a directory of yours, e.g. cache_dir='~/.cache/xla'."
        ) from None


def setup_action(
    *,
    install: bool = False,
    check: bool = False,
    dry_run: bool = False,
    device: str = "auto",
    num_devices: int | None = None,
    ir_debug: bool = False,
    cache_dir: str | os.PathLike | None = None,
    target: str | Chip | None = None,
) -> SetupAction:
    """What a `%tpu_setup` asks for, checked before anything runs: "install" the pinned
    torch/torch_xla pair (`install_pair`; dry_run: only show what pip would do), "check" the
    environment (`detect(check_import=True)`), or "setup" this process (`setup()` with the
    same device, num_devices, ir_debug, cache_dir and target).

    Installing and checking set nothing up, so a setting given beside them is a mistake:
    TpuNbUsageError names the option as %tpu_setup spells it, with the fix.
    """
    if dry_run and not install:
        raise TpuNbUsageError(
            "--dry-run shows what --install would do, and changes nothing on its own. "
            "Fix: %tpu_setup --install --dry-run"
        )
    if install and check:
        raise TpuNbUsageError(
            "choose one of --install and --check. Fix: %tpu_setup --install, "
            "then %tpu_setup --check"
        )
    if not (install or check):
        return "setup"
    only, does = "--install", "installs torch and torch_xla"
    if check:
        only, does = "--check", "checks the environment"
    given = (
        ("--device", device != "auto"),
        ("--devices", num_devices is not None),
        ("--ir-debug", ir_debug),
        ("--cache", cache_dir is not None),
        ("--target", target is not None),
    )
    option = next((option for option, value in given if value), None)
    if option is not None:
        raise TpuNbUsageError(
            f"{only} only {does} and sets nothing up, so {option} would be ignored. "
            f"Fix: %tpu_setup {only} alone, then %tpu_setup without {only}"
        )
    return "install" if install else "check"


def setup(
    device: str = "auto",
    *,
    num_devices: int | None = None,
    ir_debug: bool = False,
    hlo_debug: bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    compile_analysis: bool = True,
    debug_file: str | None = None,
    target: str | Chip | None = None,
) -> Environment:
    """Choose the XLA device and switch on compile-cause analysis before the first compile.

    device: "auto" (a TPU if this machine has one, else the CPU), "tpu" or "cpu".
    num_devices: virtual XLA:CPU devices (CPU_NUM_DEVICES), e.g. 4 for SPMD on a laptop.
    ir_debug: source locations on IR nodes (XLA_IR_DEBUG) and HLO (XLA_HLO_DEBUG), for
        graphs traced from now on.
    cache_dir: the persistent compile cache (speeds up restarts on TPU; none on CPU).
    compile_analysis: why each graph compiled (PT_XLA_DEBUG_LEVEL=1) into `debug_file`
        (default: a per-process file under the temp dir), so cell output stays clean.
    target: the TPU runs are judged for when this machine has none ("v4", "v5e", "v5p",
        "v6e", "TPU7x" or a `Chip`); v5e when not given. On a TPU, its own chip.

    Returns the Environment, with what was applied and what could not be, and why.
    """
    accelerator = detect_accelerator()
    platform = _check_device(device, accelerator)
    n_devices = _check_num_devices(num_devices, platform)
    if n_devices is None:
        _check_inherited_devices(platform, runtime_initialized())
    cache_path = _check_cache_dir(cache_dir)
    _check_options(
        ir_debug=ir_debug,
        hlo_debug=hlo_debug,
        compile_analysis=compile_analysis,
        debug_file=debug_file,
    )
    hlo_debug = ir_debug if hlo_debug is None else hlo_debug
    chip = check_target(target) if target is not None else None

    imported = backend().process.is_loaded()
    started = runtime_initialized()
    in_effect = backend().process.settings()  # PT_XLA_DEBUG_* too, once hidden from children
    first = "; restart the kernel and call tpu_nb.setup() first"
    started_why = f"the XLA runtime already started in this process{first}" if started else None
    # (variable, value, why it is latched now or None)
    wanted: list[tuple[str, str, str | None]] = [("PJRT_DEVICE", platform.upper(), started_why)]
    if n_devices is not None:
        wanted.append(("CPU_NUM_DEVICES", str(n_devices), started_why))
    if compile_analysis:
        compiled_why = None
        if backend().process.compiled_yet():
            compiled_why = (
                "a graph was already compiled in this process, and torch_xla reads "
                f"PT_XLA_DEBUG_* at the first compile{first}"
            )
        if in_effect.get("PT_XLA_DEBUG_LEVEL", "").strip() in ("", "0"):
            wanted.append(("PT_XLA_DEBUG_LEVEL", "1", compiled_why))
        inherited = in_effect.get("PT_XLA_DEBUG_FILE")
        if private_files.inherited_from_another_process(inherited):
            inherited = None  # a parent process's held log: not this process's to use
        chosen = os.path.expanduser(os.fspath(debug_file)) if debug_file else None
        # by default a per-process file in a directory private to this user (_private_files)
        path = chosen or inherited or private_files.default_log_path()
        wanted.append(("PT_XLA_DEBUG_FILE", os.path.abspath(path), compiled_why))
    if "XLA_METRICS_SAMPLES" not in os.environ:
        why = "torch_xla already recorded metrics with its default buffer" if started else None
        wanted.append(("XLA_METRICS_SAMPLES", METRICS_SAMPLES, why))
    # XLA_IR_DEBUG is read at import; after it, torch_xla's _set_ir_debug switches it on.
    if ir_debug:
        wanted.append(("XLA_IR_DEBUG", "1", None))
    if hlo_debug:
        wanted.append(("XLA_HLO_DEBUG", "1", None))  # read at each lowering
    if cache_path is not None:  # None exactly when cache_dir is
        wanted.append(("XLA_PERSISTENT_CACHE_PATH", cache_path, started_why))

    applied, not_applied, changes = [], [], {}
    for name, value, latched_why in wanted:
        if in_effect.get(name) == value:
            continue
        if latched_why:
            now = in_effect.get(name, "unset")
            not_applied.append(f"{name}={value} (now {now}): {latched_why}.")
        else:
            changes[name] = value
            applied.append(f"{name}={value}")
    notes = []
    if cache_dir is not None and platform == "cpu" and not started:
        notes.append(
            "compile cache on XLA:CPU: executables are written but cannot be loaded "
            "back on CPU, so it gives no speed-up there (it does on TPU)"
        )
    if "PT_XLA_DEBUG_FILE" in changes:  # created 0600 by us before torch_xla opens it
        named = changes["PT_XLA_DEBUG_FILE"]
        given, log_notes = private_files.prepare_log(named)
        notes += log_notes
        if given != named:  # handed over as the descriptor we hold: say which file it is
            changes["PT_XLA_DEBUG_FILE"] = given
            applied[applied.index(f"PT_XLA_DEBUG_FILE={named}")] = (
                f"PT_XLA_DEBUG_FILE={given} ({named}, held open)"
            )
    if "XLA_PERSISTENT_CACHE_PATH" in changes:
        _make_cache_dir(changes["XLA_PERSISTENT_CACHE_PATH"])
        changes["XLA_PERSISTENT_CACHE_READ_ONLY"] = "0"
    global _configured, _chosen
    for name in DEBUG_SETTINGS:
        if name in changes and name not in _debug_before:
            _debug_before[name] = os.environ.get(name)
    os.environ.update(changes)  # everything validated above: all or nothing
    _configured = True
    _chosen = platform if device.strip().lower() != "auto" else None
    if chip is not None:
        set_target(chip)
        notes.append(f"runs are judged for a {chip.name} when this machine has no TPU")
    if ir_debug and imported:
        backend().process.set_source_lines(True)
    env = detect()
    return replace(env, applied=tuple(applied + notes), not_applied=tuple(not_applied))


_configured = False
# What PT_XLA_DEBUG_* were before setup() set them (None: unset), for `undo_debug_settings`.
DEBUG_SETTINGS = ("PT_XLA_DEBUG_LEVEL", "PT_XLA_DEBUG_FILE")
_debug_before: dict[str, str | None] = {}
_chosen: str | None = None  # the device named to setup() ("cpu"/"tpu"); None for "auto"


def chosen_device() -> str | None:
    """The device this process's `setup()` was told by name ("cpu" or "tpu"), else None:
    what a pod launch passes to its hosts, whose own "auto" would look at their machine."""
    return _chosen


def undo_debug_settings() -> str:
    """Put PT_XLA_DEBUG_* back as they were before `setup()` (what `%unload_ext tpu_nb`
    does). '' when done; once a graph has compiled torch_xla keeps them for the life of the
    process, and the one line returned says so and what to do."""
    if not _debug_before:
        return ""
    if backend().process.compiled_yet():  # PT_XLA_DEBUG_* are latched at the first compile
        log = backend().process.compile_log_path()
        if not log:
            return ""
        return (
            "torch_xla keeps writing compile analysis to "
            f"{private_files.log_name(log)} for the rest of this process (PT_XLA_DEBUG_* are "
            "read at its first compile). Fix: restart the kernel to stop it"
        )
    for name, value in _debug_before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _debug_before.clear()
    # Nothing compiled with them: the next device() sets up again (a reloaded extension's
    # first %%on_tpu would otherwise compile with no compile analysis to read).
    global _configured
    _configured = False
    return ""


def ensure_setup() -> None:
    """Run `setup()` once, before the runtime starts, if the user has not (called by
    `device()`): a PJRT_DEVICE set by the user or the platform (Colab sets TPU) is kept."""
    if _configured or runtime_initialized():
        return
    current = os.environ.get("PJRT_DEVICE", "").strip().lower()
    if current in ("", "tpu", "cpu"):
        setup(current or "auto")
    # Anything else (XLA:GPU, a typo) is left for torch_xla's import to explain.
