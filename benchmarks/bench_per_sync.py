"""What on_tpu() adds to each sync, and which of its parts adds it.

Two loops, each run plain and inside on_tpu(), in alternating rounds:
  - a tiny step (`x = x + 1`, `torch_xla.sync()`): almost all of its time is the sync, so
    what tpu_nb adds per sync stands out;
  - the eager MLP training step of bench_compiled.py.
Inside on_tpu(), the same loop is also run with one of the probe's sync subscribers left out
at a time (the recorder, the step anatomy's collector, the run's sync watch), with none of
them (the probe's own hook alone), and with the host sampler stopped; each one's share is
the full run's time less the time without it. The subscribers are left out by taking them
off the probe's lists for the loop and putting them back after: the figures say what each
costs, not a way to run tpu_nb. First, the calls each step makes, counted (no clock); then
what the same few reads cost right after a sync and in a warm loop; then what a run costs
once, at its start and end.

Medians over the rounds, in microseconds per step; the spread is the 25th-75th percentile
range. The target is the issue's: <= 1 % of a ~1 ms eager step, so about 10 us per sync.

    PYTHONPATH=. PJRT_DEVICE=CPU python benchmarks/bench_per_sync.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

ROUNDS, STEPS = int(os.environ.get("ROUNDS", 7)), int(os.environ.get("STEPS", 1000))


def _tiny(dev):
    import torch
    import torch_xla

    held = [torch.zeros(8, device=dev)]

    def step():
        held[0] = held[0] + 1
        torch_xla.sync()

    return step


def _timed(step, steps: int) -> float:
    import torch_xla.core.xla_model as xm

    xm.wait_device_ops()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    xm.wait_device_ops()
    return (time.perf_counter() - start) / steps * 1e6


def _measure(step, label: str, steps: int) -> None:
    import tpu_nb
    from tpu_nb.runtime.probe import probe
    from tpu_nb.runtime.tracking import current_run

    times: dict[str, list[float]] = {}

    def keep(name: str, value: float) -> None:
        times.setdefault(name, []).append(value)

    _timed(step, 20)
    for _ in range(ROUNDS):
        keep("plain", _timed(step, steps))
        with tpu_nb.on_tpu(sync=False):
            p = probe()
            befores, afters = p.befores["sync"], p.afters["sync"]
            _timed(step, 20)
            keep("on_tpu", _timed(step, steps))
            for name in sorted({type(s).__name__ for s, _ in befores + afters}):
                p.befores["sync"] = tuple(e for e in befores if type(e[0]).__name__ != name)
                p.afters["sync"] = tuple(e for e in afters if type(e[0]).__name__ != name)
                keep(f"without {name}", _timed(step, steps))
            p.befores["sync"], p.afters["sync"] = (), ()
            keep("the probe's hook alone", _timed(step, steps))
            p.befores["sync"], p.afters["sync"] = befores, afters
            run = current_run()
            sampler = run.collector.sampler if run and run.collector else None
            if sampler is not None:
                sampler.stop()
                keep("without the host sampler", _timed(step, steps))
    plain, full = statistics.median(times["plain"]), statistics.median(times["on_tpu"])
    print(f"\n{label}: us per step, median of {ROUNDS} rounds of {steps} steps")
    for name, values in times.items():
        med = statistics.median(values)
        q = statistics.quantiles(values, n=4) if len(values) > 1 else [med, med, med]
        share = ""
        if name.startswith("without") or name.startswith("the probe"):
            share = f"  its share {full - med:7.1f} us"
        print(
            f"  {name:32} {med:8.1f}  (spread {q[0]:.1f}-{q[2]:.1f})  "
            f"+{med - plain:7.1f} us, {100 * (med / plain - 1):+6.1f} % vs plain{share}"
        )


def _calls(step, label: str, steps: int = 200, fresh=None) -> None:
    """Python calls and C calls (`sys.setprofile`'s "call" and "c_call" events) per step,
    plain and inside on_tpu(), its loop warmed first: a count that other processes on the
    machine cannot move, beside the timings they do. tpu_nb's own functions are listed.
    `fresh`: the step on_tpu() runs instead, one whose graph compiles inside the run (as a
    notebook's training cell does): its line then compares its variables' shapes at each
    sync, to name a recompile."""
    import collections

    import tpu_nb

    counts: collections.Counter = collections.Counter()

    def profile(frame, event, arg) -> None:
        if event == "call":
            code = frame.f_code
            counts[(code.co_filename, code.co_name)] += 1
        elif event == "c_call":
            counts[("C", getattr(arg, "__qualname__", "?"))] += 1

    def loop(n: int, counted: int) -> None:
        for i in range(n):
            if i == n - counted:
                sys.setprofile(profile)
            step()
        sys.setprofile(None)

    loop(steps + 20, steps)
    plain = sum(counts.values()) / steps
    counts.clear()
    step = fresh or step
    with tpu_nb.on_tpu(sync=False):
        loop(steps + 20, steps)  # one loop line: its first and third syncs' captures are warm-up
    tracked = sum(counts.values()) / steps
    package = os.path.dirname(tpu_nb.__file__)
    ours = sorted(
        ((n / steps, name) for (path, name), n in counts.items() if path.startswith(package)),
        reverse=True,
    )
    print(
        f"\n{label}: calls per step (Python and C), {steps} steps: plain {plain:.0f}, "
        f"on_tpu {tracked:.0f} (+{tracked - plain:.0f}); tpu_nb's functions per step:\n  "
        + ", ".join(f"{name} {n:g}" for n, name in ours)
    )


def _per_run(step, label: str, runs: int = 40) -> None:
    """What on_tpu() costs once per run, apart from its steps: an empty block and one of 5
    steps, each timed by the thread's CPU clock (the hooks installed and removed, the
    recorder, step anatomy and host sampler started and stopped, the report built), with the
    calls it makes counted as in _calls (a figure other processes cannot move)."""
    import tpu_nb

    def block(n: int) -> None:
        with tpu_nb.on_tpu(sync=False):
            for _ in range(n):
                step()

    calls = [0]

    def profile(frame, event, arg) -> None:
        if event in ("call", "c_call"):
            calls[0] += 1

    print(f"\n{label}: once per run, median of {runs} runs")
    for n in (0, 5):
        for _ in range(3):
            block(n)
        sys.setprofile(profile)
        block(n)
        sys.setprofile(None)
        counted, calls[0] = calls[0], 0
        cpu = []
        for _ in range(runs):
            start = time.thread_time()
            block(n)
            cpu.append(time.thread_time() - start)
        print(
            f"  on_tpu() block of {n} steps: {statistics.median(cpu) * 1e3:.2f} ms of the "
            f"thread's CPU (best {min(cpu) * 1e3:.2f}); {counted} calls"
        )


def _cold(dev, steps: int = 2000) -> None:
    """Why a hook costs more in a loop than in a micro-benchmark: the same four counter reads
    and a clock read, timed right after each sync of the tiny step, right after it and a wait
    for the device (no runtime thread is then busy), and back to back in a warm loop. Code
    that ran a while ago runs from cold caches, whatever the device is doing."""
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm

    from tpu_nb.runtime.backend import current

    read = current().counters.reader()
    clock = time.perf_counter_ns
    held = [torch.zeros(8, device=dev)]

    def reads() -> int:
        start = clock()
        read("UncachedCompile")
        read("CachedCompile")
        read("CreateXlaTensor")
        read("UncachedCompile")
        time.time()
        return clock() - start

    def after_syncs(wait: bool) -> float:
        times = []
        for _ in range(steps):
            held[0] = held[0] + 1
            torch_xla.sync()
            if wait:
                xm.wait_device_ops()
            times.append(reads())
        return statistics.median(times) / 1e3

    after_syncs(False)
    warm = statistics.median(reads() for _ in range(steps)) / 1e3
    print(
        f"\nfour counter reads and a clock, median of {steps}: right after a sync "
        f"{after_syncs(False):.2f} us; after a sync and wait_device_ops {after_syncs(True):.2f} "
        f"us; back to back {warm:.2f} us"
    )


def main() -> None:
    import torch_xla
    from bench_compiled import _steps

    import tpu_nb

    tpu_nb.setup("cpu")
    dev = torch_xla.device()
    for step, label in ((_tiny(dev), "tiny step"), (_steps(dev, "eager"), "eager MLP step")):
        _calls(step, label)
    _calls(
        _steps(dev, "eager"),
        "eager MLP step compiled inside the run",
        fresh=_steps(dev, "eager", width=320),
    )
    _cold(dev)
    _per_run(_tiny(dev), "tiny step")
    _measure(_tiny(dev), "tiny step (x + 1, sync)", STEPS)
    _measure(_steps(dev, "eager"), "eager MLP training step", max(STEPS // 10, 50))


if __name__ == "__main__":
    main()
