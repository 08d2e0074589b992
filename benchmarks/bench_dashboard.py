"""The live dashboard's cost (issue "Live XLA dashboard"), in one real kernel.

1. Step time of the small MLP training loop (~1.3 ms a step on XLA:CPU) with the dashboard
   live at its default refresh (`with tpu_nb.dashboard(): ...`: widgets, panels, charts)
   against the same loop without it, alternating in one kernel. Each sample is the mean step
   time over ROUND_SECONDS of steps, device-synced at both ends; the dashboard's start and
   final drawing are outside the timed loop. Target: <= 2 % median overhead.
2. What the dashboard's polling thread itself used: CPU seconds per wall second, the cost of
   one refresh (poll + widget updates + any chart), of one chart draw, of start and stop; and
   the extra CPU of the kernel's IOPub thread, which sends the widget messages (/proc).

    make bench     # or: PYTHONPATH=$PWD PJRT_DEVICE=CPU python benchmarks/bench_dashboard.py

The machine may be shared: the rounds alternate so that background load hits both variants
alike, and the spread (interquartile range of the per-round ratios) is printed with the median.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

from jupyter_client.manager import start_new_kernel

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = int(os.environ.get("BENCH_ROUNDS", 25))
ROUND_SECONDS = float(os.environ.get("BENCH_ROUND_SECONDS", 6))

SETUP = f"""
%load_ext tpu_nb
%tpu_setup --device cpu
import sys, time, json
sys.path.insert(0, {str(ROOT / "benchmarks")!r})
import torch, torch_xla
import torch_xla.core.xla_model as xm
import tpu_nb
from _workload import make_mlp_step
step = make_mlp_step(torch_xla.device())
def timed(n):
    xm.wait_device_ops()
    start = time.perf_counter()
    for _ in range(n):
        step()
    xm.wait_device_ops()
    return (time.perf_counter() - start) / n
import os, threading
def iopub_cpu():   # CPU seconds of the kernel's IOPub thread (it sends widget messages)
    for t in threading.enumerate():
        if t.name == "IOPub":
            with open("/proc/self/task/%d/stat" % t.native_id) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return float("nan")
def measured(n):
    cpu, wall = iopub_cpu(), time.perf_counter()
    r = timed(n)
    return r, (iopub_cpu() - cpu) / (time.perf_counter() - wall)
