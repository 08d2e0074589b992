"""Install the matching torch/torch_xla pair with pip, in a subprocess, streaming its output."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from tpu_nb.runtime.environment._detect import TORCH_PAIR, detect_accelerator, pair_install_command


def install_pair(
    *, tpu: bool | None = None, dry_run: bool = False, stream: Callable[[str], None] = print
) -> tuple[int, bool]:
    """pip-install torch and torch_xla at the pinned pair (with `[tpu]` on TPU hosts).

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
