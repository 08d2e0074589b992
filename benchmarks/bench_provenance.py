"""What recording provenance costs, measured side by side in one run.

While a tracked run is active, `tpu_nb.track()` runs a provenance.Recorder, a subscriber of the
probe (runtime/probe.py) that wraps torch_xla.sync, the Tensor read methods and
CPU-fallback-prone ops; it captures pending graphs at lines that compile. `%%on_tpu` also
swaps torch's factories for default_device()'s wrappers.
Target: the recorder costs <= 1 % of a ~1 ms training step and <= 10 us per sync.

1. a ~1 ms MLP training step: plain, in track(record=False), in track() (recorder on);
2. the recorder's cost per sync (empty syncs at the tracked line and 10 calls below it, a tiny
   step), and per track() (installing and removing the hooks);
3. value reads with the recorder on and off: .item() of an XLA scalar (at the tracked line,
   after a step, 5 modules deep), bool() of a CPU tensor;
4. graph capture: capture_seconds of a run whose line recompiles (an MLP step with changing
   batch sizes), and one capture of a GPT-2 (124M) training step's pending graph;
5. default_device()'s factory wrapper: torch.zeros without device= from the block's own code
   and from library code, against plain torch.zeros.

Every comparison alternates its variants within each round (the order rotates every round);
medians over rounds, spread = the 25th-75th percentile range over rounds.

    PYTHONPATH=. PJRT_DEVICE=CPU python benchmarks/bench_provenance.py
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _workload import make_mlp_step  # noqa: E402

ROUNDS = 25


# -- measuring ---------------------------------------------------------------------------------


def _quartiles(xs):
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


class Sample:
    """Wall and main-thread CPU time of one variant in one round, in us per unit. The
    recorder's work is Python on the main thread: its CPU time is what the recorder adds,
    with little of the noise other processes put into wall time."""

    def __init__(self, wall: float, cpu: float):
        self.wall, self.cpu = wall, cpu


def clock():
    return time.perf_counter(), time.thread_time()


def since(start, n: int) -> Sample:
    wall, cpu = clock()
    return Sample((wall - start[0]) / n * 1e6, (cpu - start[1]) / n * 1e6)


def rounds(variants: dict, n: int, count: int = ROUNDS) -> dict[str, list[Sample]]:
    """Run each variant's fn(n) -> Sample once a round, rotating the order every round."""
    names = list(variants)
    out = {name: [] for name in names}
    for r in range(count):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            out[name].append(variants[name](n))
    return out


def spread(xs, unit: str = "us") -> str:
    lo, mid, hi = _quartiles(xs)
    return f"{mid:8.2f} {unit} [{lo:.2f} .. {hi:.2f}]"


def paired(samples: dict, a: str, b: str, kind: str) -> list[float]:
    """a - b within each round (us): noise common to a round cancels."""
    return [
        getattr(x, kind) - getattr(y, kind) for x, y in zip(samples[a], samples[b], strict=True)
    ]


def print_samples(samples: dict, unit: str, width: int = 22) -> None:
    for name, xs in samples.items():
        print(
            f"    {name:{width}} wall {spread([x.wall for x in xs])}   "
            f"CPU {spread([x.cpu for x in xs])}  per {unit}"
        )


def print_difference(samples: dict, a: str, b: str, label: str, unit: str):
    """Print a - b per round, wall and CPU, each also as % of b's median wall time (the
    step as the user waits for it); return the CPU difference's quartiles."""
    parts, base = [], statistics.median(x.wall for x in samples[b])
    for kind in ("wall", "cpu"):
        lo, mid, hi = _quartiles(paired(samples, a, b, kind))
        pct = [100 * v / base for v in (lo, mid, hi)]
        parts.append(
            f"{kind:4} {mid:+7.2f} us [{lo:+.2f} .. {hi:+.2f}] = "
            f"{pct[1]:+5.2f} % [{pct[0]:+.2f} .. {pct[2]:+.2f}]"
        )
    best = min(x.cpu for x in samples[a]) - min(x.cpu for x in samples[b])
    print(
        f"    {label:26} per {unit}: {parts[0]};  {parts[1]};  least disturbed rounds "
        f"(min - min) cpu {best:+.2f} us"
    )
    return lo, mid, hi


