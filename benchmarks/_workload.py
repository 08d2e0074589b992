"""The small MLP training step the benchmarks time (about 1.3 ms a step on 2-core XLA:CPU)."""

from __future__ import annotations

import statistics
import time


def make_mlp_step(device, width: int = 256, hidden: int = 512, batch: int = 64):
    """Return step(): one SGD step of a 2-layer MLP, ending in torch_xla.sync()."""
    import torch
    import torch_xla

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10)
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, width, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    loss_fn = torch.nn.functional.cross_entropy

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        torch_xla.sync()
        return loss

    return step


def per_step_ms(run, steps: int) -> float:
    """Milliseconds per step of run(steps), waiting for the device at the end."""
    import torch_xla.core.xla_model as xm

    xm.wait_device_ops()
    start = time.perf_counter()
    run(steps)
    xm.wait_device_ops()
    return (time.perf_counter() - start) / steps * 1e3


def interleave(variants: dict, steps: int, rounds: int) -> dict[str, list[float]]:
    """Run each variant for `steps` steps, round-robin, `rounds` times: ms/step samples."""
    out = {name: [] for name in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            out[name].append(per_step_ms(run, steps))
    return out


def median(xs):
    return statistics.median(xs)
