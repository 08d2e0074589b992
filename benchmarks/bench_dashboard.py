"""The live dashboard's cost, in real kernels: what `%%on_tpu --live` takes from a training loop.

1. Step time of the small MLP training loop (~1.3-1.9 ms a step on XLA:CPU) as a plain cell,
   as an `%%on_tpu` cell (tracked, no live view) and as an `%%on_tpu --live` cell (tracked,
   with the live dashboard at its default refresh: widgets, panels, charts, step anatomy),
   the three in turn in one kernel, round after round. Each sample is the mean step time over
   ROUND_SECONDS of steps, device-synced at both ends; the dashboard's start and final drawing
   are outside the timed loop. Printed: per-step medians side by side, and the median of the
   per-round ratios. `--live` over `%%on_tpu` is the live view's own cost (target <= 1 %).
2. What the dashboard's polling thread used while the loop ran: its CPU seconds per wall
   second (Python time the loop shares the interpreter with), the cost of one refresh (poll,
   panels, charts when due), of one chart update and of one live step anatomy; and the extra
   CPU of the kernel's IOPub thread, which sends the widget messages (/proc).

    PYTHONPATH=$PWD PJRT_DEVICE=CPU python benchmarks/bench_dashboard.py
    # before/after: one kernel per source tree, their rounds interleaved
    git worktree add /tmp/livebase <commit>
    PYTHONPATH=$PWD PJRT_DEVICE=CPU python benchmarks/bench_dashboard.py --before /tmp/livebase

BENCH_ROUNDS (12) and BENCH_ROUND_SECONDS (3) set the rounds. The machine may be shared: the
variants (and the trees) alternate within each round so that background load hits them alike,
and the interquartile range of the per-round ratios is printed with their median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from jupyter_client.manager import start_new_kernel

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = int(os.environ.get("BENCH_ROUNDS", 12))
ROUND_SECONDS = float(os.environ.get("BENCH_ROUND_SECONDS", 3))

SETUP = f"""
%load_ext tpu_nb
%tpu_setup --device cpu
import sys, time, json, os, threading
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
def running_dashboard():   # the one %%on_tpu --live started (its thread's owner)
    (thread,) = [t for t in threading.enumerate() if t.name == "tpu_nb-dashboard"]
    return thread._target.__self__
timed(100)
per_step = timed(300)
N = max(200, int({ROUND_SECONDS} / per_step))
"""

REPORT = "print(json.dumps({'ms': r * 1e3, 'iopub': io}))"
PLAIN = f"r, io = measured(N)\n{REPORT}"
TRACKED = f"%%on_tpu --quiet\nr, io = measured(N)\n{REPORT}"
LIVE = f"%%on_tpu --live --quiet\ndash = running_dashboard()\nr, io = measured(N)\n{REPORT}"
# After the live cell (its dashboard stopped): what its thread did. Old trees lack some
# figures (None).
STATS = (
    "s = dash.stats\n"
    "print(json.dumps({k: getattr(s, k, None) for k in ("
    "'refreshes', 'refresh_cost', 'refresh_cpu_cost', 'chart_draws', 'chart_cost',"
    " 'chart_full_draws', 'full_draw_cost', 'cpu_per_second', 'thread_seconds',"
    " 'anatomy_builds', 'anatomy_cost', 'start_seconds', 'stop_seconds')}))"
)
VARIANTS = {"plain": PLAIN, "on_tpu": TRACKED, "live": LIVE}


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


class Tree:
    """One kernel running tpu_nb from one source tree, and what its rounds measured."""

    def __init__(self, name: str, path: Path):
        self.name, self.path = name, path
        self.ms: dict[str, list[float]] = {v: [] for v in VARIANTS}
        self.iopub: dict[str, list[float]] = {v: [] for v in VARIANTS}
        self.stats: list[dict] = []

    def start(self) -> None:
        os.environ["PYTHONPATH"] = str(self.path)
        self.km, self.kc = start_new_kernel(kernel_name="python3", cwd=str(self.path))
        self.kc.execute_interactive(SETUP, timeout=600, output_hook=lambda msg: None)
        _run(self.kc, LIVE)  # warm-up: imports, the first charts, the first final view

    def round(self, k: int) -> None:
        names = list(VARIANTS)
        for name in names[k % 3 :] + names[: k % 3]:  # each variant goes first in turn
            result = _run(self.kc, VARIANTS[name])
            self.ms[name].append(result["ms"])
            self.iopub[name].append(result["iopub"])
            if name == "live":
                self.stats.append(_run(self.kc, STATS))

    def stop(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)

    def ratios(self, a: str, b: str) -> list[float]:
        return [x / y for x, y in zip(self.ms[a], self.ms[b], strict=True)]

    def per_second(self, key: str) -> float:
        """A count over all live rounds, per second of the polling thread's life."""
        seconds = sum(s["thread_seconds"] for s in self.stats)
        return sum(s.get(key) or 0 for s in self.stats) / seconds if seconds else 0.0

    def stat(self, key: str) -> float | None:
        values = [s[key] for s in self.stats if s.get(key) is not None]
        return statistics.median(values) if values else None


