"""Pod launch costs on a fake slice (Ray's `cluster_utils.Cluster`, nodes carrying TPU resources
and labels, as in tests/test_pod.py), side by side in one run.

1. Time from the launch's start to every host running the work (`PodResult.started_seconds`:
   reserving the slice, one new Ray worker process per host importing torch_xla and setting
   up its runtime, the work sent through Ray's object store), against starting the same work
   in one new Python process on this machine (python -c, import torch_xla, first line).
2. Step time of the same training loop (a small MLP, XLA:CPU) measured inside the loop by the
   same code: on a host of the launch (tracked, polled by the launch 10 times a second), in
   one process under tpu_nb.track() (what %%on_tpu adds on one host), and in one process
   without tpu_nb. The difference of the medians is the added cost per step.

All fake hosts share this machine's cores, so the figures are the launch's own costs, not a
real slice's (no network between hosts, no multi-host TPU runtime).

    PYTHONPATH=$PWD python benchmarks/bench_pod.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import ray

import tpu_nb

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fake_slice import fake_slice  # noqa: E402  (Ray on 127.0.0.1, its files in $TMPDIR)

ROOT = Path(__file__).resolve().parents[1]
HOSTS = 2
ROUNDS = 3
STEPS = 60

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def train(host=0, steps=STEPS):
    """The loop every setting runs; returns each step's seconds (perf_counter between
    the ends of consecutive steps, the first step's compile dropped)."""
    import time

    import torch
    import torch_xla

    dev = torch_xla.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64).to(dev)
    y = torch.randint(0, 10, (32,)).to(dev)
    ends = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        torch_xla.sync()
        ends.append(time.perf_counter())
    return [b - a for a, b in zip(ends[2:], ends[3:], strict=False)]


def _one_process(tracked: bool) -> tuple[float, list[float]]:
    """(seconds from process start to the loop's first line, step seconds) in a new process."""
    code = textwrap.dedent(f"""
        import json, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import torch_xla
        import tpu_nb
        tpu_nb.setup("cpu")
        first = time.time()
        from bench_pod import train
        if {tracked}:
            with tpu_nb.track("one host"):
                steps = train()
        else:
            steps = train()
        print(json.dumps([first, steps]))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PT_XLA", "XLA_"))}
    env["PJRT_DEVICE"] = "CPU"
    started = time.time()
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
    )
    first, steps = json.loads(out.stdout.strip().splitlines()[-1])
    return first - started, steps


def _ms(values) -> str:
    return f"{statistics.median(values) * 1e3:8.3f} ms"


def main() -> None:
    with fake_slice(HOSTS, pod_type="v4-16", topology="2x2x2", name="bench-slice"):
        measured = _measure()
    _print(*measured)


def _measure():
    one_start: list[float] = []
    tracked_steps: list[float] = []
    plain_steps: list[float] = []
    started: dict[int, list] = {1: [], HOSTS: []}
    pod_steps: dict[int, list] = {1: [], HOSTS: []}
    for _ in range(ROUNDS):
        for n in (1, HOSTS):
            result = tpu_nb.launch_hosts(train, hosts=n, stream=lambda line: None)
            started[n].append(
                (result.reserved_seconds, result.ready_seconds, result.started_seconds)
            )
            for host in result.hosts:
                pod_steps[n] += host.value
        # In the same round: the machine's load changes over minutes.
        seconds, steps = _one_process(tracked=True)
        one_start.append(seconds)
        tracked_steps += steps
        plain_steps += _one_process(tracked=False)[1]
    return one_start, tracked_steps, plain_steps, started, pod_steps


def _print(one_start, tracked_steps, plain_steps, started, pod_steps) -> None:
    print(f"fake slice: {HOSTS} hosts (v4-16) on {os.cpu_count()} cores; {ROUNDS} rounds")
    print("time to running the work, median s: reserved / hosts ready / every host running")
    for n in (1, HOSTS):
        r, ready, run = (statistics.median(t[i] for t in started[n]) for i in range(3))
        print(
            f"  launch on {n} host{'s' if n > 1 else ' '}"
            f"             {r:6.2f} / {ready:6.2f} / {run:6.2f}"
        )
    print(f"  one new process (import, setup)                  {statistics.median(one_start):6.2f}")
    print("step time, median (steps)")
    for n in (1, HOSTS):
        label = f"on a host of a {n}-host launch"
        print(f"  {label:34} {_ms(pod_steps[n])} ({len(pod_steps[n])})")
    print(f"  {'one process under tpu_nb.track':34} {_ms(tracked_steps)} ({len(tracked_steps)})")
    print(f"  {'one process without tpu_nb':34} {_ms(plain_steps)} ({len(plain_steps)})")
    for n in (1, HOSTS):
        added = statistics.median(pod_steps[n]) - statistics.median(tracked_steps)
        print(f"  added per step, {n}-host launch vs one tracked process: {added * 1e3:+.3f} ms")
    print(
        "  (the hosts of a fake slice share this machine's cores: a 2-host launch runs two "
        "loops at once)"
    )


if __name__ == "__main__":
    main()
