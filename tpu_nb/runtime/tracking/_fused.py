"""A fused optimizer on an XLA device, read into facts: which optimizer, who asked for the
fused kernel, and what to do.

torch has fused Adam, AdamW, SGD and Adagrad kernels for its own devices only; on an XLA
tensor, the optimizer's first `step()` raises "`fused=True` requires all the params to be
floating point Tensors of supported devices: ['mps', 'cuda', ...] but torch.float32 and
xla". Recent releases of transformers' Trainer ask for one by default with torch 2.8 and
later (`optim="adamw_torch_fused"`), so a Trainer with default arguments stops there on a
TPU.
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

    optimizer: str  # its class, "torch.optim.AdamW" ("" when the traceback did not show it)
    devices: tuple[str, ...]  # the device types torch's fused kernels run on, as it listed them
    # TrainingArguments.optim when a Trainer ran the step and its optim is the fused AdamW
    trainer_optim: str = ""
    # the optimizer is the one Trainer made from that optim (its class, learning rate, betas
    # and eps; no optimizer or optimizer class given to Trainer, no create_optimizer of
    # a subclass's): False when it may be one the user gave it
    trainer_made: bool = False

    def headline(self) -> str:
        # (a private backend not renamed is listed as "privateuseone": no device of the user's)
        listed = [d for d in self.devices if d and d != "privateuseone"]
        devices = " and ".join(filter(None, (", ".join(listed[:-1]), *listed[-1:])))
        return (
            f"{self.optimizer or 'the optimizer'} was made with fused=True: torch's fused "
            f"kernels run on {f'{devices} tensors' if devices else 'its own devices'}, not "
            "on an XLA device, so its first step() raised"
        )

    def fix(self) -> str:
        traced = (
            "on an XLA device the optimizer's ops are traced into the step's graph and "
            "compiled with it whichever implementation runs them"
        )
        asked = f'optim="{self.trainer_optim}", the default of recent releases with torch 2.8+'
        if self.trainer_made:
            return (
                f'pass optim="adamw_torch" to TrainingArguments (Trainer made it from '
                f"{asked}); {traced}"
            )
        if self.trainer_optim:
            return (
                "drop fused=True where this optimizer is made; if Trainer made it (from "
                f'{asked}), pass optim="adamw_torch" to TrainingArguments instead; {traced}'
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
    optimizer, trainer = None, None
    for frame in traceback_frames(error.__traceback__):
        path = frame.f_code.co_filename.replace("\\", "/")
        owner = frame_variables(frame).get("self")
        if _OPTIMIZER_FILES in path and hasattr(owner, "param_groups"):
            optimizer = owner
        elif path.endswith(_TRAINER_FILE) and trainer is None and hasattr(owner, "args"):
            trainer = owner
    kind = type(optimizer)
    name = "" if optimizer is None else f"{kind.__module__}.{kind.__qualname__}"
    if name.startswith("torch.optim."):  # "torch.optim.adamw.AdamW": as torch exports it
        name = f"torch.optim.{kind.__qualname__}"
    optim = str(getattr(trainer.args.optim, "value", trainer.args.optim)) if trainer else ""
    if optim != TRAINER_FUSED:
        return FusedOptimizer(name, devices)
    return FusedOptimizer(name, devices, optim, _made_by(trainer, optimizer, name))


def _made_by(trainer, optimizer, name: str) -> bool:
    """Whether `optimizer` is the AdamW Trainer.create_optimizer made from its arguments."""
    args = trainer.args
    made = type(trainer).create_optimizer.__module__ == "transformers.trainer"
    defaults = getattr(optimizer, "defaults", {})
    return (
        made
        and getattr(trainer, "optimizer_cls_and_kwargs", None) is None
        and name == "torch.optim.AdamW"
        and defaults.get("lr") == args.learning_rate
        and tuple(defaults.get("betas", ())) == (args.adam_beta1, args.adam_beta2)
        and defaults.get("eps") == args.adam_epsilon
    )