timed(100)
per_step = timed(300)
N = max(200, int({ROUND_SECONDS} / per_step))
"""

PLAIN = "r, io = measured(N)\nprint(json.dumps({'ms': r * 1e3, 'iopub': io}))"
LIVE = (
    "with tpu_nb.dashboard() as dash:\n    r, io = measured(N)\n"
    "s = dash.stats\n"
    "print(json.dumps({'ms': r * 1e3, 'iopub': io, 'refreshes': s.refreshes,"
    " 'refresh_s': s.refresh_cost,"
    " 'refresh_cpu_s': s.refresh_cpu_cost, 'chart_draws': s.chart_draws,"
    " 'chart_s': s.chart_cost, 'cpu_per_s': s.cpu_per_second,"
    " 'blit_s': s.blit_cost, 'full_s': s.full_draw_cost, 'full_draws': s.chart_full_draws,"
    " 'thread_s': s.thread_seconds, 'start_s': s.start_seconds, 'stop_s': s.stop_seconds}))"
)


def _run(kc, code: str) -> dict:
    out = []

    def hook(msg):
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("ERROR " + "\n".join(msg["content"]["traceback"]))

    reply = kc.execute_interactive(code, timeout=600, output_hook=hook)
    text = "".join(out)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(text)
    lines = [line for line in text.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def _quartiles(xs):
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


def main() -> None:
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith(("PT_XLA", "XLA_"))}
    os.environ["PJRT_DEVICE"] = "CPU"
    os.environ["PYTHONPATH"] = str(ROOT)
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(ROOT))
    try:
        kc.execute_interactive(SETUP, timeout=600, output_hook=lambda msg: None)
        _run(kc, LIVE)  # warm-up: imports, first chart draws
        plain, live, ratios, plain_runs = [], [], [], []
        for k in range(ROUNDS):
            order = (PLAIN, LIVE) if k % 2 == 0 else (LIVE, PLAIN)  # alternate who goes first
            results = {code: _run(kc, code) for code in order}
            p, lv = results[PLAIN], results[LIVE]
            plain.append(p["ms"])
            plain_runs.append(p)
            live.append(lv)
            ratios.append(lv["ms"] / p["ms"])
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        os.environ.update(saved)
        load = os.getloadavg()

    live_ms = [r["ms"] for r in live]
    q1, q3 = _quartiles(ratios)
    print(
        f"MLP training loop with and without the live dashboard (default refresh 0.5 s), "
        f"{ROUNDS} alternating rounds of ~{ROUND_SECONDS:.0f} s each, one kernel"
    )
    print(
        f"  without dashboard   median {statistics.median(plain):6.3f} ms/step   "
        f"(rounds: {min(plain):.3f}-{max(plain):.3f})"
    )
    print(
        f"  with dashboard      median {statistics.median(live_ms):6.3f} ms/step   "
        f"(rounds: {min(live_ms):.3f}-{max(live_ms):.3f})"
    )
    of_ratios = 100 * (statistics.median(ratios) - 1)
    of_medians = 100 * (statistics.median(live_ms) / statistics.median(plain) - 1)
    print(
        f"  overhead            median of per-round ratios {of_ratios:+5.2f} %"
        f"   interquartile {100 * (q1 - 1):+.2f} % .. {100 * (q3 - 1):+.2f} %   "
        f"ratio of medians {of_medians:+5.2f} %"
        f"   (target <= 2 %)"
    )

    def med(key):
        return statistics.median(r[key] for r in live)

    iopub_extra = statistics.median(r["iopub"] for r in live) - statistics.median(
        p["iopub"] for p in plain_runs
    )
    refreshes = sum(r["refreshes"] for r in live)
    seconds = sum(r["thread_s"] for r in live)
    print(
        f"  polling thread      {100 * med('cpu_per_s'):.2f} % of a core "
        f"({med('cpu_per_s') * 1e3:.1f} ms CPU per second), {refreshes / seconds:.2f} "
        f"refreshes/s"
    )
    print(
        f"  kernel IOPub thread +{iopub_extra * 1e3:.1f} ms CPU per second sending the "
        f"widget updates: with the polling thread, "
        f"{(med('cpu_per_s') + iopub_extra) * 1e3:.1f} ms/s of Python work the training loop "
        "shares the GIL with"
    )
    print(
        f"  one refresh         {med('refresh_s') * 1e3:.2f} ms wall, "
        f"{med('refresh_cpu_s') * 1e3:.2f} ms CPU (poll + widget updates + charts when due)"
    )
    draws = sum(r["chart_draws"] for r in live)
    full = sum(r["full_draws"] for r in live)
    print(
        f"  one chart draw      {med('chart_s') * 1e3:.2f} ms on average "
        f"({draws / seconds:.2f} draws/s): data-only update (blit + PNG) "
        f"{statistics.median(r['blit_s'] for r in live if r['blit_s']) * 1e3:.2f} ms, "
        f"full redraw {statistics.median(r['full_s'] for r in live if r['full_s']) * 1e3:.1f} ms "
        f"({full} of {draws}: when an axis grows)"
    )
    print(
        f"  start / stop        {med('start_s') * 1e3:.0f} ms / {med('stop_s') * 1e3:.0f} ms "
        "(outside the timed loop: first view; final poll, charts and static view)"
    )
    print(
        f"  machine load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
        f"({os.cpu_count()} CPUs)"
    )


if __name__ == "__main__":
    sys.exit(main())
