"""What the cost per step adds: to a new graph's compile, and to a cached step, side by side.

1. A new graph: tpu_nb counts its FLOPs from its HLO and what the tracked code holds, once,
   when it first captures it (`tracking._cost.count_new_graph`). Timed against the compile
   of the same graph (the first sync of a tracked step that compiles it), for a small MLP
   step, a GPT-2 training step and a resnet18 training step built from configs.
2. A cached step: tracked steps with the cost machinery as it is, and with it switched off
   (counting and the step's cost made no-ops), interleaved over rounds; medians, and the
   same code run twice ("cost on, again") for the noise floor.

    PYTHONPATH=$PWD PJRT_DEVICE=CPU python benchmarks/bench_cost.py
"""

from __future__ import annotations

import statistics
import time

ROUNDS, STEPS = 15, 100


def _first_compile(make_step):
    """(seconds counting the new graph's cost, seconds compiling it) for one new graph."""
    from tpu_nb.runtime.tracking import _cost as cost

    counted: list[float] = []
    original = cost.count_new_graph

    def timed(own_hash, tensors, spaces=None):
        start = time.perf_counter()
        original(own_hash, tensors, spaces)
        counted.append(time.perf_counter() - start)

    step = make_step()
    cost.count_new_graph = timed
    try:
        import tpu_nb

        with tpu_nb.track("first") as report:
            step()  # it syncs: the first sync compiles the step's graph
    finally:
        cost.count_new_graph = original
    return sum(counted), report.metrics.compile_seconds, report.cost


def _mlp():
    import torch_xla

    from benchmarks._workload import make_mlp_step

    inner = make_mlp_step(torch_xla.device())
    return lambda: inner()


def _gpt2():
    import torch
    import torch_xla
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=8000, n_positions=128)
    dev = torch_xla.device()
    with torch.device(dev):
        model = GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 8000, (4, 128), device=dev)

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
        torch_xla.sync()

    return step


def _resnet18():
    import torch
    import torch_xla
    import torchvision

    dev = torch_xla.device()
    with torch.device(dev):
        model = torchvision.models.resnet18(num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(8, 3, 64, 64, device=dev)

    def step():
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        torch_xla.sync()

    return step


def _cached_steps(step, steps: int, off: bool) -> float:
    """Seconds per tracked cached step, the cost machinery on or off."""
    import torch_xla

    import tpu_nb
    from tpu_nb.runtime.tracking import _cost as cost

    saved = cost.count_new_graph, cost.step_cost
    if off:
        cost.count_new_graph = lambda *a, **k: None
        cost.step_cost = lambda *a, **k: None
    try:
        with tpu_nb.track("cached") as report:
            for _ in range(steps):
                step()
    finally:
        cost.count_new_graph, cost.step_cost = saved
    torch_xla.sync()
    assert report.metrics.compiles == 0, "the steps were not all cached"
    return report.wall_seconds / steps


def main() -> None:
    import tpu_nb

    tpu_nb.setup("cpu")
    print("1. a new graph: counting its cost (once) against compiling it")
    print(f"{'graph':10} {'cost counted':>14} {'compile':>10} {'ratio':>8}  flops/step")
    for name, make in (("mlp", _mlp), ("gpt2", _gpt2), ("resnet18", _resnet18)):
        counted, compiled, cost = _first_compile(make)
        flops = f"{cost.flops:.3g}" if cost is not None and cost.flops else "-"
        print(
            f"{name:10} {counted * 1e3:11.2f} ms {compiled:8.2f} s "
            f"{counted / compiled:8.2%}  {flops}"
        )

    print(f"\n2. a cached step (MLP, {STEPS} tracked steps a run, {ROUNDS} rounds, medians)")
    import torch_xla

    from benchmarks._workload import make_mlp_step

    inner = make_mlp_step(torch_xla.device())
    for _ in range(3):  # compile the step's graphs
        inner()
    # "cost on, again" runs the very same code as "cost on": the difference between those
    # two is the noise floor of this machine, against which the cost's is read.
    keys = ("cost on", "cost on, again", "cost off")
    times: dict[str, list[float]] = {k: [] for k in keys}
    for r in range(ROUNDS):
        for key in keys if r % 2 == 0 else tuple(reversed(keys)):
            times[key].append(_cached_steps(inner, STEPS, off=key == "cost off"))
    for key in keys:
        print(f"{key:15} {statistics.median(times[key]) * 1e6:8.1f} us per step")
    for a, b in (("cost on", "cost off"), ("cost on", "cost on, again")):
        paired = [x - y for x, y in zip(times[a], times[b], strict=True)]
        print(
            f"{a} - {b}: median {statistics.median(paired) * 1e6:+.1f} us per step "
            f"(rounds from {min(paired) * 1e6:+.1f} to {max(paired) * 1e6:+.1f} us)"
        )


if __name__ == "__main__":
    main()
