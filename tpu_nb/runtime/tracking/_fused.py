"""A fused optimizer on an XLA device, read into facts: which optimizer, who asked for the
fused kernel, and what to do.

torch has fused Adam, AdamW, SGD and Adagrad kernels for its own devices only; on an XLA
tensor, the optimizer's first `step()` raises "`fused=True` requires all the params to be
floating point Tensors of supported devices: ['mps', 'cuda', ...] but torch.float32 and
xla". transformers' Trainer asks for one by default with torch 2.8 and later
(`optim="adamw_torch_fused"`), so a Trainer with default arguments stops there on a TPU.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from tpu_nb.runtime.frame import frame_variables
from tpu_nb.runtime.sources import traceback_frames

_MESSAGE = re.compile(
    r"`fused=True` requires all the params to be floating point Tensors of supported "
    r"devices: (\[[^\]]*\]) but \S+ and xla\b"
)
_TRAINER_FILE = "transformers/trainer.py"
_OPTIMIZER_FILES = "torch/optim/"
TRAINER_FUSED = "adamw_torch_fused"


@dataclass(frozen=True)
class FusedOptimizer:
    """An optimizer that asked for torch's fused kernel on an XLA device
    (`RunReport.fused_optimizer`)."""

    optimizer: str  # its class ("AdamW"), or "" when the traceback did not show it
    devices: tuple[str, ...]  # the device types torch's fused kernels run on, as it listed them
    trainer_optim: str = ""  # TrainingArguments.optim, when Trainer's made it and asked for it

    def headline(self) -> str:
        name = f"torch.optim.{self.optimizer}" if self.optimizer else "the optimizer"
        # (a private backend not renamed is listed as "privateuseone": no device of the user's)
        listed = [d for d in self.devices if d and d != "privateuseone"]
        devices = " and ".join(filter(None, (", ".join(listed[:-1]), *listed[-1:])))
        return (
            f"{name} was made with fused=True: torch's fused kernels run on "
            f"{f'{devices} tensors' if devices else 'its own devices'}, not on an XLA "
            "device, so its first step() raised"
        )

    def fix(self) -> str:
        traced = (
            "on an XLA device the optimizer's ops are traced into the step's graph and "
            "compiled with it whichever implementation runs them"
        )
        if self.trainer_optim:
            return (
                f'pass optim="adamw_torch" to TrainingArguments (Trainer made it from '
                f'optim="{self.trainer_optim}", its default with torch 2.8 and later); {traced}'
            )
        return f"drop fused=True where the optimizer is made; {traced}"

    def lines(self) -> list[str]:
        return [self.headline(), f"Fix: {self.fix()}"]

    def __str__(self) -> str:
        return "\n".join(self.lines())


def fused_optimizer(error: BaseException | None) -> FusedOptimizer | None:
    """The facts of `error` when it is torch's refusal of a fused optimizer on an XLA
    tensor, else None."""
    if not isinstance(error, RuntimeError):
        return None
    found = _MESSAGE.search(str(error))
    if found is None:
        return None
    try:
        listed = ast.literal_eval(found.group(1))
        devices = tuple(str(d) for d in listed) if isinstance(listed, list) else ()
    except (ValueError, SyntaxError):
        devices = ()
    optimizer, optim = "", ""
    for frame in traceback_frames(error.__traceback__):
        path = frame.f_code.co_filename.replace("\\", "/")
        if _OPTIMIZER_FILES in path:
            owner = frame_variables(frame).get("self")
            if owner is not None and hasattr(owner, "param_groups"):
                optimizer = type(owner).__name__
        elif path.endswith(_TRAINER_FILE) and not optim:
            args = getattr(frame_variables(frame).get("self"), "args", None)
            value = getattr(args, "optim", None)
            value = str(getattr(value, "value", value) or "")
            optim = value if value == TRAINER_FUSED else ""
    return FusedOptimizer(optimizer, devices, optim)
