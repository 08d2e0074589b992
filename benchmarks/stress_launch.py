"""Stress test for `launch()`: many replica launches, every failure counted.

Not part of `make bench` or the test suite (it takes minutes). Each launch runs 4 XLA:CPU
replicas that do their first XLA work at the same moment — where torch_xla 2.9's first use of
a counter from several threads once crashed the launcher (1 launch in 26) — and checks each
replica's result. At the end: failures by message, run directories and file descriptors left.

    PYTHONPATH=$PWD PJRT_DEVICE=CPU python benchmarks/stress_launch.py            # 200, fork
    PYTHONPATH=$PWD PJRT_DEVICE=CPU python benchmarks/stress_launch.py 50 worker  # worker path

fork: this process never uses XLA itself, so every launch forks a launcher (the path of a
fresh notebook). worker: it uses XLA first, so every launch starts a fresh worker process.

kernel: the fork path from a real ipykernel (jupyter_client), with the cell of
tests/test_kernel.py's replica test (`%%on_tpu --replicas`: the cell's own factories on the
replica's device, a first `.item()` in every replica at once), launched `count` times in one
kernel through launch() so that a ReplicaCrash's `.stack` can be printed (the first one whole).
A number after it starts that many busy loops beside it, as on a loaded CI machine:

    PYTHONPATH=$PWD PJRT_DEVICE=CPU python benchmarks/stress_launch.py 1200 kernel 2
"""

from __future__ import annotations

import collections
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tpu_nb
from tpu_nb.runtime.errors import TpuNbError
from tpu_nb.runtime.parallel import launch


def replica(index):
    import torch
    import torch_xla

    dev = torch_xla.device()
    x = torch.ones(8, 8, device=dev) * (index + 1)
    y = (x @ x).sum()
    torch_xla.sync()
    print("sum", y.item())
    return index


# The replica test's cells (tests/test_kernel.py), and a loop of launches of its replica cell
# run in the kernel: prints a line per crash (the first with every thread's stack) and, last,
# the counts as JSON.
KERNEL_SETUP = (
    "%load_ext tpu_nb\n%tpu_setup --device cpu --devices 4",
    "import torch, torch_xla\nbase = 10\ndef double(v):\n    return 2 * v",
)
KERNEL_CELL = (
    "print('replica', index, double((torch.ones(2) * base).sum().item()), "
    "torch.ones(1).device.type)"
)
# kernel-together: the same cell after a barrier of the 4 replica threads (made in the kernel,
# fresh in each forked launcher), so that their first ops start at the same moment.
TOGETHER_SETUP = "import threading\ntogether = threading.Barrier(4)"
TOGETHER_CELL = "together.wait()\n" + KERNEL_CELL
KERNEL_LOOP = """
import json as _json
from tpu_nb.runtime.errors import TpuNbError as _TpuNbError
from tpu_nb.runtime.parallel import CellFunction as _Cell, ReplicaCrash as _Crash, launch as _launch
_counts = {{"ok": 0, "crash": 0, "other": 0}}
_expected = sorted(f"replica {{i}} 40.0 xla" for i in range(4))
for _i in range({count}):
    _cell = _Cell.from_namespace({cell!r}, "/tmp/stress-cell.py", globals())
    _lines = []
    try:
        _launch(_cell, devices=4, stream=_lines.append)
    except _Crash as _exc:
        _counts["crash"] += 1
        print(f"launch {{_i}}: crash: {{_exc.signal}} in {{_exc.where}}")
        if _counts["crash"] == 1:
            print(_exc.stack)
        continue
    except _TpuNbError as _exc:
        _counts["other"] += 1
        print(f"launch {{_i}}: {{str(_exc).splitlines()[0][:300]}}")
        continue
    if sorted(_line.split("] ", 1)[-1] for _line in _lines) == _expected:
        _counts["ok"] += 1
    else:
        _counts["other"] += 1
        print(f"launch {{_i}}: wrong output {{_lines}}")
print("COUNTS", _json.dumps(_counts))
"""


def _kernel_run(kc, code: str) -> str:
    """Run `code` in the kernel; echo and return its output (and error, if any)."""
    msg_id = kc.execute(code)
    text = []
    while True:
        msg = kc.get_iopub_msg(timeout=7200)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            text.append(content["text"])
            print(content["text"], end="", flush=True)
        elif kind == "error":
            text.append(f"{content['ename']}: {content['evalue']}\n")
            print(text[-1], end="", flush=True)
        elif kind == "status" and content["execution_state"] == "idle":
            return "".join(text)


def kernel_main(count: int, busy: int, together: bool = False) -> int:
    from jupyter_client.manager import start_new_kernel

    checkout = str(Path(tpu_nb.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PT_XLA", "XLA_"))}
    env["PYTHONPATH"] = checkout
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    start = time.perf_counter()
    try:
        km, kc = start_new_kernel(kernel_name="python3", cwd=checkout, env=env)
        try:
            for setup in (*KERNEL_SETUP, TOGETHER_SETUP) if together else KERNEL_SETUP:
                _kernel_run(kc, setup)
            cell = TOGETHER_CELL if together else KERNEL_CELL
            out = _kernel_run(kc, KERNEL_LOOP.format(count=count, cell=cell))
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    counts = next(
        (json.loads(line[7:]) for line in out.splitlines() if line.startswith("COUNTS ")),
        {"ok": 0, "crash": 0, "other": count},
    )
    print(
        f"\nkernel{'-together' if together else ''} path ({checkout}, {busy} busy loops): "
        f"{count} launches of 4 replicas, "
        f"{counts['crash']} crashed, {counts['other']} failed otherwise, "
        f"{(time.perf_counter() - start) / count:.2f} s a launch"
    )
    return 1 if counts["crash"] or counts["other"] else 0


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    path = sys.argv[2] if len(sys.argv) > 2 else "fork"
    if path in ("kernel", "kernel-together"):
        busy = int(sys.argv[3]) if len(sys.argv) > 3 else 0
        return kernel_main(count, busy, together=path == "kernel-together")
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
