"""What the interrupt notice costs, and what it buys, measured side by side in one run.

1. Per cell: a trivial cell in a real InteractiveShell with the notice's hooks (a wakeup pipe
   and a watcher thread started and joined inside the cell) and without them, interleaved
   over rounds; medians and the 25th-75th percentile range.
2. In a real kernel, an interrupt during a long compile (~2,500 ops at one sync): seconds until
   the cell says "interrupt received", and until the KeyboardInterrupt ends the cell.
3. Fresh kernels whose first `--live` cell is interrupted while the dashboard is first imported
   and started: how many are left broken (`python benchmarks/bench_interrupts.py live 30` for more).
4. In a real kernel, an interrupt into a running step loop, plain `%%on_tpu` and `--live`:
   seconds until the cell ends with the KeyboardInterrupt (the tests check that it does;
   this says how fast, which a timed assert on a shared machine cannot).

    PYTHONPATH=$PWD PJRT_DEVICE=CPU python benchmarks/bench_interrupts.py
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CELLS, ROUNDS = 200, 9


def per_cell_cost() -> None:
    from IPython.testing.globalipapp import start_ipython

    from tpu_nb.ipython.extension import get_state

    ip = start_ipython()
    ip.run_line_magic("load_ext", "tpu_nb")
    ip.run_cell("import torch, torch_xla")
    notice = get_state(ip).notice
    hooks = (("pre_run_cell", notice.pre_run_cell), ("post_run_cell", notice.post_run_cell))
    times: dict[str, list[float]] = {"with notice": [], "without": []}
    for r in range(ROUNDS):
        for variant in ("with notice", "without") if r % 2 == 0 else ("without", "with notice"):
            for event, hook in hooks:
                registered = hook in ip.events.callbacks[event]
                if variant == "without" and registered:
                    ip.events.unregister(event, hook)
                elif variant == "with notice" and not registered:
                    ip.events.register(event, hook)
            start = time.perf_counter()
            for _ in range(CELLS):
                ip.run_cell("x = 1")
            times[variant].append((time.perf_counter() - start) / CELLS)
    print(f"1. a trivial cell, {CELLS} cells x {ROUNDS} rounds (interleaved):")
    for name, values in times.items():
        q = statistics.quantiles(values, n=4)
        print(
            f"   {name:<12} {statistics.median(values) * 1e6:7.0f} us per cell "
            f"(spread {q[0] * 1e6:.0f}-{q[2] * 1e6:.0f})"
        )
    extra = statistics.median(times["with notice"]) - statistics.median(times["without"])
    print(f"   the notice adds {extra * 1e6:.0f} us per cell")


def interrupt_during_compile() -> None:
    from jupyter_client.manager import start_new_kernel

    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith(("PT_XLA", "XLA_"))}
    try:
        km, kc = start_new_kernel(kernel_name="python3", cwd=str(ROOT))
    finally:
        os.environ.update(saved)
    try:
        kc.execute_interactive(
            "%load_ext tpu_nb\n%tpu_setup --device cpu\nimport torch, torch_xla", timeout=180
        )
        msg_id = kc.execute(
            "x = torch.randn(64, 64, device=torch_xla.device())\n"
            "for i in range(2500):\n    x = torch.tanh(x @ x * 0.01 + i)\n"
            "print('compiling', flush=True)\ntorch_xla.sync()"
        )
        said = ended = start = None
        while ended is None:
            msg = kc.get_iopub_msg(timeout=300)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            text = msg["content"].get("text", "")
            if "compiling" in text and start is None:
                time.sleep(1)
                start = time.perf_counter()
                km.interrupt_kernel()
            elif "interrupt received" in text:
                said = time.perf_counter() - start
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                ended = time.perf_counter() - start
        print("2. an interrupt 1 s into a long compile, in a real kernel:")
        print(
            f"   the cell says 'interrupt received' after {said:.2f} s; "
            f"the KeyboardInterrupt ends it after {ended:.1f} s"
        )
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


FIRST_LIVE = "%%on_tpu --live\nx = (torch.ones(3, device=torch_xla.device()) * 2).sum().item()"
NEXT_LIVE = "%%on_tpu --live\ny = (torch.ones(5, device=torch_xla.device()) + 1).sum().item()"


def interrupt_first_live_cell(kernels: int) -> None:
    """Fresh kernels, each interrupted (the kernel's own interrupt) at a spread of moments
    0.1-0.8 s into its first `--live` cell, where the dashboard is first imported and started;
    then two more `--live` cells must work."""
    import random

    from jupyter_client.manager import start_new_kernel

    rng = random.Random(0)
    broken: list[str] = []
    for k in range(kernels):
        delay = 0.1 + 0.7 * k / max(kernels - 1, 1) + rng.uniform(-0.02, 0.02)
        saved = {
            key: os.environ.pop(key)
            for key in list(os.environ)
            if key.startswith(("PT_XLA", "XLA_"))
        }
        try:
            km, kc = start_new_kernel(kernel_name="python3", cwd=str(ROOT))
        finally:
            os.environ.update(saved)
        try:
            kc.execute_interactive(
                "%load_ext tpu_nb\n%tpu_setup --device cpu\nimport torch, torch_xla",
                timeout=180,
                output_hook=lambda msg: None,
            )
            msg_id = kc.execute(FIRST_LIVE)
            time.sleep(delay)
            km.interrupt_kernel()
            while True:
                msg = kc.get_iopub_msg(timeout=120)
                if (
                    msg["parent_header"].get("msg_id") == msg_id
                    and msg["msg_type"] == "status"
                    and msg["content"]["execution_state"] == "idle"
                ):
                    break
            time.sleep(1)  # ipykernel aborts requests that arrive while it handles an error
            for cell in (NEXT_LIVE, NEXT_LIVE):
                reply = kc.execute_interactive(cell, timeout=120, output_hook=lambda msg: None)
                reply = reply["content"]
                if reply["status"] != "ok":
                    broken.append(f"{delay:.2f} s: {reply['ename']}: {reply['evalue']}")
                    break
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    print(f"3. the first --live cell of {kernels} fresh kernels interrupted 0.1-0.8 s in:")
    print(f"   kernels left with a broken --live cell: {len(broken)}")
    for line in broken:
        print(f"   {line}")


LOOP = (
    "for i in range(10**7):\n    w = (w @ w).tanh()\n    torch_xla.sync()\n"
    "    if i == 20:\n        print('looping', flush=True)\n"
)


def interrupt_running_loops(rounds: int = 3) -> None:
    from jupyter_client.manager import start_new_kernel

    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith(("PT_XLA", "XLA_"))}
    try:
        km, kc = start_new_kernel(kernel_name="python3", cwd=str(ROOT))
    finally:
        os.environ.update(saved)
    quiet = {"output_hook": lambda msg: None}
    seconds: dict[str, list[float]] = {"%%on_tpu": [], "%%on_tpu --live": []}
    try:
        kc.execute_interactive(
            "%load_ext tpu_nb\n%tpu_setup --device cpu\nimport torch, torch_xla",
            timeout=180,
            **quiet,
        )
        for _ in range(rounds):
            for magic in seconds:
                kc.execute_interactive("w = torch.randn(64, 64)", timeout=60, **quiet)
                msg_id = kc.execute(f"{magic}\n{LOOP}")
                start = None
                while True:
                    msg = kc.get_iopub_msg(timeout=120)
                    if msg["parent_header"].get("msg_id") != msg_id:
                        continue
                    if start is None and "looping" in msg["content"].get("text", ""):
                        start = time.perf_counter()
                        km.interrupt_kernel()
                    if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                        break
                assert start is not None
                seconds[magic].append(time.perf_counter() - start)
                while (
                    kc.execute_interactive("pass", timeout=60, **quiet)["content"]["status"]
                    == "aborted"
                ):  # ipykernel aborts what arrives while it handles the error
                    time.sleep(0.05)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    print(f"4. an interrupt into a running step loop, in a real kernel ({rounds} rounds):")
    for magic, values in seconds.items():
        print(
            f"   {magic:<16} the cell ends {statistics.median(values):.2f} s after the "
            f"interrupt (max {max(values):.2f} s)"
        )


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["loops"]:  # only section 4
        interrupt_running_loops()
    elif sys.argv[1:2] == ["live"]:  # the stress run: python benchmarks/bench_interrupts.py live 30
        interrupt_first_live_cell(int(sys.argv[2]) if len(sys.argv) > 2 else 20)
    else:
        per_cell_cost()
        interrupt_during_compile()
        interrupt_first_live_cell(5)
        interrupt_running_loops()
