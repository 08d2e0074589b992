"""What reading the compile log costs per sync, the log held open or named, side by side.

A tracked run asks the compile log for its size at every sync (the max_graphs guard and the
recorder of where compiles came from) and reads it when it grew. Measured on a real log of
this process (setup() and real compiles on XLA:CPU), interleaved over rounds, medians:

1. the stat behind `CompileLog.size()`: the name in the temp directory (torch_xla given the
   name), the /proc/self/task/<pid>/fd/<n> path torch_xla is given, and fstat of the held
   descriptor (what `size()` does when the log is held);
2. `CompileLog.size()` itself, the log held, and a reader of the same file by its name (what
   every size() was before the log was held);
3. reading one new compile's blocks: with the check of the last 4 KB read (a file rewritten
   in place) and without it.

    PYTHONPATH=$PWD PJRT_DEVICE=CPU python benchmarks/bench_compile_log.py
"""

from __future__ import annotations

import os
import statistics
import time

CALLS, ROUNDS = 20_000, 9


def per_call(fn, calls: int = CALLS) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main() -> None:
    import torch
    import torch_xla

    import tpu_nb
    from tpu_nb.runtime.metrics import CompileLog, compile_log

    env = tpu_nb.setup("cpu")
    dev = torch_xla.device()
    for n in range(3, 8):  # a few real compiles in the log
        (torch.ones(n, device=dev) * 2).sum().item()
    log = compile_log()
    given, name = log.path, env.debug_file
    held = log._held  # the descriptor size() uses
    print(f"the log: {name}\ntorch_xla writes to: {given}")

    variants = {
        "stat(name)": lambda: os.stat(name),
        "stat(/proc/self/task/<pid>/fd/<n>)": lambda: os.stat(given),
        "fstat(held fd)": (lambda: os.fstat(held)) if held is not None else None,
        "CompileLog.size(), held": log.size,
        "CompileLog.size(), by name": CompileLog(name).size,  # as before the log was held
    }
    times: dict[str, list[float]] = {k: [] for k, v in variants.items() if v is not None}
    for r in range(ROUNDS):
        order = list(times) if r % 2 == 0 else list(reversed(times))
        for key in order:
            times[key].append(per_call(variants[key]))
    print(f"1-2. per call, {CALLS:,} calls x {ROUNDS} rounds (interleaved):")
    for key, values in times.items():
        print(f"   {key:<36} {statistics.median(values) * 1e6:6.2f} us")

    # 3. One compile's blocks appended, then read: the seam check is one pread of 4 KB.
    with open(given, "rb") as f:
        data = f.read()
    block = data[data.rfind(b"Compilation Analysis: ====", 0, data.rfind(b"Compilation Cause")) :]
    folder = os.path.dirname(name)
    path = os.path.join(folder, "bench-read.log")
    reads: dict[str, list[float]] = {"with the 4 KB check": [], "without": []}
    from tpu_nb.runtime.metrics import _compile_log

    try:
        for r in range(ROUNDS):
            for variant in reads if r % 2 == 0 else reversed(list(reads)):
                _compile_log._SEAM = 4096 if variant == "with the 4 KB check" else 0
                with open(path, "wb") as f:
                    f.write(block * 20)
                reader = CompileLog(path)
                reader.events_since(0)
                total = 0.0
                for _ in range(200):
                    with open(path, "ab") as f:
                        f.write(block)
                    start = time.perf_counter()
                    reader.events_since(0)
                    total += time.perf_counter() - start
                reads[variant].append(total / 200)
    finally:
        _compile_log._SEAM = 4096
        os.unlink(path)
    print(f"3. reading one new compile's blocks ({len(block):,} bytes), {ROUNDS} rounds:")
    for key, values in reads.items():
        print(f"   {key:<28} {statistics.median(values) * 1e6:6.1f} us")


if __name__ == "__main__":
    main()
