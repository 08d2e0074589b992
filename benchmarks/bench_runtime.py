"""Runtime library costs, measured side by side in one run.

1. snapshot() + since() against the raw _XLAC reads of every counter and metric they wrap.
2. track() around every step of a ~1.3 ms MLP training step, interleaved with the bare loop.
3. PT_XLA_DEBUG_LEVEL=1 against 0 (latched per process: alternating child processes).

    make bench            # or: PYTHONPATH=. PJRT_DEVICE=CPU python benchmarks/bench_runtime.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _workload import interleave, make_mlp_step, median  # noqa: E402

CHILD = "--child-debug-level"


def _per_call_us(fn, n: int = 3000) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n * 1e6)
    return best


def bench_snapshot(step) -> None:
    import torch_xla

    import tpu_nb

    xc = torch_xla._XLAC

    def raw():
        counters = {n: xc._xla_counter_value(n) for n in xc._xla_counter_names()}
        metrics = {n: xc._xla_metric_data(n) for n in xc._xla_metric_names()}
        return counters, metrics

    base = tpu_nb.snapshot()
    for label, warm_steps in (("after 20 steps", 20), ("after 2,000 steps", 1980)):
        for _ in range(warm_steps):
            step()
        tpu_nb.sync(wait=True)
        raw_us = _per_call_us(raw)
        snap_us = _per_call_us(lambda: tpu_nb.snapshot().since(base))
        print(
            f"  {label:18} raw _XLAC reads {raw_us:7.1f} us   snapshot()+since() "
            f"{snap_us:6.1f} us   ratio {snap_us / raw_us:4.2f}x"
        )


def bench_track(step) -> None:
    import tpu_nb

    def bare(n):
        for _ in range(n):
            step()

    def tracked(n):
        for _ in range(n):
            with tpu_nb.track(wait=False):
                step()

    def tracked_nosync(n):
        for _ in range(n):
            with tpu_nb.track(sync=False, wait=False):
                step()

    def tracked_wait(n):
        for _ in range(n):
            with tpu_nb.track():
                step()

    for _ in range(50):
        step()
    times = interleave(
        {
            "bare": bare,
            "track(sync=False, wait=False)": tracked_nosync,
            "track(wait=False)": tracked,
            "track() (waits each step)": tracked_wait,
        },
        steps=200,
        rounds=21,
    )
    ref = median(times["bare"])
    for name, samples in times.items():
        m = median(samples)
        print(f"  {name:32} {m:6.3f} ms/step   overhead {100 * (m / ref - 1):+5.1f} %")


def child(level: str) -> None:
    import tpu_nb

    tpu_nb.setup("cpu", compile_analysis=level != "0")
    step = make_mlp_step(tpu_nb.device())
    for _ in range(50):
        step()

    def bare(n):
        for _ in range(n):
            step()

    print(median(interleave({"x": bare}, steps=200, rounds=5)["x"]))


def bench_debug_level() -> None:
    results = {"0": [], "1": []}
    for _ in range(4):
        for level in results:
            out = subprocess.run(
                [sys.executable, __file__, CHILD, level], capture_output=True, text=True, check=True
            )
            results[level].append(float(out.stdout.strip().splitlines()[-1]))
    off, on = median(results["0"]), median(results["1"])
    print(
        f"  PT_XLA_DEBUG_LEVEL=0 {off:6.3f} ms/step   =1 {on:6.3f} ms/step   "
        f"difference {100 * (on / off - 1):+5.1f} %  (4 alternating processes each)"
    )


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == CHILD:
        child(sys.argv[2])
        return
    import tpu_nb

    tpu_nb.setup("cpu")
    step = make_mlp_step(tpu_nb.device())
    print("snapshot() + since() against raw reads (target: <= 2x raw, <= 50 us)")
    bench_snapshot(step)
    print("track() around each step of the MLP loop (target: <= 2 % overhead)")
    bench_track(step)
    print("compile-cause analysis cost (target: not measurable)")
    bench_debug_level()


if __name__ == "__main__":
    main()