def verdict(quartiles, limit: float, what: str) -> None:
    lo, mid, hi = quartiles
    state = (
        "met"
        if hi <= limit
        else "missed"
        if lo > limit
        else "undecided: the spread between rounds straddles it"
    )
    print(
        f"    -> target {what} <= {limit:.1f} us: recorder's CPU cost {mid:.2f} us "
        f"[{lo:.2f} .. {hi:.2f}]: {state}"
    )


def timed(body, context, code=None):
    """fn(n) -> Sample of body(n) inside `context(code)`, measured inside the block (entering
    and leaving the block is measured separately), waiting for the device at both ends."""
    import torch_xla.core.xla_model as xm

    def run(n):
        with context(code):
            xm.wait_device_ops()
            start = clock()
            body(n)
            xm.wait_device_ops()
            return since(start, n)

    return run


def plain(code):
    return contextlib.nullcontext()


def record_off(code):
    import tpu_nb

    return tpu_nb.track(record=False, wait=False, code=code)


def record_on(code):
    import tpu_nb

    return tpu_nb.track(wait=False, code=code)


ON, OFF, PLAIN = "track() recorder on", "track(record=False)", "plain"
CONTEXTS = {PLAIN: plain, OFF: record_off, ON: record_on}


def three_ways(body, n: int, count: int = ROUNDS) -> dict[str, list[Sample]]:
    # The tracked code is `timed.run` (as a cell's code is in %%on_tpu): sites are its lines.
    code = (timed(None, plain).__code__,)
    return rounds({name: timed(body, ctx, code) for name, ctx in CONTEXTS.items()}, n, count)


def print_three(samples: dict, unit: str):
    """Print the variants and the recorder's cost; return its CPU quartiles (vs record=False)."""
    print_samples(samples, unit)
    cost = print_difference(samples, ON, OFF, "recorder on - record=False", unit)
    print_difference(samples, ON, PLAIN, "recorder on - plain", unit)
    return cost


# -- 1. the training step ----------------------------------------------------------------------


def bench_step(step) -> None:
    def body(n):
        for _ in range(n):
            step()

    for _ in range(30):
        step()
    samples = three_ways(body, 150)
    cost = print_three(samples, "step")
    step_wall = statistics.quantiles([x.wall for x in samples[PLAIN]], n=4)
    print(
        f"    (1 % of the plain step: {step_wall[1] / 100:.1f} us at its median wall time, "
        f"{step_wall[0] / 100:.1f} us at its 25th percentile, the least disturbed rounds)"
    )
    verdict(cost, step_wall[0] / 100, "1 % of the step,")
    verdict(cost, 10.0, "per sync (one sync a step)")


# -- 2. per sync -------------------------------------------------------------------------------


def _deep(depth, fn):
    if depth == 0:
        return fn()
    return _deep(depth - 1, fn)


def bench_sync(dev) -> None:
    import torch
    import torch_xla

    def empty(n):
        for _ in range(n):
            torch_xla.sync()

    def empty_deep(n):
        for _ in range(n):
            _deep(10, torch_xla.sync)

    x = torch.zeros(4, device=dev)

    def tiny(n):
        nonlocal x
        for _ in range(n):
            x = x + 1
            torch_xla.sync()

    tiny(5)
    for label, body, n in (
        ("empty sync at the tracked line", empty, 400),
        ("empty sync 10 calls below it", empty_deep, 400),
        ("tiny step (x = x + 1; sync)", tiny, 200),
    ):
        print(f"  {label}:")
        verdict(print_three(three_ways(body, n), "sync"), 10.0, "per sync")


def bench_start_stop() -> None:
    def enter_exit(context):
        def run(n):
            start = clock()
            for _ in range(n):
                with context(()):
                    pass
            return since(start, n)

        return run

    samples = rounds({OFF: enter_exit(record_off), ON: enter_exit(record_on)}, 20)
    print_samples(samples, "empty block")
    print_difference(samples, ON, OFF, "installing + removing hooks", "track()")


# -- code the tracked code calls into -------------------------------------------------------

LIBRARY_SOURCE = '''
import torch

def library_zeros(n):
    for _ in range(n):
        made = torch.zeros(3)
    return made

def _down(depth, n):
    return library_zeros(n) if depth == 0 else _down(depth - 1, n)

def library_zeros_deep(n):
    _down(8, n)

class Reader(torch.nn.Module):
    """Reads a value back in its forward, as transformers' mask checks do."""

    def __init__(self, value):
        super().__init__()
        self.value = value

    def forward(self, x):
        self.value.item()
        return x

class Wrapper(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)
'''


