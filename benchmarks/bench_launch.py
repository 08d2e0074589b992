"""Multi-device launch costs, measured side by side in one run.

1. Time to the first replica's output: `%%on_tpu --replicas all` in a real kernel, fork path
   (the kernel has not used XLA) and worker path (it has), against a bare
   `torch_xla.launch(fn, start_method='fork')` in a script. Kernel figures are from the cell's
   busy status to the first replica line on IOPub; the script's from the launch call to the
   replica's first print (both wall clock, 4 XLA:CPU devices).
2. SPMD data-parallel step time on 4 XLA:CPU devices against 1, same global batch.
3. What making the replicas' first counter use from one thread costs a whole launch.

    make bench     # or: PYTHONPATH=$PWD python benchmarks/bench_launch.py
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

from jupyter_client.manager import start_new_kernel

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 5
REPLICA_CELL = "%%on_tpu --replicas all --quiet\nprint('first', index)"


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PT_XLA", "XLA_"))}
    env.pop("PJRT_DEVICE", None)
    env["PYTHONPATH"] = str(ROOT)
    return env


def _first_output_seconds(kc) -> float:
    msg_id = kc.execute(REPLICA_CELL)
    busy = first = None
    while True:
        msg = kc.get_iopub_msg(timeout=300)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind == "status" and msg["content"]["execution_state"] == "busy":
            busy = msg["header"]["date"]
        elif kind == "stream" and "] first" in msg["content"]["text"] and first is None:
            first = msg["header"]["date"]
        elif kind == "error":
            raise RuntimeError("\n".join(msg["content"]["traceback"]))
        elif kind == "status" and msg["content"]["execution_state"] == "idle":
            break
    kc.get_shell_msg(timeout=60)
    return (first - busy).total_seconds()


def bench_kernel_paths() -> dict[str, float]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(_env())
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(ROOT))
    os.environ.clear()
    os.environ.update(saved)
    try:
        kc.execute_interactive(
            "%load_ext tpu_nb\n%tpu_setup --device cpu --devices 4\nimport torch, torch_xla",
            timeout=120,
            output_hook=lambda m: None,
        )
        fork = [_first_output_seconds(kc) for _ in range(ROUNDS)]
        kc.execute_interactive(
            "(torch.ones(2, device=torch_xla.device()) * 2).sum().item()",
            timeout=120,
            output_hook=lambda m: None,
        )
        worker = [_first_output_seconds(kc) for _ in range(ROUNDS)]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return {"fork": statistics.median(fork), "worker": statistics.median(worker)}


def bench_bare_launch() -> float:
    code = textwrap.dedent("""
        import os, time
        os.environ.update(PJRT_DEVICE="CPU", CPU_NUM_DEVICES="4")
        import torch, torch_xla
        def fn(index):
            print("first", index, time.time(), flush=True)
        start = time.time()
        print("start", start, flush=True)
        torch_xla.launch(fn, start_method="fork")
    """)
    runs = []
    for _ in range(ROUNDS):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), check=True
        ).stdout
        start = float(re.search(r"start ([0-9.]+)", out).group(1))
        firsts = [float(t) for t in re.findall(r"first \d+ ([0-9]+\.[0-9]+)", out)]
        runs.append(min(firsts) - start)
    return statistics.median(runs)


SPMD = textwrap.dedent("""
    import json, statistics, sys, time
    import tpu_nb, torch, torch_xla
    from tpu_nb.runtime.parallel import launch
    tpu_nb.setup("cpu", num_devices=int(sys.argv[1]))
    def train(spmd):
        torch.manual_seed(0)
        dev = torch_xla.device()
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                    torch.nn.Linear(1024, 10)).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = spmd.shard_batch(torch.randn(512, 256).to(dev))
        y = spmd.shard_batch(torch.randint(0, 10, (512,)).to(dev))
        times = []
        for step in range(60):
            start = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            torch_xla.sync(wait=True)
            times.append(time.perf_counter() - start)
        return statistics.median(times[10:])
    print("RESULT", launch(train, mode="spmd").values[0])
""")


def bench_spmd() -> dict[int, float]:
    out = {}
    for n in (1, 4):
        runs = []
        for _ in range(3):
            text = subprocess.run(
                [sys.executable, "-c", SPMD, str(n)],
                capture_output=True,
                text=True,
                env=_env(),
                check=True,
            ).stdout
            runs.append(float(text.split("RESULT")[1]))
        out[n] = statistics.median(runs)
    return out


FIRST_USE = textwrap.dedent("""
    import importlib, statistics, sys, time
    import tpu_nb
    launching = importlib.import_module("tpu_nb.runtime.parallel")   # the module, not launch()
    tpu_nb.setup("cpu", num_devices=4)
    def replica(index):
        import torch, torch_xla
        return (torch.ones(4, device=torch_xla.device()) * index).sum().item()
    times = {True: [], False: []}
    for _ in range(int(sys.argv[1])):
        for warm in (True, False):      # interleaved: the machine's load hits both alike
            launching._first_use_done = not warm     # inherited by the forked launcher
            start = time.perf_counter()
            launching.launch(replica, stream=lambda line: None)
            times[warm].append(time.perf_counter() - start)
    print("RESULT", statistics.median(times[True]), statistics.median(times[False]))
""")


def bench_first_use(rounds: int = 6) -> tuple[float, float]:
    """A whole fork-path launch with the replicas' first counter use made by one thread
    and without it (what torch_xla alone does)."""
    out = subprocess.run(
        [sys.executable, "-c", FIRST_USE, str(rounds)],
        capture_output=True,
        text=True,
        env=_env(),
        check=True,
    ).stdout
    with_, without = out.split("RESULT")[1].split()
    return float(with_), float(without)


def main() -> None:
    print(f"time to the first replica's output, 4 XLA:CPU devices (median of {ROUNDS})")
    bare = bench_bare_launch()
    paths = bench_kernel_paths()
    print(f"  bare torch_xla.launch(fork) in a script   {bare:6.3f} s")
    print(
        f"  %%on_tpu --replicas all, fork path        {paths['fork']:6.3f} s   "
        f"({paths['fork'] / bare:.2f}x the bare launch)"
    )
    print(
        f"  %%on_tpu --replicas all, worker path      {paths['worker']:6.3f} s   "
        f"({paths['worker'] / bare:.2f}x; a fresh process imports torch and torch_xla)"
    )
    print("SPMD data parallel, MLP 256-1024-10, global batch 512, synced steps (median of 3 runs)")
    spmd = bench_spmd()
    print(f"  1 device  {spmd[1] * 1e3:7.2f} ms/step")
    print(
        f"  4 devices {spmd[4] * 1e3:7.2f} ms/step   ({spmd[1] / spmd[4]:.2f}x; XLA:CPU devices "
        "share this machine's 2 cores)"
    )
    print(
        "replicas' first counter use made by one thread (whole launch, fork path, 4 XLA:CPU "
        "devices, median of 6 interleaved)"
    )
    warm, bare = bench_first_use()
    print(f"  with     {warm:6.3f} s\n  without  {bare:6.3f} s   ({warm - bare:+.3f} s)")


if __name__ == "__main__":
    main()
