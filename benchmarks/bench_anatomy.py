"""What the step anatomy costs, measured side by side in one run.

While a run is tracked, tpu_nb.runtime.tracking._anatomy.Collector records three timestamps per
sync and per value read and times the data loaders' __next__ (events of the probe,
runtime/probe.py), looks at the runtime's sample buffers every 48 syncs and reads, and builds
the per-step records when the run ends. Target: <= 1 % of a ~1 ms step, <= 10 us per sync.

1. a ~1.3 ms MLP training step inside track(): the recorder alone (anatomy unhooked right
   after entry) against the recorder with the anatomy, and plain for reference;
2. per sync: empty syncs in a tracked block, anatomy on and off;
3. per batch: DataLoader.__next__ over an in-memory dataset, wrapped and not;
4. one-off costs: a read of the sample buffers (full), building the Anatomy of 1,000 steps.

Every comparison alternates its variants within each round (the order rotates every round);
medians over rounds, spread = the 25th-75th percentile range over rounds; "paired" is the
per-round difference, so noise common to a round cancels.

    PYTHONPATH=. PJRT_DEVICE=CPU python benchmarks/bench_anatomy.py [--rounds N]
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


def _rounds(variants: dict, n: int, count: int) -> dict[str, list[tuple[float, float]]]:
    """variant(n) -> (wall us, main-thread CPU us) per unit; order rotates every round."""
    names = list(variants)
    out = {name: [] for name in names}
    for r in range(count):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            out[name].append(variants[name](n))
    return out


def _show(samples, unit: str, base_name: str | None = None) -> None:
    for name, xs in samples.items():
        for i, kind in enumerate(("wall", "CPU")):
            lo, mid, hi = _quartiles([x[i] for x in xs])
            print(f"    {name:28} {kind:4} {mid:9.2f} us [{lo:.2f} .. {hi:.2f}] per {unit}")
    if base_name is None:
        return
    base_wall = statistics.median(x[0] for x in samples[base_name])
    for name in samples:
        if name == base_name:
            continue
        for i, kind in enumerate(("wall", "CPU")):
            diffs = [a[i] - b[i] for a, b in zip(samples[name], samples[base_name], strict=True)]
            lo, mid, hi = _quartiles(diffs)
            print(
                f"    paired {name} - {base_name} {kind:4}: {mid:+8.2f} us "
                f"[{lo:+.2f} .. {hi:+.2f}] = {100 * mid / base_wall:+.2f} % of the "
                f"{unit} [{100 * lo / base_wall:+.2f} .. {100 * hi / base_wall:+.2f}]"
            )


def _clock():
    return time.perf_counter(), time.thread_time()


def _per(start, n: int) -> tuple[float, float]:
    wall, cpu = _clock()
    return (wall - start[0]) / n * 1e6, (cpu - start[1]) / n * 1e6


@contextlib.contextmanager
def _tracked(anatomy: bool):
    import tpu_nb

    with tpu_nb.track(wait=False) as report:
        if not anatomy:  # the recorder alone: what tpu_nb cost before
            report.anatomy._unhook()
        yield report


def _timed(body, context):
    import torch_xla.core.xla_model as xm

    def run(n):
        with context():
            xm.wait_device_ops()
            start = _clock()
            body(n)
            xm.wait_device_ops()
            return _per(start, n)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()

    import torch
    import torch_xla
    from torch.utils.data import DataLoader, TensorDataset

    import tpu_nb
    from tpu_nb.runtime.tracking import _anatomy as anatomy

    tpu_nb.setup("cpu")
    dev = torch_xla.device()
    step = make_mlp_step(dev)

    def steps(n):
        for _ in range(n):
            step()

    with tpu_nb.track():
        steps(20)  # compile, warm every hook and cache

    print(f"1. ~1 ms MLP training step, {args.rounds} rounds of 200 steps")
    samples = _rounds(
        {
            "plain": _timed(steps, contextlib.nullcontext),
            "recorder": _timed(steps, lambda: _tracked(False)),
            "recorder+anatomy": _timed(steps, lambda: _tracked(True)),
        },
        200,
        args.rounds,
    )
    _show(samples, "step", base_name="recorder")

    print(f"\n2. empty syncs in a tracked block, {args.rounds} rounds of 2,000")

    def empty_syncs(n):
        for _ in range(n):
            torch_xla.sync()

    _show(
        _rounds(
            {
                "recorder": _timed(empty_syncs, lambda: _tracked(False)),
                "recorder+anatomy": _timed(empty_syncs, lambda: _tracked(True)),
            },
            2000,
            args.rounds,
        ),
        "sync",
        base_name="recorder",
    )

    print(f"\n3. DataLoader.__next__ (in-memory, batch 8), {args.rounds} rounds of 2,000")
    data = TensorDataset(torch.randn(16000, 4))

    def batches(n):
        for i, _ in enumerate(DataLoader(data, batch_size=8)):
            if i + 1 >= n:
                break

    _show(
        _rounds(
            {
                "recorder": _timed(batches, lambda: _tracked(False)),
                "recorder+anatomy": _timed(batches, lambda: _tracked(True)),
            },
            2000,
            args.rounds,
        ),
        "batch",
        base_name="recorder",
    )

    print("\n4. one-off costs")
    with tpu_nb.track() as report:
        steps(1000)
        collector = report.anatomy
        t = time.perf_counter()
        for _ in range(20):
            collector._gate_values.clear()  # every buffer read, as after busy syncs
            collector._harvest()
        harvest = (time.perf_counter() - t) / 20
        t = time.perf_counter()
        built = anatomy.build(collector, None)
        build = time.perf_counter() - t
    print(
        f"    reading the sample buffers once: {harvest * 1e6:.1f} us "
        f"(at most every 48 syncs and reads: {harvest * 1e6 / 48:.2f} us per sync)"
    )
    print(
        f"    building the anatomy of {len(built.steps)} steps: {build * 1e3:.1f} ms "
        f"({build / max(len(built.steps), 1) * 1e6:.1f} us per step, once at the run's end)"
    )
    with tpu_nb.track() as report:
        steps(300)
        t = time.perf_counter()
        for _ in range(10):
            report.anatomy.snapshot(last=64)
        snap = (time.perf_counter() - t) / 10
    print(
        f"    live snapshot of the last 64 steps (a 300-step run): {snap * 1e3:.2f} ms "
        "(twice a second from the dashboard's thread)"
    )


if __name__ == "__main__":
    main()
