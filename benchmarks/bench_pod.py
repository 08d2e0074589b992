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
from ray.cluster_utils import Cluster

import tpu_nb

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
    os.environ["TPU_NAME"] = "bench-slice"
    cluster = Cluster()
    for worker in range(HOSTS):
        resources = {"TPU": 4}
        if worker == 0:
            resources["TPU-v4-16-head"] = 1
        cluster.add_node(
            num_cpus=1,
            object_store_memory=80 * 1024 * 1024,
            resources=resources,
            labels={
                "ray.io/tpu-slice-name": "bench-slice",
                "ray.io/tpu-worker-id": str(worker),
                "ray.io/tpu-pod-type": "v4-16",
                "ray.io/tpu-topology": "2x2x2",
            },
            **({"include_dashboard": False} if worker == 0 else {}),
        )
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        started, pod_steps = [], []
        for _ in range(ROUNDS):
            result = tpu_nb.launch(train, hosts=HOSTS, stream=lambda line: None)
            started.append(result.started_seconds)
            for host in result.hosts:
                pod_steps += host.value
        one_start, tracked_steps, plain_steps = [], [], []
        for _ in range(ROUNDS):
            seconds, steps = _one_process(tracked=True)
            one_start.append(seconds)
            tracked_steps += steps
            plain_steps += _one_process(tracked=False)[1]
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"fake slice: {HOSTS} hosts (v4-16) on {os.cpu_count()} cores; {ROUNDS} rounds")
    print("time to running the work (median)")
    print(f"  every host of the launch        {statistics.median(started):8.2f} s")
    print(f"  one new process (import, setup) {statistics.median(one_start):8.2f} s")
    print(f"step time, median of {len(pod_steps)}/{len(tracked_steps)}/{len(plain_steps)} steps")
    print(f"  on a host of the launch          {_ms(pod_steps)}")
    print(f"  one process under tpu_nb.track   {_ms(tracked_steps)}")
    print(f"  one process without tpu_nb       {_ms(plain_steps)}")
    added = statistics.median(pod_steps) - statistics.median(tracked_steps)
    print(f"  added per step by the launch vs one tracked host: {added * 1e3:+.3f} ms")


if __name__ == "__main__":
    main()