def _library():
    """Code from a file that is not the tracked code's (a stand-in for a library's)."""
    namespace: dict = {}
    exec(
        compile(LIBRARY_SOURCE, "/opt/lib/python3/site-packages/somelib/core.py", "exec"), namespace
    )
    return namespace


# -- 3. value reads ----------------------------------------------------------------------------


def bench_item(dev, step) -> None:
    import torch

    t = torch.ones((), device=dev) * 3
    t.item()

    def reads(n):
        for _ in range(n):
            t.item()

    print("  .item() of a computed scalar, in a loop:")
    verdict(print_three(three_ways(reads, 200), "read"), 10.0, "per read (as per sync)")

    def step_and_read(n):
        for _ in range(n):
            step().item()

    cpu_value = torch.tensor(1.0)

    def cpu_reads(n):  # data-pipeline code: values of CPU tensors, no XLA involved
        for _ in range(n):
            bool(cpu_value)

    print("  bool() of a CPU tensor (no device data: nothing to record):")
    verdict(print_three(three_ways(cpu_reads, 2000), "read"), 10.0, "per read (as per sync)")

    print("  MLP step + loss.item() per step:")
    print_three(three_ways(step_and_read, 60), "step")

    lib = _library()
    model = lib["Reader"](t)
    for _ in range(4):
        model = lib["Wrapper"](model)

    def nested_reads(n):
        for _ in range(n):
            model(None)

    print(
        "  .item() inside a model's forward, 5 modules deep (~15 frames, like a read in "
        "transformers' forward):"
    )
    verdict(print_three(three_ways(nested_reads, 200), "read"), 10.0, "per read (as per sync)")


# -- 4. graph capture --------------------------------------------------------------------------


def _best_of(times: int, fn) -> float:
    best = float("inf")
    for _ in range(times):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bench_capture_recompiling(dev) -> None:
    import torch
    import torch_xla

    import tpu_nb

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch):
        opt.zero_grad()
        x = torch.randn(batch, 256, device=dev)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        torch_xla.sync()

    batches = (8, 8, 16, 24, 32, 40, 48)
    run = tpu_nb.track("recompiling")
    with run as report:
        for batch in batches:
            step(batch)  # one line, a new graph at every new batch size
    recording = run._recorder.recording  # captures are counted there, not in the report
    per = report.capture_seconds / max(1, recording.captures)
    print(
        f"  MLP step, batch sizes {batches}: {report.metrics.compiles} compiles "
        f"({report.metrics.compile_seconds:.2f} s), wall {report.wall_seconds:.2f} s"
    )
    print(
        f"    report.capture_seconds {report.capture_seconds * 1e3:.1f} ms for "
        f"{recording.captures} captures = {per * 1e3:.1f} ms per capture "
        f"({100 * report.capture_seconds / report.wall_seconds:.1f} % of the run's wall)"
    )


def bench_capture_gpt2(dev) -> None:
    """One capture of a GPT-2 (124M) training step's pending graph, by the recorder's own
    capture function (what it runs before a sync that is due a capture); nothing is compiled
    (a GPT-2 step takes ~30 s to compile on this machine)."""
    import torch
    import torch_xla

    from tpu_nb.runtime.tracking import _provenance as provenance

    try:
        from transformers import GPT2Config, GPT2LMHeadModel
        from transformers.utils import logging as hf_logging
    except ImportError:
        print("  GPT-2: transformers not installed (pip install -e .[test]); skipped")
        return
    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).to(dev)  # built on the CPU: copies, no compile
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 50257, (2, 64)).to(dev)
    start = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()  # the parameters now hold the whole step's pending graph
    trace = time.perf_counter() - start
    frame = sys._getframe()
    seconds, graph = [], None
    for _ in range(3):
        start = time.perf_counter()
        graph = provenance._capture_pending(frame)
        seconds.append(time.perf_counter() - start)
    nodes = len(graph.nodes) if graph is not None else 0
    print(
        f"  GPT-2 124M training step (AdamW, batch 2 x 64), {nodes} IR nodes pending, traced in "
        f"{trace:.2f} s: one capture {min(seconds) * 1e3:.0f} ms (best of 3; "
        f"{', '.join(f'{s * 1e3:.0f}' for s in seconds)} ms)"
    )
    # Where a capture's time goes: torch_xla's IR text dump, against the graph hash alone.
    xc = torch_xla._XLAC
    pending = list(model.parameters()) + [loss]
    dump = _best_of(3, lambda: xc._get_xla_tensors_text(pending))
    hashing = _best_of(3, lambda: xc._get_graph_hash(pending))
    print(
        f"    of which torch_xla's IR text dump {dump * 1e3:.0f} ms; the graph's hash alone "
        f"{hashing * 1e3:.1f} ms"
    )
    del model, opt, loss  # drop the pending graph unrun: nothing compiles