def _spread(ratios: list[float]) -> str:
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return f"{statistics.median(ratios):.3f} ({q1:.3f}-{q3:.3f})"


def _ms(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value * 1e3:.{digits}f}"


def report(trees: list[Tree]) -> None:
    width = max(len(t.name) for t in trees) + 2
    print(
        f"MLP training loop, {ROUNDS} rounds of ~{ROUND_SECONDS:g} s per variant, variants "
        "(and trees) alternating, one kernel per tree"
    )
    print(f"{'ms/step':{width}}{'plain':>9}{'%%on_tpu':>10}{'--live':>9}   (median of rounds)")
    for t in trees:
        med = {v: statistics.median(t.ms[v]) for v in VARIANTS}
        print(f"{t.name:{width}}{med['plain']:9.3f}{med['on_tpu']:10.3f}{med['live']:9.3f}")
    print(
        f"{'ratios':{width}}{'--live / plain':>24}{'--live / %%on_tpu':>24}"
        f"{'%%on_tpu / plain':>24}   (median of per-round ratios, interquartile range)"
    )
    for t in trees:
        print(
            f"{t.name:{width}}{_spread(t.ratios('live', 'plain')):>24}"
            f"{_spread(t.ratios('live', 'on_tpu')):>24}{_spread(t.ratios('on_tpu', 'plain')):>24}"
        )
    print("\nthe dashboard's polling thread while the loop ran (medians over the live rounds):")
    print(
        f"{'':{width}}{'CPU ms/s':>9}{'refresh/s':>10}{'refresh':>9}{'chart':>9}"
        f"{'chart/s':>8}{'full':>8}{'anatomy':>9}{'anat./s':>8}{'IOPub ms/s':>11}"
    )
    for t in trees:
        per_s = t.per_second
        iopub = statistics.median(t.iopub["live"]) - statistics.median(t.iopub["plain"])
        anatomy = t.stat("anatomy_cost")
        print(
            f"{t.name:{width}}{_ms(t.stat('cpu_per_second'), 1):>9}{per_s('refreshes'):10.2f}"
            f"{_ms(t.stat('refresh_cpu_cost')):>9}{_ms(t.stat('chart_cost')):>9}"
            f"{per_s('chart_draws'):8.2f}{_ms(t.stat('full_draw_cost')):>8}"
            f"{_ms(anatomy) if anatomy else 'each':>9}"
            f"{per_s('anatomy_builds') if anatomy else per_s('refreshes'):8.2f}"
            f"{iopub * 1e3:11.1f}"
        )
    print(
        "  CPU ms/s: the thread's CPU per wall second (1 ms/s is 0.1 % of the loop's time);\n"
        "  refresh: CPU ms of one refresh (poll, panels, charts when due); chart: ms of one\n"
        "  chart update, full: of a full redraw (an axis grew); anatomy: ms to build the live\n"
        "  step anatomy ('each': rebuilt inside every refresh); IOPub: the kernel's extra\n"
        "  CPU sending the widget updates."
    )
    for t in trees:
        print(
            f"  {t.name}: start {_ms(t.stat('start_seconds'), 0)} ms, stop "
            f"{_ms(t.stat('stop_seconds'), 0)} ms (outside the timed loop)"
        )
    load = os.getloadavg()
    print(
        f"machine load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
        f"({os.cpu_count()} CPUs)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--before", type=Path, help="another source tree (e.g. a git worktree) to compare"
    )
    args = parser.parse_args()
    trees = [Tree("after" if args.before else "this tree", ROOT)]
    if args.before:
        trees.insert(0, Tree("before", args.before.resolve()))
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith(("PT_XLA", "XLA_"))}
    saved_path = os.environ.get("PYTHONPATH")
    os.environ["PJRT_DEVICE"] = "CPU"
    started: list[Tree] = []
    try:
        for t in trees:
            t.start()
            started.append(t)
        for k in range(ROUNDS):
            for t in trees if k % 2 == 0 else trees[::-1]:
                t.round(k)
            print(f"round {k + 1}/{ROUNDS} done", file=sys.stderr)
    finally:
        for t in started:
            t.stop()
        os.environ.update(saved)
        if saved_path is not None:
            os.environ["PYTHONPATH"] = saved_path
    report(trees)


if __name__ == "__main__":
    sys.exit(main())
