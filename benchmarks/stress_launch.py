"""Stress test for `launch()` (issue 13, item 10): many replica launches, every failure counted.

Not part of `make bench` or the test suite (it takes minutes). Each launch runs 4 XLA:CPU
replicas that do their first XLA work at the same moment — where torch_xla 2.9's first use of
a counter from several threads once crashed the launcher (1 launch in 26) — and checks each
replica's result. At the end: failures by message, run directories and file descriptors left.

    PYTHONPATH=$PWD PJRT_DEVICE=CPU python benchmarks/stress_launch.py            # 200, fork
    PYTHONPATH=$PWD PJRT_DEVICE=CPU python benchmarks/stress_launch.py 50 worker  # worker path

fork: this process never uses XLA itself, so every launch forks a launcher (the path of a
fresh notebook). worker: it uses XLA first, so every launch starts a fresh worker process.
"""

from __future__ import annotations

import collections
import glob
import os
import sys
import tempfile
import time

import tpu_nb
from tpu_nb.runtime.errors import TpuNbError
from tpu_nb.runtime.launch import launch


def replica(index):
    import torch
    import torch_xla

    dev = torch_xla.device()
    x = torch.ones(8, 8, device=dev) * (index + 1)
    y = (x @ x).sum()
    torch_xla.sync()
    print("sum", y.item())
    return index


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    path = sys.argv[2] if len(sys.argv) > 2 else "fork"
    tpu_nb.setup("cpu", num_devices=4)
    if path == "worker":
        import torch
        import torch_xla

        (torch.ones(2, device=torch_xla.device()) * 2).sum().item()
    launch_dirs = os.path.join(tempfile.gettempdir(), "tpu_nb-launch-*")
    dirs_before = set(glob.glob(launch_dirs))
    fds_before = len(os.listdir("/proc/self/fd"))
    failures: collections.Counter[str] = collections.Counter()
    start = time.perf_counter()
    for i in range(count):
        try:
            result = launch(replica, stream=lambda line: None)
            if result.values != [0, 1, 2, 3] or result.path != path:
                failures[f"wrong result {result.values} via {result.path}"] += 1
        except TpuNbError as exc:
            failures[str(exc).splitlines()[0][:300]] += 1
        done = i + 1
        if done % 20 == 0 or done == count:
            print(
                f"{done:4d} launches, {sum(failures.values())} failed, "
                f"{time.perf_counter() - start:6.1f} s",
                flush=True,
            )
    left_dirs = set(glob.glob(launch_dirs)) - dirs_before
    left_fds = len(os.listdir("/proc/self/fd")) - fds_before
    print(
        f"\n{path} path: {count} launches of 4 replicas, {sum(failures.values())} failed, "
        f"{(time.perf_counter() - start) / count:.2f} s a launch"
    )
    for message, n in failures.most_common():
        print(f"  {n:4d} x {message}")
    print(f"run directories left behind: {len(left_dirs)}; file descriptors gained: {left_fds}")
    return 1 if failures or left_dirs or left_fds > 0 else 0


if __name__ == "__main__":
    sys.exit(main())