# -- 5. default_device() factory wrapper ----------------------------------------------------


def bench_factories(dev) -> None:
    import torch

    from tpu_nb.runtime.environment import default_device

    lib = _library()

    def explicit(n):
        for _ in range(n):
            torch.zeros(3, device=dev)

    def implicit(n):
        for _ in range(n):
            made = torch.zeros(3)
        return made

    def via_library(n):  # the block calls a library that makes a tensor (AdamW's steps)
        return lib["library_zeros"](n)

    def via_library_deep(n):
        lib["library_zeros_deep"](n)

    def in_block(body, from_code):
        def run(n):
            with default_device(dev, code=(from_code.__code__,)):
                start = clock()
                body(n)
                return since(start, n)

        return run

    def outside(body):
        def run(n):
            start = clock()
            body(n)
            return since(start, n)

        return run

    variants = {
        "plain zeros(3, device=xla)": outside(explicit),
        "block, zeros(3, device=xla)": in_block(explicit, explicit),
        "block's code, zeros(3)": in_block(implicit, implicit),
        "plain zeros(3) (CPU)": outside(implicit),
        "library, 1 call below": in_block(via_library, via_library),
        "library, ~10 calls below": in_block(via_library_deep, via_library_deep),
    }
    with default_device(dev, code=(implicit.__code__,)):  # the variants do what they say
        assert implicit(1).device.type == "xla"
    with default_device(dev, code=(via_library.__code__,)):
        assert via_library(1).device.type == "cpu"
    samples = rounds(variants, 2000)
    print_samples(samples, "call", width=28)
    print("    wrapper cost:")
    for label, a, b in (
        ("block's own code (-> xla)", "block's code, zeros(3)", "plain zeros(3, device=xla)"),
        ("explicit device= in block", "block, zeros(3, device=xla)", "plain zeros(3, device=xla)"),
        ("library, 1 call (-> CPU)", "library, 1 call below", "plain zeros(3) (CPU)"),
        ("library, 10 calls (-> CPU)", "library, ~10 calls below", "plain zeros(3) (CPU)"),
    ):
        print_difference(samples, a, b, label, "call")


# -- main --------------------------------------------------------------------------------------


def main() -> None:
    import tpu_nb

    started = time.perf_counter()
    tpu_nb.setup("cpu")
    dev = tpu_nb.device()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"Provenance recorder costs. {os.cpu_count()} cores, load average {load:.1f} at start: "
        "this machine is shared and noisy, so every figure is a median over interleaved "
        "rounds with [25th .. 75th percentile] over rounds; differences are paired per round."
    )
    print(
        "Target: the recorder (track() against track(record=False)) costs <= 1 % of a ~1 ms "
        "step and <= 10 us per sync."
    )
    print(
        "wall: elapsed time; CPU: the main thread's CPU time (the recorder's work is Python on "
        "that thread; other processes barely move it). Differences: median of per-round "
        "differences [25th .. 75th percentile], and that as % of the reference's median wall "
        "time; min - min: the difference between each variant's least disturbed round.\n"
    )
    step = make_mlp_step(dev)
    print(
        f"1. MLP training step (256-512-10, batch 64, one sync per step), {ROUNDS} rounds "
        "x 150 steps per variant:"
    )
    bench_step(step)
    print(f"\n2. recorder cost per sync, {ROUNDS} rounds:")
    bench_sync(dev)
    print("  entering + leaving track() (once per cell, not per sync):")
    bench_start_stop()
    print(f"\n3. value reads, {ROUNDS} rounds:")
    bench_item(dev, step)
    print("\n4. graph capture (only at a line's first sync and after it compiles; time-budgeted):")
    bench_capture_recompiling(dev)
    bench_capture_gpt2(dev)
    print(f"\n5. default_device() factory wrapper (%%on_tpu), {ROUNDS} rounds x 2000 calls:")
    bench_factories(dev)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\ntotal {time.perf_counter() - started:.0f} s, load average {load:.1f} at the end")


if __name__ == "__main__":
    main()
