"""What the host sampler costs, measured side by side in one run, and the rate it reaches.

While a run is tracked, tpu_nb.runtime.tracking._sampler.Sampler reads the tracked thread's
stack from a daemon thread every 5 ms (sys._current_frames(), a walk to the cell's frame, a
dict update). Its cost to the user's loop: the walk's CPU time, and the GIL it takes from the
tracked thread. Target: <= 1 % of a ~1 ms training step.

1. a ~1.3 ms MLP training step inside track(): the anatomy without the sampler against the
   anatomy with it (both wait=False, as a per-step tracked loop runs), plain for reference;
   the sampling rate the sampler reached meanwhile;
2. the rate under a host that never lets the GIL go by itself (a pure-Python loop): the
   sampler must force the switch interval;
3. one sample's cost: the stack walk and its bookkeeping, on a stack as deep as the step's.

Each comparison alternates its variants within each round (the order rotates every round);
medians over rounds, spread = the 25th-75th percentile range over rounds; "paired" is the
per-round difference, so noise common to a round cancels.

    PYTHONPATH=. PJRT_DEVICE=CPU python benchmarks/bench_sampler.py [--rounds N]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _workload import make_mlp_step  # noqa: E402


def _quartiles(xs):
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


@contextlib.contextmanager
def _tracked(sampling: bool, rates: list | None = None):
    import tpu_nb
    from tpu_nb.runtime.tracking._anatomy import Collector

    saved = Collector.sample_interval
    Collector.sample_interval = saved if sampling else None
    try:
        with tpu_nb.track(wait=False) as report:
            yield report
    finally:
        Collector.sample_interval = saved
    sampler = report.anatomy.sampler if report.anatomy is not None else None
    if rates is not None and sampler is not None:
        rates.append((sampler.rate, sampler.cpu_seconds / (sampler.stopped - sampler.started)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()

    import torch_xla
    import torch_xla.core.xla_model as xm

    import tpu_nb
    from tpu_nb.runtime.tracking._sampler import INTERVAL, Sampler

    tpu_nb.setup("cpu")
    step = make_mlp_step(torch_xla.device())

    def steps(n):
        for _ in range(n):
            step()

    with tpu_nb.track():
        steps(20)  # compile, warm every hook and cache

    rates: list[tuple[float, float]] = []
    variants: dict = {
        "plain": contextlib.nullcontext,
        "anatomy": lambda: _tracked(False),
        "anatomy+sampler": lambda: _tracked(True, rates),
    }
    names = list(variants)
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    print(
        f"1. ~1 ms MLP training step, {args.rounds} rounds of {args.steps} steps "
        f"(sampling every {INTERVAL * 1e3:g} ms)"
    )
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            with variants[name]():
                xm.wait_device_ops()
                wall, cpu = time.perf_counter(), time.thread_time()
                steps(args.steps)
                xm.wait_device_ops()
                got[name].append(
                    (
                        (time.perf_counter() - wall) / args.steps * 1e6,
                        (time.thread_time() - cpu) / args.steps * 1e6,
                    )
                )
    for name in names:
        for i, kind in enumerate(("wall", "CPU")):
            lo, mid, hi = _quartiles([x[i] for x in got[name]])
            print(f"    {name:16} {kind:4} {mid:8.1f} us [{lo:.1f} .. {hi:.1f}] per step")
    base = statistics.median(x[0] for x in got["anatomy"])
    for i, kind in enumerate(("wall", "CPU (main thread)")):
        diffs = [a[i] - b[i] for a, b in zip(got["anatomy+sampler"], got["anatomy"], strict=True)]
        lo, mid, hi = _quartiles(diffs)
        print(
            f"    paired anatomy+sampler - anatomy, {kind}: {mid:+.2f} us "
            f"[{lo:+.2f} .. {hi:+.2f}] = {100 * mid / base:+.2f} % of the step "
            f"[{100 * lo / base:+.2f} .. {100 * hi / base:+.2f}]"
        )
    with_s = statistics.median(x[0] for x in got["anatomy+sampler"])
    print(f"    ratio of medians anatomy+sampler / anatomy: {with_s / base:.4f}")
    lo, mid, hi = _quartiles([r for r, _ in rates])
    print(
        f"    sampling rate reached: {mid:.0f} Hz [{lo:.0f} .. {hi:.0f}] (asked {1 / INTERVAL:.0f})"
    )
    lo, mid, hi = _quartiles([c for _, c in rates])
    print(
        f"    the sampling thread's CPU time (it holds the GIL meanwhile): {100 * mid:.2f} % "
        f"of the wall time [{100 * lo:.2f} .. {100 * hi:.2f}] = {mid * with_s:.1f} us per step"
    )

    print(f"\n2. sampling rate under a pure-Python host loop, {min(args.rounds, 7)} runs of 0.5 s")
    busy_rates: list[tuple[float, float]] = []
    for _ in range(min(args.rounds, 7)):
        with _tracked(True, busy_rates):
            end = time.perf_counter() + 0.5
            n = 0
            while time.perf_counter() < end:
                n += 1
    lo, mid, hi = _quartiles([r for r, _ in busy_rates])
    print(
        f"    {mid:.0f} Hz [{lo:.0f} .. {hi:.0f}] (switch interval "
        f"{sys.getswitchinterval() * 1e3:g} ms: a sample waits for it)"
    )

    print("\n3. one sample: the stack walk and its bookkeeping (every frame the cell's: the worst)")
    import threading

    here = sys._getframe()
    sampler = Sampler(threading.get_ident(), root_frame=here)

    def deep(n):
        if n:
            return deep(n - 1)
        t = time.perf_counter()
        for _ in range(2000):
            key = sampler._sample()
            sampler._add(key, 0.0, 1e-9)
        return (time.perf_counter() - t) / 2000

    for depth in (10, 40):
        cost = deep(depth)
        print(
            f"    {depth} frames deep: {cost * 1e6:.1f} us a sample, "
            f"{cost / INTERVAL:.2%} of one CPU at {1 / INTERVAL:.0f} Hz"
        )


if __name__ == "__main__":
    main()
